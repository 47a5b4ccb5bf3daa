#!/usr/bin/env bash
# Tokenizer speed vs Hugging Face `tokenizers` (single thread, same corpus, one run); fails unless dsv4 is faster.
# CI uses a 2 MB slice and 1 pass to stay quick; docs/BENCHMARKS.md records the full 6 MB, 3-pass numbers.
#   bash text_tokenizer_bench.sh DSV4_BIN SOURCE_DIR BINARY_DIR
set -euo pipefail
bin=$1 src=$2
python3 "$src/tools/text/bench_tokenizer.py" --dsv4 "$bin" --tokenizer "$src/models/default/tokenizer.json" \
  --mb 2 --repeat 1
