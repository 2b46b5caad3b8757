#!/usr/bin/env bash
# CPU experts benchmark of two moex builds (e.g. before / after a kernel change) beside the reference
# library's CPU backends, interleaved round by round so that a VM whose memory bandwidth changes from
# minute to minute gives every side the same chances; bench/compare.py keeps each side's fastest round.
#   OLD=/path/to/old/moex NEW=/path/to/new/moex [ROUNDS=3] [THREADS=2] bench/cpu_old_new_side_by_side.sh OUTDIR
# Writes OUTDIR/{moex_old,moex_new,hf_cpu}.jsonl and OUTDIR/table_{old,new}.md. Needs `pip install torch transformers`.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?"usage: OLD=... NEW=... bench/cpu_old_new_side_by_side.sh OUTDIR"}
OLD=${OLD:?"OLD: the old build's moex"}
NEW=${NEW:?"NEW: the new build's moex"}
THREADS=${THREADS:-2}
mkdir -p "$OUT"
: > "$OUT/moex_old.jsonl"; : > "$OUT/moex_new.jsonl"; : > "$OUT/hf_cpu.jsonl"
for round in $(seq "${ROUNDS:-3}"); do
  for dt in bf16 f32; do
    for side in old new; do
      bin=$OLD; [ "$side" = new ] && bin=$NEW
      "$bin" bench --device cpu --backends eager,batched_mm,grouped_mm --shapes qwen3_30b_a3b,small_moe --tokens 1,16,256 \
        --dtype $dt --threads "$THREADS" --format json >> "$OUT/moex_$side.jsonl"
    done
  done
  THREADS=$THREADS python3 bench/hf_experts_bench_cpu.py >> "$OUT/hf_cpu.jsonl"
  echo "round $round done" >&2
done
for side in old new; do
  python3 bench/compare.py --moex "$OUT/moex_$side.jsonl" --ref "$OUT/hf_cpu.jsonl" --threads "$THREADS" > "$OUT/table_$side.md"
done
cat "$OUT/table_new.md"
