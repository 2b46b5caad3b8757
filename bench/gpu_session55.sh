#!/usr/bin/env bash
# bench/gpu_session55.sh — the fifty-fifth session's GPU call (the bf16 KV cache), through the carried binaries:
#   here:  PACK_TARGETS="moex_tests moex_model_bench moex" bash bench/gpu_prebuilt.sh pack /tmp/breal
#   there: CALL_LIMIT=560 bash bench/gpu_prebuilt.sh run bench/gpu_session55.sh   (carry ["build-carry"])
# Steps (PARTS, default "kv e2e ab suite", in this order, each skipped when too little of CALL_LIMIT is left):
#   kv     the new and changed tests first: the attention kernels with f32 and bf16 caches, the model's
#          bf16-vs-f32 cache test, the graphs, parity and switching tests → kv_tests.log
#   e2e    issue 5's end-to-end table beside the reference library (bench/gpu_session28.sh PARTS=model;
#          moex_model_bench at batches 1, 8, 64 with the default bf16 KV cache)
#   ab     moex_model_bench --batches 1,8,64, switching + graphs, with MOEX_CUDA_KV_CACHE=$AB_KV (default
#          f32: the previous cache; "f32 model" adds the default again): step times, which batches fit → ab_*.txt
#   suite  the GPU suite, $TEST_FILTER (default every CUDA and deepgemm test but the timed one) → tests.log
# → $OUT/summary.txt (and the logs named above, side_by_side.md, moex_e2e.json, ref_e2e.json)
set -u
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export BUILD=${BUILD:-build-gpu} MOEX_SOURCE_DIR=$PWD
PARTS=${PARTS:-"kv e2e ab suite"}
has() { [[ " $PARTS " == *" $1 "* ]]; }
t0=$(date +%s)
limit=${CALL_LIMIT:-560}
left() { echo $(( limit - ($(date +%s) - t0) )); }
echo "== $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -1); tree $(cat build-carry/commit 2> /dev/null); parts: $PARTS" |
  tee "$OUT/summary.txt"

if has kv && [ "$(left)" -gt 60 ]; then
  timeout $(( $(left) - 30 )) "$BUILD/moex_tests" \
    --gtest_filter='CudaAttentionKernels.*:CudaModelKvCache.*:CudaModelGraphs.*:*CudaModelParity.*:CudaModelSwitching.*:CudaModelErrors.*:CudaModelAttention.*' \
    > "$OUT/kv_tests.log" 2>&1
  echo "kv tests rc $? at $(( $(date +%s) - t0 )) s" | tee -a "$OUT/summary.txt"
  grep -E "bf16 vs f32 KV|^\[  (PASSED|FAILED) |FAILED  \]|Failure" "$OUT/kv_tests.log" | head -30 | tee -a "$OUT/summary.txt"
fi

if has e2e && [ "$(left)" -gt 120 ]; then
  OUT=$OUT/r PARTS=model SKIP_BUILD=1 DEADLINE=$(( $(left) - 10 )) bash bench/gpu_session28.sh 2>&1 |
    tail -24 | tee -a "$OUT/summary.txt"
  for f in side_by_side.md moex_e2e.json ref_e2e.json model.txt progress.log; do cp "$OUT/r/$f" "$OUT/" 2> /dev/null; done
  rm -rf "$OUT/r"
  echo "e2e done at $(( $(date +%s) - t0 )) s" | tee -a "$OUT/summary.txt"
fi

if has ab; then
  for kv in ${AB_KV:-f32}; do
    [ "$(left)" -gt 40 ] || break
    echo "== moex_model_bench, MOEX_CUDA_KV_CACHE=$kv" | tee -a "$OUT/summary.txt"
    MOEX_CUDA_KV_CACHE=$kv timeout $(( $(left) - 5 )) "$BUILD/moex_model_bench" --layers 48 --prompt 2048 --decode-prompt 128 \
      --new 64 --batches 1,8,64 --variants switch+graphs --out "$OUT/ab_$kv.json" > "$OUT/ab_$kv.txt" 2>&1
    grep -vE "^\s*$" "$OUT/ab_$kv.txt" | tail -8 | tee -a "$OUT/summary.txt"
  done
fi
if has suite && [ "$(left)" -gt 100 ]; then
  OUT=$OUT/r PARTS=tests SKIP_BUILD=1 TEST_TIMEOUT=$(( $(left) - 15 )) \
    TEST_FILTER="${TEST_FILTER:-*Cuda*:*DeepGemm*:-CudaPerf.*}" bash bench/gpu_check.sh 2>&1 | tail -12 | tee -a "$OUT/summary.txt"
  cp "$OUT/r/tests.log" "$OUT/" 2> /dev/null
  rm -rf "$OUT/r"
  echo "suite done at $(( $(date +%s) - t0 )) s" | tee -a "$OUT/summary.txt"
fi

echo "done at $(( $(date +%s) - t0 )) s" | tee -a "$OUT/summary.txt"
ls "$OUT"
