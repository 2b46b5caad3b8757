#!/usr/bin/env bash
# bench/gpu_session42c.sh — the forty-second session's last host-CPU call, from the repository root (`run`
# with command `bash bench/gpu_session42c.sh`): the model runtime's CPU prefill of this tree against an
# earlier tree placed (untracked) in $OLD_TREE (default old_tree/), both built CPU-only here; an
# interleaved A/B of moex bench-model prefill (grouped_mm, 16 threads) at 256- and 2 048-token prompts,
# $AB_ROUNDS rounds (default 3); one stage profile (MOEX_CPU_PROFILE=1) of each at 256 tokens; then
# bench/model_side_by_side.py at 16 threads, 256 and 2 048-token prompts, with this tree. DEADLINE
# (default 560).
source "$(dirname "$0")/gpu_common.sh" "all"
OLD_TREE=${OLD_TREE:-old_tree}
M=/tmp/moex_qwen3_small
stamp build
for t in new:. old:$OLD_TREE; do
  { cmake -S "${t#*:}" -B "build-cpu-${t%%:*}" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEX_CUDA=OFF -DMOEX_BUILD_TESTS=OFF &&
    cmake --build "build-cpu-${t%%:*}" -j "$(nproc)" --target moex; } > "$OUT/build_${t%%:*}.log" 2>&1 ||
    { grep error "$OUT/build_${t%%:*}.log" | head; exit 1; }
done
[ -f $M/config.json ] || timeout 120 python3 bench/model_side_by_side.py --moex build-cpu-new/moex --threads 16 \
  --prompt-len 16 --new-tokens 2 --repeat 1 > /dev/null 2>&1
stamp "A/B"
for r in $(seq ${AB_ROUNDS:-3}); do
  for p in 256 2048; do
    for v in old new; do
      [ "$(left)" -gt 200 ] || break 3
      echo "round $r prompt $p $v: $(OMP_NUM_THREADS=16 build-cpu-$v/moex bench-model --model $M --dtype bf16 --prompt-len $p \
        --new-tokens 4 --backends grouped_mm --repeat 3 2>&1 | grep '^grouped_mm')"
    done
  done
done | tee "$OUT/ab.txt"
for v in old new; do
  echo "profile $v:"
  MOEX_CPU_PROFILE=1 OMP_NUM_THREADS=16 build-cpu-$v/moex bench-model --model $M --dtype bf16 --prompt-len 256 --new-tokens 16 \
    --backends grouped_mm --repeat 3 2>&1 | sed -n '/profile, prefill/,/profile, decode/p' | grep -v "profile, decode"
done | tee "$OUT/profiles.txt"
for p in 256 2048; do
  [ "$(left)" -gt 90 ] || break
  stamp "model side by side, 16 threads, $p-token prompts"
  timeout $(( $(left) - 15 )) python3 bench/model_side_by_side.py --moex build-cpu-new/moex --threads 16 --prompt-len $p \
    --new-tokens 16 --repeat 2 > "$OUT/model_t16_p$p.txt" 2>&1; echo "rc $?"; grep "^|" "$OUT/model_t16_p$p.txt"
done
stamp done
