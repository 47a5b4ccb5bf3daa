#!/usr/bin/env bash
# What each Flash layer kind adds to a batch-1 decode step as the graph really runs (side branches on), by
# difference: `dsv4 bench --synthetic flash --layers N` at N = 2 (SWA, SWA), 3 (+ CSA), 4 (+ HCA), alternating the
# depths REPS times, once per setting in SETTINGS (space-separated; "-" = defaults, else VAR=V,VAR2=V2 env settings).
# The trace (--trace-steps) cannot show this: it puts the compressor / indexer branches on the main stream.
# Usage: BIN=build/dsv4 [REPS=3] [SETTINGS="- DSV4_ATTN_FORK=0"] tools/gpu/layer_kinds.sh
set -uo pipefail
BIN=${BIN:-build/dsv4}
REPS=${REPS:-3}
SETTINGS=${SETTINGS:--}
CONTEXT=${CONTEXT:-8192}
for s in $SETTINGS; do
  for r in $(seq "$REPS"); do
    for n in 2 3 4; do
      env_args=()
      [ "$s" != "-" ] && IFS=, read -r -a env_args <<< "$s"
      us=$(env "${env_args[@]}" "$BIN" bench --synthetic flash --layers "$n" --context "$CONTEXT" --prompt 256 \
             --steps 60 2>&1 | sed -n 's/.*decode step without head: median \([0-9.]*\) us.*/\1/p')
      echo "setting=$s rep=$r layers=$n step_us=${us:-FAILED}"
    done
  done
done
