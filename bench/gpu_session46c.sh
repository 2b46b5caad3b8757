#!/usr/bin/env bash
# bench/gpu_session46c.sh — the converting up GEMM (X = 6) as grouped_mm's FP8 default from 256 pairs
# per expert (deepgemm.cu's kConvMinRowsPerExpert), through bench/gpu_prebuilt.sh run:
#   tests  CudaFp8Prefill (every mode) and CudaEquivalence (its large FP8 cases now take X = 6)
#   perf   CUDA-graph replay, bf16 and FP8 grouped_mm at T = 512 / 4096 on the four SPEC §9 shapes:
#          the new default against "x1" (MOEX_CUDA_FP8_X_CONV=0: the previous default), AB_ROUNDS
#          interleaved rounds → $OUT/fp8_decode.md
set -u
export OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
PARTS=${PARTS:-"build tests perf"} TEST_TIMEOUT=${TEST_TIMEOUT:-300} \
  TEST_FILTER=${TEST_FILTER:-'*CudaFp8Prefill*:*CudaEquivalence.EveryCudaBackend*'} AB_ROUNDS=${AB_ROUNDS:-2} \
  AB_VARIANTS=${AB_VARIANTS:-"x1:MOEX_CUDA_FP8_X_CONV=0"} STEPS=${STEPS:-none} \
  bash bench/gpu_session43.sh
rm -f "$OUT"/perf_*.log "$OUT/build.log"
ls "$OUT"
