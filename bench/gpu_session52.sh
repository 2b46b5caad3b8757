#!/usr/bin/env bash
# bench/gpu_session52.sh — one call that does what the card it lands on is needed for (fifty-second session):
# on an H200 (the bar's machine, > 100 GB) issue 5's end-to-end table beside the reference and its A/B
# (bench/gpu_session51b.sh: batch 64 needs more than an H100's 80 GB); on any other card the GPU suite
# (bench/gpu_session50a.sh). Run through the carried binaries:
#   here:  PACK_TARGETS="moex_tests moex_model_bench" bash bench/gpu_prebuilt.sh pack /tmp/breal
#   there: bash bench/gpu_prebuilt.sh run bench/gpu_session52.sh   (carry ["build-carry"])
# WANT=suite or WANT=e2e forces one of the two; TESTS_RESERVE (150 s) is what the end-to-end table leaves the tests.
set -u
mem_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1 | tr -d ' ')
want=${WANT:-$([ "${mem_mib:-0}" -gt 100000 ] && echo e2e || echo suite)}
echo "== $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), ${mem_mib} MiB: $want"
if [ "$want" = e2e ]; then
  # issue 5's end-to-end table beside the reference, then (in place of bench/gpu_session51b.sh's A/B) the tests
  # this session's code changed, with what is left of the call
  OUT=${OUT:-$PWD/out}
  mkdir -p "$OUT/r"
  export BUILD=${BUILD:-build-gpu} MOEX_SOURCE_DIR=$PWD
  t0=$(date +%s)
  OUT=$OUT/r PARTS=model SKIP_BUILD=1 DEADLINE=$(( ${CALL_LIMIT:-580} - ${TESTS_RESERVE:-150} )) bash bench/gpu_session28.sh 2>&1 |
    tail -20 | tee -a "$OUT/summary.txt"
  for f in side_by_side.md moex_e2e.json ref_e2e.json model.txt; do cp "$OUT/r/$f" "$OUT/" 2> /dev/null; done
  left=$(( ${CALL_LIMIT:-580} - ($(date +%s) - t0) - 15 ))
  if [ "$left" -gt 30 ]; then
    OUT=$OUT/r PARTS=tests SKIP_BUILD=1 TEST_TIMEOUT=$left \
      TEST_FILTER="*CudaFp8Decode*:*CudaFp8Prefill*:CudaModelGraphs.*:CudaModelSwitching.*" bash bench/gpu_check.sh 2>&1 |
      tail -12 | tee -a "$OUT/summary.txt"
  fi
  cp "$OUT/r/tests.log" "$OUT/" 2> /dev/null
  tar czf "$OUT/logs.tgz" -C "$OUT" r && rm -rf "$OUT/r"
  ls "$OUT"
else
  limit=${CALL_LIMIT:-590}
  SUITE_TIMEOUT=${SUITE_TIMEOUT:-$(( limit - 30 ))} CALL_LIMIT=$limit AB_VARIANTS=" " TOKENS=1 exec bash bench/gpu_session50a.sh
fi
