#!/usr/bin/env bash
# bench/gpu_session18.sh — one call on the GPU machine for the eighteenth session's changes (FP8 QGMMA
# in 2-CTA clusters, deepgemm's paired tile order)
# (`run` with command `bash bench/gpu_session18.sh`), from the repository root:
#   build   moex, moex_tests, moex_model_bench (CUDA, Release) into $BUILD (an incremental rebuild
#           when it exists)
#   tests   the FP8 TMA tests with the QGMMA kernel in 2-CTA clusters (MOEX_CUDA_FP8_CLUSTER=
#           $TEST_FP8_CLUSTER, default 1: every QGMMA GEMM): deepgemm both layouts, grouped_mm's FP8
#           prefill modes, graphs
#   sanitize  compute-sanitizer memcheck on deepgemm's FP8 graph tests in clusters
#   fp8ab   moex bench --quant fp8, deepgemm and grouped_mm, $FP8_SHAPES x $FP8_TOKENS, for each
#           MOEX_CUDA_FP8_CLUSTER of $FP8_MODES (default "0 1"), $FP8_ROUNDS interleaved rounds -> $OUT/fp8ab.md
#           (its table compares modes 0 and 1; fp8ab.json holds every mode)
#   side    issue 7's side by side: moex bench (deepgemm / grouped_mm bf16 with the dense cuBLAS GEMM of the
#           same FLOPs, deepgemm FP8) and the reference library's experts backends
#           (bench/hf_experts_bench.py), $FP8_SHAPES x $SIDE_TOKENS -> $OUT/side.md
#   pairab  deepgemm with the paired tile order against expert order (MOEX_DEEPGEMM_PAIRED=1 / 0), bf16
#           and FP8, $PAIR_SHAPES x $PAIR_TOKENS, one round
#   ab      the 48-layer model bench for "base" and every "name:ENV=V" of $AB_VARIANTS
#           (bench/gpu_session6.sh PARTS=ab)
# PARTS selects steps (default "build tests sanitize fp8ab side"). DEADLINE (s, default 560) skips steps that would start
# after it. Logs in $OUT.
set -u
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export MOEX_SOURCE_DIR=$PWD
BUILD=${BUILD:-build-gpu}
PARTS=${PARTS:-"build tests sanitize fp8ab side"}
FP8_SHAPES=${FP8_SHAPES:-deepseek_v3,qwen3_30b_a3b,mixtral_8x7b}
FP8_TOKENS=${FP8_TOKENS:-4096,16384}
FP8_ROUNDS=${FP8_ROUNDS:-2}
DEADLINE=${DEADLINE:-560}
has() { [[ " $PARTS " == *" $1 "* ]]; }
t0=$(date +%s)
left() { echo $(( DEADLINE - ($(date +%s) - t0) )); }
stamp() { echo "== $1 ($(( $(date +%s) - t0 )) s)"; }

if has build; then
  stamp build
  { cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEX_CUDA=ON &&
    cmake --build "$BUILD" -j "$(nproc)" --target moex moex_tests moex_model_bench; } > "$OUT/build.log" 2>&1 ||
    { grep -E "error" "$OUT/build.log" | head -30; exit 1; }
fi

if has tests && [ "$(left)" -gt 300 ]; then
  stamp "FP8 tests, MOEX_CUDA_FP8_CLUSTER=${TEST_FP8_CLUSTER:-1}"
  MOEX_CUDA_FP8_CLUSTER=${TEST_FP8_CLUSTER:-1} timeout ${TEST_TIMEOUT:-150} "$BUILD/moex_tests" \
    --gtest_filter="${TEST_FILTER:-*DeepGemm*:*CudaFp8Prefill*:CudaModelFp8*}" > "$OUT/tests_fp8mc.log" 2>&1
  echo "FP8 cluster tests rc $?"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]|passed, worst" "$OUT/tests_fp8mc.log" | head -30
  grep -B3 -A10 "Failure" "$OUT/tests_fp8mc.log" | head -40
fi

if has sanitize && [ "$(left)" -gt 280 ]; then
  stamp "memcheck, FP8 clusters"
  MOEX_CUDA_FP8_CLUSTER=1 timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 "$BUILD/moex_tests" \
    --gtest_filter='Layouts/DeepGemmGraph.*contiguous_fp8*' > "$OUT/memcheck_fp8mc.log" 2>&1
  echo "memcheck rc $?"
  grep -E "ERROR SUMMARY|Invalid|PASSED|FAILED" "$OUT/memcheck_fp8mc.log" | head -8
fi

if has fp8ab && [ "$(left)" -gt 200 ]; then
  : > "$OUT/fp8ab.json"
  for r in $(seq 1 "$FP8_ROUNDS"); do
    for c in ${FP8_MODES:-0 1}; do
      [ "$(left)" -gt 150 ] || break
      stamp "fp8 bench round $r cluster=$c"
      MOEX_CUDA_FP8_CLUSTER=$c timeout 120 "$BUILD/moex" bench --device cuda --backends deepgemm,grouped_mm \
        --shapes "$FP8_SHAPES" --tokens "$FP8_TOKENS" --dtype bf16 --quant fp8 --format json --min-time-ms 20 \
        --max-iters 10 --warmup 2 2>> "$OUT/fp8ab.err" | sed "s/^{/{\"cluster\": $c, \"round\": $r, /" >> "$OUT/fp8ab.json"
    done
  done
  python3 - "$OUT/fp8ab.json" <<'EOF' | tee "$OUT/fp8ab.md"
import json, sys, statistics
rows = []
for line in open(sys.argv[1]):
    line = line.strip()
    if line.startswith("{"):
        try: rows.append(json.loads(line))
        except Exception: pass
cell = {}
for r in rows:
    if "shape" not in r or "ms" not in r: continue
    cell.setdefault((r["shape"], r["T"], r["backend"]), {}).setdefault(r["cluster"], []).append((r["ms"], r.get("tflops", 0)))
print("| shape | T | backend | no clusters ms (TFLOP/s) | clusters ms (TFLOP/s) | off / on |")
print("|---|---|---|---|---|---|")
for (s, t, b), v in cell.items():
    def f(c):
        if c not in v: return "—", None
        ms = statistics.median(x[0] for x in v[c]); tf = statistics.median(x[1] for x in v[c])
        return f"{ms:.3f} ({tf:.1f}) [{' / '.join(f'{x[0]:.3f}' for x in v[c])}]", ms
    a, ma = f(0); b2, mb = f(1)
    print(f"| {s} | {t} | {b} | {a} | {b2} | {ma / mb:.3f} |" if ma and mb else f"| {s} | {t} | {b} | {a} | {b2} | |")
EOF
fi

if has side && [ "$(left)" -gt 200 ]; then
  stamp "moex bench bf16 + fp8 (side by side)"
  : > "$OUT/bench.json"
  for q in none fp8; do
    timeout 150 "$BUILD/moex" bench --device cuda --backends deepgemm,grouped_mm --shapes "$FP8_SHAPES" \
      --tokens "${SIDE_TOKENS:-512,4096,16384}" --dtype bf16 --quant $q --format json --min-time-ms 20 --max-iters 10 \
      --warmup 2 2>> "$OUT/side.err" | sed "s/^{/{\"quant\": \"$q\", /" >> "$OUT/bench.json"
  done
  stamp "reference experts bench"
  PYTHONUNBUFFERED=1 BACKENDS=${HF_BACKENDS:-eager,grouped_mm} SHAPES="$FP8_SHAPES" TOKENS="${SIDE_TOKENS:-512,4096,16384}" OUT="$OUT" timeout $(( $(left) - 15 )) \
    python3 bench/hf_experts_bench.py > "$OUT/hf.json" 2> "$OUT/hf.err"
  echo "reference rc $? ($(grep -c '"ms"' "$OUT/hf.json") cases)"
  python3 bench/side_table18.py "$OUT" | tee "$OUT/side.md"
fi

# deepgemm's paired tile order against expert order (MOEX_DEEPGEMM_PAIRED), bf16 and FP8, one round
if has pairab && [ "$(left)" -gt 40 ]; then
  : > "$OUT/pairab.json"
  for pv in 1 0; do
    for q in none fp8; do
      [ "$(left)" -gt 20 ] || break
      stamp "deepgemm paired=$pv quant=$q"
      MOEX_DEEPGEMM_PAIRED=$pv timeout 60 "$BUILD/moex" bench --device cuda --backends deepgemm --shapes "${PAIR_SHAPES:-deepseek_v3,qwen3_30b_a3b}" \
        --tokens "${PAIR_TOKENS:-4096,16384}" --dtype bf16 --quant $q --format json --min-time-ms 20 --max-iters 10 --warmup 2 \
        2>> "$OUT/pairab.err" | sed "s/^{/{\"paired\": $pv, \"quant\": \"$q\", /" >> "$OUT/pairab.json"
    done
  done
  python3 - "$OUT/pairab.json" <<'PY'
import json, sys
c = {}
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l)
        if "ms" in r: c.setdefault((r["shape"], r["T"], r["quant"]), {})[r["paired"]] = (r["ms"], r.get("tflops", 0))
print("| shape | T | quant | expert order ms (TFLOP/s) | paired ms (TFLOP/s) | expert / paired |")
print("|---|---|---|---|---|---|")
for (s, t, q), v in c.items():
    a, b = v.get(0), v.get(1)
    f = lambda x: f"{x[0]:.3f} ({x[1]:.0f})" if x else "—"
    print(f"| {s} | {t} | {q} | {f(a)} | {f(b)} | {a[0] / b[0]:.3f} |" if a and b else f"| {s} | {t} | {q} | {f(a)} | {f(b)} | |")
PY
fi

if has ab && [ "$(left)" -gt 60 ]; then
  BUILD=$BUILD PARTS=ab AB_BATCHES=${AB_BATCHES:-1,8} AB_VARIANTS="${AB_VARIANTS:-pf1:MOEX_CUDA_PREFETCH=1 pf2:MOEX_CUDA_PREFETCH=2 pf3:MOEX_CUDA_PREFETCH=3}" \
    bash bench/gpu_session6.sh
fi
stamp done
