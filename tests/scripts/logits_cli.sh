#!/usr/bin/env bash
# The `dsv4 logits` contract (issue 3): golden agreement through the CLI for chunk whole/1/7 on one fixture, and
# clear refusals (exit 1-2) for bad ids and missing files. Args: DSV4_BIN SOURCE_DIR BINARY_DIR.
set -u
bin="$1"; src="$2"; tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fx="$src/tests/fixtures/flash_fp8"; fails=0
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }
for chunk in "" 1 7; do
  args=(); [ -n "$chunk" ] && args=(--chunk "$chunk")
  "$bin" logits --model "$fx" --ids "$fx/ids.bin" --out "$tmp/out.bin" "${args[@]}" || { bad "logits chunk '$chunk'"; continue; }
  python3 - "$fx/logits.bin" "$tmp/out.bin" "chunk=${chunk:-whole}" <<'PY' || fails=$((fails + 1))
import array, sys
g = array.array('f'); g.frombytes(open(sys.argv[1], 'rb').read())
o = array.array('f'); o.frombytes(open(sys.argv[2], 'rb').read())
assert len(g) == len(o), (len(g), len(o))
err = max(abs(a - b) for a, b in zip(g, o)); tol = 1e-4 * max(abs(a) for a in g)
print(f"{sys.argv[3]}: max|diff| {err:.3g} (tol {tol:.3g})")
sys.exit(0 if err <= tol else 1)
PY
done
refuse() {  # description, expected stderr pattern, command...
  local d="$1" pat="$2"; shift 2
  out=$("$@" 2>&1 >/dev/null); rc=$?
  if [ $rc -ge 1 ] && [ $rc -le 2 ] && grep -q "$pat" <<<"$out"; then echo "ok: refuses $d (exit $rc)"; else bad "$d: exit $rc: $out"; fi
}
python3 -c "import struct,sys; open(sys.argv[1],'wb').write(struct.pack('<3i', 5, 99999, 7))" "$tmp/bad_ids.bin"
refuse "an id >= vocab" "outside the vocabulary" "$bin" logits --model "$fx" --ids "$tmp/bad_ids.bin" --out "$tmp/o.bin"
python3 -c "import struct,sys; open(sys.argv[1],'wb').write(struct.pack('<2i', 5, -3))" "$tmp/neg_ids.bin"
refuse "a negative id" "outside the vocabulary" "$bin" logits --model "$fx" --ids "$tmp/neg_ids.bin" --out "$tmp/o.bin"
printf 'abc' > "$tmp/odd.bin"
refuse "an ids file of 3 bytes" "int32" "$bin" logits --model "$fx" --ids "$tmp/odd.bin" --out "$tmp/o.bin"
refuse "a missing ids file" "cannot open" "$bin" logits --model "$fx" --ids "$tmp/none.bin" --out "$tmp/o.bin"
refuse "a missing model" "cannot open" "$bin" logits --model "$tmp/nomodel" --ids "$fx/ids.bin" --out "$tmp/o.bin"
refuse "an unknown backend" "backend" "$bin" logits --model "$fx" --ids "$fx/ids.bin" --out "$tmp/o.bin" --backend tpu
[ $fails -eq 0 ] && echo "all logits CLI checks passed" || { echo "$fails failure(s)"; exit 1; }
