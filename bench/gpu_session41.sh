#!/usr/bin/env bash
# bench/gpu_session41.sh — the forty-first session's CPU call on the GPU machine's 16-core host, from the
# repository root (`run` with command `bash bench/gpu_session41.sh`), after or without the suite call
# (bench/gpu_session28.sh PARTS="build tests" leaves build-gpu/; without it moex is built first). Steps
# (PARTS, default "model cpu"), each writing into $OUT and skipped once DEADLINE seconds (default 560)
# have passed:
#   model  bench/model_side_by_side.py at $MODEL_THREADS (default "16 2") threads: the model runtime's
#          CPU path (moex bench-model) beside the reference library's forward / generate, same model,
#          same run → $OUT/model_t<threads>.txt
#   cpu    bench/cpu_h200.sh with the build's moex: the A/B of $CPU_AB (default: the AMX FP8 / FP4
#          dispatch — tiles from 8 rows per call — against vdpbf16ps everywhere, MOEX_CPU_AMX_QUANT=0)
#          on $CPU_AB_CASES, then issue 8's side-by-side table at 16 and 2 threads → $OUT/cpu/
source "$(dirname "$0")/gpu_common.sh" "model cpu"
[ -x "$BUILD/moex" ] || gpu_build moex
if has model; then
  for th in ${MODEL_THREADS:-16 2}; do
    [ "$(left)" -gt 240 ] || break
    stamp "model side by side, $th threads"
    timeout 170 python3 bench/model_side_by_side.py --moex "$BUILD/moex" --threads "$th" --prompt-len 256 --new-tokens 32 \
      --repeat 3 > "$OUT/model_t$th.txt" 2>&1
    echo "rc $?"
    grep "^|" "$OUT/model_t$th.txt"
  done
fi
if has cpu && [ "$(left)" -gt 150 ]; then
  stamp "cpu (issue 8)"
  OUT=$OUT/cpu TOTAL=$(( $(left) - 10 )) SKIP_BUILD=1 SKIP_TESTS=1 BUILD=$BUILD CPU_AB_ROUNDS=${CPU_AB_ROUNDS:-1} \
    CPU_AB="${CPU_AB-default: vdp:MOEX_CPU_AMX_QUANT=0}" \
    CPU_AB_CASES="${CPU_AB_CASES-qwen3_30b_a3b bf16 1,16,256 fp8;small_moe bf16 16,256 fp8}" \
    bash bench/cpu_h200.sh 2>&1 | tail -45
fi
stamp done
