#!/usr/bin/env bash
# bench/gpu_session52.sh — one call that does what the card it lands on is needed for (fifty-second session):
# on an H200 (the bar's machine, > 100 GB) issue 5's end-to-end table beside the reference and its A/B
# (bench/gpu_session51b.sh: batch 64 needs more than an H100's 80 GB); on any other card the GPU suite
# (bench/gpu_session50a.sh). Run through the carried binaries:
#   here:  PACK_TARGETS="moex_tests moex_model_bench" bash bench/gpu_prebuilt.sh pack /tmp/breal
#   there: bash bench/gpu_prebuilt.sh run bench/gpu_session52.sh   (carry ["build-carry"])
# WANT=suite or WANT=e2e forces one of the two.
set -u
mem_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1 | tr -d ' ')
want=${WANT:-$([ "${mem_mib:-0}" -gt 100000 ] && echo e2e || echo suite)}
echo "== $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), ${mem_mib} MiB: $want"
if [ "$want" = e2e ]; then
  FP8_VARIANTS= TOKENS=1 CALL_LIMIT=${CALL_LIMIT:-580} exec bash bench/gpu_session51b.sh
else
  SUITE_TIMEOUT=${SUITE_TIMEOUT:-560} CALL_LIMIT=${CALL_LIMIT:-590} AB_VARIANTS=" " TOKENS=1 exec bash bench/gpu_session50a.sh
fi
