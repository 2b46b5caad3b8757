#!/usr/bin/env bash
# bench/gpu_session34.sh — one call on the GPU machine for the thirty-fourth session, from the
# repository root (`run` with command `bash bench/gpu_session34.sh`). It chains the project's one-call
# scripts, each into its own folder under $OUT/r, and packs them into $OUT/results.tgz at the end (the
# device tool brings back at most 8 files); the summaries are also copied to $OUT/summary.txt.
#
# STEPS (default "ab trace fp8"), in this order:
#   ab          bench/gpu_session28.sh PARTS="build ab" with $AB_VARIANTS (model step A/B)
#   tests       bench/gpu_session28.sh PARTS=tests on $TEST_FILTER (the build of "ab")
#   sanitize    bench/gpu_session28.sh PARTS=sanitize on $SANITIZE_FILTER (the build of "ab")
#   trace       bench/gpu_trace.sh PARTS=trace (batch-1 timeline, the ticket merge), then again with
#               TRACE_ENV=MOEX_CUDA_DECODE_CLUSTER=2 (the cluster merge) on the same build (TRACE_CLUSTER=0:
#               not); skipped when TRACE_BEFORE seconds (default 400) have passed
#   model       bench/gpu_session28.sh PARTS=model (issue 5's end-to-end table beside the reference)
#   fp8         bench/gpu_fp8_decode.sh PARTS=perf TOKENS=$FP8_TOKENS on the build of "ab" (issue 6),
#               FP8_ROUNDS rounds (default 2) of the default and of every FP8_VARIANTS entry
#   cpu         bench/cpu_h200.sh on the build of "ab" (issue 8 on the host's CPU): the CPU kernel and
#               equivalence tests (every kernel table this CPU has, AMX included), then the side by side at
#               16 and 2 threads within CPU_TOTAL seconds (default 420); QUANT and CPU_AB pass through
set -u
OUT=${OUT:-$PWD/out}
R=$OUT/r
mkdir -p "$R"
STEPS=${STEPS:-"ab trace fp8"}
step() { [[ " $STEPS " == *" $1 "* ]]; }
t0=$(date +%s)
note() { echo "== $1 ($(( $(date +%s) - t0 )) s)" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,driver_version --format=csv,noheader | tee -a "$OUT/summary.txt"
if step ab; then
  note "build + model A/B"
  mkdir -p "$R/ab"
  OUT=$R/ab PARTS="build ab" DEADLINE=${AB_DEADLINE:-330} bash bench/gpu_session28.sh > "$R/ab/run.txt" 2>&1
  grep -E "^==|wgmma|^\[|error" "$R/ab/run.txt" >> "$OUT/summary.txt"
fi
if step tests; then
  note "tests"
  mkdir -p "$R/tests"
  OUT=$R/tests PARTS=tests DEADLINE=${TESTS_DEADLINE:-200} SANITIZE_RESERVE=5 bash bench/gpu_session28.sh > "$R/tests/run.txt" 2>&1
  grep -E "tests rc|tests OK|PASSED|FAILED|Failure" "$R/tests/run.txt" | head -40 >> "$OUT/summary.txt"
fi
if step sanitize; then
  note "compute-sanitizer"
  mkdir -p "$R/sanitize"
  OUT=$R/sanitize PARTS=sanitize DEADLINE=${SANITIZE_DEADLINE:-120} bash bench/gpu_session28.sh > "$R/sanitize/run.txt" 2>&1
  grep -E "rc|SUMMARY" "$R/sanitize/run.txt" | head -10 >> "$OUT/summary.txt"
fi
if step trace && [ $(( $(date +%s) - t0 )) -lt ${TRACE_BEFORE:-400} ]; then
  note "trace (ticket merge)"
  mkdir -p "$R/trace"
  OUT=$R/trace PARTS=trace bash bench/gpu_trace.sh > "$R/trace/run.txt" 2>&1
  { grep -E "decode|^==" "$R/trace/run.txt"; cat "$R/trace/trace_report.md"; } >> "$OUT/summary.txt" 2>&1
  if [ "${TRACE_CLUSTER:-1}" != 0 ]; then
    note "trace (cluster merge)"
    mkdir -p "$R/trace_cluster"
    OUT=$R/trace_cluster PARTS=trace TRACE_ENV=MOEX_CUDA_DECODE_CLUSTER=2 bash bench/gpu_trace.sh > "$R/trace_cluster/run.txt" 2>&1
    { grep -E "decode|^==" "$R/trace_cluster/run.txt"; cat "$R/trace_cluster/trace_report.md"; } >> "$OUT/summary.txt" 2>&1
  fi
fi
if step model; then
  note "end-to-end table"
  mkdir -p "$R/model"
  OUT=$R/model PARTS=model DEADLINE=${MODEL_DEADLINE:-300} bash bench/gpu_session28.sh > "$R/model/run.txt" 2>&1
  cat "$R/model/side_by_side.md" >> "$OUT/summary.txt" 2>/dev/null || tail -20 "$R/model/run.txt" >> "$OUT/summary.txt"
fi
if step fp8; then
  note "FP8 decode timings (issue 6)"
  mkdir -p "$R/fp8"
  OUT=$R/fp8 SKIP_BUILD=1 BUILD=build-gpu PARTS=perf TOKENS=${FP8_TOKENS:-1,8} COMPARE_OLD=0 AB_ROUNDS=${FP8_ROUNDS:-2} \
    AB_VARIANTS=${FP8_VARIANTS:-} \
    bash bench/gpu_fp8_decode.sh > "$R/fp8/run.txt" 2>&1
  cat "$R/fp8/fp8_decode.md" >> "$OUT/summary.txt" 2>/dev/null || tail -20 "$R/fp8/run.txt" >> "$OUT/summary.txt"
fi
if step cpu; then
  note "CPU tests + side by side (issue 8)"
  mkdir -p "$R/cpu"
  OUT=$R/cpu SKIP_BUILD=1 BUILD=build-gpu TOTAL=${CPU_TOTAL:-420} bash bench/cpu_h200.sh > "$R/cpu/run.txt" 2>&1
  tail -45 "$R/cpu/run.txt" >> "$OUT/summary.txt"
fi
note done
tar czf "$OUT/results.tgz" -C "$OUT" r && rm -rf "$R"
