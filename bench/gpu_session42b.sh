#!/usr/bin/env bash
# bench/gpu_session42b.sh — the forty-second session's second host-CPU call (the AMX linears' tile rule),
# from the repository root (`run` with command `bash bench/gpu_session42b.sh`): a CPU-only build of moex,
# the AMX linears bit check on the real tiles, the model side by side at 16 threads (256-token prompts),
# an interleaved A/B of the tile rule (prefill tok/s of moex bench-model, grouped_mm, 16 threads) at 256-
# and 2 048-token prompts over $AB_VARIANTS (name:VAR=value,...; default old: MOEX_CPU_AMX_LINEARS=0, the
# per-call tiles, and new: the default; the first run of this script also had c512: fixed 256 × 512
# tiles), $AB_ROUNDS rounds (default 2) — then the side by side at 2 048-token prompts if time is left.
# DEADLINE (default 560).
source "$(dirname "$0")/gpu_common.sh" "all"
B=build-cpu/moex
M=/tmp/moex_qwen3_small
stamp build
{ cmake -S . -B build-cpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEX_CUDA=OFF -DMOEX_BUILD_TESTS=OFF &&
  cmake --build build-cpu -j "$(nproc)" --target moex; } > "$OUT/build.log" 2>&1 || { grep error "$OUT/build.log" | head; exit 1; }
stamp "AMX linears, same bits on the tiles"
MOEX_CPU_ISA=avx512_amx sh tests/amx_linears_same_bits.sh "$B" tests/fixtures "$OUT/amx_bits" 2>&1 | tail -3
stamp "model side by side, 16 threads, 256-token prompts"
timeout 150 python3 bench/model_side_by_side.py --moex "$B" --threads 16 --prompt-len 256 --new-tokens 32 --repeat 3 \
  > "$OUT/model_t16_p256.txt" 2>&1; echo "rc $?"; grep "^|" "$OUT/model_t16_p256.txt"
stamp "tile rule A/B"
for r in $(seq ${AB_ROUNDS:-2}); do
  for p in 256 2048; do
    for v in ${AB_VARIANTS:-old:MOEX_CPU_AMX_LINEARS=0 new:-}; do
      [ "$(left)" -gt 170 ] || break 3
      echo "round $r prompt $p ${v%%:*}: $(env $(envs_of "${v#*:}") OMP_NUM_THREADS=16 "$B" bench-model --model $M --dtype bf16 \
        --prompt-len $p --new-tokens 4 --backends grouped_mm --repeat 3 2>&1 | grep '^grouped_mm')"
    done
  done
done | tee "$OUT/tile_ab.txt"
if [ "$(left)" -gt 150 ]; then
  stamp "model side by side, 16 threads, 2048-token prompts"
  timeout $(( $(left) - 20 )) python3 bench/model_side_by_side.py --moex "$B" --threads 16 --prompt-len 2048 --new-tokens 16 \
    --repeat 2 > "$OUT/model_t16_p2048.txt" 2>&1; echo "rc $?"; grep "^|" "$OUT/model_t16_p2048.txt"
fi
stamp done
