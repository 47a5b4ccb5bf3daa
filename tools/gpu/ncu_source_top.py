"""The source lines with the most stall samples in an `ncu --page source --csv` export (columns vary by ncu version:
the sampling column is picked by name). Usage: ncu_source_top.py SOURCE.csv [N]."""
import csv
import sys

rows = list(csv.reader(l for l in open(sys.argv[1]) if not l.startswith("==")))
if not rows:
    sys.exit("empty source page")
hdr = rows[0]
col = next((i for i, h in enumerate(hdr) if "Sampling" in h and "All" in h), None) or next(
    (i for i, h in enumerate(hdr) if "Sampl" in h), None)
print("columns:", hdr[:12])
if col is None:
    sys.exit("no sampling column")


def val(r):
    try:
        return float(r[col].replace(",", ""))
    except Exception:
        return 0.0


body = [r for r in rows[1:] if len(r) > col]
tot = sum(val(r) for r in body) or 1.0
for r in sorted(body, key=val, reverse=True)[:int(sys.argv[2]) if len(sys.argv) > 2 else 40]:
    print(f"{100 * val(r) / tot:5.1f}%  " + " | ".join(c[:110] for c in r[:3]))
