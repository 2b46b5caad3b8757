#!/usr/bin/env bash
# bench/gpu_session49.sh — one H200 call for issues 5 and 6 (H200s come rarely: both in one start).
# Builds moex, moex_tests and moex_model_bench there (the two binaries together exceed the 64 MiB a
# call may carry), then
#   1. issue 6's T <= 64 table on the four shapes with the FP8 decode path's TMA ring (default) beside
#      the register ring (MOEX_CUDA_FP8_DECODE_TMA=0) and the opt-in wide form (_WIDE=1), two rounds
#      (bench/gpu_fp8_decode.sh, CUDA-graph replay);
#   2. issue 5 on the bar's machine: the post-attention norm fusion A/B and the end-to-end table beside
#      the reference library (bench/gpu_session28.sh's ab and model steps; its batch-64 run needs > 80 GB).
# `run` with kind nvidia-h200 and needs_h200: bash bench/gpu_session49.sh
#   → $OUT/summary.txt, fp8_decode.md, ab.log, side_by_side.md, moex_e2e.json, ref_e2e.json, logs.tgz
set -u
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT/r"
export BUILD=${BUILD:-build-gpu}
t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader | tee "$OUT/summary.txt"
OUT=$OUT/r PARTS=build bash bench/gpu_session28.sh 2>&1 | tail -5 | tee -a "$OUT/summary.txt"
[ -x "$BUILD/moex_tests" ] || { echo "build failed"; exit 1; }
OUT=$OUT/r/fp8 PARTS=perf SKIP_BUILD=1 COMPARE_OLD=0 AB_ROUNDS=${AB_ROUNDS:-2} TOKENS=${TOKENS:-1,8,64} \
  AB_VARIANTS="reg:MOEX_CUDA_FP8_DECODE_TMA=0 wide:MOEX_CUDA_FP8_DECODE_TMA_WIDE=1" bash bench/gpu_fp8_decode.sh 2>&1 |
  tail -16 | tee -a "$OUT/summary.txt"
cp "$OUT/r/fp8/fp8_decode.md" "$OUT/" 2> /dev/null
# issue 5 with what is left of the call (gpu_session28's own clock starts now)
OUT=$OUT/r PARTS="ab model" SKIP_BUILD=1 AB_PREFILLS=2048 AB_BATCHES=1,8 AB_ROUNDS=2 \
  AB_VARIANTS="nopost:MOEX_CUDA_FUSE_POST_NORM=0" \
  DEADLINE=$(( ${CALL_LIMIT:-590} - ($(date +%s) - t0) )) bash bench/gpu_session28.sh 2>&1 | tail -30 | tee -a "$OUT/summary.txt"
for f in ab.log side_by_side.md moex_e2e.json ref_e2e.json; do cp "$OUT/r/$f" "$OUT/" 2> /dev/null; done
tar czf "$OUT/logs.tgz" -C "$OUT" r && rm -rf "$OUT/r"
ls "$OUT"
