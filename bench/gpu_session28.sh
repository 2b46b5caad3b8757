#!/usr/bin/env bash
# bench/gpu_session28.sh — one call on the GPU machine for the twenty-eighth session, from the
# repository root (`run` with command `bash bench/gpu_session28.sh`). Issue 5: the decode attention's
# cluster merge (MOEX_CUDA_DECODE_CLUSTER, on by default from this session) timed in the 48-layer model
# at a short and at the end-to-end table's KV capacity, the end-to-end table itself beside the
# reference library; the GPU suite; compute-sanitizer; issue 8 on this machine's CPU. Every step writes
# into $OUT as it goes and is skipped once DEADLINE seconds (default 560) have passed. Steps (PARTS,
# default "build ab model tests sanitize", in this order):
#   build     moex, moex_tests, moex_model_bench (CUDA, Release) into $BUILD
#   ab        moex_model_bench (48-layer random Qwen3-30B-A3B, decode prompts of 128 tokens; switching and
#             graphs at $AB_BATCHES, default 1,8) for "base" and every "name:ENV=V[,ENV=V]" of
#             $AB_VARIANTS, the list $AB_ROUNDS times (default 2), interleaved, once per prefill length
#             of $AB_PREFILLS (default "64 2048": KV capacities of 193 and 2 113 keys) → $OUT/ab.log
#   model     bench/gpu_model_check.sh's bench, ref and table: issue 5's end-to-end table → $OUT/side_by_side.md
#   tests     $TEST_FILTER (default: every CUDA test but the timed one) → $OUT/tests.log
#   sanitize  compute-sanitizer memcheck and racecheck on $SANITIZE_FILTER
#   cpu       bench/cpu_h200.sh with the build's moex (issue 8 on this machine's 16-core CPU; the CPU
#             tests are CI's) → $OUT/cpu/
source "$(dirname "$0")/gpu_common.sh" "build ab model tests sanitize"
if has build; then
  gpu_build moex moex_tests moex_model_bench
  stamp built
fi
if has ab && [ "$(left)" -gt 60 ]; then
  for prefill in ${AB_PREFILLS:-64 2048}; do
    for round in $(seq 1 "${AB_ROUNDS:-2}"); do
      for v in "base:-" ${AB_VARIANTS:-}; do
        [ "$(left)" -gt 40 ] || break
        name=${v%%:*}
        stamp "model bench [$name] prefill $prefill round $round"
        env $(envs_of "${v#*:}") timeout 90 "$BUILD/moex_model_bench" --layers 48 --prompt "$prefill" --decode-prompt 128 \
          --batches "${AB_BATCHES:-1,8}" --variants switch+graphs --out "$OUT/e2e_${name}_p${prefill}_$round.json" 2>&1 |
          grep -E "^decode|^#|error" | sed "s/^/[$name p$prefill] /" | tee -a "$OUT/ab.log"
      done
    done
  done
fi
if has model && [ "$(left)" -gt 120 ]; then
  stamp "end-to-end table"
  OUT=$OUT PARTS="bench ref table" BUILD=$BUILD timeout "$(( $(left) - 20 ))" bash bench/gpu_model_check.sh > "$OUT/model.txt" 2>&1
  echo "model rc $?"
  cat "$OUT/side_by_side.md" 2>/dev/null
fi
if has tests && [ "$(left)" -gt 60 ]; then
  gpu_tests "${TEST_FILTER:-*Cuda*:-CudaPerf.*}" "$(( $(left) - ${SANITIZE_RESERVE:-40} ))"
  grep -c "^\[       OK \]" "$OUT/tests.log" | sed 's/^/tests OK: /'
fi
if has sanitize && [ "$(left)" -gt 30 ]; then
  gpu_sanitize "${SANITIZE_FILTER:-CudaAttentionKernels.DecodeWithThePostProcessingMatchesTheTwoKernels}" "$(( ($(left) - 10) / 2 ))"
fi
if has cpu && [ "$(left)" -gt 150 ]; then
  stamp "cpu (issue 8)"
  OUT=$OUT/cpu TOTAL=$(( $(left) - 10 )) SKIP_BUILD=1 SKIP_TESTS=1 BUILD=$BUILD bash bench/cpu_h200.sh 2>&1 | tail -40
fi
stamp done
