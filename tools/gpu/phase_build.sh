#!/usr/bin/env bash
# Builds a phase-stamp binary beside the normal one (dev machine; no GPU needed): kernels.cu with DSV4_PHASE_STAMPS
# (kernels.cu's "Phase stamps"), the binary copied to $BUILD/dsv4_phases, then the normal build restored (kernels.cu
# is rebuilt twice, ~2 min each on 2 cores). Run it on the GPU machine with check.sh PHASE_BIN=$BUILD/dsv4_phases.
# Usage: [BUILD=build] tools/gpu/phase_build.sh
set -euo pipefail
BUILD=${BUILD:-build}
restore() { cmake -S . -B "$BUILD" -DDSV4_PHASE_STAMPS=OFF > /dev/null && cmake --build "$BUILD" -j2 --target dsv4 > /dev/null; }
trap restore EXIT
cmake -S . -B "$BUILD" -DDSV4_PHASE_STAMPS=ON > /dev/null
cmake --build "$BUILD" -j2 --target dsv4 > /dev/null
cp "$BUILD/dsv4" "$BUILD/dsv4_phases"
echo "phase-stamp binary: $BUILD/dsv4_phases"
