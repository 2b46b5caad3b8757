#!/usr/bin/env bash
# bench/gpu_deepgemm.sh — the `deepgemm` backend on the GPU machine in one call (run from the
# repository root: `bash bench/gpu_deepgemm.sh`; results under $OUT, default ./out):
#
#   build     cmake Release with CUDA into $BUILD (default build-gpu), targets moex + moex_tests
#   sass      HGMMA / QGMMA / UTMALDG counts of the TMA grouped GEMM object (the FP8 variant must
#             show QGMMA)
#   tests     moex_tests --gtest_filter='*DeepGemm*' (both layouts, bf16 / FP8 f32 / FP8 UE8M0,
#             graph replay)
#   sanitize  compute-sanitizer memcheck + racecheck on the graph tests (small cases)
#   bench     moex bench --device cuda: deepgemm and grouped_mm, bf16 and FP8, over $SHAPES x $TOKENS,
#             JSON lines into deepgemm_bench.json, plus a table
# PARTS selects steps (default: all). Keep the whole run under ~8 minutes.
set -u
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
PARTS=${PARTS:-"build sass tests sanitize bench"}
SHAPES=${SHAPES:-qwen3_30b_a3b,mixtral_8x7b,deepseek_v3}
TOKENS=${TOKENS:-1,64,512,4096,16384}
BUILD=${BUILD:-build-gpu}
has() { [[ " $PARTS " == *" $1 "* ]]; }
t0=$(date +%s)
stamp() { echo "== $1 ($(( $(date +%s) - t0 )) s)"; }

if has build; then
  stamp build
  { cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEX_CUDA=ON &&
    cmake --build "$BUILD" -j "$(nproc)" --target moex moex_tests; } > "$OUT/dg_build.log" 2>&1
  grep -E "error|FAILED" "$OUT/dg_build.log" | head -30
  if [ ! -x "$BUILD/moex_tests" ]; then echo "build failed"; tail -40 "$OUT/dg_build.log"; exit 1; fi
fi

if has sass; then
  stamp sass
  for o in "$BUILD"/CMakeFiles/moex_lib.dir/src/backends/cuda/sm90_tma_kernels_*.cu.o; do
    cuobjdump --dump-sass "$o"
  done > "$OUT/dg_sass.txt" 2>&1
  printf 'sm90_tma_grouped_gemm: HGMMA %s QGMMA %s UTMALDG %s\n' "$(grep -c 'HGMMA' "$OUT/dg_sass.txt")" \
    "$(grep -c 'QGMMA' "$OUT/dg_sass.txt")" "$(grep -c 'UTMALDG' "$OUT/dg_sass.txt")"
  grep -o 'QGMMA[^;]*' "$OUT/dg_sass.txt" | sort | uniq -c | head -3
  rm -f "$OUT/dg_sass.txt"
  "$BUILD/moex" info 2>&1 | grep -A2 "deepgemm "
fi

if has tests; then
  stamp tests
  timeout ${TEST_TIMEOUT:-240} "$BUILD/moex_tests" --gtest_filter='*DeepGemm*' > "$OUT/dg_tests.log" 2>&1
  echo "deepgemm tests exit status $?"
  grep -E "^\[  (FAILED|PASSED|SKIPPED) |passed, worst|generated|Failure|Expected|Which is|deepgemm skipped|: (failed|threw)" "$OUT/dg_tests.log" | head -60
fi

if has sanitize; then
  stamp sanitize
  {
    timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 "$BUILD/moex_tests" --gtest_filter='Layouts/DeepGemmGraph.*' 2>&1 | tail -6
    echo "memcheck exit status ${PIPESTATUS[0]}"
    timeout 120 compute-sanitizer --tool racecheck --error-exitcode 9 "$BUILD/moex_tests" \
      --gtest_filter='Layouts/DeepGemmGraph.*contiguous_fp8:Layouts/DeepGemmGraph.*masked_bf16' 2>&1 | tail -6
    echo "racecheck exit status ${PIPESTATUS[0]}"
  } > "$OUT/dg_sanitizer.log" 2>&1
  grep -E "exit status|ERROR SUMMARY|RACECHECK SUMMARY|Invalid|Race" "$OUT/dg_sanitizer.log" | head -20
fi

if has bench; then
  stamp bench
  : > "$OUT/deepgemm_bench.json"
  for q in none fp8; do
    timeout ${BENCH_TIMEOUT:-200} "$BUILD/moex" bench --device cuda --backends deepgemm,grouped_mm --shapes "$SHAPES" \
      --tokens "$TOKENS" --dtype bf16 --quant $q --format json --min-time-ms 20 --max-iters 10 --warmup 2 \
      >> "$OUT/deepgemm_bench.json" 2>> "$OUT/dg_bench.log"
    echo "bench quant=$q exit status $?"
  done
  python3 - "$OUT/deepgemm_bench.json" <<'EOF'
import json, sys
rows = []
for line in open(sys.argv[1]):
    line = line.strip()
    if line.startswith("{"):
        try: rows.append(json.loads(line))
        except Exception: pass
print("| shape | T | quant | backend | ms | TFLOP/s | GB/s | floor ms | % floor | note |")
print("|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    if "shape" not in r: continue
    g = lambda k: r.get(k, "")
    f = lambda k, d=3: (f"{r[k]:.{d}f}" if isinstance(r.get(k), (int, float)) else "")
    print(f"| {g('shape')} | {g('T')} | {g('quant')} | {g('backend')} | {f('ms')} | {f('tflops',1)} | {f('gbps',0)} | {f('floor_ms')} | {f('pct_floor',0)} | {g('skipped')} |")
EOF
fi
stamp done
