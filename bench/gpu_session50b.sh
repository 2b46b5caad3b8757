#!/usr/bin/env bash
# bench/gpu_session50b.sh — bench/stream_probe.cu alone, every form (the 4- and 8-tile bulk copies and the register
# loads too), on qwen3_30b_a3b's T = 1 streams with other splits of decode_down's 12.6 MB (ks 2: 256 blocks, two per
# SM) and of decode_up's 25.2 MB (ks 4), in a short call.
# Here: PACK_TARGETS=moex_stream_probe bash bench/gpu_prebuilt.sh pack   There (`run`, carry ["build-carry"]):
#   bash bench/gpu_prebuilt.sh run bench/gpu_session50b.sh → $OUT/probe.txt
set -u
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
BUILD=${BUILD:-build-gpu}
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader | tee "$OUT/probe.txt"
for a in "--rows 12288 --k 2048 --ks 2 --stages-kb 4" "--rows 12288 --k 2048 --ks 4 --stages-kb 4" \
         "--rows 16384 --k 768 --ks 1 --stages-kb 4" "--rows 16384 --k 768 --ks 2 --stages-kb 4" \
         "--rows 16384 --k 768 --ks 1 --stages-kb 6 --blocks-per-sm 1"; do
  echo "== moex_stream_probe $a" | tee -a "$OUT/probe.txt"
  # shellcheck disable=SC2086
  timeout 40 "$BUILD/moex_stream_probe" $a 2>&1 | tee -a "$OUT/probe.txt"
done
