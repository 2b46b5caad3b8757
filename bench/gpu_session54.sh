#!/usr/bin/env bash
# bench/gpu_session54.sh — the fifty-fourth session's H200 call, through the carried binaries:
#   here:  PACK_TARGETS="moex_tests moex_model_bench moex" bash bench/gpu_prebuilt.sh pack /tmp/breal
#   there: CALL_LIMIT=560 bash bench/gpu_prebuilt.sh run bench/gpu_session54.sh   (carry ["build-carry"])
# Steps (PARTS, default "e2e suite fp8", in this order, each skipped when too little of CALL_LIMIT is left):
#   e2e    issue 5's end-to-end table beside the reference library (bench/gpu_session28.sh PARTS=model:
#          moex_model_bench + bench/model_e2e_reference.py on the 48-layer random Qwen3-30B-A3B, bf16; ~300-400 s)
#   suite  the GPU suite, $TEST_FILTER (default every CUDA and deepgemm test but the timed one) → tests.log
#   fp8    issue 6's T <= 64 table: moex bench grouped_mm / batched_mm, bf16 and FP8, the four shapes,
#          T = 1, 16, 64 (bench/gpu_check.sh's fp8 part is the full form; this is its decode cells)
# → $OUT/summary.txt (and side_by_side.md, moex_e2e.json, ref_e2e.json, tests.log, fp8_*.txt, logs.tgz)
set -u
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export BUILD=${BUILD:-build-gpu} MOEX_SOURCE_DIR=$PWD
PARTS=${PARTS:-"e2e suite fp8"}
has() { [[ " $PARTS " == *" $1 "* ]]; }
t0=$(date +%s)
limit=${CALL_LIMIT:-560}
left() { echo $(( limit - ($(date +%s) - t0) )); }
echo "== $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -1); tree $(cat build-carry/commit 2> /dev/null); parts: $PARTS" |
  tee "$OUT/summary.txt"

if has e2e && [ "$(left)" -gt 300 ]; then
  OUT=$OUT/r PARTS=model SKIP_BUILD=1 DEADLINE=$(( $(left) - 10 )) bash bench/gpu_session28.sh 2>&1 |
    tail -24 | tee -a "$OUT/summary.txt"
  for f in side_by_side.md moex_e2e.json ref_e2e.json model.txt progress.log; do cp "$OUT/r/$f" "$OUT/" 2> /dev/null; done
  rm -rf "$OUT/r"
  echo "e2e done at $(( $(date +%s) - t0 )) s" | tee -a "$OUT/summary.txt"
fi

if has suite && [ "$(left)" -gt 90 ]; then
  OUT=$OUT/r PARTS=tests SKIP_BUILD=1 TEST_TIMEOUT=$(( $(left) - ${FP8_RESERVE:-45} )) \
    TEST_FILTER="${TEST_FILTER:-*Cuda*:*DeepGemm*:-CudaPerf.*}" bash bench/gpu_check.sh 2>&1 | tail -30 | tee -a "$OUT/summary.txt"
  cp "$OUT/r/tests.log" "$OUT/" 2> /dev/null
  rm -rf "$OUT/r"
fi

if has fp8 && [ -x "$BUILD/moex" ]; then
  for q in none fp8; do
    [ "$(left)" -gt 20 ] || break
    echo "== moex bench, quant $q" | tee -a "$OUT/summary.txt"
    timeout $(( $(left) - 5 )) "$BUILD/moex" bench --device cuda --backends grouped_mm,batched_mm --quant "$q" \
      --shapes qwen3_30b_a3b,qwen15_moe_a2_7b,mixtral_8x7b,deepseek_v3 --tokens 1,16,64 --dtype bf16 --format table 2>&1 |
      tee "$OUT/fp8_$q.txt" | tee -a "$OUT/summary.txt"
  done
fi
echo "done at $(( $(date +%s) - t0 )) s" | tee -a "$OUT/summary.txt"
ls "$OUT"
