#!/usr/bin/env python3
"""bench/side_table18.py OUT — issue 7's side-by-side table from OUT/bench.json (moex bench JSON lines,
each with a "quant" key) and OUT/hf.json (bench/hf_experts_bench.py JSON lines), as markdown."""
import json
import os
import sys

out = sys.argv[1]


def rows(name):
    path = os.path.join(out, name)
    r = []
    if os.path.exists(path):
        for line in open(path):
            line = line.strip()
            if line.startswith("{"):
                try:
                    r.append(json.loads(line))
                except ValueError:
                    pass
    return r


m = {(r["shape"], r["T"], r["backend"], r.get("quant", "none")): r for r in rows("bench.json") if "ms" in r}
hf = {}
for r in rows("hf.json"):
    if "ms" in r:
        hf.setdefault((r["shape"], r["T"]), []).append((r["ms"], r["backend"]))
fm = lambda v: f"{v['ms']:.3f} ({v['tflops']:.0f})" if v else "—"
print("| shape | T | deepgemm bf16 ms (TFLOP/s) | grouped_mm bf16 | deepgemm FP8 | reference best (bf16) | "
      "bf16 deepgemm vs ref | FP8 deepgemm vs ref | dense cuBLAS bf16, same FLOPs | deepgemm bf16 % of dense |")
print("|---|---|---|---|---|---|---|---|---|---|")
for s, t in sorted({(k[0], k[1]) for k in m}):
    d, g, f = m.get((s, t, "deepgemm", "none")), m.get((s, t, "grouped_mm", "none")), m.get((s, t, "deepgemm", "fp8"))
    h = min(hf.get((s, t), []), default=None)
    dn = d if d and d.get("dense_ms") else None
    cells = [s, str(t), fm(d), fm(g), fm(f), f"{h[0]:.3f} {h[1]}" if h else "—",
             f"{h[0] / d['ms']:.2f}x" if h and d else "—", f"{h[0] / f['ms']:.2f}x" if h and f else "—",
             f"{dn['dense_ms']:.3f} ({dn['dense_tflops']:.0f})" if dn else "—",
             f"{100 * dn['dense_ms'] / d['ms']:.0f}%" if dn else "—"]
    print("| " + " | ".join(cells) + " |")
