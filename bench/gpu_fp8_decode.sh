#!/usr/bin/env bash
# bench/gpu_fp8_decode.sh — the FP8 decode path (src/backends/cuda/quant_decode.cu) on the GPU
# machine, one command from the repository root (`run` with `bash bench/gpu_fp8_decode.sh`):
#
#   1. builds moex + moex_tests with CUDA into $BUILD (default build-gpu; SKIP_BUILD=1 reuses it)
#   2. SASS of the decode kernels: HMMA / F2FP (e4m3x2 -> f16x2) counts, local memory (must be 0),
#      streaming weight loads without a predicate (must be 0)
#   3. tests: CudaFp8Decode.* (T 1/3/8/64/200, partial blocks, skewed/dropped routing, f32/f16/bf16,
#      f32/UE8M0 scales), CudaGraph.* (incl. fp8_t1 / fp8_t64: replay with new routing == direct call,
#      bit for bit), CudaEquivalence.*, CudaFp8MmaGemv.*, CudaBackends.* (TEST_FILTER overrides);
#      compute-sanitizer memcheck and racecheck on the bf16 decode cases (SANITIZE_FILTER, SANITIZE_TOOLS)
#   4. timings, CUDA-graph replay (CudaPerf.Shapes): bf16 and FP8 experts side by side in one run,
#      batched_mm and grouped_mm (PERF_BACKENDS), SHAPES x TOKENS (default the 4 SPEC §9 shapes x 1,8,64), then
#      every "name:ENV=V[,ENV=V]" of AB_VARIANTS (COMPARE_OLD=1, the default, adds
#      "old:MOEX_CUDA_FP8_DECODE=0"), the whole list AB_ROUNDS times (medians in the table)
#   5. ncu (PARTS must name it): each FP8 decode kernel's GPU time and DRAM bytes alone for every
#      NCU_CASES "shape:T" (default SHAPES x TOKENS) → $OUT/ncu.md
#
# PARTS selects steps (default "build sass tests sanitize perf"); the whole run with the build
# should stay under the 10-minute limit of one command (on the H200, 2026-12-01: an incremental
# build ~60 s, these tests ~30 s, sanitizers ~15 s, one timing round ~10-20 s, ncu ~5 s per case).
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
PARTS=${PARTS:-"build sass tests sanitize perf"}  # also: ncu
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
  # the streaming weight loads are unpredicated: their k is clamped to the row's last 16 bytes
  # (load_stage); compute-sanitizer's memcheck below is what shows that none reads past a row
  echo "streaming weight loads: $(grep -c 'LDG.E.NA.LTC256B' "$OUT/quant_decode.sass")"
else
  echo "no cuobjdump or object: skipped"
fi
for xname in exact exact_wide; do  # the exact FP8 prefill kernels (X = 1, and the wide X = 4)
  xobj=$(find "$BUILD" -name "sm90_tma_kernels_fp8_$xname.cu.o" | head -1)
  if command -v cuobjdump > /dev/null && [ -n "$xobj" ]; then
    cuobjdump -sass "$xobj" | awk -v n="$xname" '/HGMMA/{h++} /F2FP.F16.E4M3/{c++} /LDL|STL/{l++} /QGMMA/{q++}
      END{printf "%s FP8 TMA kernels: %d HGMMA, %d QGMMA, %d F2FP.F16.E4M3, %d local-memory\n", n, h, q, c, l}'
  fi
done
fi

if has tests; then
stamp tests
OMP_WAIT_POLICY=passive timeout "${TEST_TIMEOUT:-300}" "$BUILD/moex_tests" \
  --gtest_filter="${TEST_FILTER:-*CudaFp8Decode*:*CudaGraph*:*CudaEquivalence*:*CudaFp8MmaGemv*:CudaBackends.*}" > "$OUT/tests.log" 2>&1
rc=$?
grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]|worst rel L2|FP8 decode path|FP8 prefill" "$OUT/tests.log" | head -60
[ $rc -eq 0 ] || grep -B2 -A10 "Failure" "$OUT/tests.log" | head -80
fi
# SANITIZE_FILTER: the gtest filter run under each of SANITIZE_TOOLS (default: the bf16 decode tests,
# memcheck and racecheck), at most SANITIZE_TIMEOUT s each
if has sanitize && command -v compute-sanitizer > /dev/null; then
  stamp sanitizer
  for tool in ${SANITIZE_TOOLS:-memcheck racecheck}; do
    timeout "${SANITIZE_TIMEOUT:-150}" compute-sanitizer --tool "$tool" --error-exitcode 9 "$BUILD/moex_tests" \
      --gtest_filter="${SANITIZE_FILTER:-Dtypes/CudaFp8Decode.*/bf16}" > "$OUT/$tool.log" 2>&1
    echo "$tool rc $? ($(grep -c 'Invalid' "$OUT/$tool.log") invalid accesses, $(grep -ci 'hazard' "$OUT/$tool.log") hazard lines)"
  done
fi

if has perf; then
stamp timings
perf() {  # $1 = "ENV=V,ENV=V" of the variant ("" = default), $2 = log
  env MOEX_CUDA_PERF=1 MOEX_CUDA_PERF_QUANT=none,fp8 MOEX_CUDA_PERF_TOKENS="$TOKENS" \
    MOEX_CUDA_PERF_SHAPES="$SHAPES" MOEX_CUDA_PERF_BACKENDS="${PERF_BACKENDS:-batched_mm,grouped_mm}" $(echo "$1" | tr ',' ' ') \
    timeout 240 "$BUILD/moex_tests" --gtest_filter='CudaPerf.Shapes' > "$2" 2>&1
}
# AB_VARIANTS: "name:ENV=V[,ENV=V]" ... timed after the default ("base"), AB_ROUNDS rounds interleaved;
# COMPARE_OLD=1 adds "old:MOEX_CUDA_FP8_DECODE=0" (the FP8 kernels used above T = 64)
VARIANTS="base:"
[ "$COMPARE_OLD" = 1 ] && VARIANTS="$VARIANTS old:MOEX_CUDA_FP8_DECODE=0"
VARIANTS="$VARIANTS ${AB_VARIANTS:-}"
for round in $(seq 1 "${AB_ROUNDS:-1}"); do
  for v in $VARIANTS; do perf "${v#*:}" "$OUT/perf_${v%%:*}_$round.log"; done
done
python3 - "$OUT" "$VARIANTS" "${AB_ROUNDS:-1}" <<'PY' | tee "$OUT/fp8_decode.md"
import os, sys, statistics
out, variants, rounds = sys.argv[1], [v.split(":")[0] for v in sys.argv[2].split()], int(sys.argv[3])
def read(path):
    rows = {}
    if not os.path.exists(path): return rows
    for line in open(path):
        f = line.split()
        if len(f) >= 5 and f[0] == "PERF" and f[3] != "backend":
            try: rows[(f[1], int(f[2]), f[3])] = float(f[4])
            except ValueError: pass
    return rows
runs = {v: [read(os.path.join(out, f"perf_{v}_{r}.log")) for r in range(1, rounds + 1)] for v in variants}
def med(v, key):
    xs = [r[key] for r in runs[v] if key in r]
    return statistics.median(xs) if xs else 0
cases = sorted({(k[0], k[1]) for r in runs["base"] for k in r})
fmt = lambda x: f"{x:.4f}" if x else "—"
print(f"CUDA-graph replay of one forward, ms (median of {rounds} round(s)); best FP8 = min(batched_mm, grouped_mm)")
print("| shape | T | bf16 batched | bf16 grouped | FP8 batched | FP8 grouped | best bf16 / best FP8 | >= 1.6x | " +
      " | ".join(f"FP8 best {v} | bf16/FP8 {v}" for v in variants[1:]) + " |")
print("|---|---|---|---|---|---|---|---|" + "---|---|" * (len(variants) - 1))
for s, T in cases:
    bb, bg = med("base", (s, T, "batched_mm")), med("base", (s, T, "grouped_mm"))
    best = lambda v: min([x for x in (med(v, (s, T, "batched_mm/fp8")), med(v, (s, T, "grouped_mm/fp8"))) if x] or [0])
    best_bf16 = min([x for x in (bb, bg) if x] or [0])
    ratio = best_bf16 / best("base") if best_bf16 and best("base") else 0
    def vratio(v):  # the variant's own best bf16 over its best FP8 (variants that time both, e.g. MOEX_CUDA_PERF_BATCH)
        b16 = min([x for x in (med(v, (s, T, "batched_mm")), med(v, (s, T, "grouped_mm"))) if x] or [0])
        return f"{b16 / best(v):.2f}x" if b16 and best(v) else "—"
    print(f"| {s} | {T} | {fmt(bb)} | {fmt(bg)} | {fmt(med('base', (s, T, 'batched_mm/fp8')))} | "
          f"{fmt(med('base', (s, T, 'grouped_mm/fp8')))} | " + (f"{ratio:.2f}x" if ratio else "—") +
          f" | {'yes' if ratio >= 1.6 else 'NO'} | " + " | ".join(f"{fmt(best(v))} | {vratio(v)}" for v in variants[1:]) + " |")
PY
grep -h "error" "$OUT"/perf_*.log | grep PERF | head
fi

# ncu: GPU time of each FP8 decode kernel of one forward (serialised, no PDL overlap) per NCU_CASES
# "shape:T" (default: the 12 cells of the table), grouped_mm FP8; NCU_KERNELS: the kernel-name regex
# (default: quant_decode.cu's kernels)
if has ncu && command -v ncu > /dev/null; then
  stamp ncu
  for c in ${NCU_CASES:-$(for s in ${SHAPES//,/ }; do for t in ${TOKENS//,/ }; do echo "$s:$t"; done; done)}; do
    MOEX_CUDA_PERF=1 MOEX_CUDA_PERF_QUANT=fp8 MOEX_CUDA_PERF_TOKENS="${c#*:}" MOEX_CUDA_PERF_SHAPES="${c%%:*}" \
      MOEX_CUDA_PERF_BACKENDS=grouped_mm MOEX_CUDA_PERF_REPS=2 timeout 120 ncu --clock-control none --csv --print-units base \
      --kernel-name "regex:${NCU_KERNELS:-decode_}" --metrics gpu__time_duration.sum,dram__bytes_read.sum \
      "$BUILD/moex_tests" --gtest_filter='CudaPerf.Shapes' > "$OUT/ncu_${c/:/_}.csv" 2> /dev/null
  done
  python3 - "$OUT" <<'PY' | tee "$OUT/ncu.md"
import csv, sys, os, glob, collections, statistics
print("| case | kernel | µs (median) | DRAM MB | TB/s |")
print("|---|---|---|---|---|")
for path in sorted(glob.glob(os.path.join(sys.argv[1], "ncu_*.csv"))):
    case = os.path.basename(path)[4:-4]
    rows = list(csv.reader(open(path)))
    try: hdr = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
    except StopIteration: print(f"| {case} | no kernels | | | |"); continue
    h = rows[hdr]; ii, ki, mi, vi = h.index("ID"), h.index("Kernel Name"), h.index("Metric Name"), h.index("Metric Value")
    k = {}
    for r in rows[hdr + 1:]:
        if len(r) > vi:
            name = next((n for n in ("decode_prep", "decode_up", "decode_down", "decode_fused", "combine") if n in r[ki]), r[ki][:30])
            k.setdefault(r[ii], {"name": name})[r[mi]] = float(r[vi].replace(",", ""))
    per = collections.defaultdict(lambda: ([], []))
    for d in k.values():
        per[d["name"]][0].append(d.get("gpu__time_duration.sum", 0) / 1e3)
        per[d["name"]][1].append(d.get("dram__bytes_read.sum", 0) / 1e6)
    for name, (ts, bs) in per.items():
        us, mb = statistics.median(ts), statistics.median(bs)
        print(f"| {case} | {name} | {us:.1f} | {mb:.1f} | {mb / us:.2f} |" if us else f"| {case} | {name} | 0 | | |")
PY
fi
stamp done
