#!/usr/bin/env bash
# bench/gpu_session51b.sh — bench/gpu_session49.sh (one H200 call for issues 5 and 6) without the build where
# carried binaries run (bench/gpu_prebuilt.sh sets SKIP_BUILD=1): the T <= 64 FP8 table on the four shapes (default and
# the opt-in wide form, FP8_VARIANTS; two rounds), then issue 5's end-to-end table beside the reference, then its
# post-norm A/B with what is left of the call.
# Here: the binaries built for sm_90a only (no PTX, so that two of them fit the 64 MiB a call may carry):
#   cmake -S . -B /tmp/breal -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEX_CUDA=ON -DMOEX_CUDA_ARCHITECTURES=90a-real
#   PACK_TARGETS="moex_tests moex_model_bench" bash bench/gpu_prebuilt.sh pack /tmp/breal
# There (`run`, kind nvidia-h200, needs_h200, carry ["build-carry"]):
#   bash bench/gpu_prebuilt.sh run bench/gpu_session51b.sh
#   → $OUT/summary.txt, fp8_decode.md, ab.log, side_by_side.md, moex_e2e.json, ref_e2e.json, logs.tgz
set -u
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT/r"
export BUILD=${BUILD:-build-gpu}
t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader | tee "$OUT/summary.txt"
if [ -n "${SKIP_BUILD:-}" ] && [ -x "$BUILD/moex_tests" ] && [ -x "$BUILD/moex_model_bench" ]; then
  echo "carried binaries: no build" | tee -a "$OUT/summary.txt"
else
  OUT=$OUT/r PARTS=build bash bench/gpu_session28.sh 2>&1 | tail -5 | tee -a "$OUT/summary.txt"
fi
[ -x "$BUILD/moex_tests" ] || { echo "build failed"; exit 1; }
OUT=$OUT/r/fp8 PARTS=perf SKIP_BUILD=1 COMPARE_OLD=0 AB_ROUNDS=${AB_ROUNDS:-2} TOKENS=${TOKENS:-1,8,64} \
  AB_VARIANTS="${FP8_VARIANTS-wide:MOEX_CUDA_FP8_DECODE_TMA_WIDE=1}" bash bench/gpu_fp8_decode.sh 2>&1 |
  tail -16 | tee -a "$OUT/summary.txt"
cp "$OUT/r/fp8/fp8_decode.md" "$OUT/" 2> /dev/null
# issue 5's end-to-end table first (the bar's table), then the post-norm A/B with what is left of the call
OUT=$OUT/r PARTS=model SKIP_BUILD=1 DEADLINE=$(( ${CALL_LIMIT:-590} - ($(date +%s) - t0) )) bash bench/gpu_session28.sh 2>&1 |
  tail -20 | tee -a "$OUT/summary.txt"
OUT=$OUT/r PARTS=ab SKIP_BUILD=1 AB_PREFILLS=2048 AB_BATCHES=1,8 AB_ROUNDS=2 AB_VARIANTS="nopost:MOEX_CUDA_FUSE_POST_NORM=0" \
  DEADLINE=$(( ${CALL_LIMIT:-590} - ($(date +%s) - t0) )) bash bench/gpu_session28.sh 2>&1 | tail -12 | tee -a "$OUT/summary.txt"
for f in ab.log side_by_side.md moex_e2e.json ref_e2e.json; do cp "$OUT/r/$f" "$OUT/" 2> /dev/null; done
tar czf "$OUT/logs.tgz" -C "$OUT" r && rm -rf "$OUT/r"
ls "$OUT"
