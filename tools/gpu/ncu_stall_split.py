"""Warp-stall reasons of one kernel, summed over its SASS lines, and the SASS lines with the most samples of one
reason: an `ncu --page source --print-source cuda,sass --csv` export (profile_prefill.sh SOURCE=1 writes one).
Usage: ncu_stall_split.py SOURCE.csv"""
import csv, collections, sys
rows=list(csv.reader(open(sys.argv[1])))
hdr=next(r for r in rows if 'Address' in r)
cols=[i for i,h in enumerate(hdr) if h.startswith('stall_') and 'Not Issued' not in h]
ai=hdr.index('Address')
tot=collections.Counter(); seen=set(); per=[]
for r in rows:
    if len(r)>max(cols) and r[ai].startswith('0x') and r[ai] not in seen:
        seen.add(r[ai])
        for i in cols:
            try: v=int(r[i])
            except: continue
            tot[hdr[i]]+=v
            per.append((v,hdr[i],r[ai][-5:],r[ai+1].strip()[:60]))
s=sum(tot.values())
for k,v in tot.most_common(): print(f"{k:24s} {v/s*100:5.1f}%")
print()
for v,k,a,ins in sorted(per,reverse=True)[:25]: print(f"{v/s*100:5.1f}% {k:20s} {a} {ins}")
