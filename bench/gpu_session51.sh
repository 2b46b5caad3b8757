#!/usr/bin/env bash
# bench/gpu_session51.sh — the fifty-first session's first call, prepared by the fiftieth (docs/PERF.md, "For the next
# session (fifty-first)"), one H100 or H200, carried binaries:
#   1. the FP8 decode tests (`Dtypes/CudaFp8Decode.*`: EverySwitchMatchesTheReference now runs
#      MOEX_CUDA_FP8_DECODE_KS_UP=1 / 8 and expects an error for 3, never run on a GPU before);
#   2. the co-residency A/B at T = 1 / 8 on the qwen shapes, three interleaved rounds (CUDA-graph replay):
#      ks1 (decode_up in 96 blocks, register ring), ks1t (the same with the TMA ring forced), hqup (h quantized by
#      decode_up), b2 (decode_down's split from two blocks per SM), ec (decode_down's first pair-list entries read
#      before pdl_wait, MOEX_CUDA_FP8_DECODE_EARLY_COLS=1, fifty-first session), ks1ec (ks1 and ec);
#   3. bench/gpu_session50b.sh's probe runs (the stream forms and decode_down splits that did not run) when the carry
#      has moex_stream_probe.
# Here: PACK_TARGETS="moex_tests moex_stream_probe" bash bench/gpu_prebuilt.sh pack   There (`run`, carry ["build-carry"]):
#   bash bench/gpu_prebuilt.sh run bench/gpu_session51.sh → $OUT/summary.txt, fp8_decode.md, probe.txt, logs.tgz
set -u
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export BUILD=${BUILD:-build-gpu} MOEX_SOURCE_DIR=$PWD
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader | tee "$OUT/summary.txt"
OUT=$OUT/main PARTS="tests perf" SKIP_BUILD=1 COMPARE_OLD=0 AB_ROUNDS=${AB_ROUNDS:-3} SHAPES=qwen3_30b_a3b,qwen15_moe_a2_7b \
  TOKENS=${TOKENS:-1,8} TEST_FILTER="${TEST_FILTER:-Dtypes/CudaFp8Decode.*}" \
  AB_VARIANTS="${AB_VARIANTS:-ks1:MOEX_CUDA_FP8_DECODE_KS_UP=1 ks1t:MOEX_CUDA_FP8_DECODE_KS_UP=1,MOEX_CUDA_FP8_DECODE_TMA=1 hqup:MOEX_CUDA_FP8_DECODE_HQ=up b2:MOEX_CUDA_FP8_DECODE_BLOCKS=2 ec:MOEX_CUDA_FP8_DECODE_EARLY_COLS=1 ks1ec:MOEX_CUDA_FP8_DECODE_KS_UP=1,MOEX_CUDA_FP8_DECODE_EARLY_COLS=1}" \
  timeout 400 bash bench/gpu_fp8_decode.sh 2>&1 | tail -30 | tee -a "$OUT/summary.txt"
cp "$OUT/main/fp8_decode.md" "$OUT/" 2> /dev/null
[ -x "$BUILD/moex_stream_probe" ] && OUT=$OUT bash bench/gpu_session50b.sh > /dev/null 2>&1
tar czf "$OUT/logs.tgz" -C "$OUT" main 2> /dev/null && rm -rf "$OUT/main"
ls "$OUT"
