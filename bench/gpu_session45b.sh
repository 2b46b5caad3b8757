#!/usr/bin/env bash
# bench/gpu_session45b.sh — a short call on a fresh GPU machine after a change to the converting exact
# FP8 kernel (X = 6, MOEX_CUDA_FP8_X_CONV=1), from the repository root (`run` with
# `bash bench/gpu_session45b.sh`), through bench/gpu_session43.sh:
#   build  CUDA Release (moex, moex_tests)
#   tests  CudaFp8Prefill's X = 6 modes only (MOEX_TEST_FP8_CONV_ONLY=1; f32 / f16 / bf16)
#   perf   CUDA-graph replay, bf16 and FP8 grouped_mm at T = 512 / 4096 on the four SPEC §9 shapes,
#          the default (X = 1) against "conv" (X = 6), one round → $OUT/fp8_decode.md
#   ncu    the TMA GEMMs of qwen3_30b_a3b T = 4096, X = 1 against X = 6 → $OUT/ncu_x.md, and X = 6's
#          stall reasons and pipe use (one launch) → $OUT/ncu_stalls.txt, $OUT/stalls_x6_source.csv.gz
set -u
export MOEX_TEST_FP8_CONV_ONLY=1
export PARTS=${PARTS:-"build tests perf"} TEST_TIMEOUT=${TEST_TIMEOUT:-120} \
  TEST_FILTER=${TEST_FILTER:-'*CudaFp8Prefill*'} AB_ROUNDS=${AB_ROUNDS:-1} \
  AB_VARIANTS=${AB_VARIANTS:-"conv:MOEX_CUDA_FP8_X_CONV=1"} STEPS=${STEPS:-ncu} \
  NCU_VARIANTS=${NCU_VARIANTS:-"base:MOEX_CUDA_FP8_X_CONV=0 conv:MOEX_CUDA_FP8_X_CONV=1"} \
  NCU_STALLS=${NCU_STALLS:-1} NCU_STALL_X=${NCU_STALL_X:-6} NCU_STALL_ENV=${NCU_STALL_ENV:-MOEX_CUDA_FP8_X_CONV=1}
exec bash bench/gpu_session43.sh
