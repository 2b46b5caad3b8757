#!/usr/bin/env bash
# bench/gpu_session48b.sh — issue 6's T = 1 cells: the FP8 decode path's TMA weight ring
# (MOEX_CUDA_FP8_DECODE_TMA, quant_decode.cu) against the register ring, on one GPU machine with a
# moex_tests built here: tests (the ring bit for bit against the register ring, every switch, graph
# replay), memcheck / racecheck, the bf16 / FP8 table with the register ring as an A/B variant, and
# ncu of each decode kernel at T = 1 on the qwen shapes under both rings.
# Overrides: PARTS (default "tests sanitize perf"), TEST_FILTER, AB_VARIANTS (default the register ring),
# AB_ROUNDS, SHAPES / TOKENS (bench/gpu_fp8_decode.sh's), NCU_VARIANTS ("name:TMA-value ...", "" skips ncu).
# Here: bash bench/gpu_prebuilt.sh pack   There (`run`, carry ["build-carry"]):
#   bash bench/gpu_prebuilt.sh run bench/gpu_session48b.sh   → $OUT/summary.txt, fp8_decode.md, ncu_*.md
set -u
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export BUILD=${BUILD:-build-gpu}
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader | tee "$OUT/summary.txt"
OUT=$OUT/main PARTS="${PARTS:-tests sanitize perf}" SKIP_BUILD=1 COMPARE_OLD=0 AB_ROUNDS=${AB_ROUNDS:-2} \
  AB_VARIANTS="${AB_VARIANTS:-reg:MOEX_CUDA_FP8_DECODE_TMA=0}" SANITIZE_TIMEOUT=200 \
  TEST_FILTER="${TEST_FILTER:-*CudaFp8Decode*:*CudaGraph*:*CudaFp8Route*}" bash bench/gpu_fp8_decode.sh 2>&1 | tee -a "$OUT/summary.txt"
cp "$OUT/main/fp8_decode.md" "$OUT/" 2> /dev/null
for v in ${NCU_VARIANTS-tma:1 reg:0}; do
  MOEX_CUDA_FP8_DECODE_TMA=${v#*:} OUT=$OUT/ncu_${v%%:*} PARTS=ncu SKIP_BUILD=1 NCU_CASES="qwen3_30b_a3b:1 qwen15_moe_a2_7b:1 qwen3_30b_a3b:8" \
    bash bench/gpu_fp8_decode.sh > /dev/null 2>&1
  cp "$OUT/ncu_${v%%:*}/ncu.md" "$OUT/ncu_${v%%:*}.md" 2> /dev/null
  echo "== ncu ${v%%:*}" >> "$OUT/summary.txt"; cat "$OUT/ncu_${v%%:*}.md" >> "$OUT/summary.txt" 2> /dev/null
done
tar czf "$OUT/logs.tgz" -C "$OUT" main ncu_tma ncu_reg 2> /dev/null && rm -rf "$OUT/main" "$OUT/ncu_tma" "$OUT/ncu_reg"
ls "$OUT"
