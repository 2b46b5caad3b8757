#!/usr/bin/env bash
# bench/gpu_final.sh — one device-machine call for a session's closing measurements:
#   1. the GPU suite of bench/gpu_check.sh (build, GPU tests, sanitizers, CUDA-graph timings,
#      `moex bench --device cuda` beside the reference library, side-by-side table)
#   2. the CPU side by side on the device machine's CPU (16 and 2 threads): `moex bench --device cpu`
#      and the reference library's CPU backends (bench/hf_experts_bench_cpu.py), merged into cpu.md
# Everything lands under $OUT (8 files at most come back from the device machine).
set -u
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
t0=$(date +%s)
PARTS=${PARTS:-"build tests sanitize perf bench hf table"} PERF_TOKENS=${PERF_TOKENS:-1,8,64} DEADLINE=${GPU_DEADLINE:-330} \
  OUT="$OUT" bash bench/gpu_check.sh
gpu_status=$?
echo "== cpu side by side ($(( $(date +%s) - t0 )) s)"
BUILD=${BUILD:-build-gpu}
tmp=$(mktemp -d)
{
  echo "# CPU side by side on the device machine: $(lscpu | grep -m1 'Model name' | sed 's/ \+/ /g'), $(nproc) cores"
  for th in ${CPU_THREADS:-16 2}; do
    for dt in bf16 f32; do
      timeout 150 "$BUILD/moex" bench --device cpu --backends eager,batched_mm,grouped_mm --shapes qwen3_30b_a3b,small_moe \
        --tokens 1,16,256 --dtype $dt --threads $th --format json --min-time-ms 200 --max-iters 20 >> "$tmp/moex_$th.jsonl"
    done
  done
  THREADS=$(echo ${CPU_THREADS:-16 2} | tr ' ' ,) PYTHONUNBUFFERED=1 timeout ${CPU_HF_TIMEOUT:-240} python3 bench/hf_experts_bench_cpu.py > "$tmp/hf.jsonl" 2>&1
  for th in ${CPU_THREADS:-16 2}; do
    echo; echo "## $th threads"; echo
    python3 bench/compare.py --moex "$tmp/moex_$th.jsonl" --ref "$tmp/hf.jsonl" --threads "$th"
  done
  echo; echo "## raw moex JSON"; cat "$tmp"/moex_*.jsonl
  echo; echo "## raw reference JSON"; cat "$tmp/hf.jsonl"
} > "$OUT/cpu.md" 2>&1
grep -A 20 "^## 16 threads" "$OUT/cpu.md" | head -18
grep -A 20 "^## 2 threads" "$OUT/cpu.md" | head -18
echo "== done ($(( $(date +%s) - t0 )) s)"
exit $gpu_status
