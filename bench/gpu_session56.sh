#!/usr/bin/env bash
# bench/gpu_session56.sh — the fifty-sixth session's GPU call (batched_mm's expert-shared form), through the
# carried binaries:
#   here:  PACK_TARGETS="moex_tests moex_model_bench moex" bash bench/gpu_prebuilt.sh pack /tmp/breal
#   there: CALL_LIMIT=560 bash bench/gpu_prebuilt.sh run bench/gpu_session56.sh   (carry ["build-carry"])
# Steps (PARTS, default "new perf ab e2e suite", in this order, each skipped when too little of CALL_LIMIT is left):
#   new    the new test (expert-shared form bit for bit with the per-pair kernels, all dtypes), batched_mm's
#          other equivalence tests, the model's switching and graph tests → new_tests.log
#   perf   CudaPerf, batched_mm and grouped_mm on the four SPEC §9 shapes at $PERF_TOKENS (default
#          1,8,16,32,64,128,512), MOEX_CUDA_BATCHED_SHARED=0 (per pair) then unset (the default rule)
#          then 1 (forced) → perf_{0,auto,1}.log
#   (calls 3, 4 and 7 also had parts pipe, ring and occ: A/B runs of kernel variants chosen by temporary
#   variables, removed with the variants they measured; docs/PERF.md, fifty-sixth session)
#   prof   ncu of the expert-shared chain at qwen3_30b_a3b T = 64 → prof.txt
#   ab     moex_model_bench --batches $AB_BATCHES (default 1,8,64), switch+graphs and no_switch+graphs, with the default rule
#          and with MOEX_CUDA_BATCHED_SHARED=0 → ab_{auto,0}.txt
#   e2e    issue 5's end-to-end table beside the reference library (bench/gpu_session28.sh PARTS=model)
#   suite  the GPU suite, $TEST_FILTER (default every CUDA and deepgemm test but the timed one) → tests.log
# → $OUT/summary.txt (and the logs named above, side_by_side.md, moex_e2e.json, ref_e2e.json)
set -u
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export BUILD=${BUILD:-build-gpu} MOEX_SOURCE_DIR=$PWD
PARTS=${PARTS:-"new perf ab e2e suite"}
has() { [[ " $PARTS " == *" $1 "* ]]; }
t0=$(date +%s)
limit=${CALL_LIMIT:-560}
left() { echo $(( limit - ($(date +%s) - t0) )); }
echo "== $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -1); tree $(cat build-carry/commit 2> /dev/null); parts: $PARTS" |
  tee "$OUT/summary.txt"

if has new && [ "$(left)" -gt 60 ]; then
  timeout $(( $(left) - 30 )) "$BUILD/moex_tests" \
    --gtest_filter='*CudaEquivalence.BatchedMm*:CudaModelSwitching.*:CudaModelGraphs.*:CudaFp8Decode.AllSlotsDroppedGiveZeros*' \
    > "$OUT/new_tests.log" 2>&1
  echo "new tests rc $? at $(( $(date +%s) - t0 )) s" | tee -a "$OUT/summary.txt"
  grep -E "expert-shared|MOEX_CUDA_UP_CHANNELS|^\[  (PASSED|FAILED) |FAILED  \]|Failure" "$OUT/new_tests.log" | head -30 |
    tee -a "$OUT/summary.txt"
fi

if has perf; then
  for mode in 0 auto 1; do
    [ "$(left)" -gt 60 ] || break
    echo "== CudaPerf, MOEX_CUDA_BATCHED_SHARED=$mode" | tee -a "$OUT/summary.txt"
    ( [ "$mode" = auto ] && unset MOEX_CUDA_BATCHED_SHARED || export MOEX_CUDA_BATCHED_SHARED=$mode
      MOEX_CUDA_PERF=1 MOEX_CUDA_PERF_BACKENDS=batched_mm,grouped_mm MOEX_CUDA_PERF_TOKENS=${PERF_TOKENS:-1,8,16,32,64,128,512} \
        MOEX_CUDA_PERF_SHAPES=${PERF_SHAPES:-qwen3_30b_a3b,qwen15_moe_a2_7b,mixtral_8x7b,deepseek_v3} \
        timeout $(( $(left) - 10 )) "$BUILD/moex_tests" --gtest_filter='CudaPerf.Shapes' > "$OUT/perf_$mode.log" 2>&1 )
    grep -E "batched_mm|grouped_mm" "$OUT/perf_$mode.log" | grep -v "^\[" | head -60 | tee -a "$OUT/summary.txt"
  done
fi

if has prof && [ "$(left)" -gt 60 ]; then  # ncu: the expert-shared chain at qwen3_30b_a3b T = 64
  timeout $(( $(left) - 10 )) ncu --clock-control none -k "regex:shared_|combine|plan_" --launch-skip 4 --launch-count 4 \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
    "$BUILD/moex" bench --device cuda --backends batched_mm --shapes qwen3_30b_a3b --tokens 64 --min-time-ms 0 \
    --max-iters 2 --warmup 1 > "$OUT/prof.txt" 2>&1
  echo "ncu rc $?" | tee -a "$OUT/summary.txt"
  grep -E "^  [a-z_]+.*\(|Duration|DRAM Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Theoretical Occupancy" \
    "$OUT/prof.txt" | head -40 | tee -a "$OUT/summary.txt"
fi

if has ab; then
  for mode in auto 0; do
    [ "$(left)" -gt 60 ] || break
    echo "== moex_model_bench, MOEX_CUDA_BATCHED_SHARED=$mode" | tee -a "$OUT/summary.txt"
    ( [ "$mode" = auto ] && unset MOEX_CUDA_BATCHED_SHARED || export MOEX_CUDA_BATCHED_SHARED=$mode
      timeout $(( $(left) - 5 )) "$BUILD/moex_model_bench" --layers 48 --prompt 2048 --decode-prompt 128 \
        --new 64 --batches ${AB_BATCHES:-1,8,64} --variants switch+graphs,no_switch+graphs --out "$OUT/ab_$mode.json" > "$OUT/ab_$mode.txt" 2>&1 )
    grep -vE "^\s*$" "$OUT/ab_$mode.txt" | tail -10 | tee -a "$OUT/summary.txt"
  done
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

echo "done at $(( $(date +%s) - t0 )) s" | tee -a "$OUT/summary.txt"
# everything but the summary in one archive (a call brings back only a few files)
( cd "$OUT" && tar czf /tmp/logs56.tgz --exclude=summary.txt . && find . -type f ! -name summary.txt -delete &&
  mv /tmp/logs56.tgz logs.tgz )
ls "$OUT"
