#!/usr/bin/env bash
# `dsv4 check` (issue 6's A/B tool), exercised CPU vs CPU in CI: identical backends agree exactly at every
# sub-layer; reference vs official numerics are reported as diverging and the exit code says so.
# Args: DSV4_BIN SOURCE_DIR BINARY_DIR.
set -u
bin="$1"; src="$2"; fx="$src/tests/fixtures/pro_fp8"; fails=0
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }
out=$("$bin" check --model "$fx" --a cpu --b cpu --numerics official --tokens 40) || bad "cpu vs cpu exit $?: $out"
grep -q "top-1 agreement 40/40" <<<"$out" || bad "cpu vs cpu top-1: $(tail -1 <<<"$out")"
[ "$(grep -c '^[0-9]' <<<"$out")" -eq 8 ] || bad "expected 8 sub-layer rows (4 layers x attn/ffn): $out"
grep -q "worst sub-layer cosine 1.000000" <<<"$out" || bad "cpu vs cpu not exact"
out=$("$bin" check --model "$fx" --a cpu --b cpu --numerics reference --b-numerics official --min-cosine 0.99999 --layers 2)
rc=$?; [ $rc -eq 1 ] || bad "reference vs official should fail the cosine bar (exit $rc)"
grep -q "<--" <<<"$out" || bad "diverging sub-layers not marked"
[ "$(grep -c '^[0-9]' <<<"$out")" -eq 4 ] || bad "--layers 2 should report 4 rows"
"$bin" check --model "$fx" --b cpu --ids /nonexistent >/dev/null 2>&1; rc=$?
[ $rc -ge 1 ] && [ $rc -le 2 ] || bad "missing ids file: exit $rc"
[ $fails -eq 0 ] && echo "all check CLI tests passed" || { echo "$fails failure(s)"; exit 1; }
