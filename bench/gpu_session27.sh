#!/usr/bin/env bash
# bench/gpu_session27.sh — one call on the GPU machine for the twenty-seventh session, from the
# repository root (`run` with command `bash bench/gpu_session27.sh`). Issue 5: the decode attention's
# first tile before the PDL wait (MOEX_CUDA_DECODE_EARLY; call 1 measured =1 against the default of
# then, call 2 the new default against =0) and, in call 1 only, batched_mm's down kernel with h
# staged in shared memory (MOEX_CUDA_DOWN_STAGE, commit 07ee3e1, removed: slower), timed in the
# 48-layer model; the experts alone (issue 6's table, graph replay); the GPU suite; compute-sanitizer. Every step writes into $OUT as it goes and is skipped once DEADLINE
# seconds (default 560) have passed. Steps (PARTS, default all, in this order):
#   build     moex_tests, moex_model_bench (CUDA, Release) into $BUILD
#   ab        moex_model_bench (48-layer random Qwen3-30B-A3B, decode prompts of $AB_PROMPT tokens,
#             default 128; switching and graphs at $AB_BATCHES, default 1,8) for "base" and every
#             "name:ENV=V[,ENV=V]" of $AB_VARIANTS, the list $AB_ROUNDS times (default 3), interleaved
#             → $OUT/ab.log
#   perf      bench/gpu_fp8_decode.sh's timings (CudaPerf.Shapes, graph replay, bf16 and FP8,
#             batched_mm and grouped_mm, $TOKENS default 1,8,64) for base and $PERF_VARIANTS
#             → $OUT/perf.txt
#   tests     $TEST_FILTER (default: every CUDA test but the timed one) → $OUT/tests.log
#   sanitize  compute-sanitizer memcheck and racecheck on $SANITIZE_FILTER
source "$(dirname "$0")/gpu_common.sh" "build ab perf tests sanitize"
if has build; then
  gpu_build moex_tests moex_model_bench
  stamp built
fi
if has ab && [ "$(left)" -gt 60 ]; then
  for round in $(seq 1 "${AB_ROUNDS:-3}"); do
    for v in "base:-" ${AB_VARIANTS:-}; do
      [ "$(left)" -gt 40 ] || break
      name=${v%%:*}
      stamp "model bench [$name] round $round"
      env $(envs_of "${v#*:}") timeout 90 "$BUILD/moex_model_bench" --layers 48 --prompt 64 --decode-prompt "${AB_PROMPT:-128}" \
        --batches "${AB_BATCHES:-1,8}" --variants switch+graphs --out "$OUT/e2e_${name}_$round.json" 2>&1 |
        grep -E "^decode|^#|error" | sed "s/^/[$name] /" | tee -a "$OUT/ab.log"
    done
  done
fi
if has perf && [ "$(left)" -gt 60 ]; then
  stamp perf
  timeout "$(( $(left) - 30 ))" env PARTS=perf SKIP_BUILD=1 COMPARE_OLD=0 TOKENS="${TOKENS:-1,8,64}" AB_ROUNDS="${PERF_ROUNDS:-1}" \
    AB_VARIANTS="${PERF_VARIANTS:-}" bash bench/gpu_fp8_decode.sh > "$OUT/perf.txt" 2>&1
  echo "perf rc $?"
  grep -E "^\|" "$OUT/perf.txt" | head -30
fi
if has tests && [ "$(left)" -gt 60 ]; then
  gpu_tests "${TEST_FILTER:-*Cuda*:-CudaPerf.*}" "$(( $(left) - ${SANITIZE_RESERVE:-70} ))"
  grep -c "^\[       OK \]" "$OUT/tests.log" | sed 's/^/tests OK: /'
fi
if has sanitize && [ "$(left)" -gt 30 ]; then
  gpu_sanitize "${SANITIZE_FILTER:-CudaAttentionKernels.Decode*}" "$(( ($(left) - 10) / 2 ))"
fi
stamp done
