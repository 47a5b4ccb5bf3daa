#!/usr/bin/env python3
"""Summarises `ncu --csv --metrics gpu__time_duration.sum` output: GPU time per kernel (grouped by name, in order of
first appearance), counts, the total, and the decode step time the bench measured (argv[2], its log), so the share
of the step spent inside kernels is visible. Used by tools/gpu/profile_decode.sh."""
import csv
import re
import sys


def main() -> int:
    rows = []
    with open(sys.argv[1], newline="") as f:
        lines = [ln for ln in f if ln.startswith('"')]  # ncu prefixes its own log lines with ==PROF==
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = r.get("Metric Unit", "nsecond")
        v = float(r["Metric Value"].replace(",", ""))
        scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6}.get(unit, 1e-3)
        name = re.sub(r"\(.*", "", r.get("Kernel Name", "?"))
        rows.append((name, v * scale))
    if not rows:
        print("no kernels profiled (is ncu allowed to profile here? see ncu.csv)")
        return 1
    order, agg = [], {}
    for name, us in rows:
        if name not in agg:
            order.append(name)
            agg[name] = [0, 0.0]
        agg[name][0] += 1
        agg[name][1] += us
    total = sum(us for _, us in rows)
    print(f"{len(rows)} kernels, {total:.1f} us of kernel time (each kernel alone, as ncu serialises them)")
    for name in sorted(order, key=lambda n: -agg[n][1]):
        c, us = agg[name]
        print(f"  {us:9.1f} us  {100 * us / total:5.1f}%  x{c:<4d} {us / c:7.2f} us each  {name[:90]}")
    if len(sys.argv) > 2:
        m = None
        with open(sys.argv[2]) as f:
            for ln in f:
                m = re.search(r"decode step without head: median ([0-9.]+) us", ln) or m
        if m:
            step = float(m.group(1))
            print(f"bench graph step (no head): {step:.1f} us -> kernels alone are {100 * total / step:.0f}% of it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
