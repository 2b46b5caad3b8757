#!/usr/bin/env bash
# bench/gpu_session29.sh — one call on the GPU machine for the twenty-ninth session, from the repository
# root (`run` with command `bash bench/gpu_session29.sh`): the whole GPU suite on the current tree, then
# the same-day tables of the two expert issues that had not been re-measured on it. Every step writes
# into $OUT as it goes and is skipped once DEADLINE seconds (default 570) have passed. Steps (PARTS,
# default "build tests side fp8", in this order):
#   build  moex, moex_tests (CUDA, Release) into $BUILD
#   tests  $TEST_FILTER (default: every CUDA test but the timed one) -> $OUT/tests.log
#   side   issue 7's side by side (bench/gpu_session18.sh PARTS=side: moex deepgemm / grouped_mm bf16
#          and FP8, the dense cuBLAS GEMM of the same FLOPs, the reference library's experts backends)
#          -> $OUT/side.md
#   fp8    issue 6's table (bench/gpu_fp8_decode.sh PARTS=perf: bf16 and FP8 batched_mm / grouped_mm,
#          CUDA-graph replay, T = $FP8_TOKENS, default 1,8,64,512,4096) -> $OUT/fp8_decode.md
source "$(dirname "$0")/gpu_common.sh" "build tests side fp8"
DEADLINE=${DEADLINE:-570}
if has build; then
  gpu_build moex moex_tests
  stamp built
fi
if has tests && [ "$(left)" -gt 60 ]; then
  gpu_tests "${TEST_FILTER:-*Cuda*:-CudaPerf.*}" "$(( $(left) - 30 ))"
  grep -c "^\[       OK \]" "$OUT/tests.log" | sed 's/^/tests OK: /'
fi
if has side && [ "$(left)" -gt 210 ]; then
  stamp "issue 7 side by side"
  mkdir -p "$OUT/side"
  OUT=$OUT/side BUILD=$BUILD PARTS=side DEADLINE=$(( $(left) - 5 )) bash bench/gpu_session18.sh 2>&1 | tail -20
fi
if has fp8 && [ "$(left)" -gt 60 ]; then
  stamp "issue 6 table"
  mkdir -p "$OUT/fp8"
  OUT=$OUT/fp8 BUILD=$BUILD PARTS=perf SKIP_BUILD=1 COMPARE_OLD=0 TOKENS=${FP8_TOKENS:-1,8,64,512,4096} \
    timeout "$(( $(left) - 5 ))" bash bench/gpu_fp8_decode.sh 2>&1 | tail -30
fi
stamp done
