#!/usr/bin/env bash
# (X = 8 was removed after this call, forty-seventh session: MOEX_CUDA_FP8_X_CONV=2 now selects nothing, i.e. off.)
# bench/gpu_session47.sh — the first call for X = 8 (the converting up GEMM with its e4m3 tiles staged in
# a ring of their own, opt-in MOEX_CUDA_FP8_X_CONV=2; built in the forty-sixth session, not yet run),
# through bench/gpu_prebuilt.sh run (a carried moex_tests: SKIP_BUILD=1; else it builds):
#   tests  CudaFp8Prefill's converting modes (X = 6 and X = 8; MOEX_TEST_FP8_CONV_ONLY=1, f32 / f16 / bf16)
#          and CudaFp8Route.ConvertingKernelsMatchBitForBit (X = 8's output equal to X = 6's) → $OUT/tests.log
#   perf   CUDA-graph replay, bf16 and FP8 grouped_mm at T = 512 / 4096 on the four SPEC §9 shapes: the
#          default (X = 6 from 256 pairs per expert, X = 1 below), x6 (X = 6 forced), x8 (X = 8 forced),
#          AB_ROUNDS rounds → $OUT/fp8_decode.md
#   ncu    the TMA GEMMs of qwen3_30b_a3b T = 4096 per variant → $OUT/ncu_x.md; X = 8's stall samples →
#          $OUT/ncu_stalls.txt, $OUT/stalls_x8_summary.txt (bench/stall_summary.py), $OUT/stalls_x8_source.csv.gz
# At most 8 files come back from $OUT: the per-run logs are removed at the end.
set -u
export OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export MOEX_TEST_FP8_CONV_ONLY=1
PARTS=${PARTS:-"build tests perf"} TEST_TIMEOUT=${TEST_TIMEOUT:-240} \
  TEST_FILTER=${TEST_FILTER:-'*CudaFp8Prefill*:CudaFp8Route.Converting*'} AB_ROUNDS=${AB_ROUNDS:-2} \
  AB_VARIANTS=${AB_VARIANTS:-"x6:MOEX_CUDA_FP8_X_CONV=1 x8:MOEX_CUDA_FP8_X_CONV=2"} STEPS=${STEPS:-ncu} \
  NCU_VARIANTS=${NCU_VARIANTS:-"x1:MOEX_CUDA_FP8_X_CONV=0 x6:MOEX_CUDA_FP8_X_CONV=1 x8:MOEX_CUDA_FP8_X_CONV=2"} \
  NCU_STALLS=${NCU_STALLS:-1} NCU_STALL_X=${NCU_STALL_X:-8} NCU_STALL_ENV=${NCU_STALL_ENV:-MOEX_CUDA_FP8_X_CONV=2} \
  bash bench/gpu_session43.sh
python3 bench/stall_summary.py "$OUT/stalls_x${NCU_STALL_X:-8}_source.csv.gz" F2FP 40 > "$OUT/stalls_x${NCU_STALL_X:-8}_summary.txt" 2>&1
head -40 "$OUT/stalls_x${NCU_STALL_X:-8}_summary.txt"
rm -f "$OUT"/perf_*.log "$OUT"/ncu_x_*.csv "$OUT/ncu_stalls.log" "$OUT/build.log"
grep -E "^\[  (PASSED|FAILED) |Failure|worst rel L2" "$OUT/tests.log" | head -20
ls "$OUT"
