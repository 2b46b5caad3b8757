#!/usr/bin/env bash
# bench/gpu_final4.sh — the fourth session's closing call on the GPU machine (`run` with command
# `bash bench/gpu_final4.sh`), from the repository root:
#   1. build and the model-runtime GPU tests (bench/gpu_session4.sh PARTS="build model", logs in
#      $OUT/s4/s4_logs.tgz)
#   2. issue 3: A/B of grouped GEMM variants (AB_VARIANTS, gpu_issue3.sh's default unless set), GPU
#      tests of the experts backends (CudaEquivalence f16/bf16 with MOEX_CUDA_TEST_CASES generated
#      cases, CudaGraph, CudaBackends) and the side-by-side table with the reference
#      (bench/gpu_issue3.sh with SKIP_BUILD=1; the chosen variant is exported for its tests)
#   3. moex_model_bench (48 layers, with the table's grouped GEMM settings) and the FP8 vs bf16
#      decode timings (bench/gpu_fp8_decode.sh PARTS=perf)
#   4. the per-kernel ncu profile of the model runtime's decode step (bench/gpu_profile.sh PARTS=model)
set -u
OUT=${OUT:-$PWD/out}
export MOEX_SOURCE_DIR=$PWD
mkdir -p "$OUT/logs"
BUILD=${BUILD:-build-gpu}
t0=$(date +%s)
stamp() { echo "== $1 ($(( $(date +%s) - t0 )) s)"; }
stamp "build + model tests (bench/gpu_session4.sh PARTS=\"build model\")"
OUT="$OUT/s4" BUILD=$BUILD PARTS="build model" bash bench/gpu_session4.sh || exit 1

stamp "issue 3 (A/B, tests, bench, reference, table)"
SKIP_BUILD=1 BUILD=$BUILD MOEX_CUDA_TEST_CASES=${MOEX_CUDA_TEST_CASES:-10} \
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
