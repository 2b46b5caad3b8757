#!/usr/bin/env bash
# (X = 7 and later X = 8 were removed, forty-sixth / forty-seventh sessions: MOEX_CUDA_FP8_X_CONV=2 now selects nothing, i.e. off.)
# bench/gpu_session46b.sh — the forty-sixth session's call after adding X = 7 (the converting exact FP8
# kernel with the weights loaded into registers, MOEX_CUDA_FP8_X_CONV=2), through
# bench/gpu_prebuilt.sh run (a carried moex_tests: SKIP_BUILD=1; else it builds):
#   tests  CudaFp8Prefill's converting modes (X = 6 and X = 7; MOEX_TEST_FP8_CONV_ONLY=1, f32 / f16 / bf16)
#          and CudaFp8Route.ConvertingKernelsMatchBitForBit → $OUT/tests.log
#   perf   CUDA-graph replay, bf16 and FP8 grouped_mm at T = 512 / 4096 on the four SPEC §9 shapes:
#          the default (X = 1), conv (X = 6), conv2 (X = 7), AB_ROUNDS rounds → $OUT/fp8_decode.md
#   ncu    the TMA GEMMs of qwen3_30b_a3b T = 4096 per variant → $OUT/ncu_x.md; X = 7's stall samples →
#          $OUT/ncu_stalls.txt, $OUT/stalls_x7_summary.txt (bench/stall_summary.py), the source page
#          $OUT/stalls_x7_source.csv.gz
# At most 8 files come back from $OUT: the per-run logs are removed at the end.
# Ran once (tree 97b789c, docs/PERF.md, forty-sixth session, call 2); X = 7 was removed afterwards (1.9x
# slower than X = 6). MOEX_CUDA_FP8_X_CONV=2 now selects X = 8, a different kernel (the e4m3 staging
# ring; bench/gpu_session47.sh measures it), so this script's "conv2" figures belong to X = 7 only.
set -u
export OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export MOEX_TEST_FP8_CONV_ONLY=1
PARTS=${PARTS:-"build tests perf"} TEST_TIMEOUT=${TEST_TIMEOUT:-200} \
  TEST_FILTER=${TEST_FILTER:-'*CudaFp8Prefill*:CudaFp8Route.Converting*'} AB_ROUNDS=${AB_ROUNDS:-1} \
  AB_VARIANTS=${AB_VARIANTS:-"conv:MOEX_CUDA_FP8_X_CONV=1 conv2:MOEX_CUDA_FP8_X_CONV=2"} STEPS=${STEPS:-ncu} \
  NCU_VARIANTS=${NCU_VARIANTS:-"base:MOEX_CUDA_FP8_X_CONV=0 conv:MOEX_CUDA_FP8_X_CONV=1 conv2:MOEX_CUDA_FP8_X_CONV=2"} \
  NCU_STALLS=${NCU_STALLS:-1} NCU_STALL_X=${NCU_STALL_X:-7} NCU_STALL_ENV=${NCU_STALL_ENV:-MOEX_CUDA_FP8_X_CONV=2} \
  bash bench/gpu_session43.sh
python3 bench/stall_summary.py "$OUT/stalls_x${NCU_STALL_X:-7}_source.csv.gz" F2FP 40 > "$OUT/stalls_x${NCU_STALL_X:-7}_summary.txt" 2>&1
head -60 "$OUT/stalls_x${NCU_STALL_X:-7}_summary.txt"
rm -f "$OUT"/perf_*.log "$OUT"/ncu_x_*.csv "$OUT/ncu_stalls.log" "$OUT/build.log"
grep -E "^\[  (PASSED|FAILED) |Failure|worst rel L2" "$OUT/tests.log" | head -20
ls "$OUT"
