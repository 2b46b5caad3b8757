#!/usr/bin/env bash
# (Ran in the fifty-eighth session on trees 2f49d2d and 781039b; the forms it compares were removed in ec23aea, and
# MOEX_CUDA_DOWN_FORM no longer exists: kept as it ran.)
# bench/gpu_session58.sh — the fifty-eighth session's second GPU call: batched_mm's down kernel with its first
# weight chunks requested before pdl_wait (MOEX_CUDA_DOWN_FORM=early, the new default; batched_down_lean_nt)
# — tested bit for bit against batched_down_nt, A/B'd on the 48-layer model, then the end-to-end table (H200
# only, with E2E_ONLY_ON=H200), the GPU suite and the timeline with the faster form. Carried binaries
# (moex_model_bench_trace: a -DMOEX_CUDA_TRACE=ON build):
#   here:  PACK_TARGETS="moex_tests moex_model_bench" bash bench/gpu_prebuilt.sh pack /tmp/breal
#          xz -T0 -6 -c /tmp/btrace/moex_model_bench > build-carry/moex_model_bench_trace.xz
#   there: CALL_LIMIT=540 bash bench/gpu_prebuilt.sh run bench/gpu_session58.sh   (carry ["build-carry"])
# Steps (PARTS, default "new ab e2e suite trace", in this order, each skipped when too little of CALL_LIMIT is left):
#   new    the new test (the three down forms bit for bit, every dtype) and the model's parity, graph and
#          switching tests on the default ($NEW_FILTER overrides the test filter) → new_tests.log
#   ab     moex_model_bench --batches 1,8 switch+graphs, $AB_ROUNDS (default 3) interleaved rounds of $AB_FORMS (default
#          "early plain lean": early, the default, plain (MOEX_CUDA_DOWN_FORM=plain) and lean) → ab_<form>_<round>.txt; the fastest at batch 1
#          (sum over rounds, equal round counts only) is exported for the steps after it
#   e2e    issue 5's end-to-end table beside the reference library (bench/gpu_session28.sh PARTS=model)
#   suite  the GPU suite, $TEST_FILTER (default every CUDA and deepgemm test but the timed one) → tests.log
#   trace  the traced moex_model_bench at batch 1 with the chosen form, bench/trace_report.py → trace_report.md
# → $OUT/summary.txt and logs.tgz
set -u
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export BUILD=${BUILD:-build-gpu} MOEX_SOURCE_DIR=$PWD
PARTS=${PARTS:-"new ab e2e suite trace"}
has() { [[ " $PARTS " == *" $1 "* ]]; }
t0=$(date +%s)
limit=${CALL_LIMIT:-450}
left() { echo $(( limit - ($(date +%s) - t0) )); }
gpu=$(nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader | head -1)
# E2E_ONLY_ON=H200: the end-to-end table only on that card (the bar's; the H100's table was measured in call 1)
if [ -n "${E2E_ONLY_ON:-}" ] && [[ "$gpu" != *"$E2E_ONLY_ON"* ]]; then PARTS=${PARTS//e2e/}; fi
echo "== $gpu; tree $(cat build-carry/commit 2> /dev/null); parts: $PARTS" | tee "$OUT/summary.txt"

if has new && [ "$(left)" -gt 60 ]; then
  timeout $(( $(left) - 30 )) "$BUILD/moex_tests" \
    --gtest_filter="${NEW_FILTER:-*BatchedMmDownForms*:*CudaModelParity*:CudaModelGraphs.*:CudaModelSwitching.*}" > "$OUT/new_tests.log" 2>&1
  echo "new test, parity / graphs / switching: rc $? at $(( $(date +%s) - t0 )) s" | tee -a "$OUT/summary.txt"
  grep -E "down forms|^\[  (PASSED|FAILED) |FAILED  \]|Failure" -A3 "$OUT/new_tests.log" | head -40 | tee -a "$OUT/summary.txt"
fi

best=early
if has ab; then
  declare -A total=([early]=0 [plain]=0 [lean]=0) count=([early]=0 [plain]=0 [lean]=0)
  for round in $(seq 1 "${AB_ROUNDS:-3}"); do
    for v in ${AB_FORMS:-early plain lean}; do
      [ "$(left)" -gt 45 ] || break 2
      ( export MOEX_CUDA_DOWN_FORM=$v
        timeout $(( $(left) - 5 )) "$BUILD/moex_model_bench" --layers 48 --prompt 2048 --decode-prompt 128 --new 64 \
          --batches 1,8 --variants switch+graphs --out "$OUT/ab_${v}_$round.json" > "$OUT/ab_${v}_$round.txt" 2>&1 )
      echo "== ab $v round $round (at $(( $(date +%s) - t0 )) s): $(grep -E "^#" "$OUT/ab_${v}_$round.txt" | head -1)" |
        tee -a "$OUT/summary.txt"
      grep -E "^decode" "$OUT/ab_${v}_$round.txt" | head -4 | tee -a "$OUT/summary.txt"
      ms=$(grep -E "^decode switch\+graphs +batch +1:" "$OUT/ab_${v}_$round.txt" | sed -E 's/.*: ([0-9.]+) ms.*/\1/')
      if [ -n "$ms" ]; then total[$v]=$(python3 -c "print(${total[$v]} + $ms)"); count[$v]=$(( ${count[$v]} + 1 )); fi
    done
  done
  # the fastest of the forms that ran as many rounds as the default (a failed round must not look faster)
  best=$(python3 -c "
t = {'early': ${total[early]}, 'plain': ${total[plain]}, 'lean': ${total[lean]}}
n = {'early': ${count[early]}, 'plain': ${count[plain]}, 'lean': ${count[lean]}}
ok = [v for v in t if n[v] == n['early'] and n[v] > 0]
print(min(ok, key=lambda v: t[v]) if ok else 'early')")
  echo "batch-1 ms summed over rounds: early ${total[early]} (${count[early]}), plain ${total[plain]} (${count[plain]}), lean ${total[lean]} (${count[lean]}) -> $best" |
    tee -a "$OUT/summary.txt"
fi
export MOEX_CUDA_DOWN_FORM=$best
echo "MOEX_CUDA_DOWN_FORM=$MOEX_CUDA_DOWN_FORM for the steps below" | tee -a "$OUT/summary.txt"

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
( cd "$OUT" && tar czf /tmp/logs58.tgz --exclude=summary.txt . && find . -type f ! -name summary.txt -delete &&
  mv /tmp/logs58.tgz logs.tgz )
ls "$OUT"
