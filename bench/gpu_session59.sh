#!/usr/bin/env bash
# bench/gpu_session59.sh — the fifty-ninth session's GPU call: on an H200 (the bar's card) issue 5's end-to-end
# table, the model runtime's H100-chosen defaults A/B'd there, and the GPU suite; on any other card the GPU suite
# only (the final tree had not run it whole). Carried binaries, built on the development machine:
#   here:  PACK_TARGETS="moex_tests moex_model_bench moex" bash bench/gpu_prebuilt.sh pack /tmp/breal
#          mkdir -p build-carry2 && mv build-carry/moex.xz build-carry2/   (the carry limit: 64 MiB with the tree)
#          xz -T0 -9e -c /tmp/btrace/moex_model_bench > build-carry/moex_model_bench_trace.xz   (-DMOEX_CUDA_TRACE=ON)
#   there: CALL_LIMIT=540 bash bench/gpu_prebuilt.sh run bench/gpu_session59.sh   (carry ["build-carry"])
# Steps (PARTS, default "ab e2e trace suite", in this order, each skipped when too little of CALL_LIMIT is left; on a
# card whose name lacks $BAR_CARD (default H200) only $NON_BAR_PARTS, default "suite", runs):
#   ab     moex_model_bench --batches 1,8 switch+graphs, $AB_ROUNDS (default 2) interleaved rounds of
#          base / fin (MOEX_CUDA_FUSE_IN_NORM=1) / nopost (MOEX_CUDA_FUSE_POST_NORM=0) / kvf32
#          (MOEX_CUDA_KV_CACHE=f32) → ab_<variant>_<round>.txt: the defaults chosen on H100s, checked on the H200
#   e2e    issue 5's end-to-end table beside the reference library (bench/gpu_session28.sh PARTS=model)
#   trace  the traced moex_model_bench at batch 1, bench/trace_report.py → trace_report.md (the per-kernel timeline)
#   suite  the GPU suite, $TEST_FILTER (default every CUDA and deepgemm test but the timed one) → tests.log
# → $OUT/summary.txt and logs.tgz. A second call on the same warm machine, carrying build-carry2, can run issue 7's
# and issue 6's tables: moex unpacked from build-carry2/moex.xz into build-gpu/ beside the binaries this call left
# there, then PARTS="side fp8" BUILD=build-gpu DEADLINE=560 bash bench/gpu_session29.sh (the whole command:
# docs/PERF.md, fifty-ninth session, "For the next session (sixtieth)").
set -u
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export BUILD=${BUILD:-build-gpu} MOEX_SOURCE_DIR=$PWD
PARTS=${PARTS:-"ab e2e trace suite"}
has() { [[ " $PARTS " == *" $1 "* ]]; }
t0=$(date +%s)
limit=${CALL_LIMIT:-500}
left() { echo $(( limit - ($(date +%s) - t0) )); }
gpu=$(nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.mem --format=csv,noheader | head -1)
if [[ "$gpu" != *"${BAR_CARD:-H200}"* ]]; then PARTS=${NON_BAR_PARTS-suite}; fi  # NON_BAR_PARTS="": nothing there
echo "== $gpu; tree $(cat build-carry/commit 2> /dev/null); parts: $PARTS" | tee "$OUT/summary.txt"

if has ab; then
  variants=(base fin nopost kvf32)
  declare -A envs=([base]="" [fin]="MOEX_CUDA_FUSE_IN_NORM=1" [nopost]="MOEX_CUDA_FUSE_POST_NORM=0"
                   [kvf32]="MOEX_CUDA_KV_CACHE=f32")
  for round in $(seq 1 "${AB_ROUNDS:-2}"); do
    for v in "${variants[@]}"; do
      [ "$(left)" -gt 350 ] || break 2  # leave the e2e table, the trace and the suite their time
      # shellcheck disable=SC2086
      env ${envs[$v]} timeout 60 "$BUILD/moex_model_bench" --layers 48 --prompt 2048 --decode-prompt 128 --new 64 \
        --batches 1,8 --variants switch+graphs --out "$OUT/ab_${v}_$round.json" > "$OUT/ab_${v}_$round.txt" 2>&1
      echo "== ab $v round $round (rc $?, at $(( $(date +%s) - t0 )) s): $(grep -E "^#" "$OUT/ab_${v}_$round.txt" | head -1)" |
        tee -a "$OUT/summary.txt"
      grep -E "^decode" "$OUT/ab_${v}_$round.txt" | head -4 | tee -a "$OUT/summary.txt"
    done
  done
fi

if has e2e && [ "$(left)" -gt 120 ]; then
  OUT=$OUT/r PARTS=model SKIP_BUILD=1 DEADLINE=$(( $(left) - 10 )) bash bench/gpu_session28.sh 2>&1 |
    tail -24 | tee -a "$OUT/summary.txt"
  for f in side_by_side.md moex_e2e.json ref_e2e.json model.txt progress.log; do cp "$OUT/r/$f" "$OUT/" 2> /dev/null; done
  rm -rf "$OUT/r"
  echo "e2e done at $(( $(date +%s) - t0 )) s" | tee -a "$OUT/summary.txt"
fi

if has trace && [ "$(left)" -gt 240 ] && [ -x "$BUILD/moex_model_bench_trace" ]; then
  timeout 60 "$BUILD/moex_model_bench_trace" --layers 48 --prompt 2048 --new 32 --batches 1 \
    --variants switch+graphs --trace "$OUT/trace.csv" --trace-steps "${TRACE_STEPS:-8}" > "$OUT/trace_bench.txt" 2>&1
  echo "traced bench rc $? at $(( $(date +%s) - t0 )) s" | tee -a "$OUT/summary.txt"
  timeout 40 python3 bench/trace_report.py "$OUT/trace.csv" --json "$OUT/trace_report.json" \
    --launches "$OUT/launches.csv" > "$OUT/trace_report.md" 2>&1
  head -24 "$OUT/trace_report.md" | tee -a "$OUT/summary.txt"
  rm -f "$OUT/trace.csv" "$OUT/launches.csv"
fi

if has suite && [ "$(left)" -gt 100 ]; then
  OUT=$OUT/r PARTS=tests SKIP_BUILD=1 TEST_TIMEOUT=$(( $(left) - 15 )) \
    TEST_FILTER="${TEST_FILTER:-*Cuda*:*DeepGemm*:-CudaPerf.*}" bash bench/gpu_check.sh 2>&1 | tail -12 | tee -a "$OUT/summary.txt"
  cp "$OUT/r/tests.log" "$OUT/" 2> /dev/null
  rm -rf "$OUT/r"
  echo "suite done at $(( $(date +%s) - t0 )) s" | tee -a "$OUT/summary.txt"
fi

echo "done at $(( $(date +%s) - t0 )) s" | tee -a "$OUT/summary.txt"
( cd "$OUT" && tar czf /tmp/logs59.tgz --exclude=summary.txt . && find . -type f ! -name summary.txt -delete &&
  mv /tmp/logs59.tgz logs.tgz )
ls "$OUT"
