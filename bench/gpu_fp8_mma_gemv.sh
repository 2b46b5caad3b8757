#!/usr/bin/env bash
# bench/gpu_fp8_mma_gemv.sh — the tensor-core FP8 GEMV of batched_mm (quant_gemv.cu, quant_up_mma /
# quant_down_mma) on the GPU machine (`run` with command `bash bench/gpu_fp8_mma_gemv.sh`), from the
# repository root:
#
#   1. builds moex + moex_tests with CUDA into $BUILD (default build-gpu; SKIP_BUILD=1 reuses it)
#   2. SASS check: mma.sync e4m3 instructions (QMMA) in the two kernels
#   3. tests: CudaFp8MmaGemv.* (quantized cases on batched_mm, MOEX_CUDA_FP8_MMA_GEMV=1 and =0) and
#      CudaEquivalence.* with MOEX_CUDA_FP8_MMA_GEMV=1; compute-sanitizer memcheck on the bf16 MMA test
#   4. timings: batched_mm bf16, FP8 on CUDA cores (=0) and FP8 on tensor cores (=1), same seed, on
#      SHAPES × TOKENS (default deepseek_v3,qwen3_30b_a3b,mixtral_8x7b × 1,8,64), one table
#
# Output: "== step" lines, test PASSED/FAILED lines, the table (also $OUT/mma_gemv.md); logs under
# $OUT (build.log, tests.log, sanitizer.log, mma_gemv.json). Whole run: ~6 minutes with the build.
set -u
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
BUILD=${BUILD:-build-gpu}
SHAPES=${SHAPES:-deepseek_v3,qwen3_30b_a3b,mixtral_8x7b}
TOKENS=${TOKENS:-1,8,64}
t0=$(date +%s)
stamp() { echo "== $1 ($(( $(date +%s) - t0 )) s)"; }

if [ -z "${SKIP_BUILD:-}" ]; then
  stamp build
  { cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEX_CUDA=ON &&
    cmake --build "$BUILD" -j "$(nproc)" --target moex moex_tests; } > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
fi

stamp sass
obj=$(find "$BUILD" -name 'quant_gemv.cu.o' | head -1)
if command -v cuobjdump > /dev/null && [ -n "$obj" ]; then
  cuobjdump -sass "$obj" | awk '/Function :/{f=$3} /QMMA|HMMA/{if (f ~ /mma/) n[f]++} END{for (k in n) print n[k], "tensor-core instructions in", k}'
else
  echo "no cuobjdump or object: skipped"
fi

stamp tests
OMP_WAIT_POLICY=passive "$BUILD/moex_tests" --gtest_filter='CudaFp8MmaGemv*' > "$OUT/tests.log" 2>&1
rc1=$?
MOEX_CUDA_FP8_MMA_GEMV=1 OMP_WAIT_POLICY=passive "$BUILD/moex_tests" --gtest_filter='*CudaEquivalence*' >> "$OUT/tests.log" 2>&1
rc2=$?
grep -E "^\[  (PASSED|FAILED) |MOEX_CUDA_FP8_MMA_GEMV=|worst rel L2" "$OUT/tests.log"
[ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] || grep -B2 -A8 "Failure" "$OUT/tests.log" | head -60
if command -v compute-sanitizer > /dev/null; then
  stamp sanitizer
  timeout 240 compute-sanitizer --tool memcheck --error-exitcode 9 "$BUILD/moex_tests" \
    --gtest_filter='Settings/CudaFp8MmaGemv.*/bf16_mma' > "$OUT/sanitizer.log" 2>&1
  echo "memcheck rc $? ($(grep -c 'Invalid' "$OUT/sanitizer.log") invalid accesses)"
fi

stamp timings
: > "$OUT/mma_gemv.json"
for shape in $(echo "$SHAPES" | tr ',' ' '); do
  for variant in bf16:none:0 fp8_cuda_cores:fp8:0 fp8_mma:fp8:1; do
    IFS=: read -r name q mma <<< "$variant"
    MOEX_CUDA_FP8_MMA_GEMV=$mma timeout 150 "$BUILD/moex" bench --device cuda --backends batched_mm --shapes "$shape" \
      --tokens "$TOKENS" --dtype bf16 --quant "$q" --format json --min-time-ms 20 --max-iters 20 --warmup 3 2>>"$OUT/tests.log" |
      sed "s/^{/{\"variant\": \"$name\", /" >> "$OUT/mma_gemv.json"
  done
done
python3 - "$OUT" <<'PY' | tee "$OUT/mma_gemv.md"
import json, os, sys
rows = {}
for line in open(os.path.join(sys.argv[1], "mma_gemv.json")):
    line = line.strip()
    if not line.startswith("{"): continue
    try: r = json.loads(line)
    except Exception: continue
    if "ms" in r and "shape" in r and not r.get("skipped"): rows[(r["shape"], r["T"], r["variant"])] = r["ms"]
print("| shape | T | bf16 ms | fp8 CUDA cores ms | fp8 mma ms | bf16/fp8 mma |")
print("|---|---|---|---|---|---|")
for s, T in sorted({(k[0], k[1]) for k in rows}):
    b, c, m = (rows.get((s, T, v)) for v in ("bf16", "fp8_cuda_cores", "fp8_mma"))
    f = lambda v: f"{v:.3f}" if v else "—"
    print(f"| {s} | {T} | {f(b)} | {f(c)} | {f(m)} | " + (f"{b / m:.2f}x" if b and m else "—") + " |")
PY
stamp done
