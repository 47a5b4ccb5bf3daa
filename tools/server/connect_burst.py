#!/usr/bin/env python3
"""Connection burst against a busy `dsv4 serve` (issue 7: no hangs when many agents connect at once).

Keeps the server decoding (8 long completions), then opens N connections at the same instant, each sending GET
/health. Checks that the kernel dropped no connection request (TcpExt ListenOverflows/ListenDrops in
/proc/net/netstat did not move; with httplib's default listen backlog of 5 they did, and each dropped client waited
1-3 s for its SYN retry) and that every request got 200. Prints the latencies. Usage: connect_burst.py URL [N]
"""
import json
import socket
import sys
import threading
import time
import urllib.request
from urllib.parse import urlparse


def listen_drops():
    try:
        lines = open("/proc/net/netstat").read().splitlines()
    except OSError:
        return None
    for h, v in zip(lines[::2], lines[1::2]):
        if h.startswith("TcpExt:"):
            d = dict(zip(h.split()[1:], map(int, v.split()[1:])))
            return d.get("ListenOverflows", 0) + d.get("ListenDrops", 0)
    return None


def main():
    url = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 128
    u = urlparse(url)
    host, port = u.hostname, u.port

    def busy():
        body = json.dumps({"prompt": "hello world " * 20, "max_tokens": 200, "temperature": 0}).encode()
        req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=300).read()

    bg = [threading.Thread(target=busy) for _ in range(8)]
    for t in bg:
        t.start()
    time.sleep(1.0)  # decoding is under way

    lat = [None] * n
    status = [None] * n
    go = threading.Event()

    def one(i):
        go.wait()
        t0 = time.time()
        try:
            s = socket.create_connection((host, port), timeout=30)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            data = b""
            while True:
                b = s.recv(4096)
                if not b:
                    break
                data += b
            s.close()
            status[i] = data.split(b"\r\n", 1)[0].decode(errors="replace")
        except OSError as e:
            status[i] = f"error: {e}"
        lat[i] = time.time() - t0

    ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    time.sleep(0.2)
    before = listen_drops()
    go.set()
    for t in ts:
        t.join()
    after = listen_drops()
    for t in bg:
        t.join()

    lat.sort()
    slow = sum(x > 0.9 for x in lat)
    print(f"{n} simultaneous connections to a busy server: median {lat[n // 2] * 1000:.0f} ms, "
          f"max {lat[-1] * 1000:.0f} ms, {slow} over 0.9 s; listen-queue drops "
          f"{'n/a' if before is None else after - before}")
    fails = 0
    bad = [s for s in status if " 200 " not in (s + " ")]
    if bad:
        print(f"FAIL: {len(bad)} requests without 200, e.g. {bad[0]}")
        fails += 1
    if before is not None and after - before > 0:
        print(f"FAIL: the kernel dropped {after - before} connection requests (listen backlog overflow)")
        fails += 1
    if before is None and slow:  # no counters: a dropped SYN shows as a >= 1 s retry
        print(f"FAIL: {slow} connections took over 0.9 s (SYN retry after a listen backlog overflow)")
        fails += 1
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
