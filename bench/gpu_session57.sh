#!/usr/bin/env bash
# bench/gpu_session57.sh — the fifty-seventh session's GPU call (issue 5 on the H200: the final tree's tests, the
# end-to-end table, the defaults chosen on H100s A/B'd on the H200, the per-kernel timeline), through carried
# binaries:
#   here:  PACK_TARGETS="moex_tests moex_model_bench" bash bench/gpu_prebuilt.sh pack /tmp/breal
#          xz -T0 -6 -c /tmp/btrace/moex_model_bench > build-carry/moex_model_bench_trace.xz
#          (/tmp/btrace: the same tree configured with -DMOEX_CUDA_TRACE=ON)
#   there: CALL_LIMIT=570 bash bench/gpu_prebuilt.sh run bench/gpu_session57.sh   (carry ["build-carry"])
# REQUIRE_GPU=H200: nothing runs unless the card's name contains it.
# Steps (PARTS, default "new e2e suite ab trace", in this order, each skipped when too little of CALL_LIMIT is left):
#   new    batched_mm's equivalence tests (the expert-shared form's 4-block kernels bit for bit with the per-pair
#          ones), the model's switching and graph tests, the every-slot-dropped helper's tests → new_tests.log
#   e2e    issue 5's end-to-end table beside the reference library (bench/gpu_session28.sh PARTS=model)
#   suite  the GPU suite, $TEST_FILTER (default every CUDA and deepgemm test but the timed one) → tests.log
#   ab     moex_model_bench at --batches $AB_BATCHES (default 1,8), switch+graphs, $AB_ROUNDS (default 2)
#          interleaved rounds of $AB_VARIANTS (default: base; nopost = MOEX_CUDA_FUSE_POST_NORM=0, the
#          post-attention norm as its own kernel; kvf32 = MOEX_CUDA_KV_CACHE=f32) → ab_<variant>_<round>.txt
#   trace  the traced moex_model_bench (build-gpu/moex_model_bench_trace) at batch 1, bench/trace_report.py
#          → trace_report.md
# → $OUT/summary.txt and logs.tgz (everything else: a call brings back only a few files)
set -u
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export BUILD=${BUILD:-build-gpu} MOEX_SOURCE_DIR=$PWD
PARTS=${PARTS:-"new e2e suite ab trace"}
has() { [[ " $PARTS " == *" $1 "* ]]; }
t0=$(date +%s)
limit=${CALL_LIMIT:-560}
left() { echo $(( limit - ($(date +%s) - t0) )); }
envs_of() { [ "${1:--}" = "-" ] && return; echo "${1//,/ }"; }
gpu=$(nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader | head -1)
echo "== $gpu; tree $(cat build-carry/commit 2> /dev/null); parts: $PARTS" | tee "$OUT/summary.txt"
# REQUIRE_GPU=H200: stop at once on any other card (a call that asks for the bar's card may get an H100)
if [ -n "${REQUIRE_GPU:-}" ] && [[ "$gpu" != *"$REQUIRE_GPU"* ]]; then
  echo "not a $REQUIRE_GPU: stopping" | tee -a "$OUT/summary.txt"
  exit 0
fi

if has new && [ "$(left)" -gt 60 ]; then
  timeout $(( $(left) - 30 )) "$BUILD/moex_tests" \
    --gtest_filter='*CudaEquivalence.BatchedMm*:CudaModelSwitching.*:CudaModelGraphs.*:CudaFp8Decode.AllSlotsDroppedGiveZeros*' \
    > "$OUT/new_tests.log" 2>&1
  echo "new tests rc $? at $(( $(date +%s) - t0 )) s" | tee -a "$OUT/summary.txt"
  grep -E "expert-shared|^\[  (PASSED|FAILED) |FAILED  \]|Failure" "$OUT/new_tests.log" | head -30 |
    tee -a "$OUT/summary.txt"
fi

if has e2e && [ "$(left)" -gt 120 ]; then
  OUT=$OUT/r PARTS=model SKIP_BUILD=1 DEADLINE=$(( $(left) - 10 )) bash bench/gpu_session28.sh 2>&1 |
    tail -24 | tee -a "$OUT/summary.txt"
  for f in side_by_side.md moex_e2e.json ref_e2e.json model.txt progress.log; do cp "$OUT/r/$f" "$OUT/" 2> /dev/null; done
  rm -rf "$OUT/r"
  echo "e2e done at $(( $(date +%s) - t0 )) s" | tee -a "$OUT/summary.txt"
fi

if has suite && [ "$(left)" -gt 100 ]; then
  OUT=$OUT/r PARTS=tests SKIP_BUILD=1 TEST_TIMEOUT=$(( $(left) - 15 )) \
    TEST_FILTER="${TEST_FILTER:-*Cuda*:*DeepGemm*:-CudaPerf.*}" bash bench/gpu_check.sh 2>&1 | tail -12 | tee -a "$OUT/summary.txt"
  cp "$OUT/r/tests.log" "$OUT/" 2> /dev/null
  rm -rf "$OUT/r"
  echo "suite done at $(( $(date +%s) - t0 )) s" | tee -a "$OUT/summary.txt"
fi

if has ab; then
  variants=${AB_VARIANTS:-"base:- nopost:MOEX_CUDA_FUSE_POST_NORM=0 kvf32:MOEX_CUDA_KV_CACHE=f32"}
  for round in $(seq 1 "${AB_ROUNDS:-2}"); do
    for v in $variants; do
      [ "$(left)" -gt 45 ] || break 2
      name=${v%%:*}
      # shellcheck disable=SC2046
      env $(envs_of "${v#*:}") timeout $(( $(left) - 5 )) "$BUILD/moex_model_bench" --layers 48 --prompt 2048 \
        --decode-prompt 128 --new 64 --batches "${AB_BATCHES:-1,8}" --variants switch+graphs \
        --out "$OUT/ab_${name}_$round.json" > "$OUT/ab_${name}_$round.txt" 2>&1
      echo "== ab $name round $round (rc $?, at $(( $(date +%s) - t0 )) s): $(grep -E "^#" "$OUT/ab_${name}_$round.txt" | head -1)" |
        tee -a "$OUT/summary.txt"
      grep -E "^decode" "$OUT/ab_${name}_$round.txt" | head -6 | tee -a "$OUT/summary.txt"
    done
  done
fi

if has trace && [ "$(left)" -gt 60 ] && [ -x "$BUILD/moex_model_bench_trace" ]; then
  timeout $(( $(left) - 20 )) "$BUILD/moex_model_bench_trace" --layers 48 --prompt 2048 --new 32 --batches 1 \
    --variants switch+graphs --trace "$OUT/trace.csv" --trace-steps "${TRACE_STEPS:-8}" > "$OUT/trace_bench.txt" 2>&1
  echo "traced bench rc $? at $(( $(date +%s) - t0 )) s" | tee -a "$OUT/summary.txt"
  timeout 60 python3 bench/trace_report.py "$OUT/trace.csv" --json "$OUT/trace_report.json" \
    --launches "$OUT/launches.csv" > "$OUT/trace_report.md" 2>&1
  head -40 "$OUT/trace_report.md" | tee -a "$OUT/summary.txt"
  rm -f "$OUT/trace.csv" "$OUT/launches.csv"  # ~100 MB of block records: kept off the way back
fi

echo "done at $(( $(date +%s) - t0 )) s" | tee -a "$OUT/summary.txt"
( cd "$OUT" && tar czf /tmp/logs57.tgz --exclude=summary.txt . && find . -type f ! -name summary.txt -delete &&
  mv /tmp/logs57.tgz logs.tgz )
ls "$OUT"
