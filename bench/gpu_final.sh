#!/usr/bin/env bash
# bench/gpu_final.sh — one device-machine call for a session's closing measurements (< 10 min):
#   1. the GPU suite of bench/gpu_check.sh: build, GPU tests, sanitizers, CUDA-graph timings,
#      `moex bench --device cuda` beside the reference library, side-by-side table
#   2. the CPU side by side on the device machine's CPU (16 and 2 threads): `moex bench --device cpu`
#      and the reference library's CPU backends (bench/hf_experts_bench_cpu.py), merged into cpu.md
# Everything lands under $OUT (8 files at most come back from the device machine).
set -u
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
t0=$(date +%s)
left() { echo $(( ${TOTAL:-560} - ($(date +%s) - t0) )); }
PARTS=${PARTS:-"build tests sanitize perf bench hf table"} PERF_TOKENS=${PERF_TOKENS:-1,8,64} DEADLINE=${GPU_DEADLINE:-300} \
  SAN_CASES=${SAN_CASES:-12} SAN_RACE_CASES=${SAN_RACE_CASES:-6} BENCH_TIMEOUT=${BENCH_TIMEOUT:-150} HF_TIMEOUT=${HF_TIMEOUT:-150} \
  OUT="$OUT" bash bench/gpu_check.sh
gpu_status=$?
BUILD=${BUILD:-build-gpu}
echo "== cpu side by side ($(( $(date +%s) - t0 )) s, $(left) s left)"
tmp=$(mktemp -d)
{
  echo "# CPU side by side on the device machine: $(lscpu | grep -m1 'Model name' | sed 's/ \+/ /g'), $(nproc) cores, $(lscpu | grep -m1 -o 'amx_bf16' || echo 'no amx')"
  for th in ${CPU_THREADS:-16 2}; do
    for dt in bf16 f32; do
      timeout 50 "$BUILD/moex" bench --device cpu --backends eager,batched_mm,grouped_mm --shapes qwen3_30b_a3b,small_moe \
        --tokens 1,16,256 --dtype $dt --threads $th --format json --min-time-ms 100 --max-iters 10 --warmup 1 >> "$tmp/moex_$th.jsonl"
    done
  done
  hf_left=$(( $(left) - 15 )); [ $hf_left -gt 150 ] && hf_left=150
  THREADS=$(echo ${CPU_THREADS:-16 2} | tr ' ' ,) PYTHONUNBUFFERED=1 timeout $hf_left python3 bench/hf_experts_bench_cpu.py > "$tmp/hf.jsonl" 2>&1
  for th in ${CPU_THREADS:-16 2}; do
    echo; echo "## $th threads"; echo
    python3 bench/compare.py --moex "$tmp/moex_$th.jsonl" --ref "$tmp/hf.jsonl" --threads "$th"
  done
  echo; echo "## raw moex JSON"; cat "$tmp"/moex_*.jsonl
  echo; echo "## raw reference JSON"; cat "$tmp/hf.jsonl"
} > "$OUT/cpu.md" 2>&1
sed -n '/^## 16 threads/,/^## 2 threads/p' "$OUT/cpu.md" | head -18
sed -n '/^## 2 threads/,/^## raw/p' "$OUT/cpu.md" | head -18
echo "== done ($(( $(date +%s) - t0 )) s)"
exit $gpu_status
