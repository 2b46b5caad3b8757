#!/usr/bin/env bash
# bench/gpu_session22.sh — one call on the GPU machine for the twenty-second session, from the repository
# root (`run` with command `bash bench/gpu_session22.sh`): where the FP8 decode chain's time goes at
# the cells issue 6 still misses (qwen T = 1, mixtral T = 64). Steps:
#   build  moex, moex_tests (CUDA, Release) into $BUILD
#   sass   local-memory instructions (must be 0) and QGMMA / HGMMA counts of the FP8 TMA kernels
#   tests  $TEST_FILTER (default: the FP8 decode path, the graph replays, the equivalence harness)
#   ncu    ncu's SpeedOfLight / Occupancy / LaunchStats / WarpStateStats / SchedulerStats /
#          MemoryWorkloadAnalysis sections of each kernel of one forward (the second: warm), for
#          every NCU_CASES item "shape:T:backend:quant[:ENV=V,...]" → $OUT/ncu_<n>.txt
#   sanitize  compute-sanitizer memcheck / racecheck on $SANITIZE_FILTER (default: the bf16 decode
#          cases) with $SANITIZE_ENV ("ENV=V[,ENV=V]", default none) set
#   bench  moex bench of $BENCH_BACKENDS (default deepgemm) on $BENCH_SHAPES at $BENCH_TOKENS, FP8 and bf16
#          (JSON lines: ms, TFLOP/s) → $OUT/bench.json
#   perf   bench/gpu_fp8_decode.sh's table (CUDA-graph replay, bf16 and FP8, batched_mm / grouped_mm)
#          at $TOKENS with $AB_VARIANTS (COMPARE_OLD=1 adds the TMA kernels at every T)
# PARTS selects steps (default "build sass tests sanitize ncu bench perf").
source "$(dirname "$0")/gpu_common.sh" "build sass tests sanitize ncu bench perf"
if has build; then gpu_build moex moex_tests; fi
if has sass; then
  stamp sass
  for f in $(find "$BUILD" -name 'sm90_tma_kernels_fp8*.cu.o'); do
    cuobjdump -sass "$f" > "$OUT/k.sass" 2>/dev/null
    echo "$(basename "$f"): $(grep -cE 'LDL|STL' "$OUT/k.sass") local-memory, $(grep -c QGMMA "$OUT/k.sass") QGMMA, $(grep -c HGMMA "$OUT/k.sass") HGMMA"
  done
  rm -f "$OUT/k.sass"
fi
if has tests; then gpu_tests "${TEST_FILTER:-*CudaFp8Decode*:CudaFp8Route.*:Capturable/CudaGraph.*:*CudaEquivalence*}" "${TEST_TIMEOUT:-240}"; fi
if has sanitize; then
  (for v in $(envs_of "${SANITIZE_ENV:-}"); do export "$v"; done
   gpu_sanitize "${SANITIZE_FILTER:-Dtypes/CudaFp8Decode.MatchesTheReference/bf16}")
fi
if has ncu; then
  n=0
  for c in ${NCU_CASES:-qwen3_30b_a3b:1:grouped_mm:fp8 qwen3_30b_a3b:1:batched_mm:none mixtral_8x7b:64:grouped_mm:fp8}; do
    n=$((n + 1))
    IFS=: read -r shape T backend quant extra <<< "$c"
    stamp "ncu $n [$c]"
    env $(envs_of "${extra:-}") MOEX_CUDA_PERF=1 MOEX_CUDA_PERF_QUANT="$quant" MOEX_CUDA_PERF_TOKENS="$T" MOEX_CUDA_PERF_SHAPES="$shape" \
      MOEX_CUDA_PERF_BACKENDS="$backend" MOEX_CUDA_PERF_REPS=2 timeout 200 ncu --clock-control none \
      --launch-skip "${NCU_SKIP:-4}" --launch-count "${NCU_COUNT:-4}" \
      --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
      --section SchedulerStats --section MemoryWorkloadAnalysis ${NCU_EXTRA:-} \
      "$BUILD/moex_tests" --gtest_filter=CudaPerf.Shapes > "$OUT/ncu_$n.txt" 2>&1
    echo "ncu rc $?"
    grep -E "^  [a-z_]+.*\(|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Grid Size|Block Size|Waves Per SM|Dynamic Shared|Issued Warp|No Eligible|Active Warps Per" "$OUT/ncu_$n.txt" | head -80
  done
fi
if has bench; then
  for q in fp8 none; do
    stamp "bench $q"
    timeout 200 "$BUILD/moex" bench --device cuda --backends "${BENCH_BACKENDS:-deepgemm}" --shapes "${BENCH_SHAPES:-deepseek_v3}" \
      --tokens "${BENCH_TOKENS:-4096,16384}" --dtype bf16 --quant $q --format json --no-dense 2>> "$OUT/bench.err" | tee -a "$OUT/bench.json"
  done
fi
if has perf; then PARTS=perf SKIP_BUILD=1 COMPARE_OLD=${COMPARE_OLD:-1} bash bench/gpu_fp8_decode.sh; fi
stamp done
