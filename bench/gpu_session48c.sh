#!/usr/bin/env bash
# bench/gpu_session48c.sh — the final tree of the forty-eighth session on one GPU machine, with a
# moex_tests built here: the GPU suite (`*Cuda*:*DeepGemm*:-CudaPerf.*`, bench/gpu_check.sh's tests
# step) and issue 6's qwen T = 1 / 8 cells with the TMA ring on (default) and off.
# Here: bash bench/gpu_prebuilt.sh pack   There (`run`, carry ["build-carry"]):
#   bash bench/gpu_prebuilt.sh run bench/gpu_session48c.sh   → $OUT/summary.txt, tests.log, fp8_decode.md
set -u
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export BUILD=${BUILD:-build-gpu}
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader | tee "$OUT/summary.txt"
OUT=$OUT/suite PARTS="tests" SKIP_BUILD=1 TEST_TIMEOUT=${TEST_TIMEOUT:-470} \
  TEST_FILTER="${TEST_FILTER:-*Cuda*:*DeepGemm*:-CudaPerf.*}" bash bench/gpu_check.sh 2>&1 | tail -30 | tee -a "$OUT/summary.txt"
cp "$OUT/suite/tests.log" "$OUT/" 2> /dev/null
OUT=$OUT/t1 PARTS="perf" SKIP_BUILD=1 COMPARE_OLD=0 AB_ROUNDS=${AB_ROUNDS:-2} SHAPES=qwen3_30b_a3b,qwen15_moe_a2_7b TOKENS=1,8 \
  AB_VARIANTS="reg:MOEX_CUDA_FP8_DECODE_TMA=0" bash bench/gpu_fp8_decode.sh 2>&1 | tee -a "$OUT/summary.txt"
cp "$OUT/t1/fp8_decode.md" "$OUT/" 2> /dev/null
tar czf "$OUT/logs.tgz" -C "$OUT" suite t1 2> /dev/null && rm -rf "$OUT/suite" "$OUT/t1"
ls "$OUT"
