#!/usr/bin/env bash
# bench/gpu_session47b.sh — issue 6's T = 1 cells: decode_down with its weight slice copied into shared
# memory before pdl_wait (MOEX_CUDA_FP8_DECODE_WSM, default on where the grid is one wave), through
# bench/gpu_prebuilt.sh run (a carried moex_tests: SKIP_BUILD=1; else it builds):
#   tests     CudaFp8Decode (every switch incl. WSM=0), CudaFp8Route.DecodeDownWeightsInSharedMemoryMatchBitForBit,
#             CudaGraph (replays bit for bit)                                          → $OUT/tests.log
#   sanitize  memcheck + racecheck on the bit-for-bit test and the bf16 decode cases → $OUT/{memcheck,racecheck}.log
#   perf      CUDA-graph replay, bf16 and FP8 at T = 1 / 8 on the four SPEC §9 shapes, the default against
#             wsm0 (the register ring), AB_ROUNDS interleaved rounds                 → $OUT/fp8_decode.md
# At most 8 files come back from $OUT: the per-run logs are removed at the end.
set -u
export OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
PARTS=${PARTS:-"tests sanitize perf"} TEST_TIMEOUT=${TEST_TIMEOUT:-240} \
  TEST_FILTER=${TEST_FILTER:-'*CudaFp8Decode*:CudaFp8Route.Decode*:*CudaGraph*'} \
  SANITIZE_FILTER=${SANITIZE_FILTER:-'CudaFp8Route.DecodeDown*:Dtypes/CudaFp8Decode.MatchesTheReference/bf16'} \
  SANITIZE_TIMEOUT=${SANITIZE_TIMEOUT:-120} TOKENS=${TOKENS:-1,8} COMPARE_OLD=0 AB_ROUNDS=${AB_ROUNDS:-3} \
  AB_VARIANTS=${AB_VARIANTS:-"wsm0:MOEX_CUDA_FP8_DECODE_WSM=0"} bash bench/gpu_fp8_decode.sh
rm -f "$OUT"/perf_*.log "$OUT/build.log"
ls "$OUT"
