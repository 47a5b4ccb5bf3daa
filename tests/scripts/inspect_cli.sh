#!/usr/bin/env bash
# `dsv4 inspect` on checkpoints written in every format, and its refusal of broken ones (exit 1-2, one clear
# message, never a signal). Args: DSV4_BIN SOURCE_DIR BINARY_DIR.
set -u
bin="$1"; src="$2"; tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fails=0
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }

for f in bf16 fp8 base nvfp4; do
  "$bin" make-tiny --out "$tmp/$f" --vocab 512 --format "$f" >/dev/null || { bad "make-tiny $f"; continue; }
  out=$("$bin" inspect "$tmp/$f" 2>&1); rc=$?
  [ $rc -eq 0 ] || { bad "inspect $f exit $rc: $out"; continue; }
  for want in "layer schedule" "CSA ratio 4" "HCA ratio 16" "hash routing" "score routing" "total tensor bytes" \
              "estimated GPU memory"; do
    grep -q "$want" <<<"$out" || bad "inspect $f: missing '$want'"
  done
  case $f in
    fp8) grep -q "MXFP4" <<<"$out" && grep -q "FP8(128x128 E8M0)" <<<"$out" || bad "fp8 formats not reported" ;;
    base) grep -q "FP8(128x128 F32)" <<<"$out" || bad "base F32 scales not reported" ;;
    nvfp4) grep -q "NVFP4" <<<"$out" || bad "nvfp4 not reported" ;;
    bf16) grep -q "linear BF16" <<<"$out" || bad "bf16 not reported" ;;
  esac
  ok "inspect $f"
done
# Golden fixtures (official FP8/FP4, Pro schedule, Base, NVFP4, HF layout) must inspect cleanly too.
for d in "$src"/tests/fixtures/*/; do
  [ -f "$d/config.json" ] || continue
  "$bin" inspect "$d" >/dev/null 2>"$tmp/err" || bad "inspect fixture $d: $(cat "$tmp/err")"
done

expect_refusal() {  # name dir pattern
  local out rc
  out=$("$bin" inspect "$2" 2>&1 >/dev/null); rc=$?
  if [ $rc -ge 1 ] && [ $rc -le 2 ] && grep -q "$3" <<<"$out"; then ok "refuses $1 (exit $rc): $(head -c 160 <<<"$out" | head -1)"
  else bad "$1: exit $rc, stderr: $out"; fi
}

# Truncated file.
cp -r "$tmp/fp8" "$tmp/trunc"; truncate -s -100 "$tmp/trunc/model.safetensors"
expect_refusal "a truncated file" "$tmp/trunc" "model.safetensors"
# Overlapping offsets: rewrite the header so the second tensor starts inside the first.
cp -r "$tmp/bf16" "$tmp/overlap"
python3 - "$tmp/overlap/model.safetensors" <<'PY'
import json, struct, sys
p = sys.argv[1]; b = open(p, 'rb').read(); n = struct.unpack('<Q', b[:8])[0]
h = json.loads(b[8:8 + n]); names = sorted((k for k in h if k != '__metadata__'), key=lambda k: h[k]['data_offsets'][0])
a, c = h[names[0]], h[names[1]]
size = c['data_offsets'][1] - c['data_offsets'][0]
c['data_offsets'] = [a['data_offsets'][0] + 2, a['data_offsets'][0] + 2 + size]
s = json.dumps(h).encode(); s += b' ' * ((8 - len(s) % 8) % 8)
open(p, 'wb').write(struct.pack('<Q', len(s)) + s + b[8 + n:])
PY
expect_refusal "overlapping offsets" "$tmp/overlap" "overlap"
# Wrong-shape tensor: declare wq_a with swapped dims (same byte size, so only the model inventory can catch it).
cp -r "$tmp/bf16" "$tmp/shape"
python3 - "$tmp/shape/model.safetensors" <<'PY'
import json, struct, sys
p = sys.argv[1]; b = open(p, 'rb').read(); n = struct.unpack('<Q', b[:8])[0]
h = json.loads(b[8:8 + n]); t = h['layers.0.attn.wq_b.weight']; t['shape'] = t['shape'][::-1]
s = json.dumps(h).encode(); s += b' ' * ((8 - len(s) % 8) % 8)
open(p, 'wb').write(struct.pack('<Q', len(s)) + s + b[8 + n:])
PY
expect_refusal "a wrong-shape tensor" "$tmp/shape" "layers.0.attn.wq_b.weight has shape"
# Missing tensor and a config whose compress_ratios has the wrong length.
cp -r "$tmp/bf16" "$tmp/cfg"
python3 - "$tmp/cfg/config.json" <<'PY'
import json, sys
p = sys.argv[1]; c = json.load(open(p)); c['compress_ratios'] = c['compress_ratios'][:-1]; json.dump(c, open(p, 'w'))
PY
expect_refusal "compress_ratios of length L" "$tmp/cfg" "compress_ratios"
expect_refusal "a missing directory" "$tmp/nonexistent" "nonexistent"

"$bin" --version | grep -q "CUDA backend" || bad "--version does not report the CUDA backend"
[ $fails -eq 0 ] && echo "all inspect checks passed" || { echo "$fails failure(s)"; exit 1; }
