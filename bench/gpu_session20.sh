#!/usr/bin/env bash
# bench/gpu_session20.sh — one call on the GPU machine for the twentieth session, from the repository
# root (`run` with command `bash bench/gpu_session20.sh`). It measured batched_mm's one-token
# cooperative kernel (batched_fused_t1, MOEX_CUDA_FUSED_T1 / MOEX_CUDA_FUSED_T1_MODE, commits 879af72
# and 4dafbde; slower, removed in 3036176: docs/PERF.md, twentieth session); the steps are generic:
#   build    moex, moex_tests, moex_model_bench (CUDA, Release) into $BUILD (incremental when it exists)
#   tests    $TEST_FILTER (default: the graph replays, the equivalence harness, the model's graph /
#            switching / bf16 parity tests)
#   sanitize compute-sanitizer memcheck and racecheck on $SANITIZE_FILTER (default the T = 1 graph replays)
#   experts  moex bench, batched_mm bf16 at T = 1 on $X_SHAPES, per variant of $AB_VARIANTS, $ROUNDS rounds
#   model    moex_model_bench --layers 48 --batches $AB_BATCHES per variant, $ROUNDS interleaved rounds
#   ncu      each batched_mm kernel's GPU time, DRAM rate and achieved occupancy at T = 1 on
#            $NCU_SHAPE (default qwen3_30b_a3b), per variant (ncu serialises: no PDL overlap)
# AB_VARIANTS: "name:ENV=V[,ENV=V]" items after "base" (default none).
# PARTS selects steps (default all). Logs and JSON under $OUT; the last lines are the tables.
set -u
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export MOEX_SOURCE_DIR=$PWD
BUILD=${BUILD:-build-gpu}
PARTS=${PARTS:-"build tests sanitize experts model"}
VARIANTS="base: ${AB_VARIANTS:-}"
ROUNDS=${ROUNDS:-2}
has() { [[ " $PARTS " == *" $1 "* ]]; }
t0=$(date +%s)
stamp() { echo "== $1 ($(( $(date +%s) - t0 )) s)"; }
envs_of() { echo "${1//,/ }"; }

if has build; then
  stamp build
  { cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEX_CUDA=ON &&
    cmake --build "$BUILD" -j "$(nproc)" --target moex moex_tests moex_model_bench; } > "$OUT/build.log" 2>&1 ||
    { grep -E "error" "$OUT/build.log" | head -30; exit 1; }
fi
if has tests; then
  stamp tests
  timeout ${TEST_TIMEOUT:-240} "$BUILD/moex_tests" --gtest_filter="${TEST_FILTER:-Capturable/CudaGraph.*:*CudaEquivalence*:CudaModelGraphs*:CudaModelSwitching*:*CudaModelParity.Bf16*}" > "$OUT/tests.log" 2>&1
  echo "tests rc $?"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]|rel L2" "$OUT/tests.log" | head -40
  grep -B3 -A12 "Failure" "$OUT/tests.log" | head -60
fi
if has sanitize; then
  for tool in memcheck racecheck; do
    stamp "$tool"
    timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 "$BUILD/moex_tests" \
      --gtest_filter="${SANITIZE_FILTER:-Capturable/CudaGraph.*t1}" > "$OUT/$tool.log" 2>&1
    echo "$tool rc $? ($(grep -c 'Invalid' "$OUT/$tool.log") invalid, $(grep -ci 'hazard' "$OUT/$tool.log") hazard lines)"
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/$tool.log" | head -3
  done
fi
if has experts; then
  : > "$OUT/experts.json"
  for r in $(seq 1 "$ROUNDS"); do
    for v in $VARIANTS; do
      name=${v%%:*}; e=${v#*:}
      env $(envs_of "$e") timeout 120 "$BUILD/moex" bench --device cuda --backends batched_mm \
        --shapes "${X_SHAPES:-qwen3_30b_a3b,qwen15_moe_a2_7b}" --tokens 1 --dtype bf16 --format json --no-dense \
        --min-time-ms 50 2>> "$OUT/experts.err" | sed "s/^{/{\"variant\": \"$name\", \"round\": $r, /" >> "$OUT/experts.json"
    done
  done
  stamp "experts table"
  python3 - "$OUT/experts.json" <<'PY' | tee "$OUT/experts.md"
import json, sys, statistics, collections
c = collections.defaultdict(list)
for line in open(sys.argv[1]):
    if line.startswith("{"):
        r = json.loads(line)
        if "ms" in r: c[(r["shape"], r["variant"])].append((r["ms"], r.get("gbps", 0), r.get("floor_ms", 0)))
print("| shape | variant | ms (median) | GB/s | floor ms | rounds |")
print("|---|---|---|---|---|---|")
for (s, v), xs in sorted(c.items()):
    print(f"| {s} | {v} | {statistics.median(x[0] for x in xs):.4f} | {statistics.median(x[1] for x in xs):.0f} | {xs[0][2]:.4f} | {' / '.join(f'{x[0]:.4f}' for x in xs)} |")
PY
fi
if has model; then
  for r in $(seq 1 "$ROUNDS"); do
    for v in $VARIANTS; do
      name=${v%%:*}; e=${v#*:}
      stamp "model bench round $r [$name]"
      env $(envs_of "$e") timeout 150 "$BUILD/moex_model_bench" --layers 48 --batches ${AB_BATCHES:-1,8} \
        --out "$OUT/e2e_${name}_$r.json" > "$OUT/e2e_${name}_$r.log" 2>&1
      grep -E "decode|prefill|floor" "$OUT/e2e_${name}_$r.log" | head -12 | sed "s/^/[$name $r] /"
    done
  done
fi
if has ncu; then
  for v in $VARIANTS; do
    name=${v%%:*}; e=${v#*:}
    stamp "ncu [$name]"
    env $(envs_of "$e") timeout 120 ncu --clock-control none --kernel-name regex:batched --csv --print-units base \
      --metrics gpu__time_duration.sum,dram__bytes_read.sum,sm__warps_active.avg.pct_of_peak_sustained_active \
      "$BUILD/moex" bench --device cuda --backends batched_mm --shapes "${NCU_SHAPE:-qwen3_30b_a3b}" --tokens 1 --dtype bf16 \
      --no-dense --min-time-ms 0 --max-iters 3 --warmup 1 > "$OUT/ncu_$name.csv" 2> "$OUT/ncu_$name.err"
    python3 - "$OUT/ncu_$name.csv" "$name" <<'PY'
import csv, sys, collections, statistics
rows = [r for r in csv.reader(open(sys.argv[1])) if r]
try: hdr = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
except StopIteration: print(sys.argv[2], "no kernels"); sys.exit()
h = rows[hdr]; ii, ki, mi, vi = h.index("ID"), h.index("Kernel Name"), h.index("Metric Name"), h.index("Metric Value")
k = collections.defaultdict(dict)
for r in rows[hdr + 1:]:
    if len(r) > vi: k[(r[ii], r[ki].split("(")[0].split("<")[0][-30:])][r[mi]] = float(r[vi].replace(",", ""))
per = collections.defaultdict(list)
for (i, name), m in k.items(): per[name].append(m)
for name, ms in per.items():
    us = statistics.median(m.get("gpu__time_duration.sum", 0) for m in ms) / 1e3
    mb = statistics.median(m.get("dram__bytes_read.sum", 0) for m in ms) / 1e6
    occ = statistics.median(m.get("sm__warps_active.avg.pct_of_peak_sustained_active", 0) for m in ms)
    print(f"[{sys.argv[2]}] {name}: {us:.1f} us, {mb:.1f} MB, {mb / us if us else 0:.2f} TB/s, warps active {occ:.0f} %")
PY
  done
fi
stamp done
