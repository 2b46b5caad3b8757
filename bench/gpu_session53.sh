#!/usr/bin/env bash
# bench/gpu_session53.sh — the fifty-third session's call, through the carried binaries:
#   here:  PACK_TARGETS="moex_tests moex_model_bench moex" bash bench/gpu_prebuilt.sh pack /tmp/breal
#   there: CALL_LIMIT=570 bash bench/gpu_prebuilt.sh run bench/gpu_session53.sh   (carry ["build-carry"])
# Issue 5: batched_mm's down projection staged in shared memory before its wait (MOEX_CUDA_DOWN_STAGED=1,
# batched_gemv.cu) against the default, then issue 5's end-to-end table (H200) or the GPU suite (other cards).
#   1. tests: the staged kernel bit for bit against the default (CudaEquivalence.BatchedMmStagedDown*)
#   2. the experts alone: moex bench batched_mm, qwen3_30b_a3b and qwen15_moe_a2_7b, T = 1, bf16, default and
#      staged, AB_ROUNDS rounds interleaved
#   3. the 48-layer model at batch 1 (bench/gpu_session28.sh's ab: prefill 2048, decode prompts of 128 tokens,
#      switching + graphs): base and staged, AB_ROUNDS rounds interleaved
#   4. WANT=e2e (default on a card of > 100 GB: the H200): issue 5's end-to-end table with what is left
#      (bench/gpu_session28.sh PARTS=model, needs ~300-420 s); WANT=suite (default elsewhere): the GPU suite
# → $OUT/summary.txt (and tests.log, ab.log, side_by_side.md, logs.tgz)
set -u
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export BUILD=${BUILD:-build-gpu} MOEX_SOURCE_DIR=$PWD
t0=$(date +%s)
limit=${CALL_LIMIT:-570}
left() { echo $(( limit - ($(date +%s) - t0) )); }
mem_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1 | tr -d ' ')
want=${WANT:-$([ "${mem_mib:-0}" -gt 100000 ] && echo e2e || echo suite)}
# the end-to-end table's share of the call (on an H200): steps 1-3 get the rest
e2e_need=${E2E_NEED:-$([ "$want" = e2e ] && echo 400 || echo 0)}
echo "== $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), ${mem_mib} MiB: $want; tree $(cat build-carry/commit 2> /dev/null)" |
  tee "$OUT/summary.txt"

# 1. tests of the staged kernel
timeout 60 "$BUILD/moex_tests" --gtest_filter='*BatchedMmStagedDown*' > "$OUT/tests_staged.log" 2>&1
echo "staged tests rc $?" | tee -a "$OUT/summary.txt"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|bit for bit" "$OUT/tests_staged.log" | tee -a "$OUT/summary.txt"
grep -A8 "Failure" "$OUT/tests_staged.log" | head -30 | tee -a "$OUT/summary.txt"

# 2. the experts alone
if [ -x "$BUILD/moex" ]; then
  for round in $(seq 1 "${AB_ROUNDS:-2}"); do
    for v in 0 1; do
      [ "$(left)" -gt $(( e2e_need + 60 )) ] || break
      echo "== moex bench, MOEX_CUDA_DOWN_STAGED=$v, round $round" | tee -a "$OUT/summary.txt"
      MOEX_CUDA_DOWN_STAGED=$v timeout 60 "$BUILD/moex" bench --device cuda --backends batched_mm \
        --shapes qwen3_30b_a3b,qwen15_moe_a2_7b --tokens 1 --dtype bf16 --format table 2>&1 | tail -6 | tee -a "$OUT/summary.txt"
    done
  done
fi

# 3. the model, batch 1
ab_deadline=$(( $(left) - e2e_need ))
if [ "$ab_deadline" -gt 60 ]; then
  OUT=$OUT/ab PARTS=ab SKIP_BUILD=1 DEADLINE=$ab_deadline AB_PREFILLS=2048 AB_BATCHES=${AB_BATCHES:-1} \
    AB_ROUNDS=${AB_ROUNDS:-2} AB_VARIANTS="staged:MOEX_CUDA_DOWN_STAGED=1" bash bench/gpu_session28.sh 2>&1 |
    grep -vE "^== model bench" | tee -a "$OUT/summary.txt"
  cp "$OUT/ab/ab.log" "$OUT/" 2> /dev/null
fi

# 4. the end-to-end table, or the suite
if [ "$want" = e2e ]; then
  OUT=$OUT/r PARTS=model SKIP_BUILD=1 DEADLINE=$(( $(left) - 10 )) bash bench/gpu_session28.sh 2>&1 |
    tail -20 | tee -a "$OUT/summary.txt"
  for f in side_by_side.md moex_e2e.json ref_e2e.json model.txt; do cp "$OUT/r/$f" "$OUT/" 2> /dev/null; done
else
  OUT=$OUT/r PARTS=tests SKIP_BUILD=1 TEST_TIMEOUT=$(( $(left) - 15 )) \
    TEST_FILTER="${TEST_FILTER:-*Cuda*:*DeepGemm*:-CudaPerf.*}" bash bench/gpu_check.sh 2>&1 | tail -30 | tee -a "$OUT/summary.txt"
  cp "$OUT/r/tests.log" "$OUT/" 2> /dev/null
fi
echo "done at $(( $(date +%s) - t0 )) s" | tee -a "$OUT/summary.txt"
tar czf "$OUT/logs.tgz" -C "$OUT" r ab 2> /dev/null && rm -rf "$OUT/r" "$OUT/ab"
ls "$OUT"
