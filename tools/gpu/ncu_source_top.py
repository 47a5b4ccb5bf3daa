"""The source lines with the most stall samples in an `ncu --page source --csv` export. Columns vary by ncu version
(the sampling column is picked by name), and a kernel whose code spans several files (headers included) gives one
table per file, each after a "File Path" row: every row naming a sampling column starts a table.
Usage: ncu_source_top.py SOURCE.csv [N]."""
import csv
import sys

rows = list(csv.reader(l for l in open(sys.argv[1]) if not l.startswith("==")))
if not rows:
    sys.exit("empty source page")


def sampling_col(r):
    col = next((i for i, h in enumerate(r) if "Sampling" in h and "All" in h), None)
    return col if col is not None else next((i for i, h in enumerate(r) if "Sampl" in h), None)


def val(r, col):
    try:
        return float(r[col].replace(",", ""))
    except Exception:
        return 0.0


body, hdr, col, path = [], None, None, ""
for r in rows:
    if len(r) >= 2 and r[0] == "File Path":
        path = r[1]
        continue
    c = sampling_col(r)
    if c is not None:
        hdr, col = r, c
        continue
    if col is not None and len(r) > col:
        body.append((val(r, col), path, r))
if hdr is None:
    sys.exit("no sampling column in " + sys.argv[1])
print("columns:", hdr[:12])
tot = sum(v for v, _, _ in body) or 1.0
for v, p, r in sorted(body, key=lambda x: x[0], reverse=True)[:int(sys.argv[2]) if len(sys.argv) > 2 else 40]:
    print(f"{100 * v / tot:5.1f}%  {p.split('/')[-1]}  " + " | ".join(c[:110] for c in r[:3]))
