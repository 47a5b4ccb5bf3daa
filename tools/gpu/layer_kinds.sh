#!/usr/bin/env bash
# What each Flash layer kind adds to a batch-1 decode step as the graph really runs (side branches on), by
# difference: `dsv4 bench --synthetic flash --layers N` at N = 2 (SWA, SWA), 3 (+ CSA), 4 (+ HCA), alternating the
# depths REPS times, once per setting in SETTINGS (space-separated; "-" = defaults, else VAR=V,VAR2=V2 env settings).
# Prints every run, then per setting the median step of each depth and the CSA / HCA layers' costs from the medians.
# The trace (--trace-steps) cannot show this: it puts the compressor / indexer branches on the main stream.
# Usage: BIN=build/dsv4 [REPS=3] [SETTINGS="- DSV4_ATTN_FORK=0"] [CONTEXT=8192] tools/gpu/layer_kinds.sh
set -uo pipefail
BIN=${BIN:-build/dsv4}
REPS=${REPS:-3}
SETTINGS=${SETTINGS:--}
CONTEXT=${CONTEXT:-8192}
runs=$(mktemp)
trap 'rm -f "$runs"' EXIT
for r in $(seq "$REPS"); do
  for s in $SETTINGS; do  # settings alternate within a rep, so drifts of the machine hit all of them alike
    for n in 2 3 4; do
      env_args=()
      [ "$s" != "-" ] && IFS=, read -r -a env_args <<< "$s"
      us=$(env "${env_args[@]}" "$BIN" bench --synthetic flash --layers "$n" --context "$CONTEXT" --prompt 256 \
             --steps 60 2>&1 | sed -n 's/.*decode step without head: median \([0-9.]*\) us.*/\1/p')
      echo "setting=$s rep=$r layers=$n step_us=${us:-FAILED}" | tee -a "$runs"
    done
  done
done
# Medians per (setting, depth), then the differences.
awk '
  { st = substr($1, 9); split($3, b, "="); split($4, c, "=");  # $1 = "setting=" + the setting (may hold "=")
    if (!(st in seen)) { seen[st] = 1; order[++ns] = st }
    if (c[2] == "FAILED") { failed[st] = 1; next }
    k = st SUBSEP b[2]; v[k, ++cnt[k]] = c[2] + 0 }
  function median(k,   n, i, j, t, x) {
    n = cnt[k]; if (n == 0) return -1
    for (i = 1; i <= n; ++i) x[i] = v[k, i]
    for (i = 1; i <= n; ++i) for (j = i + 1; j <= n; ++j) if (x[j] < x[i]) { t = x[i]; x[i] = x[j]; x[j] = t }
    return n % 2 ? x[(n + 1) / 2] : (x[n / 2] + x[n / 2 + 1]) / 2
  }
  END {
    for (i = 1; i <= ns; ++i) {
      s = order[i]; m2 = median(s SUBSEP 2); m3 = median(s SUBSEP 3); m4 = median(s SUBSEP 4)
      if (m2 < 0 || m3 < 0 || m4 < 0 || (s in failed)) { printf "setting=%s: a run failed, no differences\n", s; continue }
      printf "setting=%s medians: 2 layers %.1f us, 3 layers %.1f, 4 layers %.1f -> CSA layer %.1f us, HCA layer %.1f us\n",
             s, m2, m3, m4, m3 - m2, m4 - m3
    }
  }' "$runs"
