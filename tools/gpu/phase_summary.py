#!/usr/bin/env python3
"""Medians of a phase-stamp binary's [phases] lines (kernels.cu, "Phase stamps").

Each line: `[phases] NAME tag TAG launch ID marks N: d1 .. d11` -- microseconds from the kernel's mark 0 (entry) to
marks 1..N of one launch, -1 where a mark was not reached. Prints, per (kernel, tag), the launch count and the median
of each mark, then the median gap between consecutive marks (where the time goes).
Usage: tools/gpu/phase_summary.py phases.log
"""
import re
import statistics
import sys
from collections import defaultdict

LINE = re.compile(r"\[phases\] (\S+) tag (-?\d+) launch \d+ marks (\d+): (.*)$")


def main(path):
    runs = defaultdict(list)
    for line in open(path, errors="replace"):
        m = LINE.search(line)
        if not m:
            continue
        n = int(m.group(3))
        vals = [float(v) for v in m.group(4).split()][:n]
        runs[(m.group(1), int(m.group(2)))].append(vals)
    if not runs:
        print("no [phases] lines (not a phase-stamp binary, or too few launches)")
        return 1
    print("kernel tag launches | median us from entry to marks 1.. | median gaps between marks")
    for (name, tag), rs in sorted(runs.items()):
        n = max(len(r) for r in rs)
        med = []
        for i in range(n):
            xs = [r[i] for r in rs if i < len(r) and r[i] >= 0]
            med.append(statistics.median(xs) if xs else None)
        cum = " ".join("-" if v is None else f"{v:.2f}" for v in med)
        prev, gaps = 0.0, []
        for v in med:
            gaps.append("-" if v is None else f"{v - prev:.2f}")
            if v is not None:
                prev = v
        print(f"{name} {tag} {len(rs)} | {cum} | {' '.join(gaps)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
