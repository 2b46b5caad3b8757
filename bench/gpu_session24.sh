#!/usr/bin/env bash
# bench/gpu_session24.sh — one call on the GPU machine for the twenty-fourth session, from the
# repository root (`run` with command `bash bench/gpu_session24.sh`): built to test and time the FP8
# decode path's fused chain (T <= 8: two kernels instead of four; commit 570ebaf, removed in 8c14cb1 as
# slower: docs/PERF.md, twenty-fourth session) against the four kernels, and the few-row exact kernel
# after its pipelined loop was removed. At 570ebaf the perf default was
# AB_VARIANTS="four:MOEX_CUDA_FP8_DECODE_FUSE=0 comb:MOEX_CUDA_FP8_DECODE_FUSE=combine" and the sanitizers'
# filter Dtypes/CudaFp8Decode.FusedChain*/bf16; the tree after it has neither. Every step writes into $OUT as it goes
# and is skipped once DEADLINE seconds (default 520) have passed, so that a slow step cannot take
# the others' results with it. Steps (PARTS, default all):
#   build     moex, moex_tests (CUDA, Release) into $BUILD
#   tests     $TEST_FILTER (default: the decode path, the FP8 routes, graph replays, FP8 prefill)
#   perf      bench/gpu_fp8_decode.sh's table at $TOKENS (default 1,8,64) with $AB_VARIANTS (default
#             none) → $OUT/fp8_decode.md, $OUT/perf.txt
#   sanitize  compute-sanitizer memcheck and racecheck on $SANITIZE_FILTER (default: the decode
#             path's bf16 cases)
source "$(dirname "$0")/gpu_common.sh" "build tests perf sanitize"
DEADLINE=${DEADLINE:-520}
if has build; then gpu_build moex moex_tests; stamp built; fi
if has tests && [ "$(left)" -gt 60 ]; then
  gpu_tests "${TEST_FILTER:-*CudaFp8Decode*:CudaFp8Route.*:Capturable/CudaGraph.*:*CudaFp8Prefill*}" "$(( $(left) - 40 ))"
fi
if has perf && [ "$(left)" -gt 40 ]; then
  stamp perf
  timeout "$(( $(left) - 20 ))" env PARTS=perf SKIP_BUILD=1 COMPARE_OLD=0 TOKENS="${TOKENS:-1,8,64}" AB_ROUNDS="${AB_ROUNDS:-2}" \
    AB_VARIANTS="${AB_VARIANTS:-}" \
    bash bench/gpu_fp8_decode.sh > "$OUT/perf.txt" 2>&1
  echo "perf rc $?"
  grep -E "^\|" "$OUT/perf.txt" | head -30
fi
if has sanitize && [ "$(left)" -gt 30 ]; then
  for tool in memcheck racecheck; do
    [ "$(left)" -gt 20 ] || break
    stamp "$tool"
    timeout "$(( $(left) - 10 ))" compute-sanitizer --tool $tool --error-exitcode 9 "$BUILD/moex_tests" \
      --gtest_filter="${SANITIZE_FILTER:-Dtypes/CudaFp8Decode.MatchesTheReference/bf16}" > "$OUT/$tool.log" 2>&1
    echo "$tool rc $?"
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" "$OUT/$tool.log" | head -4
  done
fi
stamp done
