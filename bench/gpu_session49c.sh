#!/usr/bin/env bash
# bench/gpu_session49c.sh — the four-kernel FP8 decode path with its block scales staged before the wait
# (MOEX_CUDA_FP8_DECODE_TMA_SCALES=1) and the fused form (decode_fused, opt-in MOEX_CUDA_FP8_DECODE_FUSED=1)
# measured against the four-kernel path on the qwen shapes at T = 1 with its k slices and the moment its
# down slab is requested as A/B variants; ncu's memory / warp-state sections of decode_fused and of the
# four-kernel decode_up; then the GPU suite (`*Cuda*:*DeepGemm*:-CudaPerf.*`) with what is left of the call.
# decode_fused was removed at the end of the forty-ninth session (its switches now change nothing); the
# default A/B variant is now the ring's forms before that session (call 2 ran with
# AB_VARIANTS="sc:MOEX_CUDA_FP8_DECODE_TMA_SCALES=1 fused:$F st6:$F,…_FUSED_STAGES=6 slab2:$F,…_FUSED_SLAB=2 ks2:$F,…_KS_UP=2").
# Overrides: AB_VARIANTS, AB_ROUNDS, TEST_FILTER, CALL_LIMIT (seconds the whole call may take, default 585).
# Here: bash bench/gpu_prebuilt.sh pack   There (`run`, carry ["build-carry"]):
#   bash bench/gpu_prebuilt.sh run bench/gpu_session49c.sh   → $OUT/summary.txt, fp8_decode.md, ncu.txt, tests.log
set -u
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export BUILD=${BUILD:-build-gpu} MOEX_SOURCE_DIR=$PWD
t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader | tee "$OUT/summary.txt"
F=MOEX_CUDA_FP8_DECODE_FUSED=1
OUT=$OUT/main PARTS=perf SKIP_BUILD=1 COMPARE_OLD=0 AB_ROUNDS=${AB_ROUNDS:-2} SHAPES=qwen3_30b_a3b,qwen15_moe_a2_7b TOKENS=1 \
  AB_VARIANTS="${AB_VARIANTS:-old:MOEX_CUDA_FP8_DECODE_TMA_BOX=128,MOEX_CUDA_FP8_DECODE_TMA_SCALES=0}" \
  bash bench/gpu_fp8_decode.sh 2>&1 | tee -a "$OUT/summary.txt"
cp "$OUT/main/fp8_decode.md" "$OUT/" 2> /dev/null
echo "== ncu ($(( $(date +%s) - t0 )) s)" | tee -a "$OUT/summary.txt"
for v in "fused:1" "four:0"; do
  MOEX_CUDA_FP8_DECODE_FUSED=${v#*:} MOEX_CUDA_PERF=1 MOEX_CUDA_PERF_QUANT=fp8 MOEX_CUDA_PERF_TOKENS=1 MOEX_CUDA_PERF_SHAPES=qwen3_30b_a3b \
    MOEX_CUDA_PERF_BACKENDS=grouped_mm MOEX_CUDA_PERF_REPS=1 timeout 120 ncu --clock-control none --launch-count 3 \
    --kernel-name "regex:decode_(fused|up|down)" --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section WarpStateStats --section LaunchStats --section Occupancy "$BUILD/moex_tests" --gtest_filter='CudaPerf.Shapes' \
    > "$OUT/ncu_${v%%:*}.txt" 2>&1
  echo "ncu ${v%%:*} rc $?" | tee -a "$OUT/summary.txt"
done
cat "$OUT"/ncu_fused.txt "$OUT"/ncu_four.txt > "$OUT/ncu.txt" 2> /dev/null && rm -f "$OUT"/ncu_fused.txt "$OUT"/ncu_four.txt
left=$(( ${CALL_LIMIT:-585} - ($(date +%s) - t0) ))
echo "== suite with $left s left" | tee -a "$OUT/summary.txt"
OUT=$OUT/suite PARTS="tests" SKIP_BUILD=1 TEST_TIMEOUT=$(( left - 10 )) \
  TEST_FILTER="${TEST_FILTER:-*Cuda*:*DeepGemm*:-CudaPerf.*}" bash bench/gpu_check.sh 2>&1 | tail -30 | tee -a "$OUT/summary.txt"
cp "$OUT/suite/tests.log" "$OUT/" 2> /dev/null
echo "done at $(( $(date +%s) - t0 )) s" | tee -a "$OUT/summary.txt"
tar czf "$OUT/logs.tgz" -C "$OUT" main suite 2> /dev/null && rm -rf "$OUT/main" "$OUT/suite"
ls "$OUT"
