#!/usr/bin/env bash
# bench/gpu_session57b.sh — the fifty-seventh session's second GPU call: the input RMSNorm fused into the qkv GEMV
# at batch-1 decode steps (MOEX_CUDA_FUSE_IN_NORM=1, kern::GemvFuse) — tested, A/B'd, then the end-to-end table and
# the GPU suite with the faster setting. Carried binaries (moex_model_bench_trace: a -DMOEX_CUDA_TRACE=ON build):
#   here:  PACK_TARGETS="moex_tests moex_model_bench" bash bench/gpu_prebuilt.sh pack /tmp/breal
#          xz -T0 -6 -c /tmp/btrace/moex_model_bench > build-carry/moex_model_bench_trace.xz
#   there: CALL_LIMIT=450 bash bench/gpu_prebuilt.sh run bench/gpu_session57b.sh   (carry ["build-carry"])
# E2E_ONLY_ON=H200: the e2e step only where the card's name contains it.
# Steps (PARTS, default "new ab probe e2e suite trace", in this order, each skipped when too little of CALL_LIMIT is left):
#   new    the new test (fused against separate norms, every fixture), then the bf16 / f32 parity tests and the
#          graph tests with MOEX_CUDA_FUSE_IN_NORM=1 → new_tests.log, parity_fin.log
#   ab     moex_model_bench --batches 1,8 switch+graphs, $AB_ROUNDS (default 3) interleaved rounds of base and
#          fin (MOEX_CUDA_FUSE_IN_NORM=1) → ab_<variant>_<round>.txt; the faster at batch 1 (sum over rounds)
#          is exported for the steps after it
#   probe  (fifty-eighth session) bench/experts_stream_probe.cu, when carried (xz -c /tmp/breal/moex_experts_stream_probe
#          > build-carry/moex_experts_stream_probe.xz): the batch-1 experts' two kernels against one persistent
#          kernel → probe.txt
#   e2e    issue 5's end-to-end table beside the reference library (bench/gpu_session28.sh PARTS=model)
#   suite  the GPU suite, $TEST_FILTER (default every CUDA and deepgemm test but the timed one) → tests.log
#   trace  the traced moex_model_bench at batch 1 with the chosen setting, bench/trace_report.py → trace_report.md
# → $OUT/summary.txt and logs.tgz
set -u
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export BUILD=${BUILD:-build-gpu} MOEX_SOURCE_DIR=$PWD
PARTS=${PARTS:-"new ab probe e2e suite trace"}
has() { [[ " $PARTS " == *" $1 "* ]]; }
t0=$(date +%s)
limit=${CALL_LIMIT:-450}
left() { echo $(( limit - ($(date +%s) - t0) )); }
gpu=$(nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader | head -1)
# E2E_ONLY_ON=H200: the end-to-end table only on that card (the bar's; the H100's table was measured in call 1)
if [ -n "${E2E_ONLY_ON:-}" ] && [[ "$gpu" != *"$E2E_ONLY_ON"* ]]; then PARTS=${PARTS//e2e/}; fi
echo "== $gpu; tree $(cat build-carry/commit 2> /dev/null); parts: $PARTS" | tee "$OUT/summary.txt"

if has new && [ "$(left)" -gt 60 ]; then
  timeout $(( $(left) - 30 )) "$BUILD/moex_tests" --gtest_filter='CudaModelGraphs.FusedInputNorm*' > "$OUT/new_tests.log" 2>&1
  echo "new test rc $? at $(( $(date +%s) - t0 )) s" | tee -a "$OUT/summary.txt"
  grep -E "fused input norm|^\[  (PASSED|FAILED) |FAILED  \]|Failure" -A2 "$OUT/new_tests.log" | head -40 | tee -a "$OUT/summary.txt"
  MOEX_CUDA_FUSE_IN_NORM=1 timeout $(( $(left) - 30 )) "$BUILD/moex_tests" \
    --gtest_filter='*CudaModelParity*:CudaModelGraphs.*:CudaModelSwitching.*' > "$OUT/parity_fin.log" 2>&1
  echo "parity / graphs / switching with MOEX_CUDA_FUSE_IN_NORM=1: rc $? at $(( $(date +%s) - t0 )) s" | tee -a "$OUT/summary.txt"
  grep -E "^\[  (PASSED|FAILED) |FAILED  \]|Failure" -A3 "$OUT/parity_fin.log" | head -30 | tee -a "$OUT/summary.txt"
fi

best=base
if has ab; then
  declare -A total=([base]=0 [fin]=0) count=([base]=0 [fin]=0)
  for round in $(seq 1 "${AB_ROUNDS:-3}"); do
    for v in base fin; do
      [ "$(left)" -gt 45 ] || break 2
      ( [ "$v" = fin ] && export MOEX_CUDA_FUSE_IN_NORM=1 || unset MOEX_CUDA_FUSE_IN_NORM
        timeout $(( $(left) - 5 )) "$BUILD/moex_model_bench" --layers 48 --prompt 2048 --decode-prompt 128 --new 64 \
          --batches 1,8 --variants switch+graphs --out "$OUT/ab_${v}_$round.json" > "$OUT/ab_${v}_$round.txt" 2>&1 )
      echo "== ab $v round $round (at $(( $(date +%s) - t0 )) s): $(grep -E "^#" "$OUT/ab_${v}_$round.txt" | head -1)" |
        tee -a "$OUT/summary.txt"
      grep -E "^decode" "$OUT/ab_${v}_$round.txt" | head -4 | tee -a "$OUT/summary.txt"
      ms=$(grep -E "^decode switch\+graphs +batch +1:" "$OUT/ab_${v}_$round.txt" | sed -E 's/.*: ([0-9.]+) ms.*/\1/')
      if [ -n "$ms" ]; then total[$v]=$(python3 -c "print(${total[$v]} + $ms)"); count[$v]=$(( ${count[$v]} + 1 )); fi
    done
  done
  # fin only where both ran the same number of rounds (a failed fin round must not look faster)
  best=$(python3 -c "print('fin' if ${count[fin]} == ${count[base]} > 0 and ${total[fin]} < ${total[base]} else 'base')")
  echo "batch-1 ms summed over rounds: base ${total[base]} (${count[base]} rounds), fin ${total[fin]} (${count[fin]}) -> $best" |
    tee -a "$OUT/summary.txt"
fi
[ "$best" = fin ] && export MOEX_CUDA_FUSE_IN_NORM=1
echo "MOEX_CUDA_FUSE_IN_NORM=${MOEX_CUDA_FUSE_IN_NORM:-unset} for the steps below" | tee -a "$OUT/summary.txt"

if has probe && [ "$(left)" -gt 150 ] && [ -x "$BUILD/moex_experts_stream_probe" ]; then
  for a in "" "--reps 9"; do
    # shellcheck disable=SC2086
    timeout 60 "$BUILD/moex_experts_stream_probe" $a > "$OUT/probe.txt" 2>&1
    echo "== moex_experts_stream_probe $a: rc $? at $(( $(date +%s) - t0 )) s" | tee -a "$OUT/summary.txt"
    cat "$OUT/probe.txt" | tee -a "$OUT/summary.txt"
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

if has trace && [ "$(left)" -gt 50 ] && [ -x "$BUILD/moex_model_bench_trace" ]; then
  timeout $(( $(left) - 20 )) "$BUILD/moex_model_bench_trace" --layers 48 --prompt 2048 --new 32 --batches 1 \
    --variants switch+graphs --trace "$OUT/trace.csv" --trace-steps "${TRACE_STEPS:-8}" > "$OUT/trace_bench.txt" 2>&1
  echo "traced bench rc $? at $(( $(date +%s) - t0 )) s" | tee -a "$OUT/summary.txt"
  timeout 40 python3 bench/trace_report.py "$OUT/trace.csv" --json "$OUT/trace_report.json" \
    --launches "$OUT/launches.csv" > "$OUT/trace_report.md" 2>&1
  head -24 "$OUT/trace_report.md" | tee -a "$OUT/summary.txt"
  rm -f "$OUT/trace.csv" "$OUT/launches.csv"
fi

echo "done at $(( $(date +%s) - t0 )) s" | tee -a "$OUT/summary.txt"
( cd "$OUT" && tar czf /tmp/logs57b.tgz --exclude=summary.txt . && find . -type f ! -name summary.txt -delete &&
  mv /tmp/logs57b.tgz logs.tgz )
ls "$OUT"
