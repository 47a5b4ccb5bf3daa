#!/usr/bin/env bash
# Why a decode kernel is slow: Nsight Compute's warp-state (stall reasons), scheduler, occupancy and memory sections
# for one launch of each kernel matching KERNELS (a regex; default: the mHC, norm/RoPE, ring GEMV and expert kernels),
# from one replayed decode step of the synthetic Flash bench, plus the per-line source view (stall samples) of the
# first match of SOURCE_KERNEL. Usage: tools/gpu/ncu_stalls.sh [DSV4_BIN]; output in $OUT (default build-gpu/stalls).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${1:-$ROOT/build-cuda/dsv4}
OUT=${OUT:-$ROOT/build-gpu/stalls}
KERNELS=${KERNELS:-hc_finish|norm_rope|gemv_ring|expert_ring|hc_post}
SOURCE_KERNEL=${SOURCE_KERNEL:-hc_finish}
mkdir -p "$OUT"
NCU=${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}
ARGS=(bench --synthetic flash --layers 4 --context 8192 --prompt 256 --steps 20 --profile-steps 1)
"$NCU" --profile-from-start off --clock-control none -k "regex:$KERNELS" --launch-count 12 \
  --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
  --section SpeedOfLight -o "$OUT/stalls" -f "$BIN" "${ARGS[@]}" > "$OUT/bench.log" 2>&1
"$NCU" --import "$OUT/stalls.ncu-rep" --print-summary none > "$OUT/sections.txt" 2>&1
"$NCU" --profile-from-start off --clock-control none -k "regex:$SOURCE_KERNEL" --launch-count 1 --section SourceCounters \
  --section WarpStateStats -o "$OUT/source" -f "$BIN" "${ARGS[@]}" > "$OUT/bench_source.log" 2>&1
"$NCU" --import "$OUT/source.ncu-rep" --page source --print-source cuda,sass --csv > "$OUT/source.csv" 2>&1
python3 "$ROOT/tools/gpu/ncu_source_top.py" "$OUT/source.csv" > "$OUT/source_top.txt" 2>&1
