#!/usr/bin/env bash
# bench/cpu_h200.sh — the CPU side of issue 8 on the device machine's 16-core CPU, in one call (< 10 min):
#   1. a CPU-only build (MOEX_CUDA=OFF) and the CPU kernel + equivalence tests
#   2. `moex bench --device cpu` (eager, batched_mm, grouped_mm; qwen3_30b_a3b and small_moe; T = 1, 16, 256;
#      bf16 and f32) at 16 and 2 threads, then the reference library's CPU backends
#      (bench/hf_experts_bench_cpu.py), same shapes, same run, merged by bench/compare.py
# Writes $OUT/cpu.md (tables + raw JSON) and $OUT/tests.txt; prints the two tables.
#   OUT=/some/dir bash bench/cpu_h200.sh
# CPU_THREADS (default "16 2") picks the thread counts, TOTAL (s, default 570) the time budget the
# reference run is fitted into, SKIP_TESTS=1 builds moex only and skips step 1's tests, SKIP_BUILD=1
# uses the moex already in $BUILD (a CUDA build's moex runs `bench --device cpu` with the same CPU code).
# QUANT="fp8 fp4" (optional) adds moex's FP8 / FP4 experts to the side by side (bf16 activations; each bench call
# first quantizes its random weights, ~10-20 s for qwen3_30b_a3b).
# CPU_AB (optional) runs A/B rounds before the side by side, each variant "name:ENV=V,ENV2=V" (or
# "name:" for the defaults), interleaved over CPU_AB_ROUNDS rounds (default 3), grouped_mm on
# CPU_AB_CASES ("shape dtype tokens [quant]" entries separated by ';', quant none / fp8 / fp4, default:
# qwen3_30b_a3b bf16 and f32 at T = 1,16,256), at every thread count; the table goes to
# $OUT/cpu_ab.txt. Examples (the thirty-sixth session's open questions for Intel hosts: software
# prefetch in decode and huge pages; the thirty-ninth's AMX FP8 / FP4 kernels):
#   CPU_AB="default: none:MOEX_CPU_PREFETCH_AHEAD=-1 chunk:MOEX_CPU_PREFETCH_AHEAD=0 small_pages:MOEX_CPU_HUGE_PAGES=0"
#   CPU_AB="default: amx:MOEX_CPU_AMX_QUANT=1" CPU_AB_CASES="qwen3_30b_a3b bf16 1,16,256 fp8;qwen3_30b_a3b bf16 1,16,256 fp4;small_moe bf16 16,256 fp8"
# On a CPU with AMX the tests also run the equivalence harness with MOEX_CPU_AMX_QUANT=1.
# SIDE=0 skips the side by side (tests and A/B only); otherwise the A/B stops starting cases once fewer
# than SIDE_RESERVE seconds (default 300) of TOTAL are left. Each quantized case first quantizes its
# random weights (qwen3_30b_a3b: ~10-20 s a call), so keep FP8 / FP4 A/Bs to a few cases and rounds.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
t0=$(date +%s)
left() { echo $(( ${TOTAL:-570} - ($(date +%s) - t0) )); }
BUILD=${BUILD:-build-cpu}
if [ "${SKIP_BUILD:-0}" = 1 ]; then  # $BUILD/moex (and moex_tests) already built, e.g. the CUDA build
  [ -x "$BUILD/moex" ] || { echo "SKIP_BUILD=1 but no $BUILD/moex"; exit 1; }
else
echo "== build ($(nproc) cores)"
{ cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEX_CUDA=OFF -DMOEX_BUILD_TESTS=ON >/dev/null &&
  cmake --build "$BUILD" -j "$(nproc)" --target moex $([ "${SKIP_TESTS:-0}" = 1 ] || echo moex_tests) >/dev/null; } ||
  { echo "build failed"; exit 1; }
fi
tests_status=0
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  echo "== tests ($(( $(date +%s) - t0 )) s)"
  OMP_WAIT_POLICY=passive "$BUILD/moex_tests" --gtest_filter='CpuKernels*:Dtypes/Equivalence*' --gtest_brief=1 > "$OUT/tests.txt" 2>&1
  tests_status=$?
  tail -3 "$OUT/tests.txt"
  if grep -q amx_bf16 /proc/cpuinfo; then
    # the AMX FP8 / FP4 kernels on every call (MOEX_CPU_AMX_QUANT=1; by default from 8 rows per call)
    # through the whole experts path: the equivalence harness's FP8 / FP4 cases on grouped_mm /
    # batched_mm / eager, and their kernel tests (which also run the tile unit without the variable)
    echo "== tests with MOEX_CPU_AMX_QUANT=1" | tee -a "$OUT/tests.txt"
    MOEX_CPU_AMX_QUANT=1 OMP_WAIT_POLICY=passive "$BUILD/moex_tests" --gtest_filter='Dtypes/Equivalence*:*Amx*' --gtest_brief=1 >> "$OUT/tests.txt" 2>&1 ||
      tests_status=1
    tail -2 "$OUT/tests.txt"
  fi
fi
if [ -n "${CPU_AB:-}" ]; then
  echo "== cpu A/B ($(( $(date +%s) - t0 )) s)"
  IFS=';' read -ra ab_cases <<< "${CPU_AB_CASES:-qwen3_30b_a3b bf16 1,16,256;qwen3_30b_a3b f32 1,16,256}"
  for round in $(seq 1 "${CPU_AB_ROUNDS:-3}"); do
    for th in ${CPU_THREADS:-16 2}; do
      for variant in $CPU_AB; do
        name=${variant%%:*}; envs=${variant#*:}
        for c in "${ab_cases[@]}"; do
          # keep SIDE_RESERVE seconds (default 300; 0 with SIDE=0) of TOTAL for the side by side
          if [ "$(left)" -lt "$( [ "${SIDE:-1}" = 0 ] && echo 20 || echo "${SIDE_RESERVE:-300}")" ]; then
            echo "round $round  threads $th  $name  $c  (skipped: time budget)" | tee -a "$OUT/cpu_ab.txt"
            continue
          fi
          read -r shape dt toks quant <<< "$c"
          quant=${quant:-none}
          # one line per case: round, threads, variant, shape, dtype, experts' quantization, then "T=ms" per token count
          line=$(env $(echo "$envs" | tr ',' ' ') timeout 90 "$BUILD/moex" bench --device cpu --backends grouped_mm \
                   --shapes "$shape" --tokens "$toks" --dtype "$dt" --quant "$quant" --threads "$th" --min-time-ms 300 --max-iters 20 2>&1 |
                 awk -v s="$shape" '$1 == s { printf "T=%s %s  ", $2, $4 }')
          echo "round $round  threads $th  $name  $shape $dt $quant  $line" | tee -a "$OUT/cpu_ab.txt"
        done
      done
    done
  done
fi
if [ "${SIDE:-1}" = 0 ]; then  # the tests and A/B only
  echo "== done ($(( $(date +%s) - t0 )) s; SIDE=0: no side by side)"
  exit $tests_status
fi
echo "== cpu side by side ($(( $(date +%s) - t0 )) s, $(left) s left)"
tmp=$OUT/cpu_raw; mkdir -p "$tmp"  # under $OUT: a run cut by its time limit still brings these back
{
  echo "# CPU side by side on the device machine: $(lscpu | grep -m1 'Model name' | sed 's/ \+/ /g'), $(nproc) cores, commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  for th in ${CPU_THREADS:-16 2}; do
    for dt in bf16 f32; do
      # OpenMP's default wait policy, as a user runs it (the 2026-11-30 run used passive waiting here,
      # which puts every parallel region's threads to sleep and back: fixed costs at T = 1)
      timeout 60 "$BUILD/moex" bench --device cpu --backends eager,batched_mm,grouped_mm --shapes qwen3_30b_a3b,small_moe \
        --tokens 1,16,256 --dtype $dt --threads $th --format json --min-time-ms 100 --max-iters 10 --warmup 2 >> "$tmp/moex_$th.jsonl"
    done
    # QUANT="fp8 fp4" (optional): moex's quantized experts too, beside the reference's bf16 rows (compare.py)
    for q in ${QUANT:-}; do
      timeout 90 "$BUILD/moex" bench --device cpu --backends eager,batched_mm,grouped_mm --shapes qwen3_30b_a3b,small_moe \
        --tokens 1,16,256 --dtype bf16 --quant "$q" --threads $th --format json --min-time-ms 100 --max-iters 10 --warmup 2 >> "$tmp/moex_$th.jsonl"
    done
  done
  hf_left=$(( $(left) - 15 )); [ $hf_left -gt 200 ] && hf_left=200
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
exit $tests_status
