#!/usr/bin/env bash
# bench/gpu_session50a.sh — the fiftieth session's first call: the GPU suite on the tree the forty-ninth session
# ended with (never run on a GPU: 256-byte boxes + staged scales as defaults, decode_fused removed, the
# review refactor), then issue 6's T <= 64 table (four shapes × T = 1, 8, 64; bf16 beside FP8, CUDA-graph
# replay) with the ring's forms before the forty-ninth session as the A/B variant, with what is left.
# First, when the carry has it (PACK_TARGETS="moex_tests moex_stream_probe"), bench/stream_probe.cu on qwen3's sizes.
# Here: bash bench/gpu_prebuilt.sh pack   There (`run`, carry ["build-carry"]):
#   CALL_LIMIT=... bash bench/gpu_prebuilt.sh run bench/gpu_session50a.sh → $OUT/summary.txt, tests.log, fp8_decode.md
set -u
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export BUILD=${BUILD:-build-gpu} MOEX_SOURCE_DIR=$PWD
t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader | tee "$OUT/summary.txt"
if [ -x "$BUILD/moex_stream_probe" ]; then  # the weight stream by request shape (bench/stream_probe.cu)
  for a in "--rows 12288 --k 2048 --ks 2 --stages-kb 4" "--rows 12288 --k 2048 --ks 2 --stages-kb 8" \
           "--rows 12288 --k 2048 --ks 1 --stages-kb 4" "--rows 16384 --k 768 --ks 1 --stages-kb 4" \
           "--rows 11264 --k 2048 --ks 2 --stages-kb 4"; do
    echo "== moex_stream_probe $a" | tee -a "$OUT/summary.txt"
    # shellcheck disable=SC2086
    timeout 60 "$BUILD/moex_stream_probe" $a 2>&1 | tee -a "$OUT/summary.txt"
  done
fi
OUT=$OUT/suite PARTS="tests" SKIP_BUILD=1 TEST_TIMEOUT=${SUITE_TIMEOUT:-420} \
  TEST_FILTER="${TEST_FILTER:-*Cuda*:*DeepGemm*:-CudaPerf.*}" bash bench/gpu_check.sh 2>&1 | tail -30 | tee -a "$OUT/summary.txt"
cp "$OUT/suite/tests.log" "$OUT/" 2> /dev/null
left=$(( ${CALL_LIMIT:-585} - ($(date +%s) - t0) ))
echo "== perf with $left s left" | tee -a "$OUT/summary.txt"
OUT=$OUT/main PARTS=perf SKIP_BUILD=1 COMPARE_OLD=0 AB_ROUNDS=${AB_ROUNDS:-2} TOKENS=${TOKENS:-1,8,64} \
  AB_VARIANTS="${AB_VARIANTS:-old:MOEX_CUDA_FP8_DECODE_TMA_BOX=128,MOEX_CUDA_FP8_DECODE_TMA_SCALES=0}" \
  timeout $(( left - 10 )) bash bench/gpu_fp8_decode.sh 2>&1 | tail -24 | tee -a "$OUT/summary.txt"
cp "$OUT/main/fp8_decode.md" "$OUT/" 2> /dev/null
echo "done at $(( $(date +%s) - t0 )) s" | tee -a "$OUT/summary.txt"
tar czf "$OUT/logs.tgz" -C "$OUT" main suite 2> /dev/null && rm -rf "$OUT/main" "$OUT/suite"
ls "$OUT"
