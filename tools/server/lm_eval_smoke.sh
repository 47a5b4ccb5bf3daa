#!/usr/bin/env bash
# lm-eval (EleutherAI lm-evaluation-harness, PyPI `lm-eval`, model type local-chat-completions) end to end against
# `dsv4 serve` on the tiny random model (issue 7 acceptance): the score is meaningless, the harness must complete.
# Offline: the task is tools/server/lm_eval/dsv4_smoke.yaml over the committed 8-line jsonl next to it.
#
# usage: tools/server/lm_eval_smoke.sh [DSV4_BIN] [MODEL_DIR]
#   DSV4_BIN defaults to build/dsv4; MODEL_DIR to a fresh `dsv4 make-tiny` model in a temp dir.
# needs: python3 -m pip install "lm-eval[api]"
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=${1:-$root/build/dsv4}
tmp=$(mktemp -d)
pid=""
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
command -v lm_eval >/dev/null || { echo "lm_eval not found: python3 -m pip install \"lm-eval[api]\""; exit 1; }
model=${2:-}
if [ -z "$model" ]; then model=$tmp/m; "$bin" make-tiny --out "$model" --seed 11 >/dev/null; fi

"$bin" serve --model "$model" --port 0 --max-context 1024 --max-batch 4 --served-model-name dsv4-tiny \
  >"$tmp/serve.out" 2>"$tmp/serve.log" &
pid=$!
port=""
for _ in $(seq 1 100); do
  port=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$tmp/serve.log")
  [ -n "$port" ] && curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
  sleep 0.1
done
[ -n "$port" ] || { echo "server did not start:"; cat "$tmp/serve.log"; exit 1; }

cd "$root"  # the task's data_files path is relative to the repository root
HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 lm_eval \
  --model local-chat-completions \
  --model_args "model=dsv4-tiny,base_url=http://127.0.0.1:$port/v1/chat/completions,num_concurrent=4,max_retries=1,tokenized_requests=False" \
  --apply_chat_template \
  --include_path tools/server/lm_eval \
  --tasks dsv4_smoke \
  --output_path "$tmp/out" \
  --log_samples
n=$(grep -c 'POST /v1/chat/completions 200' "$tmp/serve.log" || true)
echo "server answered $n chat completions with 200"
[ "$n" -ge 8 ] || { echo "FAIL: expected >= 8 completions (one per sample)"; tail -20 "$tmp/serve.log"; exit 1; }
if grep -q 'POST /v1/chat/completions [45]' "$tmp/serve.log"; then
  echo "FAIL: the server rejected some of lm-eval's requests:"; grep 'POST /v1/chat/completions [45]' "$tmp/serve.log"; exit 1
fi
echo "lm-eval smoke: OK"
