#!/usr/bin/env bash
# bench/gpu_session43.sh — issue 6's FP8 prefill bar with the wide exact kernel (X = 4,
# MOEX_CUDA_FP8_X_WIDE=1, written in the forty-third session without a GPU), one call on the GPU
# machine from the repository root (`run` with `bash bench/gpu_session43.sh`), through
# bench/gpu_fp8_decode.sh:
#   build     CUDA Release (moex, moex_tests)
#   sass      HGMMA / F2FP / local-memory counts of the exact kernels, X = 1 and the wide ones
#   tests     CudaFp8Prefill (every mode, the wide kernel's four included), CudaFp8Decode,
#             CudaEquivalence (its fixed cases include zero weight blocks with scale 0), CudaGraph,
#             CudaFp8Route
#   sanitize  compute-sanitizer memcheck on the bf16 prefill cases (every mode)
#   perf      CUDA-graph replay, bf16 and FP8 grouped_mm at T = 512 / 4096 on the four SPEC §9
#             shapes: the default (X = 1 up GEMM) and "wide", AB_ROUNDS (default 2) interleaved rounds
# Then the table to read: $OUT/fp8_decode.md, "best bf16 / best FP8" per variant (issue 6 asks FP8
# prefill no slower than bf16: >= 1.00x at T = 4096).
set -u
export OUT=${OUT:-$PWD/out}
PARTS=${PARTS:-"build sass tests sanitize perf"} \
TEST_FILTER=${TEST_FILTER:-"*CudaFp8Prefill*:*CudaFp8Decode*:*CudaEquivalence*:*CudaGraph*:CudaFp8Route.*"} \
SANITIZE_FILTER=${SANITIZE_FILTER:-"Dtypes/CudaFp8Prefill.*/bf16"} SANITIZE_TOOLS=${SANITIZE_TOOLS:-memcheck} \
TOKENS=${TOKENS:-512,4096} COMPARE_OLD=0 PERF_BACKENDS=${PERF_BACKENDS:-grouped_mm} \
AB_VARIANTS=${AB_VARIANTS:-"wide:MOEX_CUDA_FP8_X_WIDE=1"} AB_ROUNDS=${AB_ROUNDS:-2} \
  bash bench/gpu_fp8_decode.sh
