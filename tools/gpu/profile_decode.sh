#!/usr/bin/env bash
# Per-kernel GPU time of one decode step, from Nsight Compute (the GPU machine has /usr/local/cuda/bin/ncu, no nsys).
# Runs `dsv4 bench --synthetic ... --profile-steps 1` under `ncu --profile-from-start off`, so exactly the kernels of
# one replayed decode graph are measured (each serialised by ncu: its own duration, without launch gaps or overlap),
# then tools/gpu/ncu_summary.py prints them by kernel with counts and the sum, next to the bench's graph step time:
# sum << step time means the step is dominated by gaps/dependencies between kernels, sum ~ step time by the kernels.
# Besides the time: DRAM bytes read (-> achieved GB/s), launch geometry, registers, achieved occupancy and spill loads.
# Usage: tools/gpu/profile_decode.sh [DSV4_BIN] [bench args...]   (default: build-cuda/dsv4, Flash 4 layers at 8K:
# SWA, SWA, CSA, HCA)
# Output: $OUT (default build-gpu/profile) / ncu.csv, bench.log, summary.txt.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${1:-$ROOT/build-cuda/dsv4}
shift || true
ARGS=("$@")
[ ${#ARGS[@]} -eq 0 ] && ARGS=(--synthetic flash --layers 4 --context 8192 --prompt 256)
OUT=${OUT:-$ROOT/build-gpu/profile}
mkdir -p "$OUT"
NCU=${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}
# --clock-control none: keep the boost clocks the bench runs at (ncu locks base clocks by default).
# EXTRA_METRICS=m1,m2,...: more ncu metrics, printed per kernel after the table (first launch's values), e.g. what
# limits a kernel: smsp__issue_active.avg.pct_of_peak_sustained_active (issue slots busy),
# dram__throughput.avg.pct_of_peak_sustained_elapsed, smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct,
# smsp__warp_issue_stalled_barrier_per_warp_active.pct, smsp__warp_issue_stalled_math_pipe_throttle_per_warp_active.pct
# (names as `ncu --query-metrics` lists them on the machine; an unknown name makes ncu fail the run).
METRICS=gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size,launch__block_size,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active,l1tex__t_sectors_pipe_lsu_mem_local_op_ld.sum
[ -n "${EXTRA_METRICS:-}" ] && METRICS=$METRICS,$EXTRA_METRICS
"$NCU" --profile-from-start off --clock-control none --metrics "$METRICS" --csv \
  --log-file "$OUT/ncu.csv" "$BIN" bench "${ARGS[@]}" --steps 20 --profile-steps 1 > "$OUT/bench.log" 2>&1
python3 "$ROOT/tools/gpu/ncu_summary.py" "$OUT/ncu.csv" "$OUT/bench.log" | tee "$OUT/summary.txt"
