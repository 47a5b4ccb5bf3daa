#!/usr/bin/env python3
"""Tokenizer parity: dsv4 vs Hugging Face `tokenizers` (the reference) on the corpus of make_corpus.py.

Checks, all required to be exact (0 mismatches):
  1. encode: dsv4 ids == HF encode(doc, add_special_tokens=False).ids for every document;
  2. round trip: dsv4 decode(dsv4 encode(doc)) == doc;
  3. decode: dsv4 decode(ids) == HF decode(ids, skip_special_tokens=False) on random id sequences (including
     sequences that cut UTF-8 characters, so the U+FFFD replacement rules are compared too).
    python3 tools/text/parity.py --dsv4 BUILD/dsv4 --tokenizer models/default/tokenizer.json --workdir DIR
"""
import argparse
import json
import os
import random
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_corpus  # noqa: E402

from tokenizers import Tokenizer  # noqa: E402


def run_dsv4(args):
    r = subprocess.run(args, capture_output=True)
    if r.returncode != 0:
        sys.exit("dsv4 failed (%d): %s" % (r.returncode, r.stderr.decode("utf-8", "replace")))
    # split on "\n" only: decoded strings may hold U+2028 etc., which str.splitlines() would also cut at
    return [json.loads(line) for line in r.stdout.decode("utf-8").split("\n") if line]


def write_jsonl(path, items):
    with open(path, "w", encoding="utf-8") as f:
        for x in items:
            f.write(json.dumps(x, ensure_ascii=False) + "\n")


def first_diff(a, b):
    for k, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return k
    return min(len(a), len(b))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsv4", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--mb", type=float, default=6.0)
    ap.add_argument("--decode-sequences", type=int, default=20000)
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)

    docs, parts = make_corpus.build(a.seed, a.mb)
    corpus_bytes = sum(len(d.encode("utf-8")) for d in docs)
    docs_path = os.path.join(a.workdir, "corpus.jsonl")
    write_jsonl(docs_path, docs)

    hf = Tokenizer.from_file(a.tokenizer)
    t0 = time.time()
    ref = [e.ids for e in hf.encode_batch(docs, add_special_tokens=False)]
    t_hf = time.time() - t0
    t0 = time.time()
    got = run_dsv4([a.dsv4, "tokenize", "--tokenizer", a.tokenizer, "--jsonl", docs_path])
    t_dsv4 = time.time() - t0
    if len(got) != len(docs):
        sys.exit("dsv4 returned %d id lists for %d documents" % (len(got), len(docs)))

    encode_mismatch = 0
    for k, (r, g) in enumerate(zip(ref, got)):
        if r != g:
            encode_mismatch += 1
            if encode_mismatch <= 5:
                d = first_diff(r, g)
                print("ENCODE MISMATCH doc %d at token %d: hf %s dsv4 %s\n  text: %r" %
                      (k, d, r[max(0, d - 3):d + 5], g[max(0, d - 3):d + 5], docs[k][:300]))

    ids_path = os.path.join(a.workdir, "ids.jsonl")
    write_jsonl(ids_path, got)
    back = run_dsv4([a.dsv4, "detokenize", "--tokenizer", a.tokenizer, "--jsonl", ids_path])
    roundtrip_mismatch = sum(1 for d, b in zip(docs, back) if d != b)
    for k, (d, b) in enumerate(zip(docs, back)):
        if d != b and roundtrip_mismatch <= 5:
            print("ROUNDTRIP MISMATCH doc %d: %r vs %r" % (k, d[:200], b[:200]))

    rng = random.Random(a.seed)
    vocab = hf.get_vocab_size(with_added_tokens=True)
    seqs = []
    for _ in range(a.decode_sequences):
        n = rng.randint(1, 12)
        # Mostly byte tokens and low ids (partial UTF-8 sequences are common there), some anywhere incl. added.
        seqs.append([rng.randint(3, 258) if rng.random() < 0.5 else rng.randint(0, vocab - 1) for _ in range(n)])
    seq_path = os.path.join(a.workdir, "decode_ids.jsonl")
    write_jsonl(seq_path, seqs)
    dec = run_dsv4([a.dsv4, "detokenize", "--tokenizer", a.tokenizer, "--jsonl", seq_path])
    decode_mismatch = 0
    for s, d in zip(seqs, dec):
        r = hf.decode(s, skip_special_tokens=False)
        if r != d:
            decode_mismatch += 1
            if decode_mismatch <= 5:
                print("DECODE MISMATCH ids %s: hf %r dsv4 %r" % (s, r, d))

    tokens = sum(len(r) for r in ref)
    summary = {"documents": len(docs), "corpus_bytes": corpus_bytes, "tokens": tokens, "parts": parts,
               "encode_mismatches": encode_mismatch, "roundtrip_mismatches": roundtrip_mismatch,
               "decode_sequences": len(seqs), "decode_mismatches": decode_mismatch,
               "hf_encode_batch_s": round(t_hf, 3), "dsv4_cli_s": round(t_dsv4, 3)}
    print(json.dumps(summary))
    ok = encode_mismatch == 0 and roundtrip_mismatch == 0 and decode_mismatch == 0 and corpus_bytes >= 5_000_000
    print("PARITY OK" if ok else "PARITY FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
