#!/usr/bin/env bash
# bench/gpu_session48.sh — issue 5 on the H200 (the bar's machine): the batch-1 step of the final tree
# against its memory floor, the post-attention norm in the router A/B, and the end-to-end table beside
# the reference library (its batch-64 run needs more than an H100's 80 GB: `run` with needs_h200).
# Here: PACK_TARGETS=moex_model_bench bash bench/gpu_prebuilt.sh pack
# There (`run`, carry ["build-carry"], kind nvidia-h200, needs_h200): bash bench/gpu_prebuilt.sh run bench/gpu_session48.sh
#   → $OUT/ab.log, $OUT/side_by_side.md, $OUT/moex_e2e.json, $OUT/ref_e2e.json (the rest packed in $OUT/all.tgz)
set -u
OUT=${OUT:-$PWD/out}
R=$OUT/r
mkdir -p "$R"
OUT=$R PARTS="ab model" AB_PREFILLS=${AB_PREFILLS:-2048} AB_BATCHES=${AB_BATCHES:-1,8} AB_ROUNDS=${AB_ROUNDS:-2} \
  AB_VARIANTS=${AB_VARIANTS:-"nopost:MOEX_CUDA_FUSE_POST_NORM=0"} DEADLINE=${DEADLINE:-540} bash bench/gpu_session28.sh
for f in ab.log side_by_side.md moex_e2e.json ref_e2e.json; do cp "$R/$f" "$OUT/" 2> /dev/null; done
tar czf "$OUT/all.tgz" -C "$OUT" r && rm -rf "$R"
ls "$OUT"
