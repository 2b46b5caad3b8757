#!/usr/bin/env bash
# The main job on a built-in default, no downloads, no GPU: builds moex, shows the machine and the
# backends, checks every available backend against the f64 reference on 200 random problems per
# dtype, and benchmarks the CPU backends on a small MoE (H 1024, I 512, E 16, K 2).
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
