#!/usr/bin/env bash
# The text CLI contract of issue 4: tokenize, detokenize, render (text and --ids), parse; exact outputs.
#   bash text_cli.sh DSV4_BIN SOURCE_DIR BINARY_DIR
set -euo pipefail
bin=$1 src=$2 build=$3
tok="$src/models/default/tokenizer.json"
work="$build/text_cli"
mkdir -p "$work"
pass=0 failed=0
check() {  # name expected actual
  if [ "$2" == "$3" ]; then pass=$((pass + 1)); else failed=$((failed + 1)); printf 'FAIL %s\n  want: %q\n  got:  %q\n' "$1" "$2" "$3"; fi
}

check tokenize '[63006,223,128803,305,223,128821,6366,128822,8033]' \
  "$("$bin" tokenize --tokenizer "$tok" --text 'Say <｜User｜> and <think>hi</think> please')"
printf 'a\tb  \n' > "$work/t.txt"
check tokenize-file "$("$bin" tokenize --tokenizer "$tok" --text $'a\tb  \n')" "$("$bin" tokenize --tokenizer "$tok" --text-file "$work/t.txt")"
check detokenize 'Say <｜User｜> and <think>hi</think> please' \
  "$("$bin" detokenize --tokenizer "$tok" --ids 63006,223,128803,305,223,128821,6366,128822,8033)"
"$bin" detokenize --tokenizer "$tok" --ids 53153,234 > "$work/emoji.txt"
check detokenize-exact-bytes '🎉' "$(cat "$work/emoji.txt")"
check detokenize-no-newline 4 "$(wc -c < "$work/emoji.txt" | tr -d ' ')"

req='{"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Hi"}],"thinking_mode":"chat","reasoning_effort":null,"drop_thinking":true}'
check render '<｜begin▁of▁sentence｜>You are a helpful assistant.<｜User｜>Hi<｜Assistant｜></think>' \
  "$("$bin" render --tokenizer "$tok" --request "$req")"
check render-ids '[0,3476,477,260,11502,22896,16,128803,23166,128804,128822]' \
  "$("$bin" render --tokenizer "$tok" --request "$req" --ids)"

# The four official fixtures through the CLI request form, byte for byte (files compared, trailing bytes included).
for n in 1 2 3 4; do
  mode=thinking; [ $n = 4 ] && mode=chat
  python3 - "$src/tests/data/chat/test_input_$n.json" "$mode" > "$work/req_$n.json" <<'PY'
import json, sys
data = json.load(open(sys.argv[1], encoding="utf-8"))
req = dict(data) if isinstance(data, dict) else {"messages": data}
req.update({"thinking_mode": sys.argv[2], "reasoning_effort": None, "drop_thinking": True})
print(json.dumps(req, ensure_ascii=False))
PY
  "$bin" render --tokenizer "$tok" --request "$work/req_$n.json" > "$work/out_$n.txt"
  if cmp -s "$work/out_$n.txt" "$src/tests/data/chat/test_output_$n.txt"; then pass=$((pass + 1)); else failed=$((failed + 1)); echo "FAIL render fixture $n"; fi
done

parsed=$("$bin" parse --mode thinking --text $'Need tool.</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="f">\n<｜DSML｜parameter name="a" string="true">x "q" <b></｜DSML｜parameter>\n<｜DSML｜parameter name="n" string="false">{"k": [1,2]}</｜DSML｜parameter>\n</｜DSML｜invoke>\n<｜DSML｜invoke name="g">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜>')
check parse-tools "$(python3 -c 'import json; print(json.dumps({"reasoning_content": "Need tool.", "content": "", "tool_calls": [{"name": "f", "arguments": "{\"a\": \"x \\\"q\\\" <b>\", \"n\": {\"k\": [1,2]}}"}, {"name": "g", "arguments": "{}"}]}, ensure_ascii=False))')" "$parsed"
check parse-args-are-json '{"a": "x \"q\" <b>", "n": {"k": [1, 2]}}' \
  "$(printf '%s' "$parsed" | python3 -c 'import json,sys; print(json.dumps(json.loads(json.load(sys.stdin)["tool_calls"][0]["arguments"])))')"
printf 'Hello there.<｜end▁of▁sentence｜>' > "$work/c.txt"
check parse-file '{"reasoning_content": "", "content": "Hello there.", "tool_calls": []}' "$("$bin" parse --mode chat --text-file "$work/c.txt")"

# Bad input: a clean error (exit 1 or 2), never a crash.
for cmd in "tokenize --tokenizer $work/missing.json --text x" "detokenize --tokenizer $tok --ids 1,x" \
           "detokenize --tokenizer $tok --ids 999999" "render --request {\"messages\":5}" "parse --mode fast --text x"; do
  set +e; $bin $cmd > /dev/null 2>&1; rc=$?; set -e
  if [ $rc = 1 ] || [ $rc = 2 ]; then pass=$((pass + 1)); else failed=$((failed + 1)); echo "FAIL bad input rc=$rc: $cmd"; fi
done

echo "$pass passed, $failed failed"
[ "$failed" = 0 ]
