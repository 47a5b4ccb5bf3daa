#!/usr/bin/env python3
"""Summarises `ncu --csv` output of tools/gpu/profile_decode.sh: per kernel name (in order of GPU time), the count,
GPU time (each launch alone, as ncu serialises them), DRAM bytes read and the resulting bandwidth, grid and block
size, registers per thread, achieved occupancy and local-memory (spill) load sectors when those metrics were
collected; then the total next to the decode step time the bench measured (argv[2], its log), so the share of the
step spent inside kernels is visible."""
import csv
import re
import sys

TIME = "gpu__time_duration.sum"
SCALE_US = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6}
SCALE_B = {"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9}


def num(v: str) -> float:
    try:
        return float(v.replace(",", ""))
    except ValueError:
        return float("nan")


def main() -> int:
    launches = {}  # ID -> {"name": str, metric: value}
    with open(sys.argv[1], newline="") as f:
        lines = [ln for ln in f if ln.startswith('"')]  # ncu prefixes its own log lines with ==PROF==
    for r in csv.DictReader(lines):
        key = r.get("ID", "?")
        d = launches.setdefault(key, {"name": re.sub(r"\(.*", "", r.get("Kernel Name", "?"))})
        m, unit, v = r.get("Metric Name"), r.get("Metric Unit", ""), num(r.get("Metric Value", "nan"))
        if m == TIME:
            v *= SCALE_US.get(unit, 1e-3)
        elif m == "dram__bytes_read.sum":
            v *= SCALE_B.get(unit, 1.0)
        d[m] = v
    rows = [d for d in launches.values() if TIME in d]
    if not rows:
        print("no kernels profiled (is ncu allowed to profile here? see ncu.csv)")
        return 1
    order, agg = [], {}
    for d in rows:
        a = agg.get(d["name"])
        if a is None:
            order.append(d["name"])
            a = agg[d["name"]] = {"n": 0, "us": 0.0, "bytes": 0.0, "first": d}
        a["n"] += 1
        a["us"] += d[TIME]
        a["bytes"] += d.get("dram__bytes_read.sum", 0.0)
    total = sum(d[TIME] for d in rows)
    print(f"{len(rows)} kernels, {total:.1f} us of kernel time (each kernel alone, as ncu serialises them)")
    print(f"  {'us':>8} {'share':>6} {'count':>5} {'us each':>8} {'MB each':>8} {'GB/s':>6} {'grid':>6} {'blk':>4} {'regs':>4} {'occ%':>5} {'spill':>6}  kernel")
    for name in sorted(order, key=lambda n: -agg[n]["us"]):
        a = agg[name]
        f = a["first"]
        gbs = a["bytes"] / (a["us"] * 1e-6) / 1e9 if a["us"] > 0 else 0.0

        def g(m, fmt="{:.0f}"):
            v = f.get(m)
            return fmt.format(v) if v is not None and v == v else "-"
        print(f"  {a['us']:8.1f} {100 * a['us'] / total:5.1f}% {a['n']:5d} {a['us'] / a['n']:8.2f} "
              f"{a['bytes'] / a['n'] / 1e6:8.2f} {gbs:6.0f} {g('launch__grid_size'):>6} {g('launch__block_size'):>4} "
              f"{g('launch__registers_per_thread'):>4} {g('sm__warps_active.avg.pct_of_peak_sustained_active'):>5} "
              f"{g('l1tex__t_sectors_pipe_lsu_mem_local_op_ld.sum'):>6}  {name[:80]}")
    # Any other metrics collected (profile_decode.sh EXTRA_METRICS): one line per kernel, first launch's values.
    base = {TIME, "dram__bytes_read.sum", "launch__grid_size", "launch__block_size", "launch__registers_per_thread",
            "sm__warps_active.avg.pct_of_peak_sustained_active", "l1tex__t_sectors_pipe_lsu_mem_local_op_ld.sum", "name"}
    extra = sorted({k for d in rows for k in d} - base)
    if extra:
        print("other metrics (first launch of each kernel):")
        for name in sorted(order, key=lambda n: -agg[n]["us"]):
            f = agg[name]["first"]
            vals = "  ".join(f"{k}={f[k]:.4g}" for k in extra if k in f)
            print(f"  {name[:60]}: {vals}")
    if len(sys.argv) > 2:
        m = None
        with open(sys.argv[2]) as f:
            for ln in f:
                m = re.search(r"decode step without head: median ([0-9.]+) us", ln) or m
        if m:
            step = float(m.group(1))
            print(f"bench graph step (no head, timed outside ncu): {step:.1f} us; kernels alone sum to {total:.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
