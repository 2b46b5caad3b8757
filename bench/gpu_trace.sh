#!/usr/bin/env bash
# bench/gpu_trace.sh — one call on the GPU machine: the per-kernel timeline of batch-1 decode steps of
# the 48-layer random Qwen3-30B-A3B (issue 5), from a build with the trace hooks (trace.hpp).
#
#   PARTS="trace base" bash bench/gpu_trace.sh      (results under $OUT)
#
# Parts:
#   trace  build moex_model_bench with -DMOEX_CUDA_TRACE=ON into build-trace, run it at batch 1
#          (switching + graphs) with --trace, then bench/trace_report.py -> $OUT/trace_report.md
#   base   the same bench from an ordinary build (build-gpu): the step time without the hooks
# Environment: TRACE_STEPS (8), PROMPT (2048: the end-to-end table's KV capacity), NEW (32),
#   TRACE_ENV ("A=1,B=2": environment of the traced run, e.g. a switch under study:
#   TRACE_ENV=MOEX_CUDA_DECODE_CLUSTER=2 traces the attention's cluster merge instead of the ticket).
# The report gives, per kernel, when its blocks became resident, when its wait returned, how long it
# ran after that, and for the launch's last block the time between its marks (the decode attention:
# q ready, key loop done, partial published, merge weights computed).
source bench/gpu_common.sh
PARTS=${PARTS:-"trace base"}
TRACE_STEPS=${TRACE_STEPS:-8}
PROMPT=${PROMPT:-2048}
NEW=${NEW:-32}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
if has base; then
  CMAKE_EXTRA="-DMOEX_BUILD_TESTS=ON" gpu_build moex_model_bench
  stamp "base bench"
  "$BUILD/moex_model_bench" --layers 48 --prompt "$PROMPT" --new "$NEW" --batches 1 --variants switch+graphs \
    --out "$OUT/base.json" 2>&1 | tee "$OUT/base.txt" | grep -E "^#|decode|prefill"
fi
if has trace; then
  BUILD=build-trace CMAKE_EXTRA="-DMOEX_BUILD_TESTS=ON -DMOEX_CUDA_TRACE=ON" gpu_build moex_model_bench
  stamp "traced bench"
  env $(envs_of "${TRACE_ENV:-}") build-trace/moex_model_bench --layers 48 --prompt "$PROMPT" --new "$NEW" --batches 1 \
    --variants switch+graphs --trace "$OUT/trace.csv" --trace-steps "$TRACE_STEPS" 2>&1 | tee "$OUT/trace_bench.txt" |
    grep -E "^#|decode|prefill|trace"
  stamp report
  python3 bench/trace_report.py "$OUT/trace.csv" --json "$OUT/trace_report.json" --launches "$OUT/launches.csv" |
    tee "$OUT/trace_report.md"
  # the block records themselves are ~100 MB: kept on the machine only (files back are <= 16 MiB)
  mv "$OUT/trace.csv" /tmp/trace.csv; cp "$OUT/trace.csv.anchors.csv" /tmp/ && gzip -f "$OUT/trace.csv.anchors.csv"
fi
stamp done
