#!/usr/bin/env bash
# bench/gpu_session26.sh — one call on the GPU machine for the twenty-sixth session, from the
# repository root (`run` with command `bash bench/gpu_session26.sh`): tests and times decode-step
# fusions (issue 5: call 1 the post-attention RMSNorm in the cluster router — slower, removed, its
# switch MOEX_CUDA_FUSE_POST_NORM existed at commit edeca79 only; call 2 the q/k/v post-processing
# in the decode attention kernel, MOEX_CUDA_FUSE_QKV_POST=0 turns it off), the in-graph cost of each
# kernel (MOEX_CUDA_DEBUG_SKIP), and profiles the kernels of a batch-1 decode step. Every step writes into $OUT as it goes
# and is skipped once DEADLINE seconds (default 520) have passed. Steps (PARTS, default all):
#   build     moex_tests, moex_model_bench (CUDA, Release) into $BUILD
#   tests     $TEST_FILTER (default: the model's GPU kernels, graphs, bf16 parity, switching)
#   ab        moex_model_bench (48-layer random Qwen3-30B-A3B, decode prompts of $AB_PROMPT
#             tokens (default 128), decode with switching and graphs at
#             $AB_BATCHES, default 1,8) for "base" and every "name:ENV=V[,ENV=V]" of $AB_VARIANTS,
#             the list $AB_ROUNDS times (default 2), interleaved → $OUT/ab.log
#   skip      the batch-1 step without each of $SKIP_LIST's kernels (MOEX_CUDA_DEBUG_SKIP, one run
#             each; default norm qkv qkvpost attn o experts) → $OUT/skip.log
#   ncu       every kernel of a 4-layer model's decode steps alone (ncu, --clock-control none;
#             $NCU_KERNELS, default all) → $OUT/ncu.txt
#   detail    ncu --set full on one launch of each of $DETAIL_KERNELS (default the router and the
#             experts' down kernel) → $OUT/detail_<n>.txt
#   sanitize  compute-sanitizer memcheck and racecheck on $SANITIZE_FILTER
source "$(dirname "$0")/gpu_common.sh" "build tests ab skip ncu detail sanitize"
DEADLINE=${DEADLINE:-520}
if has build; then
  gpu_build moex_tests moex_model_bench
  stamp built
fi
if has tests && [ "$(left)" -gt 60 ]; then
  gpu_tests "${TEST_FILTER:-CudaModelKernels.*:CudaModelGraphs*:*CudaModelParity.Bf16*:CudaModelSwitching*:CudaModelRouters*:CudaBatched.*}" \
    "$(( $(left) - 40 ))"
fi
if has ab && [ "$(left)" -gt 60 ]; then
  for round in $(seq 1 "${AB_ROUNDS:-2}"); do
    for v in "base:-" ${AB_VARIANTS:-}; do
      [ "$(left)" -gt 40 ] || break
      name=${v%%:*}
      stamp "model bench [$name] round $round"
      env $(envs_of "${v#*:}") timeout 90 "$BUILD/moex_model_bench" --layers 48 --prompt 64 --decode-prompt "${AB_PROMPT:-128}" --batches "${AB_BATCHES:-1,8}" \
        --variants "${AB_DECODE:-switch+graphs}" ${BENCH_ARGS:-} --out "$OUT/e2e_${name}_$round.json" 2>&1 |
        grep -E "^decode|^#|error" | sed "s/^/[$name] /" | tee -a "$OUT/ab.log"
    done
  done
fi
if has skip && [ "$(left)" -gt 60 ]; then
  for k in base ${SKIP_LIST:-norm qkv qkvpost attn o experts}; do
    [ "$(left)" -gt 40 ] || break
    stamp "skip [$k]"
    env $([ "$k" = base ] || echo MOEX_CUDA_DEBUG_SKIP=$k) timeout 90 "$BUILD/moex_model_bench" --layers 48 --prompt 64 \
      --batches 1 --variants switch+graphs 2>&1 | grep -E "^decode|error" | sed "s/^/[skip $k] /" | tee -a "$OUT/skip.log"
  done
fi
if has ncu && [ "$(left)" -gt 60 ]; then
  stamp ncu
  # the 4-layer model: prefill of 16 tokens, then 4 decode steps (the lm head's GEMV marks each step's end)
  timeout "$(( $(left) - 30 ))" ncu --clock-control none --csv --print-units base \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__registers_per_thread,launch__grid_size \
    --kernel-name regex:"${NCU_KERNELS:-.}" --launch-skip "${NCU_SKIP:-0}" --launch-count "${NCU_COUNT:-300}" \
    "$BUILD/moex_model_bench" --layers 4 --prompt 16 --batches 1 --new 4 --variants switch_no_graphs > "$OUT/ncu.csv" 2> "$OUT/ncu.err"
  echo "ncu rc $?"
  ncu_table "$OUT/ncu.csv" > "$OUT/ncu.txt"
  tail -45 "$OUT/ncu.txt"
fi
if has detail && [ "$(left)" -gt 60 ]; then
  n=0
  for kname in ${DETAIL_KERNELS:-gemv_router batched_down batched_up}; do
    [ "$(left)" -gt 40 ] || break
    n=$((n + 1))
    stamp "ncu detail [$kname]"
    timeout 60 ncu --set full --clock-control none --kernel-name regex:"$kname" --launch-skip "${DETAIL_SKIP:-4}" --launch-count 1 \
      "$BUILD/moex_model_bench" --layers 4 --prompt 16 --batches 1 --new 4 --variants switch_no_graphs > "$OUT/detail_$n.txt" 2>&1
    echo "ncu detail rc $?"
    grep -E "Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers Per|Stall|One or More|No Eligible|Issued Warp" "$OUT/detail_$n.txt" | head -20
  done
fi
if has sanitize && [ "$(left)" -gt 30 ]; then
  gpu_sanitize "${SANITIZE_FILTER:-CudaModelKernels.*Router*}" "$(( ($(left) - 10) / 2 ))"
fi
stamp done
