#!/usr/bin/env bash
# bench/gpu_ab.sh — a kernel change checked and timed in one call on the GPU machine (`run` with
# command `bash bench/gpu_ab.sh`), from the repository root:
#   build  bench/gpu_check.sh PARTS=build (CUDA Release into $BUILD, moex + moex_tests)
#   tests  the experts' GPU tests (TEST_FILTER, MOEX_CUDA_TEST_CASES generated cases, TEST_TIMEOUT),
#          then the equivalence + graph tests with the 2-CTA clusters forced (256-wide tiles)
#   ab     grouped_mm timed for "base" and every "name:ENV=V[,ENV=V]" of AB_VARIANTS, in that order,
#          the whole list AB_ROUNDS times (interleaved rounds show the run-to-run swing) over SHAPES ×
#          AB_TOKENS → $OUT/ab.md (median over rounds per variant) and ab.json
#   ncu    per-kernel GPU time of one grouped_mm forward for each NCU_CASES "shape:T" (ncu
#          --clock-control none, gpu__time_duration) → $OUT/ncu.md
# DEADLINE (s, default 570) skips the steps that would start after it.
set -u
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
BUILD=${BUILD:-build-gpu}
PARTS=${PARTS:-"build tests ab ncu"}
SHAPES=${SHAPES:-qwen3_30b_a3b,qwen15_moe_a2_7b,mixtral_8x7b,deepseek_v3}
AB_TOKENS=${AB_TOKENS:-512,4096,16384}
AB_ROUNDS=${AB_ROUNDS:-2}
AB_VARIANTS=${AB_VARIANTS:-}
NCU_CASES=${NCU_CASES:-"deepseek_v3:16384 qwen15_moe_a2_7b:16384"}
DEADLINE=${DEADLINE:-570}
t0=$(date +%s)
has() { [[ " $PARTS " == *" $1 "* ]]; }
left() { echo $(( DEADLINE - ($(date +%s) - t0) )); }
stamp() { echo "== $1 ($(( $(date +%s) - t0 )) s)"; }

if has build; then
  stamp build
  BUILD=$BUILD PARTS=build BUILD_TARGETS="moex moex_tests" bash bench/gpu_check.sh > "$OUT/build_step.log" 2>&1 ||
    { tail -30 "$OUT/build_step.log"; exit 1; }
  grep -E "HGMMA|error" "$OUT/build_step.log" | head -5
fi

if has tests && [ "$(left)" -gt 200 ]; then
  stamp tests
  MOEX_CUDA_TEST_CASES=${MOEX_CUDA_TEST_CASES:-24} timeout ${TEST_TIMEOUT:-150} "$BUILD/moex_tests" \
    --gtest_filter="${TEST_FILTER:-*CudaEquivalence*:*CudaGraph*:CudaBackends.*:CudaRoutingPlan.*}" > "$OUT/tests.log" 2>&1
  echo "tests rc $?"
  grep -E "^\[  (FAILED|PASSED|SKIPPED) |worst|Failure" "$OUT/tests.log" | head -20
  MOEX_CUDA_TMA_CLUSTER=1 MOEX_CUDA_TMA_N=256 MOEX_CUDA_TEST_CASES=${CLUSTER_TEST_CASES:-12} timeout ${CLUSTER_TIMEOUT:-90} \
    "$BUILD/moex_tests" --gtest_filter="*CudaEquivalence*:*CudaGraph*" > "$OUT/tests_clusters.log" 2>&1
  echo "clusters forced: tests rc $?"
  grep -E "^\[  (FAILED|PASSED|SKIPPED) |worst|Failure" "$OUT/tests_clusters.log" | head -10
fi

if has ab && [ "$(left)" -gt 60 ]; then
  stamp "A/B ($AB_ROUNDS rounds)"
  : > "$OUT/ab.json"
  for round in $(seq 1 "$AB_ROUNDS"); do
    for v in "base:" $AB_VARIANTS; do
      [ "$(left)" -gt 40 ] || break 2
      name=${v%%:*}; envs=${v#*:}
      env $(echo "$envs" | tr ',' ' ') timeout 150 "$BUILD/moex" bench --device cuda --backends grouped_mm --shapes "$SHAPES" \
        --tokens "$AB_TOKENS" --dtype bf16 --format json --no-dense --min-time-ms 30 --max-iters 10 --warmup 2 2> /dev/null |
        sed "s/^{/{\"variant\": \"$name\", \"round\": $round, /" >> "$OUT/ab.json"
    done
  done
  python3 - "$OUT/ab.json" <<'PY' | tee "$OUT/ab.md"
import json, sys, statistics, collections
r = collections.defaultdict(list); names = []
for l in open(sys.argv[1]):
    if not l.startswith("{"): continue
    try: d = json.loads(l)
    except Exception: continue
    if "ms" not in d: continue
    r[(d["shape"], d["T"], d["variant"])].append(d["ms"])
    if d["variant"] not in names: names.append(d["variant"])
print("median of the rounds (each round's values in brackets), grouped_mm bf16 ms")
print("| shape | T | " + " | ".join(names) + " |"); print("|---|---|" + "---|" * len(names))
tot = {n: 0.0 for n in names}
for (s, T) in sorted({(k[0], k[1]) for k in r}):
    cells = []
    for n in names:
        v = r.get((s, T, n))
        if v:
            m = statistics.median(v); tot[n] += m
            cells.append(f"{m:.3f} [" + " ".join(f"{x:.3f}" for x in v) + "]")
        else: cells.append("—")
    print(f"| {s} | {T} | " + " | ".join(cells) + " |")
print("| total | | " + " | ".join(f"{tot[n]:.3f}" for n in names) + " |")
PY
fi

if has ncu && [ "$(left)" -gt 40 ]; then
  : > "$OUT/ncu.md"
  for c in $NCU_CASES; do
    [ "$(left)" -gt 30 ] || break
    IFS=: read -r shape T <<< "$c"
    stamp "ncu $shape T=$T"
    # the first NCU_COUNT matching kernels: the warm-up and timed forwards (plan, gathers, GEMMs, combine)
    timeout $(( $(left) - 10 )) ncu --clock-control none --metrics gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second --csv \
      -k regex:"grouped_gemm|plan_|combine|gather|act_rows" --launch-skip ${NCU_SKIP:-0} --launch-count ${NCU_COUNT:-20} \
      "$BUILD/moex" bench --device cuda --backends grouped_mm --shapes "$shape" --tokens "$T" --no-dense \
      --min-time-ms 0 --max-iters 1 --warmup 1 > "$OUT/ncu_$shape.csv" 2> "$OUT/ncu_$shape.err"
    echo "ncu rc $?"
    python3 - "$OUT/ncu_$shape.csv" "$shape T=$T" <<'PY' | tee -a "$OUT/ncu.md"
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
try: hdr = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
except StopIteration: print(f"# {sys.argv[2]}: no kernels"); sys.exit()
h = rows[hdr]; ii, ki, mi, vi = h.index("ID"), h.index("Kernel Name"), h.index("Metric Name"), h.index("Metric Value")
k = {}
for r in rows[hdr + 1:]:
    if len(r) > vi: k.setdefault(r[ii], {"name": r[ki].split("(")[0][:60]})[r[mi]] = float(r[vi].replace(",", ""))
print(f"# {sys.argv[2]} (ncu, one forward)")
tot = 0.0
for i, d in k.items():
    us = d.get("gpu__time_duration.sum", 0) / 1e3; tot += us
    ghz = d.get("sm__cycles_elapsed.avg.per_second", 0) / 1e9
    print(f"{i:>4} {us:10.1f} us {ghz:5.2f} GHz  {d['name']}")
print(f"total {tot:.1f} us")
PY
  done
fi
tar czf "$OUT/ab_logs.tgz" -C "$OUT" $(cd "$OUT" && ls build_step.log build.log tests.log tests_clusters.log ab.json ncu_*.csv ncu_*.err 2>/dev/null) 2>/dev/null &&
  (cd "$OUT" && rm -f build_step.log build.log tests.log tests_clusters.log ab.json ncu_*.csv ncu_*.err)
stamp done
