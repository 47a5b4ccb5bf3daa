#!/usr/bin/env bash
# `dsv4 serve` accepts a burst of simultaneous connections while it is decoding, without the kernel dropping any
# (issue 7, "hangs under concurrent agents"): tools/server/connect_burst.py. Args: DSV4_BIN SOURCE_DIR BINARY_DIR.
set -u
bin="$1"; src="$2"
tmp=$(mktemp -d)
pid=""
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
"$bin" make-tiny --out "$tmp/m" --seed 11 >/dev/null || { echo "make-tiny failed"; exit 1; }
"$bin" serve --model "$tmp/m" --port 0 --max-context 512 >"$tmp/out" 2>"$tmp/log" &
pid=$!
url=""
for _ in $(seq 1 100); do
  port=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$tmp/log")
  if [ -n "$port" ] && curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; then url="http://127.0.0.1:$port"; break; fi
  sleep 0.1
done
[ -n "$url" ] || { echo "server did not start: $(cat "$tmp/log")"; exit 1; }
python3 "$src/tools/server/connect_burst.py" "$url" 128
