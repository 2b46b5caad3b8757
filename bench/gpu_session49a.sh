#!/usr/bin/env bash
# bench/gpu_session49a.sh — the first of two back-to-back calls on an H200 (H200s come rarely): build moex,
# moex_tests and moex_model_bench there (bench/gpu_session28.sh's build step), then the GPU suite
# (`*Cuda*:*DeepGemm*:-CudaPerf.*`, bench/gpu_check.sh's tests step) with what is left of the call.
# The second call, on the same warm machine (its build-gpu/ kept): bash bench/gpu_session49.sh (its build is
# then a no-op; issue 6's T <= 64 table and issue 5's A/B and end-to-end table).
# `run` with kind nvidia-h200 and needs_h200: bash bench/gpu_session49a.sh → $OUT/summary.txt, tests.log, build.log
set -u
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT/r"
export BUILD=${BUILD:-build-gpu}
t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total,driver_version --format=csv,noheader | tee "$OUT/summary.txt"
OUT=$OUT/r PARTS=build bash bench/gpu_session28.sh 2>&1 | tail -5 | tee -a "$OUT/summary.txt"
cp "$OUT/r/build.log" "$OUT/" 2> /dev/null
[ -x "$BUILD/moex_tests" ] || { echo "build failed"; exit 1; }
echo "build done at $(( $(date +%s) - t0 )) s" | tee -a "$OUT/summary.txt"
OUT=$OUT/r/suite PARTS="tests" SKIP_BUILD=1 TEST_TIMEOUT=$(( ${CALL_LIMIT:-590} - ($(date +%s) - t0) - 10 )) \
  TEST_FILTER="${TEST_FILTER:-*Cuda*:*DeepGemm*:-CudaPerf.*}" bash bench/gpu_check.sh 2>&1 | tail -30 | tee -a "$OUT/summary.txt"
cp "$OUT/r/suite/tests.log" "$OUT/" 2> /dev/null
echo "done at $(( $(date +%s) - t0 )) s" | tee -a "$OUT/summary.txt"
rm -rf "$OUT/r"
ls "$OUT"
