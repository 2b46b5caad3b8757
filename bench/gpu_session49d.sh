#!/usr/bin/env bash
# bench/gpu_session49d.sh — issue 6's T <= 64 table (four shapes × T = 1, 8, 64; bf16 beside FP8, CUDA-graph
# replay) with the FP8 decode path's staged block scales (MOEX_CUDA_FP8_DECODE_TMA_SCALES=1) as the A/B
# variant, in a short call (a moex_tests built here; bench/gpu_fp8_decode.sh's perf step only).
# Here: bash bench/gpu_prebuilt.sh pack   There (`run`, carry ["build-carry"]):
#   bash bench/gpu_prebuilt.sh run bench/gpu_session49d.sh   → $OUT/summary.txt, fp8_decode.md
set -u
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export BUILD=${BUILD:-build-gpu} MOEX_SOURCE_DIR=$PWD
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader | tee "$OUT/summary.txt"
OUT=$OUT/main PARTS="${PARTS:-tests perf}" SKIP_BUILD=1 COMPARE_OLD=0 AB_ROUNDS=${AB_ROUNDS:-2} \
  AB_VARIANTS="${AB_VARIANTS:-sc:MOEX_CUDA_FP8_DECODE_TMA_SCALES=1}" TEST_FILTER="${TEST_FILTER:-Dtypes/CudaFp8Decode.TmaRingIsBitIdentical/*}" bash bench/gpu_fp8_decode.sh 2>&1 | tee -a "$OUT/summary.txt"
cp "$OUT/main/fp8_decode.md" "$OUT/" 2> /dev/null
tar czf "$OUT/logs.tgz" -C "$OUT" main 2> /dev/null && rm -rf "$OUT/main"
ls "$OUT"
