#!/usr/bin/env bash
# Tokenizer parity vs Hugging Face `tokenizers` on a >= 5 MB corpus (encode, round trip, decode): 0 mismatches.
#   bash text_tokenizer_parity.sh DSV4_BIN SOURCE_DIR BINARY_DIR
set -euo pipefail
bin=$1 src=$2 build=$3
work="$build/text_parity"
python3 "$src/tools/text/parity.py" --dsv4 "$bin" --tokenizer "$src/models/default/tokenizer.json" --workdir "$work"
