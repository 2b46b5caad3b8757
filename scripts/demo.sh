#!/usr/bin/env bash
# The main job on a built-in default, no downloads, no GPU: builds moex, shows the machine and the
# backends, checks every available backend against the f64 reference on 200 random problems per
# dtype, benchmarks the CPU backends on a small MoE (H 1024, I 512, E 16, K 2), and generates with a
# committed tiny Qwen3-MoE checkpoint (made by the reference library) through every CPU backend.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)" --target moex
"$BUILD_DIR/moex" info
echo
"$BUILD_DIR/moex" check --count 200
echo
"$BUILD_DIR/moex" bench --device cpu --backends eager,batched_mm,grouped_mm --shapes small_moe --tokens 1,16,256 --dtype bf16
echo
MODEL=tests/fixtures/qwen3_moe
echo "generate: $MODEL, prompts 1,5,9,13,2,7 and 3,4,8, 8 new tokens (greedy)"
first=""
for b in grouped_mm batched_mm eager; do
  out=$("$BUILD_DIR/moex" generate --model "$MODEL" --ids "1,5,9,13,2,7;3,4,8" --max-new-tokens 8 --experts-implementation "$b")
  printf '  %-10s %s\n' "$b" "$out"
  [ -z "$first" ] && first=$out
  [ "$out" = "$first" ] || { echo "backends disagree"; exit 1; }
done
echo "  reference  $(python3 -c "import json;print(json.load(open('$MODEL/greedy.json'))['sequences'])" 2>/dev/null || echo '(see greedy.json)')"
echo "every CPU backend generates the same tokens"
