#!/usr/bin/env bash
# bench/gpu_session46a.sh — X = 6's stall samples only (the forty-sixth session's first profile of the
# rewritten converter), through bench/gpu_prebuilt.sh run (a carried moex_tests; SKIP_BUILD=1):
#   ncu of one X = 6 up GEMM launch (qwen3_30b_a3b T = 4096) → $OUT/ncu_stalls.txt, the per-SASS
#   source page $OUT/stalls_x6_source.csv.gz and its summary $OUT/stalls_x6_summary.txt
#   (bench/stall_summary.py). At most 8 files come back: nothing else is written under $OUT.
set -u
export OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
[ -n "${SKIP_BUILD:-}" ] || PARTS=build bash bench/gpu_fp8_decode.sh
PARTS=" " NCU_VARIANTS=" " NCU_STALLS=1 NCU_STALL_X=6 NCU_STALL_ENV=MOEX_CUDA_FP8_X_CONV=1 AB_VARIANTS=" " \
  bash bench/gpu_session43.sh
rm -f "$OUT/ncu_stalls.log" "$OUT/build.log"
python3 bench/stall_summary.py "$OUT/stalls_x6_source.csv.gz" F2FP 40 > "$OUT/stalls_x6_summary.txt" 2>&1
head -80 "$OUT/stalls_x6_summary.txt"
ls "$OUT"
