#!/usr/bin/env bash
# bench/gpu_session45.sh — the first GPU call for the converting exact FP8 kernel (X = 6,
# MOEX_CUDA_FP8_X_CONV=1; built in the forty-fourth session, which got no device machine), from the
# repository root (`run` with `bash bench/gpu_session45.sh`), through bench/gpu_session43.sh:
#   build  CUDA Release (moex, moex_tests)
#   tests  CudaFp8Prefill (every mode, X = 6's two included, f32 / f16 / bf16) and CudaEquivalence
#   perf   CUDA-graph replay of one forward, bf16 and FP8 grouped_mm at T = 512 / 4096 on the four SPEC §9
#          shapes, the default against "conv" (X = 6) → $OUT/fp8_decode.md (issue 6: FP8 >= bf16 at T = 4096)
#   ncu    the TMA GEMMs of qwen3_30b_a3b T = 4096 (FP8 grouped_mm), default against X = 6 → $OUT/ncu_x.md
# Second call (warm, same build): PARTS="sanitize perf" SKIP_BUILD=1 AB_ROUNDS=2 NCU_STALLS=1 NCU_STALL_X=6
# NCU_STALL_ENV=MOEX_CUDA_FP8_X_CONV=1 bash bench/gpu_session45.sh (memcheck on the bf16 prefill cases,
# two more timing rounds, X = 6's stall reasons).
set -u
export PARTS=${PARTS:-"build tests perf"} TEST_TIMEOUT=${TEST_TIMEOUT:-240} \
  TEST_FILTER=${TEST_FILTER:-'*CudaFp8Prefill*:*CudaEquivalence*'} AB_ROUNDS=${AB_ROUNDS:-1} \
  AB_VARIANTS=${AB_VARIANTS:-"conv:MOEX_CUDA_FP8_X_CONV=1"} STEPS=${STEPS:-ncu} \
  NCU_VARIANTS=${NCU_VARIANTS:-"base:MOEX_CUDA_FP8_X_CONV=0 conv:MOEX_CUDA_FP8_X_CONV=1"}
exec bash bench/gpu_session43.sh
