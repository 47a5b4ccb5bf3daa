#!/usr/bin/env bash
# `dsv4 serve` end to end with the official openai SDK (issue 7): tiny random model, CPU, two servers on free
# loopback ports (main with the test hook, aux with an API key and a 1-slot/1-queue bound). Args: DSV4_BIN SOURCE_DIR
# BINARY_DIR. Optional env DSV4_SERVER_TEST_PER_CLIENT: requests per client in the 16-client concurrency check;
# DSV4_SERVER_TEST_MAX_BATCH: the main server's --max-batch (default 16; 1 = no batching, the check must fail).
set -u
bin="$1"; src="$2"
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; rm -rf "$tmp"; }
trap cleanup EXIT
python3 -c "import openai" 2>/dev/null || { echo "python package 'openai' missing: pip install -r tools/requirements-test.txt"; exit 1; }
"$bin" make-tiny --out "$tmp/m" --seed 11 >/dev/null || { echo "make-tiny failed"; exit 1; }

url=""
start() {  # start NAME ARGS...: serve on a free port (--port 0), wait for the banner; sets $url
  local name=$1; shift
  "$bin" serve --model "$tmp/m" --port 0 --max-context 512 "$@" >"$tmp/$name.out" 2>"$tmp/$name.log" &
  pids+=($!)
  for _ in $(seq 1 100); do
    local port; port=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$tmp/$name.log")
    if [ -n "$port" ] && curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; then url="http://127.0.0.1:$port"; return 0; fi
    sleep 0.1
  done
  echo "server $name did not start: $(cat "$tmp/$name.log")"; return 1
}
start main --max-batch "${DSV4_SERVER_TEST_MAX_BATCH:-16}" --enable-test-hooks || exit 1
main=$url
start aux --max-batch 1 --max-queue 1 --api-key sekret || exit 1
aux=$url
python3 "$src/tools/server/test_openai_sdk.py" "$main" "$aux" sekret "${DSV4_SERVER_TEST_PER_CLIENT:-8}"; rc=$?
# One log line per request; no crash.
for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null || { echo "FAIL: a server died"; rc=1; }; done
n=$(grep -c '^\[dsv4 serve\] 127.0.0.1 ' "$tmp/main.log")
[ "$n" -ge 2000 ] || { echo "FAIL: only $n request log lines"; rc=1; }
[ $rc -eq 0 ] || { echo "--- main server log (tail)"; tail -20 "$tmp/main.log"; }
exit $rc
