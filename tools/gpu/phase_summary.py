#!/usr/bin/env python3
"""Medians of a phase-stamp binary's [phases] lines (kernels.cu, "Phase stamps").

Each line: `[phases] NAME tag TAG launch ID [t0 NS] marks N: d1 .. d11` -- microseconds from the kernel's mark 0
(entry) to marks 1..N of one launch, -1 where a mark was not reached; t0: mark 0 as %globaltimer nanoseconds. Prints,
per (kernel, tag), the launch count and the median of each mark, then the median gap between consecutive marks (where
the time goes); where the lines have t0, also a timeline of TIMELINE (default 40) consecutive launches from the middle
of the log: block 0's entry, release from its wait (mark 1) and last mark, in us from the first one's entry, and the
gap from the previous launch's last mark to this one's release (what the step spends between instrumented kernels).
Usage: tools/gpu/phase_summary.py phases.log [TIMELINE]
"""
import re
import statistics
import sys
from collections import defaultdict

LINE = re.compile(r"\[phases\] (\S+) tag (-?\d+) launch \d+ (?:t0 (\d+) )?marks (\d+): (.*)$")


def timeline(launches, count):
    launches.sort(key=lambda r: r[2])
    mid = max(0, len(launches) // 2 - count // 2)
    win = launches[mid:mid + count]
    if not win:
        return
    base = win[0][2]
    print(f"timeline of {len(win)} launches (us from the first one's entry): kernel tag | entry wait-done end | "
          "gap from the previous end to this wait-done")
    prev_end = None
    for name, tag, t0, vals in win:
        start = (t0 - base) * 1e-3
        done = [v for v in vals if v >= 0]
        wait = start + (vals[0] if vals and vals[0] >= 0 else 0.0)
        end = start + (max(done) if done else 0.0)
        gap = "-" if prev_end is None else f"{wait - prev_end:.2f}"
        print(f"  {name} {tag} | {start:.2f} {wait:.2f} {end:.2f} | {gap}")
        prev_end = end if prev_end is None else max(prev_end, end)


def main(path, count=40):
    runs = defaultdict(list)
    launches = []
    for line in open(path, errors="replace"):
        m = LINE.search(line)
        if not m:
            continue
        n = int(m.group(4))
        vals = [float(v) for v in m.group(5).split()][:n]
        runs[(m.group(1), int(m.group(2)))].append(vals)
        if m.group(3):
            launches.append((m.group(1), int(m.group(2)), int(m.group(3)), vals))
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
    timeline(launches, count)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 40))
