#!/usr/bin/env bash
# Builds a phase-stamp binary beside the normal one (dev machine; no GPU needed): kernels.cu with DSV4_PHASE_STAMPS
# (kernels.cu's "Phase stamps"), the binary copied to $BUILD/dsv4_phases, then the normal build restored (kernels.cu
# is rebuilt twice, ~2 min each on 2 cores). Run it on the GPU machine with check.sh PHASE_BIN=$BUILD/dsv4_phases.
# BLOCKS=1: also the per-block stamps (kernels.cu, BLOCK_STAMPS_*: every block of the GEMV, expert and attention
# kernels records entry / wait / end, DSV4_BLOCK_FIRST picks the window; they cost registers and a barrier per block,
# so that build's step timeline is not the normal one -- e.g. the side GEMVs no longer fit beside wq_b's blocks).
# Usage: [BUILD=build] [BLOCKS=1] tools/gpu/phase_build.sh
set -euo pipefail
BUILD=${BUILD:-build}
BLOCKS=$([ "${BLOCKS:-0}" = 1 ] && echo ON || echo OFF)
restore() { cmake -S . -B "$BUILD" -DDSV4_PHASE_STAMPS=OFF -DDSV4_BLOCK_STAMPS=OFF > /dev/null && cmake --build "$BUILD" -j2 --target dsv4 > /dev/null; }
trap restore EXIT
cmake -S . -B "$BUILD" -DDSV4_PHASE_STAMPS=ON -DDSV4_BLOCK_STAMPS="$BLOCKS" > /dev/null
cmake --build "$BUILD" -j2 --target dsv4 > /dev/null
cp "$BUILD/dsv4" "$BUILD/dsv4_phases"
echo "phase-stamp binary: $BUILD/dsv4_phases"
