#!/usr/bin/env bash
# bench/gpu_session51c.sh — how much of the FP8 decode chain's T = 1 time is its own latency: CudaPerf.Shapes on the
# opt-in latency_probe shape (qwen3_30b_a3b's H, E and K with I = 16: ~0.8 MB of FP8 weights, 1.6 MB bf16 per forward)
# beside qwen3_30b_a3b and qwen15_moe_a2_7b at T = 1, bf16 and FP8, three interleaved rounds (CUDA-graph replay); then
# ncu's time of each kernel of the FP8 chain (decode_prep, decode_up, decode_down, combine) alone on latency_probe and
# qwen3_30b_a3b.
# Here: bash bench/gpu_prebuilt.sh pack   There (`run`, carry ["build-carry"]):
#   bash bench/gpu_prebuilt.sh run bench/gpu_session51c.sh → $OUT/summary.txt, fp8_decode.md, ncu.md, logs.tgz
set -u
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export BUILD=${BUILD:-build-gpu} MOEX_SOURCE_DIR=$PWD
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader | tee "$OUT/summary.txt"
OUT=$OUT/main PARTS="perf ncu" SKIP_BUILD=1 COMPARE_OLD=0 AB_ROUNDS=${AB_ROUNDS:-3} \
  SHAPES=latency_probe,qwen3_30b_a3b,qwen15_moe_a2_7b TOKENS=1 AB_VARIANTS="${AB_VARIANTS:-}" \
  NCU_CASES="latency_probe:1 qwen3_30b_a3b:1" NCU_KERNELS="decode_|combine" \
  timeout 400 bash bench/gpu_fp8_decode.sh 2>&1 | tail -24 | tee -a "$OUT/summary.txt"
cp "$OUT/main/fp8_decode.md" "$OUT/main/ncu.md" "$OUT/" 2> /dev/null
tar czf "$OUT/logs.tgz" -C "$OUT" main 2> /dev/null && rm -rf "$OUT/main"
ls "$OUT"
