#!/usr/bin/env bash
# Why a decode kernel is slow: Nsight Compute's warp-state (stall reasons), scheduler, occupancy and memory sections
# for one launch of each kernel matching KERNELS (a regex; default: the mHC, norm/RoPE, ring GEMV and expert kernels),
# from one replayed decode step of the synthetic Flash bench, plus the per-line source view (stall samples) of the
# first match of SOURCE_KERNEL. Usage: tools/gpu/ncu_stalls.sh [DSV4_BIN]; output in $OUT (default build-gpu/stalls).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${1:-$ROOT/build-cuda/dsv4}
OUT=${OUT:-$ROOT/build-gpu/stalls}
KERNELS=${KERNELS:-hc_finish|norm_rope|gemv_ring|expert_ring|hc_post}
SOURCE_KERNEL=${SOURCE_KERNEL:-hc_finish}
mkdir -p "$OUT"
NCU=${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}
ARGS=(bench --synthetic flash --layers 4 --context 8192 --prompt 256 --steps 20 --profile-steps 1)
"$NCU" --profile-from-start off --clock-control none -k "regex:$KERNELS" --launch-count 12 \
  --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
  --section SpeedOfLight -o "$OUT/stalls" -f "$BIN" "${ARGS[@]}" > "$OUT/bench.log" 2>&1
"$NCU" --import "$OUT/stalls.ncu-rep" --print-summary none > "$OUT/sections.txt" 2>&1
"$NCU" --profile-from-start off --clock-control none -k "regex:$SOURCE_KERNEL" --launch-count 1 --section SourceCounters \
  --section WarpStateStats -o "$OUT/source" -f "$BIN" "${ARGS[@]}" > "$OUT/bench_source.log" 2>&1
"$NCU" --import "$OUT/source.ncu-rep" --page source --print-source cuda,sass --csv > "$OUT/source.csv" 2>&1
# The source lines with the most stall samples (columns vary by ncu version: pick the sampling column by name).
python3 - "$OUT/source.csv" > "$OUT/source_top.txt" 2>&1 <<'PY'
import csv, sys
rows = list(csv.reader(l for l in open(sys.argv[1]) if not l.startswith("==")))
if not rows:
    sys.exit("empty source page")
hdr = rows[0]
col = next((i for i, h in enumerate(hdr) if "Sampling" in h and "All" in h), None) or next((i for i, h in enumerate(hdr) if "Sampl" in h), None)
print("columns:", hdr[:12])
if col is None:
    sys.exit("no sampling column")
def val(r):
    try: return float(r[col].replace(",", ""))
    except Exception: return 0.0
body = [r for r in rows[1:] if len(r) > col]
tot = sum(val(r) for r in body) or 1.0
for r in sorted(body, key=val, reverse=True)[:40]:
    print(f"{100 * val(r) / tot:5.1f}%  " + " | ".join(c[:110] for c in r[:3]))
PY
grep -E "^  [a-z_]+.*\(|Stall|stall|Warp Cycles|Issued|Eligible|Achieved Occupancy|Duration|DRAM Throughput|Memory Throughput|Registers|Block Size|Grid Size|Dynamic Shared" "$OUT/sections.txt" | head -400 > "$OUT/sections_brief.txt"
echo "done: $OUT"
