#!/usr/bin/env bash
# bench/gpu_session4.sh — one call on the GPU machine for the runtime and FP8-decode work
# (`run` with command `bash bench/gpu_session4.sh`), from the repository root:
#   1. build moex, moex_tests, moex_model_bench (CUDA, Release) into $BUILD
#   2. model runtime tests: the new attention kernels (CudaAttentionKernels), the runtime kernels
#      (CudaModelKernels), parity of every fixture for every CUDA backend, switching, graphs
#   3. moex_model_bench (random Qwen3-30B-A3B, 48 layers): prefill, decode batch 1/8/64, floor;
#      then prefill with one-term linears (MOEX_CUDA_LINEAR_TERMS=1) and its parity test
#   4. FP8 decode path: tests (CudaFp8Decode, CudaGraph, CudaEquivalence with few generated cases)
#      and CUDA-graph timings bf16 vs FP8 (bench/gpu_fp8_decode.sh PARTS=perf)
# PARTS selects steps (default "build model bench fp8"). Logs packed in $OUT/s4_logs.tgz.
set -u
OUT=${OUT:-$PWD/out}
export MOEX_SOURCE_DIR=$PWD
mkdir -p "$OUT/logs"
BUILD=${BUILD:-build-gpu}
PARTS=${PARTS:-"build model bench fp8"}
has() { case " $PARTS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
t0=$(date +%s)
stamp() { echo "== $1 ($(( $(date +%s) - t0 )) s)"; }

if has build; then
  stamp build
  { cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEX_CUDA=ON &&
    cmake --build "$BUILD" -j "$(nproc)" --target moex moex_tests moex_model_bench; } > "$OUT/logs/build.log" 2>&1 ||
    { grep -E "error" "$OUT/logs/build.log" | head -30; exit 1; }
fi

if has model; then
  stamp "model tests"
  for f in 'CudaAttentionKernels*:CudaModelKernels*' '*CudaModelParity.F32*' '*CudaModelParity.Bf16*' \
           'CudaModelSwitching*:CudaModelGraphs*:CudaModelErrors*:CudaModelAttention*:CudaModelLinear*:CudaModelRouters*:CudaModelFp8*:CudaModelFlash*:*ModelFlash*'; do
    timeout 150 "$BUILD/moex_tests" --gtest_filter="$f" >> "$OUT/logs/model_tests.log" 2>&1
    echo "model tests '$f': rc $?"
  done
  grep -E "^\[  (FAILED|PASSED|SKIPPED) |^\[  FAILED  \]" "$OUT/logs/model_tests.log" | head -40
  grep -B3 -A12 "Failure" "$OUT/logs/model_tests.log" | head -80
fi

if has bench; then
  stamp "moex_model_bench"
  timeout 150 "$BUILD/moex_model_bench" --layers 48 --out "$OUT/moex_e2e.json" 2>&1 | grep -v "^{" | tee "$OUT/logs/model_bench.log"
  stamp "prefill with one-term linears"
  MOEX_CUDA_LINEAR_TERMS=1 timeout 90 "$BUILD/moex_model_bench" --layers 48 --batches 1 --new 2 --out "$OUT/moex_e2e_1term.json" 2>&1 |
    grep -E "prefill|floor" | tee -a "$OUT/logs/model_bench.log"
fi

if has fp8; then
  stamp "fp8 decode tests"
  MOEX_CUDA_TEST_CASES=${MOEX_CUDA_TEST_CASES:-20} timeout 200 "$BUILD/moex_tests" \
    --gtest_filter='*CudaFp8Decode*:*CudaGraph*:*CudaEquivalence*' > "$OUT/logs/fp8_tests.log" 2>&1
  echo "fp8 tests rc $?"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]|worst rel L2" "$OUT/logs/fp8_tests.log" | head -30
  grep -B2 -A10 "Failure" "$OUT/logs/fp8_tests.log" | head -50
  stamp "fp8 decode timings"
  OUT="$OUT" SKIP_BUILD=1 BUILD=$BUILD PARTS=perf COMPARE_OLD=0 bash bench/gpu_fp8_decode.sh 2>&1 | tail -20
fi
mv "$OUT"/perf*.log "$OUT/logs/" 2>/dev/null
tar czf "$OUT/s4_logs.tgz" -C "$OUT" logs && rm -rf "$OUT/logs"
stamp done
