#!/usr/bin/env bash
# bench/gpu_fp8_decode.sh — the FP8 decode path (src/backends/cuda/quant_decode.cu) on the GPU
# machine, one command from the repository root (`run` with `bash bench/gpu_fp8_decode.sh`):
#
#   1. builds moex + moex_tests with CUDA into $BUILD (default build-gpu; SKIP_BUILD=1 reuses it)
#   2. SASS of the decode kernels: HMMA / F2FP (e4m3x2 -> f16x2) counts, local memory (must be 0)
#   3. tests: CudaFp8Decode.* (T 1/3/8/64/200, partial blocks, skewed/dropped routing, f32/f16/bf16,
#      f32/UE8M0 scales), CudaGraph.* (incl. fp8_t1 / fp8_t64: replay with new routing == direct call,
#      bit for bit), CudaEquivalence.*, CudaFp8MmaGemv.*, CudaBackends.*; compute-sanitizer memcheck
#      and racecheck on the bf16 decode cases
#   4. timings, CUDA-graph replay (CudaPerf.Shapes): bf16 and FP8 experts side by side in one run,
#      batched_mm and grouped_mm, SHAPES x TOKENS (default the 4 SPEC §9 shapes x 1,8,64); with
#      COMPARE_OLD=1 (default) a second run with MOEX_CUDA_FP8_DECODE=0 times the previous FP8 kernels
#
# PARTS selects steps (default all: "build sass tests sanitize perf"); the whole run with the build
# should stay under the 10-minute limit of one command (tests ~2 min, sanitizers <= 2x150 s, timings ~2 min).
#
# Output: "== step" lines, test PASSED/FAILED lines, the table (also $OUT/fp8_decode.md) with the
# ratio best bf16 / best FP8 per (shape, T) — issue 6 asks >= 1.6x at T <= 64; logs under $OUT.
set -u
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
BUILD=${BUILD:-build-gpu}
SHAPES=${SHAPES:-qwen3_30b_a3b,mixtral_8x7b,deepseek_v3,qwen15_moe_a2_7b}
TOKENS=${TOKENS:-1,8,64}
COMPARE_OLD=${COMPARE_OLD:-1}
PARTS=${PARTS:-"build sass tests sanitize perf"}
has() { case " $PARTS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
t0=$(date +%s)
stamp() { echo "== $1 ($(( $(date +%s) - t0 )) s)"; }

if [ -z "${SKIP_BUILD:-}" ] && has build; then
  stamp build
  { cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEX_CUDA=ON &&
    cmake --build "$BUILD" -j "$(nproc)" --target moex moex_tests; } > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
fi

if has sass; then
stamp sass
obj=$(find "$BUILD" -name 'quant_decode.cu.o' | head -1)
if command -v cuobjdump > /dev/null && [ -n "$obj" ]; then
  cuobjdump -sass "$obj" > "$OUT/quant_decode.sass" 2>/dev/null
  awk '/Function :/{f=$3} /HMMA/{h[f]++} /F2FP.F16.E4M3/{c[f]++} /LDL|STL/{l[f]++}
       END{for (k in h) printf "%s: %d HMMA, %d F2FP.F16.E4M3, %d local-memory\n", k, h[k], c[k], l[k]}' "$OUT/quant_decode.sass" |
    sed -E 's/_ZN4moex4cuda[^_]*_GLOBAL__N__[0-9a-f_]*quant_decode_cu_[0-9a-f]*//' | sort
else
  echo "no cuobjdump or object: skipped"
fi
fi

if has tests; then
stamp tests
OMP_WAIT_POLICY=passive "$BUILD/moex_tests" \
  --gtest_filter='*CudaFp8Decode*:*CudaGraph*:*CudaEquivalence*:*CudaFp8MmaGemv*:CudaBackends.*' > "$OUT/tests.log" 2>&1
rc=$?
grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]|worst rel L2|FP8 decode path" "$OUT/tests.log" | head -60
[ $rc -eq 0 ] || grep -B2 -A10 "Failure" "$OUT/tests.log" | head -80
fi
if has sanitize && command -v compute-sanitizer > /dev/null; then
  stamp sanitizer
  timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 "$BUILD/moex_tests" \
    --gtest_filter='Dtypes/CudaFp8Decode.*/bf16' > "$OUT/memcheck.log" 2>&1
  echo "memcheck rc $? ($(grep -c 'Invalid' "$OUT/memcheck.log") invalid accesses)"
  timeout 150 compute-sanitizer --tool racecheck --error-exitcode 9 "$BUILD/moex_tests" \
    --gtest_filter='Dtypes/CudaFp8Decode.*/bf16' > "$OUT/racecheck.log" 2>&1
  echo "racecheck rc $? ($(grep -ci 'hazard' "$OUT/racecheck.log") hazard lines)"
fi

if has perf; then
stamp timings
perf() {  # $1 = MOEX_CUDA_FP8_DECODE value ("" = default), $2 = log
  MOEX_CUDA_FP8_DECODE=$1 MOEX_CUDA_PERF=1 MOEX_CUDA_PERF_QUANT=none,fp8 MOEX_CUDA_PERF_TOKENS="$TOKENS" \
    MOEX_CUDA_PERF_SHAPES="$SHAPES" MOEX_CUDA_PERF_BACKENDS=batched_mm,grouped_mm \
    timeout 240 "$BUILD/moex_tests" --gtest_filter='CudaPerf.Shapes' > "$2" 2>&1
}
perf "" "$OUT/perf.log"
[ "$COMPARE_OLD" = 1 ] && perf 0 "$OUT/perf_old.log"
python3 - "$OUT" <<'PY' | tee "$OUT/fp8_decode.md"
import os, sys
out = sys.argv[1]
def read(name):
    rows = {}
    path = os.path.join(out, name)
    if not os.path.exists(path): return rows
    for line in open(path):
        f = line.split()
        if len(f) >= 5 and f[0] == "PERF" and f[3] != "backend":
            try: rows[(f[1], int(f[2]), f[3])] = float(f[4])
            except ValueError: pass
    return rows
new, old = read("perf.log"), read("perf_old.log")
cases = sorted({(k[0], k[1]) for k in new})
print("| shape | T | bf16 batched | bf16 grouped | FP8 batched | FP8 grouped | old FP8 best | best bf16 / best FP8 | >= 1.6x |")
print("|---|---|---|---|---|---|---|---|---|")
f = lambda v: f"{v:.4f}" if v else "—"
for s, T in cases:
    bb, bg = new.get((s, T, "batched_mm")), new.get((s, T, "grouped_mm"))
    qb, qg = new.get((s, T, "batched_mm/fp8")), new.get((s, T, "grouped_mm/fp8"))
    ob = min([v for v in (old.get((s, T, "batched_mm/fp8")), old.get((s, T, "grouped_mm/fp8"))) if v] or [0])
    best_bf16 = min([v for v in (bb, bg) if v] or [0])
    best_fp8 = min([v for v in (qb, qg) if v] or [0])
    ratio = best_bf16 / best_fp8 if best_bf16 and best_fp8 else 0
    print(f"| {s} | {T} | {f(bb)} | {f(bg)} | {f(qb)} | {f(qg)} | {f(ob)} | " + (f"{ratio:.2f}x" if ratio else "—") +
          f" | {'yes' if ratio >= 1.6 else 'NO'} |")
PY
grep -h "error" "$OUT/perf.log" | grep PERF | head
fi
stamp done
