#!/usr/bin/env bash
# Why a prefill kernel runs at the speed it does: Nsight Compute's throughput, warp-state, occupancy and memory
# sections for the first launches of the kernels matching DETAIL (a regex; default: the prefill MoE kernels) in the
# timed prefill of a one-layer synthetic Flash bench (`dsv4 bench --profile-prefill` brackets it with
# cudaProfilerStart/Stop). ~10 s on a warm H200. (Timing every prefill kernel under ncu instead is far too slow:
# a 4-layer 8K prefill had not finished its first 2,048-token chunk after 220 s.) Per-op prefill times without a
# profiler: the bench's "prefill time by op" table (events; "moe/..." rows split the MoE op).
# Usage: [DETAIL=REGEX] [COUNT=N] [SKIP=N] [LAYERS=N] [PROMPT=N] [SOURCE=1] [TIMES=1] tools/gpu/profile_prefill.sh [DSV4_BIN];
# output in $OUT (default build-gpu/prefill_profile): detail.txt, with SOURCE=1 source_top.txt. SKIP launches of the
# matching kernels are passed over first (e.g. LAYERS=3 SKIP=2 COUNT=1: Flash's first CSA layer, layers 0-1 being
# sliding-window only).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${1:-$ROOT/build-cuda/dsv4}
OUT=${OUT:-$ROOT/build-gpu/prefill_profile}
DETAIL=${DETAIL:-expert_f8|expert_tc2}
COUNT=${COUNT:-4}
SKIP=${SKIP:-0}
LAYERS=${LAYERS:-1}
PROMPT=${PROMPT:-2048}
mkdir -p "$OUT"
NCU=${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}
# TIMES=1: instead, every kernel of the timed prefill with its GPU time, DRAM bytes, geometry and registers
# (tools/gpu/ncu_summary.py's table: kernels by total time), one ncu pass of a few metrics: where the op-level times
# of the bench's table go, kernel by kernel (e.g. hc_post_pre = hc_post_mix_kernel + hc_finish_kernel).
if [ -n "${TIMES:-}" ]; then
  METRICS=gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size,launch__block_size,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active,l1tex__t_sectors_pipe_lsu_mem_local_op_ld.sum
  "$NCU" --profile-from-start off --clock-control none --metrics "$METRICS" --csv --log-file "$OUT/times.csv" \
    "$BIN" bench --synthetic flash --layers "$LAYERS" --context "$PROMPT" --prompt "$PROMPT" --steps 20 --profile-prefill > "$OUT/bench_times.log" 2>&1
  echo "ncu rc=$?"
  python3 "$ROOT/tools/gpu/ncu_summary.py" "$OUT/times.csv" | tee "$OUT/times.txt"
  exit 0
fi
"$NCU" --profile-from-start off --clock-control none -k "regex:$DETAIL" --launch-skip "$SKIP" --launch-count "$COUNT" \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
  --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis -o "$OUT/detail" -f \
  "$BIN" bench --synthetic flash --layers "$LAYERS" --context "$PROMPT" --prompt "$PROMPT" --steps 20 --profile-prefill > "$OUT/bench.log" 2>&1
echo "ncu rc=$?"
"$NCU" --import "$OUT/detail.ncu-rep" --print-summary none > "$OUT/detail.txt" 2>&1
grep -E "^  [a-z_ ]*void|Duration|Issue Slots Busy|Executed Ipc Active|Achieved Occupancy|Registers Per|Memory Throughput|DRAM Throughput" "$OUT/detail.txt"
# SOURCE=1: also the per-line stall samples (source view, CUDA + SASS) of the first launch matching DETAIL.
if [ -n "${SOURCE:-}" ]; then
  "$NCU" --profile-from-start off --clock-control none -k "regex:$DETAIL" --launch-skip "$SKIP" --launch-count 1 --section SourceCounters \
    --section WarpStateStats -o "$OUT/source" -f \
    "$BIN" bench --synthetic flash --layers "$LAYERS" --context "$PROMPT" --prompt "$PROMPT" --steps 20 --profile-prefill > "$OUT/bench_source.log" 2>&1
  "$NCU" --import "$OUT/source.ncu-rep" --page source --print-source cuda,sass --csv > "$OUT/source.csv" 2>&1
  python3 "$ROOT/tools/gpu/ncu_source_top.py" "$OUT/source.csv" 60 > "$OUT/source_top.txt" 2>&1
  head -70 "$OUT/source_top.txt"
fi
