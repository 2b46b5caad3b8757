#!/usr/bin/env python3
"""Merges `moex bench --format json` lines with the reference library's JSON lines (the anchors'
hf_experts_bench*.py) into one markdown table: per case each side's backends, each side's best,
the speed-up of moex's best over the reference's best, and moex's % of the floor. moex rows of
quantized experts (`moex bench --quant`) are compared with the reference's rows of their dtype. Where
a case was measured in several rounds, each side's fastest round counts (both sides alike).

    python3 bench/compare.py --moex moex.jsonl --ref hf.jsonl [--threads 2]
"""
import argparse, json, collections

def load(path):
    rows = []
    for line in open(path):
        line = line.strip()
        if line.startswith("{"):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return rows

def norm_dtype(d):
    return {"torch.bfloat16": "bf16", "torch.float32": "f32", "torch.float16": "f16"}.get(d, d)

ap = argparse.ArgumentParser()
ap.add_argument("--moex", required=True)
ap.add_argument("--ref", required=True)
ap.add_argument("--threads", type=int, default=None)
ap.add_argument("--dtype", default=None, help="dtype of the reference rows when they do not say (GPU anchor: bf16)")
a = ap.parse_args()

moex = collections.defaultdict(dict)
machines = []  # one header per moex bench run (per dtype: the bf16 run may name a different peak)
for r in load(a.moex):
    if "machine" in r:
        machines.append(r)
        continue
    if "ms" not in r:
        continue
    # quantized experts (moex bench --quant): their own rows, "bf16+fp8", beside the reference's bf16 experts
    dt = norm_dtype(r["dtype"]) + (f"+{r['quant']}" if r.get("quant", "none") != "none" else "")
    # several rounds of the same case (cpu_side_by_side.sh ROUNDS=n): each side keeps its fastest
    case = moex[(r["shape"], dt, int(r["T"]))]
    if r["backend"] not in case or r["ms"] < case[r["backend"]]["ms"]:
        case[r["backend"]] = r
ref = collections.defaultdict(dict)
for r in load(a.ref):
    if "ms" not in r:
        continue
    if a.threads is not None and "threads" in r and int(r["threads"]) != a.threads:
        continue
    dt = norm_dtype(r.get("dtype", a.dtype or "bf16"))
    case = ref[(r["shape"], dt, int(r["T"]))]
    case[r["backend"]] = min(r["ms"], case.get(r["backend"], float("inf")))

if any("+" in k[1] for k in moex):
    print("Rows bf16+fp8 / bf16+fp4: moex's FP8 / FP4 experts beside the reference's bf16 experts (its FP8 experts "
          "need a hub kernel that does not run on the CPU; its dequantize load option gives these bf16 ones).")
    print()
for machine in machines:
    read = f" (streaming read {machine['read_gbps']:.1f} GB/s)" if machine.get('read_gbps') else ""
    print(f"machine: {machine.get('machine')}, copy {machine.get('copy_gbps', 0):.1f} GB/s{read}, "
          f"peak {machine.get('peak_gflops', 0):.1f} GFLOP/s ({machine.get('peak_what')})")
if machines:
    print()
print("| shape | dtype | T | floor ms | moex: " + " / ".join(["eager", "batched_mm", "grouped_mm"]) +
      " ms | reference: eager / batched_mm / grouped_mm ms | moex best | ref best | speed-up | moex % of floor |")
print("|---|---|---|---|---|---|---|---|---|---|")
for key in sorted(moex, key=lambda k: (k[0], k[1], k[2])):
    m = moex[key]
    r = ref.get((key[0], key[1].split("+")[0], key[2]), {})
    def fmt(d, b):
        v = d.get(b)
        if v is None:
            return "—"
        return f"{(v['ms'] if isinstance(v, dict) else v):.3f}"
    mb = min(m.items(), key=lambda kv: kv[1]["ms"])
    floor = mb[1].get("floor_ms", 0)
    rb = min(r.items(), key=lambda kv: kv[1]) if r else None
    speed = f"{rb[1] / mb[1]['ms']:.2f}×" if rb else "—"
    print(f"| {key[0]} | {key[1]} | {key[2]} | {floor:.3f} | {fmt(m,'eager')} / {fmt(m,'batched_mm')} / {fmt(m,'grouped_mm')} | "
          f"{fmt(r,'eager')} / {fmt(r,'batched_mm')} / {fmt(r,'grouped_mm')} | {mb[0]} {mb[1]['ms']:.3f} | "
          f"{(rb[0] + ' ' + format(rb[1], '.3f')) if rb else '—'} | {speed} | {floor / mb[1]['ms'] * 100:.0f}% |")
