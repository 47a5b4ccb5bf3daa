#!/usr/bin/env python3
"""Aggregate decode throughput of a running `dsv4 serve` with C concurrent clients (docs/BENCHMARKS.md).

usage: bench_concurrency.py BASE_URL [CLIENTS...]   e.g. bench_concurrency.py http://127.0.0.1:8000 1 4
Each client sends 4 chat requests (max_tokens 32, distinct prompts and seeds); prints completion tok/s over the wall.
"""
import sys
import threading
import time

import openai

base, counts = sys.argv[1], [int(c) for c in sys.argv[2:]] or [1, 4]


def run(clients):
    toks, lock = [0], threading.Lock()

    def worker(ci):
        cl = openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0, timeout=600)
        for k in range(4):
            r = cl.chat.completions.create(model=cl.models.list().data[0].id, max_tokens=32, seed=ci * 10 + k,
                                           messages=[{"role": "user", "content": f"Client {ci} request {k}"}])
            with lock:
                toks[0] += r.usage.completion_tokens

    t = time.time()
    ts = [threading.Thread(target=worker, args=(c,)) for c in range(clients)]
    [x.start() for x in ts]
    [x.join() for x in ts]
    wall = time.time() - t
    print(f"clients={clients} requests={4 * clients} completion_tokens={toks[0]} wall={wall:.2f}s "
          f"aggregate={toks[0] / wall:.1f} tok/s", flush=True)


for c in counts:
    run(c)
