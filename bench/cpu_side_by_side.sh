#!/usr/bin/env bash
# CPU benchmark of moex beside the reference library's CPU backends, same shapes, same threads,
# same run. Needs `pip install torch transformers` for the reference side.
#   [ROUNDS=n] [QUANT="fp8 fp4"] bench/cpu_side_by_side.sh [THREADS] [OUTDIR]
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${1:-$(nproc)}
OUT=${2:-${OUT:-/tmp/moex_cpu_bench}}
mkdir -p "$OUT"
BUILD_DIR=${BUILD_DIR:-build}
[ -x "$BUILD_DIR/moex" ] || { cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null && cmake --build "$BUILD_DIR" --target moex; }
: > "$OUT/moex_cpu.jsonl"
: > "$OUT/hf_cpu.jsonl"
# ROUNDS=n: moex and the reference alternate n times and each side keeps its fastest round per case
# (compare.py): a machine whose memory bandwidth changes from minute to minute (the development VM:
# ~36 or ~63 GB/s) then gives both sides the same chances.
for round in $(seq "${ROUNDS:-1}"); do
  for dt in bf16 f32; do
    "$BUILD_DIR/moex" bench --device cpu --backends eager,batched_mm,grouped_mm --shapes qwen3_30b_a3b,small_moe \
      --tokens 1,16,256 --dtype $dt --threads "$THREADS" --format json | tee -a "$OUT/moex_cpu.jsonl"
  done
  # QUANT="fp8 fp4": moex's quantized experts too (bf16 activations), beside the reference's bf16 rows
  for q in ${QUANT:-}; do
    "$BUILD_DIR/moex" bench --device cpu --backends eager,batched_mm,grouped_mm --shapes qwen3_30b_a3b,small_moe \
      --tokens 1,16,256 --dtype bf16 --quant "$q" --threads "$THREADS" --format json | tee -a "$OUT/moex_cpu.jsonl"
  done
  THREADS=$THREADS python3 bench/hf_experts_bench_cpu.py | tee -a "$OUT/hf_cpu.jsonl"
done
python3 bench/compare.py --moex "$OUT/moex_cpu.jsonl" --ref "$OUT/hf_cpu.jsonl" --threads "$THREADS" | tee "$OUT/cpu_table.md"
