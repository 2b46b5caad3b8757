#!/usr/bin/env python3
"""bench/trace_report.py — the per-kernel timeline of traced decode steps (moex_model_bench --trace).

  python3 bench/trace_report.py TRACE.csv [--steps N] [--json OUT]

Reads the block records of a build configured with -DMOEX_CUDA_TRACE=ON (src/backends/cuda/trace.hpp)
and TRACE.csv.anchors.csv. Every block's SM clocks are mapped onto the global timer with its SM's two
anchors (one global-timer tick seen on that SM before the traced run and one after). Blocks are
grouped into launches (per kernel and grid size, in order of their ends: a launch's blocks all end
before any block of the next launch of that kernel passes its wait), launches are ordered by their
last block's end, and a step ends with its argmax launch.

For each launch, relative to the end of the launch before it in the chain (prev_end, its last block's
exit):
  resident  first block's entry - prev_end (negative: resident early, under PDL)
  release   first wait return - prev_end (how long the dependency took to release it)
  body      last block's exit - first wait return (its own critical path)
  adds      last block's exit - prev_end (what it adds to the step: release + body)
Printed per kernel role (kernel, grid size and the kernel launched before it), averaged over the
decode steps' layers.
"""
import argparse
import collections
import csv
import json
import statistics
import sys

MARKS = 4  # trace::kMarks
NAMES = {1: "embed", 2: "rmsnorm", 3: "gemv", 4: "router", 5: "attention", 6: "batched_up", 7: "batched_down",
         8: "combine", 9: "argmax"}
# what each kernel's MOEX_CUDA_TRACE_MARK(i) marks (the comments at the marks in the kernels)
MARK_LABELS = {"rmsnorm": ["row loaded", "reduced"],
               "router": ["logits computed", "cluster barrier passed"],
               "attention": ["q ready", "key loop done", "partial published", "merge weights computed"]}


def mark_label(kernel, i):
    labels = MARK_LABELS.get(kernel, [])
    return labels[i] if i < len(labels) else f"mark {i}"


def load(path):
    recs = []
    with open(path) as f:
        for r in csv.DictReader(f):
            recs.append({k: int(v) for k, v in r.items()})
    anchors = collections.defaultdict(dict)
    with open(path + ".anchors.csv") as f:
        for r in csv.DictReader(f):
            sm = int(r["smid"])
            if r["when"] not in anchors[sm]:
                anchors[sm][r["when"]] = (int(r["g"]), int(r["c"]))
    return recs, anchors


def timer_step(anchors):
    gs = sorted({a[w][0] for a in anchors.values() for w in a})
    d = [b - a for a, b in zip(gs, gs[1:]) if b > a]
    return min(d) if d else None


def to_ns(recs, anchors, timer_ns):
    """Entry and exit from the global timer where it is fine enough (<= 100 ns steps), the wait return
    from the block's own clock (the SM clock moves with the boost state, so no fixed rate maps clocks
    of different moments: the block's own entry-to-exit rate does, or 1.98 GHz for short blocks)."""
    coarse = timer_ns is None or timer_ns > 100
    for r in recs:
        if coarse:
            a = anchors.get(r["smid"], {})
            (gb, cb), (ga, ca) = a["before"], a["after"]
            k = (ga - gb) / (ca - cb)
            r["t_start"], r["t_end"] = gb + (r["c_start"] - cb) * k, gb + (r["c_end"] - cb) * k
        else:
            r["t_start"], r["t_end"] = float(r["g_start"]), float(r["g_end"])
        dc, dg = r["c_end"] - r["c_start"], r["t_end"] - r["t_start"]
        ghz = dc / dg if dg >= 2000 and dc > 0 else 1.98
        at = lambda c: r["t_start"] + (c - r["c_start"]) / ghz if c else None  # noqa: E731
        r["t_wait"] = at(r["c_wait"])
        for i in range(MARKS):
            r[f"t_mark{i}"] = at(r.get(f"c_mark{i}", 0))


def launches_of(recs):
    by = collections.defaultdict(list)
    for r in recs:
        by[(r["kernel"], r["grid"])].append(r)
    out, bad = [], 0
    for (k, grid), rs in by.items():
        rs.sort(key=lambda r: r["t_end"])
        for i in range(0, len(rs) - len(rs) % grid, grid):
            chunk = rs[i:i + grid]
            if len({r["block"] for r in chunk}) != grid:
                bad += 1
            waits = [r["t_wait"] for r in chunk if r["t_wait"] is not None]
            ends = sorted(r["t_end"] for r in chunk)
            crit = max(chunk, key=lambda r: r["t_end"])  # the block that ends the launch
            out.append({
                "kernel": k, "name": NAMES.get(k, str(k)), "grid": grid,
                "start": min(r["t_start"] for r in chunk), "last_start": max(r["t_start"] for r in chunk),
                "release": min(waits) if waits else None, "end": ends[-1], "end_median": ends[len(ends) // 2],
                "sms": len({r["smid"] for r in chunk}),
                "crit": {k: crit[k] for k in ["t_start", "t_wait", "t_end"] + [f"t_mark{i}" for i in range(MARKS)]},
            })
    out.sort(key=lambda l: l["end"])
    return out, bad


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--steps", type=int, default=0, help="the last N decode steps (default: all but the first step)")
    ap.add_argument("--json", help="write the per-role table as JSON here")
    ap.add_argument("--launches", help="write every launch of the decode steps as CSV here (ns from the step's start)")
    a = ap.parse_args()
    recs, anchors = load(a.trace)
    step_ns = timer_step(anchors)
    to_ns(recs, anchors, step_ns)
    print(f"# {len(recs)} block records; SMs with anchors: {len(anchors)}; "
          f"global timer step seen: {step_ns} ns")
    ls, bad = launches_of(recs)
    if bad:
        print(f"# warning: {bad} launches with repeated block ids (launch grouping uncertain)")
    ends = [i for i, l in enumerate(ls) if l["name"] == "argmax"]
    if len(ends) < 2:
        sys.exit("fewer than two argmax launches: no whole decode step in the trace")
    steps = [(ends[i] + 1, ends[i + 1] + 1) for i in range(len(ends) - 1)]  # the first step (prefill) skipped
    if a.steps:
        steps = steps[-a.steps:]
    roles = collections.defaultdict(lambda: collections.defaultdict(list, crit={}))
    order = []
    step_ms = []
    for s0, s1 in steps:
        seq = ls[s0:s1]
        step_ms.append((seq[-1]["end"] - ls[s0 - 1]["end"]) / 1e6)
        prev_end = ls[s0 - 1]["end"]
        prev_name = "argmax"
        for l in seq:
            # the role: kernel and grid, and the kernel before it (the layer's two norms differ there)
            role = f'{l["name"]}[{l["grid"]}] after {prev_name}'
            prev_name = l["name"]
            if role not in order:
                order.append(role)
            d = roles[role]
            d["adds"].append(l["end"] - prev_end)
            d["resident"].append(l["start"] - prev_end)
            d["last_resident"].append(l["last_start"] - prev_end)
            if l["release"] is not None:
                d["release"].append(l["release"] - prev_end)
                d["body"].append(l["end"] - l["release"])
            d["tail"].append(l["end"] - l["end_median"])
            d["sms"].append(l["sms"])
            c = l["crit"]
            # the launch's last block: wait -> each mark it reached -> exit (marks never reached skipped)
            if c["t_wait"] is not None:
                points = [("wait", c["t_wait"])] + [(mark_label(l["name"], i), c[f"t_mark{i}"]) for i in range(MARKS)
                                                    if c[f"t_mark{i}"] is not None] + [("exit", c["t_end"])]
                if len(points) > 2:
                    for (a_name, a_t), (b_name, b_t) in zip(points, points[1:]):
                        d["crit"].setdefault(f"{a_name} -> {b_name}", []).append(b_t - a_t)
            prev_end = l["end"]
    if a.launches:
        with open(a.launches, "w") as f:
            f.write("step,index,kernel,grid,start,last_start,release,end_median,end,sms\n")
            for si, (s0, s1) in enumerate(steps):
                base = ls[s0 - 1]["end"]
                for i, l in enumerate(ls[s0:s1]):
                    rel = "" if l["release"] is None else f'{l["release"] - base:.0f}'
                    f.write(f'{si},{i},{l["name"]},{l["grid"]},{l["start"] - base:.0f},{l["last_start"] - base:.0f},{rel},'
                            f'{l["end_median"] - base:.0f},{l["end"] - base:.0f},{l["sms"]}\n')
    print(f"# decode steps: {len(steps)}; step (argmax end to argmax end) ms: "
          + ", ".join(f"{x:.3f}" for x in step_ms))
    us = lambda v: statistics.mean(v) / 1e3 if v else float("nan")  # noqa: E731
    n_steps = len(steps)
    print("| kernel[grid] | per step | adds µs | resident µs | last block resident µs | release µs | body µs | "
          "tail (last − median end) µs | SMs | µs per step |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    table = []
    for role in order:
        d = roles[role]
        n = len(d["adds"])
        row = {"role": role, "per_step": n / n_steps, "adds_us": us(d["adds"]), "resident_us": us(d["resident"]),
               "last_resident_us": us(d["last_resident"]), "release_us": us(d["release"]), "body_us": us(d["body"]),
               "tail_us": us(d["tail"]), "sms": statistics.mean(d["sms"]),
               "us_per_step": sum(d["adds"]) / n_steps / 1e3}
        table.append(row)
        print(f'| {role} | {row["per_step"]:.0f} | {row["adds_us"]:.2f} | {row["resident_us"]:.2f} | '
              f'{row["last_resident_us"]:.2f} | {row["release_us"]:.2f} | {row["body_us"]:.2f} | {row["tail_us"]:.2f} | '
              f'{row["sms"]:.0f} | {row["us_per_step"]:.1f} |')
    for row in table:
        crit = roles[row["role"]]["crit"]
        if crit:
            row["crit_us"] = {k: us(v) for k, v in crit.items()}
            print(f'# {row["role"]}: the last block to end: '
                  + ", ".join(f"{k} {v:.2f} µs ({len(crit[k])}x)" for k, v in row["crit_us"].items()))
    total = sum(r["us_per_step"] for r in table)
    print(f"# sum of 'adds' per step: {total / 1e3:.3f} ms (the step less the previous argmax's end)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"steps_ms": step_ms, "roles": table, "timer_step_ns": step_ns}, f, indent=1)


if __name__ == "__main__":
    main()
