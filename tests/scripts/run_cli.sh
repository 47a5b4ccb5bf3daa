#!/usr/bin/env bash
# `dsv4 run` contract (issue 5): greedy consistency with `dsv4 logits`, seeds, JSON fields, errors.
# Args: DSV4_BIN SOURCE_DIR BINARY_DIR.
set -u
bin="$1"; tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fails=0
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }
"$bin" make-tiny --out "$tmp/m" --seed 5 >/dev/null || { echo "make-tiny failed"; exit 1; }
m="$tmp/m"
# Greedy: every completion token is the argmax of `dsv4 logits` over prompt + completion.
"$bin" run --model "$m" --prompt "Explain tensor parallelism." --temperature 0 --max-tokens 32 --output-format json \
  >"$tmp/g.json" 2>"$tmp/g.err" || { bad "greedy run: $(cat "$tmp/g.err")"; }
python3 - "$tmp/g.json" "$tmp/ids.bin" <<'PY' || bad "greedy json"
import json, struct, sys
o = json.load(open(sys.argv[1]))
for k in ["prompt_ids", "completion_ids", "text", "reasoning_content", "content", "tool_calls", "finish_reason", "timings"]:
    assert k in o, k
assert o["finish_reason"] in ("stop", "length"), o["finish_reason"]
assert len(o["completion_ids"]) == 32 or o["finish_reason"] == "stop", len(o["completion_ids"])
ids = o["prompt_ids"] + o["completion_ids"]
open(sys.argv[2], "wb").write(struct.pack("<%di" % len(ids), *ids))
print("prompt", len(o["prompt_ids"]), "completion", len(o["completion_ids"]))
PY
"$bin" logits --model "$m" --ids "$tmp/ids.bin" --out "$tmp/l.bin" || bad "logits"
python3 - "$tmp/g.json" "$tmp/l.bin" <<'PY' || bad "greedy tokens are not the argmax"
import array, json, sys
o = json.load(open(sys.argv[1])); P = len(o["prompt_ids"]); C = o["completion_ids"]
l = array.array('f'); l.frombytes(open(sys.argv[2], 'rb').read())
V = len(l) // (P + len(C))
for i, tok in enumerate(C):
    row = l[(P - 1 + i) * V:(P + i) * V]
    best = max(range(V), key=lambda v: (row[v], -v))
    assert best == tok, f"completion token {i}: generated {tok}, argmax {best}"
print(f"all {len(C)} greedy tokens are argmax")
PY
# --speculative mtp: the same completion as plain decoding (greedy and sampled), drafts counted in the timings.
for t in 0 1; do
  "$bin" run --model "$m" --prompt "Explain tensor parallelism." --temperature $t --seed 3 --max-tokens 32 \
    --output-format json >"$tmp/p$t.json" 2>/dev/null || bad "plain run T=$t"
  "$bin" run --model "$m" --prompt "Explain tensor parallelism." --temperature $t --seed 3 --max-tokens 32 \
    --speculative mtp --output-format json >"$tmp/s$t.json" 2>"$tmp/s$t.err" || bad "speculative run T=$t: $(cat "$tmp/s$t.err")"
  grep -q "speculative: .* draft tokens accepted" "$tmp/s$t.err" || bad "speculative run T=$t printed no draft statistics"
  python3 - "$tmp/p$t.json" "$tmp/s$t.json" <<'PY' || bad "speculative output differs from plain (T=$t)"
import json, sys
p, s = (json.load(open(f)) for f in sys.argv[1:3])
assert p["completion_ids"] == s["completion_ids"], (p["completion_ids"], s["completion_ids"])
assert p["timings"]["draft_tokens"] == 0 and s["timings"]["draft_tokens"] > 0, (p["timings"], s["timings"])
print("speculative == plain,", s["timings"]["draft_tokens"], "drafts,", s["timings"]["accepted_drafts"], "accepted")
PY
done
"$bin" run --model "$m" --prompt "Hi" --speculative eagle 2>/dev/null && bad "--speculative eagle accepted"
# Seeds: same seed -> same output; different seeds -> different output.
for s in 1 1 2; do
  "$bin" run --model "$m" --prompt "Hi" --seed $s --max-tokens 16 --output-format json 2>/dev/null \
    | python3 -c "import json,sys; print(json.load(sys.stdin)['completion_ids'])" >>"$tmp/seeds.txt"
done
[ "$(sed -n 1p "$tmp/seeds.txt")" = "$(sed -n 2p "$tmp/seeds.txt")" ] || bad "same seed gave different output"
[ "$(sed -n 1p "$tmp/seeds.txt")" != "$(sed -n 3p "$tmp/seeds.txt")" ] || bad "different seeds gave the same output"
# Sampling defaults come from the model's generation_config.json; explicit flags override it.
ids_of() { "$bin" run --model "$m" --prompt "Hi" --seed 4 --max-tokens 12 --output-format json "$@" 2>/dev/null \
  | python3 -c "import json,sys; print(json.load(sys.stdin)['completion_ids'])"; }
sampled=$(ids_of)
echo '{"temperature": 0.0, "top_p": 1.0}' > "$m/generation_config.json"
[ "$(ids_of)" = "$(ids_of --temperature 0)" ] || bad "generation_config.json temperature 0 was not applied"
[ "$(ids_of --temperature 1)" = "$sampled" ] || bad "--temperature did not override generation_config.json"
rm -f "$m/generation_config.json"
# Text mode prints a stats line on stderr.
"$bin" run --model "$m" --prompt "Hi" --max-tokens 4 --mode chat >/dev/null 2>"$tmp/s.err" || bad "text mode"
grep -q "prefill" "$tmp/s.err" && grep -q "decode" "$tmp/s.err" || bad "no stats line: $(cat "$tmp/s.err")"
# Errors: missing model, prompt longer than the context.
"$bin" run --model "$tmp/none" --prompt x >/dev/null 2>&1; rc=$?; [ $rc -ge 1 ] && [ $rc -le 2 ] || bad "missing model exit $rc"
"$bin" run --model "$m" --prompt "$(printf 'word %.0s' $(seq 1 300))" --max-context 64 >/dev/null 2>"$tmp/e.err"; rc=$?
[ $rc -ge 1 ] && [ $rc -le 2 ] && grep -q "max context" "$tmp/e.err" || bad "long prompt: exit $rc $(cat "$tmp/e.err")"
# Chat REPL: two turns and a reset through stdin.
printf 'Hello\nSecond turn\n/reset\nThird\n' | "$bin" chat --model "$m" --max-tokens 6 --seed 1 >/dev/null 2>"$tmp/c.err" \
  || bad "chat: $(cat "$tmp/c.err")"
[ "$(grep -c 'generated' "$tmp/c.err")" -eq 3 ] || bad "chat did not answer 3 turns: $(cat "$tmp/c.err")"
[ $fails -eq 0 ] && echo "all run/chat checks passed" || { echo "$fails failure(s)"; exit 1; }
