#!/usr/bin/env python3
"""Summarise an ncu per-SASS source page (`ncu -i R.ncu-rep --page source --csv --print-source sass`,
optionally gzipped): stall samples per reason over the kernel, over the code between the first and
last of a marker opcode (default F2FP: X = 6's converting warps), and the instructions with the
most samples with their main reasons. Usage: stall_summary.py FILE.csv[.gz] [MARKER] [TOP]"""
import csv, gzip, sys, collections

path = sys.argv[1]
marker = sys.argv[2] if len(sys.argv) > 2 else "F2FP"
top = int(sys.argv[3]) if len(sys.argv) > 3 else 30
f = gzip.open(path, "rt") if path.endswith(".gz") else open(path)
rows = list(csv.reader(f))
hi = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
head = rows[hi]
col = {n: i for i, n in enumerate(head)}
reasons = [n for n in head if n.startswith("stall_") and "(Not Issued)" not in n]
insts = []
for r in rows[hi + 1:]:
    if len(r) < len(head) or not r[0].startswith("0x"):
        continue
    s = {n: int(float(r[col[n]] or 0)) for n in reasons}
    insts.append((int(r[0], 16), r[col["Source"]].strip(), int(float(r[col["# Samples"]] or 0)), s,
                  int(float(r[col["Instructions Executed"]] or 0))))
base = insts[0][0] if insts else 0
total = sum(i[2] for i in insts)

def show(title, sel):
    agg = collections.Counter()
    for i in sel:
        agg.update(i[3])
    n = sum(i[2] for i in sel)
    print(f"{title}: {n} samples ({100.0 * n / max(total, 1):.1f} % of {total}), executed {sum(i[4] for i in sel)} warp instructions")
    for k, v in agg.most_common(8):
        if v:
            print(f"   {k[6:]:<18} {v:>8} ({100.0 * v / max(n, 1):.1f} %)")

show("kernel", insts)
m = [k for k, i in enumerate(insts) if marker in i[1]]
if m:
    lo, hi_ = m[0], m[-1]
    # extend to the enclosing loop: up to the nearest branch after the last marker
    while hi_ + 1 < len(insts) and "BRA" not in insts[hi_][1]:
        hi_ += 1
    region = insts[lo:hi_ + 1]
    print(f"\nregion of '{marker}' (+0x{insts[lo][0] - base:x} .. +0x{insts[hi_][0] - base:x}, {len(region)} instructions)")
    show(f"'{marker}' region", region)
    print()
    show("outside the region", insts[:lo] + insts[hi_ + 1:])
print(f"\ntop {top} instructions by samples:")
for a, src, n, s, ex in sorted(insts, key=lambda i: -i[2])[:top]:
    main = ", ".join(f"{k[6:]} {v}" for k, v in collections.Counter(s).most_common(3) if v)
    print(f"  +0x{a - base:05x} {n:>7}  {src[:60]:<60} {main}")
