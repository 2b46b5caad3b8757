#!/usr/bin/env bash
# bench/gpu_final4.sh — the fourth session's closing call on the GPU machine (`run` with command
# `bash bench/gpu_final4.sh`), from the repository root:
#   1. build moex, moex_tests, moex_model_bench (CUDA, Release) into $BUILD
#   2. GPU tests: the model runtime (attention kernels, runtime kernels, parity of every fixture,
#      one/two-term linears, switching, graphs) and the experts backends (CudaEquivalence f16/bf16
#      with MOEX_CUDA_TEST_CASES generated cases, CudaGraph, CudaBackends)
#   3. issue 3: A/B of grouped GEMM variants and the side-by-side table with the reference
#      (bench/gpu_issue3.sh with SKIP_BUILD=1; the chosen variant is exported for its tests)
#   4. moex_model_bench (48 layers, with the table's grouped GEMM settings) and the FP8 vs bf16
#      decode timings (bench/gpu_fp8_decode.sh PARTS=perf)
#   5. the per-kernel ncu profile of the model runtime's decode step (bench/gpu_profile.sh PARTS=model)
set -u
OUT=${OUT:-$PWD/out}
export MOEX_SOURCE_DIR=$PWD
mkdir -p "$OUT/logs"
BUILD=${BUILD:-build-gpu}
t0=$(date +%s)
stamp() { echo "== $1 ($(( $(date +%s) - t0 )) s)"; }
stamp build
{ cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEX_CUDA=ON &&
  cmake --build "$BUILD" -j "$(nproc)" --target moex moex_tests moex_model_bench; } > "$OUT/logs/build.log" 2>&1 ||
  { grep -E "error" "$OUT/logs/build.log" | head -30; exit 1; }

stamp "model tests"
for f in 'CudaAttentionKernels*:CudaModelKernels*:CudaModelLinear*' '*CudaModelParity*' \
         'CudaModelSwitching*:CudaModelGraphs*:CudaModelErrors*:CudaModelAttention*:CudaModelRouters*:CudaModelFp8*'; do
  timeout 150 "$BUILD/moex_tests" --gtest_filter="$f" >> "$OUT/logs/model_tests.log" 2>&1
  echo "model tests '$f': rc $?"
done
grep -E "^\[  (FAILED|PASSED|SKIPPED) |^\[  FAILED  \]|term .*prompt|flash prefill vs" "$OUT/logs/model_tests.log" | head -60
grep -B3 -A12 "Failure" "$OUT/logs/model_tests.log" | head -40

stamp "issue 3 (A/B, tests, bench, reference, table)"
SKIP_BUILD=1 BUILD=$BUILD MOEX_CUDA_TEST_CASES=${MOEX_CUDA_TEST_CASES:-10} \
  AB_VARIANTS=${AB_VARIANTS:-"krot:MOEX_CUDA_TMA_KROT=1 n128:MOEX_CUDA_TMA_N=128 promo128:MOEX_CUDA_TMA_L2PROMO=128 krot_n128:MOEX_CUDA_TMA_KROT=1,MOEX_CUDA_TMA_N=128"} \
  TEST_FILTER='Dtypes/CudaEquivalence.*/f16:Dtypes/CudaEquivalence.*/bf16:*CudaGraph*:CudaBackends.*' DEADLINE=330 bash bench/gpu_issue3.sh

choice=$(tar xzf "$OUT/issue3_logs.tgz" -O ab_choice.env 2>/dev/null)
stamp "moex_model_bench (48 layers; grouped GEMM settings of the table: '$choice')"
env $choice timeout 90 "$BUILD/moex_model_bench" --layers 48 --out "$OUT/logs/moex_e2e.json" 2>&1 | grep -v "^{"
stamp "FP8 vs bf16 decode timings"
OUT="$OUT/logs" SKIP_BUILD=1 BUILD=$BUILD PARTS=perf COMPARE_OLD=0 timeout 60 bash bench/gpu_fp8_decode.sh 2>&1 | grep "^|"

stamp "decode-step profile"
SKIP_BUILD=1 BUILD=$BUILD PARTS=model OUT="$OUT/prof" timeout 120 bash bench/gpu_profile.sh > "$OUT/logs/profile.log" 2>&1
cp "$OUT/prof/model_kernels.txt" "$OUT/prof/model_sequence.txt" "$OUT/logs/" 2>/dev/null
tail -32 "$OUT/prof/model_kernels.txt" 2>/dev/null
rm -rf "$OUT/prof"
tar czf "$OUT/final4_logs.tgz" -C "$OUT" logs && rm -rf "$OUT/logs"
stamp done
