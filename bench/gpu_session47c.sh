#!/usr/bin/env bash
# bench/gpu_session47c.sh — issue 5: the batch-1 decode step's fused norms (the input RMSNorm inside the qkv
# GEMV, the post-attention RMSNorm inside the router's cluster kernel), first call: the model tests on a
# carried moex_tests (bench/gpu_prebuilt.sh run), the fused-norm tests under compute-sanitizer.
#   → $OUT/tests.log, $OUT/memcheck.log, $OUT/racecheck.log
set -u
OUT=${OUT:-$PWD/out}
BUILD=${BUILD:-build-gpu}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,driver_version --format=csv,noheader
timeout 300 "$BUILD/moex_tests" --gtest_filter="${TEST_FILTER:-CudaModel*:CudaAttentionKernels.*}" > "$OUT/tests.log" 2>&1
echo "tests rc $?"
grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]|^\[       OK \]" "$OUT/tests.log" | head -60
grep -B3 -A15 "Failure" "$OUT/tests.log" | head -80
for tool in memcheck racecheck; do
  timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 "$BUILD/moex_tests" \
    --gtest_filter="${SANITIZE_FILTER:-CudaModelKernels.FusedNorms*}" > "$OUT/$tool.log" 2>&1
  echo "$tool rc $? ($(grep -c 'Invalid' "$OUT/$tool.log") invalid, $(grep -ci 'hazard' "$OUT/$tool.log") hazard lines)"
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/$tool.log" | head -2
done
