#!/usr/bin/env python3
"""Tokenizer speed: dsv4 vs Hugging Face `tokenizers`, single thread, same corpus, one run.

Both sides encode every document of the make_corpus.py corpus one call at a time, `--repeat` times; the best pass
is reported (the first pass, with cold caches, is reported too). Loading the tokenizer is excluded for both.
HF is measured two ways — a Python loop over encode() and encode_batch() pinned to one thread
(RAYON_NUM_THREADS=1) — and the ratio uses the faster of the two, so Python call overhead cannot flatter dsv4.
    python3 tools/text/bench_tokenizer.py --dsv4 BUILD/dsv4 --tokenizer models/default/tokenizer.json
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

os.environ["RAYON_NUM_THREADS"] = "1"  # must be set before tokenizers starts its thread pool
os.environ["TOKENIZERS_PARALLELISM"] = "false"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_corpus  # noqa: E402

from tokenizers import Tokenizer  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsv4", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--mb", type=float, default=6.0)
    a = ap.parse_args()
    docs, _ = make_corpus.build(a.seed, a.mb)
    nbytes = sum(len(d.encode("utf-8")) for d in docs)

    hf = Tokenizer.from_file(a.tokenizer)
    loop, batch = [], []
    for _ in range(a.repeat):
        t0 = time.perf_counter()
        n_tokens = 0
        for d in docs:
            n_tokens += len(hf.encode(d, add_special_tokens=False).ids)
        loop.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        hf.encode_batch(docs, add_special_tokens=False)
        batch.append(time.perf_counter() - t0)

    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", encoding="utf-8", delete=False) as f:
        for d in docs:
            f.write(json.dumps(d, ensure_ascii=False) + "\n")
        path = f.name
    try:
        r = subprocess.run([a.dsv4, "tokenize", "--tokenizer", a.tokenizer, "--jsonl", path, "--bench", "--repeat",
                            str(a.repeat)], capture_output=True, check=True)
    finally:
        os.unlink(path)
    ds = json.loads(r.stdout)
    if ds["tokens"] != n_tokens:
        sys.exit("token counts differ: dsv4 %d, hf %d" % (ds["tokens"], n_tokens))
    hf_best = min(min(loop), min(batch))
    report = {
        "documents": len(docs), "bytes": nbytes, "tokens": n_tokens, "repeat": a.repeat,
        "hf_encode_loop_best_s": round(min(loop), 3), "hf_encode_loop_first_s": round(loop[0], 3),
        "hf_encode_batch_1thread_best_s": round(min(batch), 3),
        "dsv4_best_s": round(ds["best_seconds"], 3), "dsv4_first_s": round(ds["first_seconds"], 3),
        "hf_mb_per_s": round(nbytes / hf_best / 1e6, 2), "dsv4_mb_per_s": round(nbytes / ds["best_seconds"] / 1e6, 2),
        "speedup_vs_hf": round(hf_best / ds["best_seconds"], 2),
        "speedup_vs_hf_first_pass": round(min(loop[0], batch[0]) / ds["first_seconds"], 2),
    }
    print(json.dumps(report, indent=1))
    if report["speedup_vs_hf"] <= 1.0:
        print("dsv4 is not faster than HF tokenizers", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
