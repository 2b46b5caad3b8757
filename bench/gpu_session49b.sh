#!/usr/bin/env bash
# bench/gpu_session49b.sh — issue 6's T = 1 cells: the FP8 decode path's fused form (decode_fused:
# up, down and the combine in one kernel at T·K <= 8; MOEX_CUDA_FP8_DECODE_FUSED, quant_decode.cu) on
# one GPU machine with a moex_tests built here: tests (the fused form bit for bit against the four
# kernels, every switch, graph replay), memcheck / racecheck on the fused test, the bf16 / FP8 table
# with the four-kernel path and other ring depths as A/B variants, ncu of the T = 1 kernels.
# Overrides: PARTS (default "tests sanitize perf"), TEST_FILTER, SANITIZE_FILTER, AB_VARIANTS, AB_ROUNDS
# (default 3), SHAPES / TOKENS (default the qwen shapes at T = 1), NCU_VARIANTS ("name:FUSED-value ...",
# "" skips ncu).
# Here: bash bench/gpu_prebuilt.sh pack   There (`run`, carry ["build-carry"]):
#   bash bench/gpu_prebuilt.sh run bench/gpu_session49b.sh   → $OUT/summary.txt, fp8_decode.md, ncu_*.md
# decode_fused was removed at the end of the forty-ninth session: its switches now change nothing.
set -u
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export BUILD=${BUILD:-build-gpu}
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader | tee "$OUT/summary.txt"
OUT=$OUT/main PARTS="${PARTS:-tests sanitize perf}" SKIP_BUILD=1 COMPARE_OLD=0 AB_ROUNDS=${AB_ROUNDS:-3} \
  SHAPES=${SHAPES:-qwen3_30b_a3b,qwen15_moe_a2_7b} TOKENS=${TOKENS:-1} \
  AB_VARIANTS="${AB_VARIANTS:-four:MOEX_CUDA_FP8_DECODE_FUSED=0 st6:MOEX_CUDA_FP8_DECODE_FUSED_STAGES=6 st8:MOEX_CUDA_FP8_DECODE_FUSED_STAGES=8}" \
  SANITIZE_TIMEOUT=${SANITIZE_TIMEOUT:-120} SANITIZE_FILTER="${SANITIZE_FILTER:-Dtypes/CudaFp8Decode.FusedIsBitIdentical/bf16}" \
  TEST_FILTER="${TEST_FILTER:-*CudaFp8Decode*:*CudaGraph*:*CudaFp8Route*}" bash bench/gpu_fp8_decode.sh 2>&1 | tee -a "$OUT/summary.txt"
cp "$OUT/main/fp8_decode.md" "$OUT/" 2> /dev/null
for v in ${NCU_VARIANTS-fused:1 four:0}; do
  MOEX_CUDA_FP8_DECODE_FUSED=${v#*:} OUT=$OUT/ncu_${v%%:*} PARTS=ncu SKIP_BUILD=1 NCU_CASES="qwen3_30b_a3b:1 qwen15_moe_a2_7b:1" \
    bash bench/gpu_fp8_decode.sh > /dev/null 2>&1
  cp "$OUT/ncu_${v%%:*}/ncu.md" "$OUT/ncu_${v%%:*}.md" 2> /dev/null
  echo "== ncu ${v%%:*}" >> "$OUT/summary.txt"; cat "$OUT/ncu_${v%%:*}.md" >> "$OUT/summary.txt" 2> /dev/null
done
tar czf "$OUT/logs.tgz" -C "$OUT" main $(cd "$OUT" && ls -d ncu_* 2> /dev/null | grep -v '\.md$') 2> /dev/null && rm -rf "$OUT/main" "$OUT"/ncu_*/
ls "$OUT"
