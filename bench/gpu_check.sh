#!/usr/bin/env bash
# bench/gpu_check.sh — the GPU suite in one call, run from the repository root on a machine with
# a CUDA GPU (the device machine: `run` with command `bash bench/gpu_check.sh`).
#
#   1. builds moex and moex_tests (BUILD_TARGETS) with CUDA in Release (cmake -G Ninja) into build-gpu/;
#      the longest compile steps in build_times.txt
#   2. moex info; SASS check of the tensor-core kernels (HMMA / HGMMA counts)
#   3. the GPU tests: moex_tests --gtest_filter='*Cuda*:*DeepGemm*'
#   4. compute-sanitizer memcheck on a subset of the CUDA tests and racecheck on the tests that launch
#      only moex kernels (graph tests of batched_mm / grouped_mm / deepgemm), then both with the 2-CTA
#      cluster kernels forced
#   5. timings: the CUDA-graph timings of tests/test_cuda_backends.cpp (CudaPerf.Shapes), then
#      `moex bench --device cuda` over the SPEC §9 shapes and the reference library's backends
#      (bench/hf_experts_bench.py) on the same shapes, and a side-by-side table
#
# Everything lands under $OUT (default ./out): build.log, tests.log, sanitizer.log, perf.log,
# bench.json, hf.json, side_by_side.md (at most 8 files come back from the device machine).
#   6. quant: bf16 vs FP8 experts (QUANT_KINDS, default fp8; fp4 too with QUANT_KINDS="fp8 fp4")
#      on the same shapes, T in QUANT_TOKENS (default 1,8,64,512,4096): batched_mm (T <= 512) and
#      grouped_mm, and the table of bf16/quantized time ratios (quant.json, quant.md)
#   7. clusters: the bf16/f16 equivalence, graph and deepgemm tests with the 2-CTA cluster GEMM in
#      256-wide tiles (the default rule's choice for clustered GEMMs) forced on every TMA GEMM
#      (MOEX_CUDA_TMA_CLUSTER=1 MOEX_CUDA_TMA_N=256; deepgemm follows grouped_mm's tile rule by
#      default), since the default rule only picks clusters for GEMMs
#      whose experts hold >= 256 rows on average; then the same tests in 128-wide clusters
#      (MOEX_CUDA_TMA_CLUSTER=1 alone), with the static schedule (MOEX_CUDA_TMA_DYNAMIC=0), and the
#      deepgemm tests on grouped_mm's tile rule unforced
#   8. pingpong: the bf16/f16 equivalence and graph tests with the opt-in ping-pong consumers
#      (MOEX_CUDA_TMA_PINGPONG=1), without and with clusters, and memcheck on them (not in the
#      default PARTS)
#   9. hfc: the reference's compiled variants beside its plain backends (batched_mm as a CUDA graph via
#      torch.compile(mode="reduce-overhead") at T <= 64, grouped_mm under torch.compile), so that the
#      table's "HF best" is the reference's best including them
# PARTS selects steps (default: all but pingpong): PARTS="build tests n256 clusters pingpong sanitize perf bench quant hf hfc table".
# TEST_FILTER / CLUSTER_FILTER replace the gtest filters of the tests / clusters steps.
# Timeouts: TEST_TIMEOUT (tests, 480 s), CLUSTER_TIMEOUT (300 s), SAN_TIMEOUT (each sanitizer run, 200 s).
# TOKENS, SHAPES and PERF_TOKENS narrow the timed cases; DEADLINE (seconds) ends the reference run in time. Keep the whole run under ~9 minutes.
set -u
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
PARTS=${PARTS:-"build tests n256 clusters sanitize perf perf256 bench quant hf hfc table"}
SHAPES=${SHAPES:-qwen3_30b_a3b,qwen15_moe_a2_7b,mixtral_8x7b,deepseek_v3}
TOKENS=${TOKENS:-1,8,64,512,4096,16384}
BUILD=${BUILD:-build-gpu}
has() { [[ " $PARTS " == *" $1 "* ]]; }
t0=$(date +%s)
stamp() { echo "== $1 ($(( $(date +%s) - t0 )) s)"; }
status=0

if has build; then
  stamp build
  set -o pipefail
  { nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv || true
    cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEX_CUDA=ON &&
    cmake --build "$BUILD" -j "$(nproc)" --target ${BUILD_TARGETS:-moex moex_tests}; } 2>&1 | tee "$OUT/build.log" |
    grep -E "error|FAILED|warning|moex:" | head -50
  rc=$?
  set +o pipefail
  # seconds per compiled file, longest first (the build's critical path on this machine)
  awk 'NR > 1 { t[$4] = ($2 - $1) / 1000 } END { for (f in t) printf "%7.1f %s\n", t[f], f }' "$BUILD/.ninja_log" 2>/dev/null |
    sort -rn | head -12 > "$OUT/build_times.txt"
  for target in ${BUILD_TARGETS:-moex moex_tests}; do
    if [ ! -x "$BUILD/$target" ]; then echo "build failed ($target)"; tail -40 "$OUT/build.log"; exit 1; fi
  done
  {
    "$BUILD/moex" info
    for o in "$BUILD"/CMakeFiles/moex_lib.dir/src/backends/cuda/*.o; do
      printf '%s: HMMA %s HGMMA %s LDSM %s\n' "$(basename "$o")" \
        "$(cuobjdump --dump-sass "$o" 2>/dev/null | grep -c HMMA)" \
        "$(cuobjdump --dump-sass "$o" 2>/dev/null | grep -c HGMMA)" \
        "$(cuobjdump --dump-sass "$o" 2>/dev/null | grep -c LDSM)"
    done
  } 2>&1 | tee -a "$OUT/build.log"
fi

if has tests; then
  stamp tests
  set -o pipefail
  timeout ${TEST_TIMEOUT:-480} "$BUILD/moex_tests" --gtest_filter="${TEST_FILTER:-*Cuda*:*DeepGemm*}" 2>&1 | tee "$OUT/tests.log" | grep -E "^\[  (FAILED|PASSED|SKIPPED) |passed of|Failure|error" | head -60
  rc=$?; [ $rc -ne 0 ] && status=1
  set +o pipefail
  echo "gpu tests exit status $rc"
fi

if has n256; then
  # the m64n256 wgmma variant (MOEX_CUDA_WGMMA_N=256): correctness on the GPU suite's bf16/f16 cases
  stamp n256
  set -o pipefail
  MOEX_CUDA_WGMMA_N=256 "$BUILD/moex_tests" --gtest_filter='Dtypes/CudaEquivalence.*/bf16:Dtypes/CudaEquivalence.*/f16:Capturable/*' 2>&1 |
    sed 's/^/[n256] /' | tee -a "$OUT/tests.log" | grep -E "^\[n256\] \[  (FAILED|PASSED) |passed of|Failure" | head -20
  echo "n256 tests exit status $?"
  set +o pipefail
fi

# variant_tests LABEL FILTER [VAR=VALUE ...]: the GPU tests matching FILTER with the variables set
# (CLUSTER_TEST_CASES generated cases, CLUSTER_TIMEOUT), tagged [LABEL] in tests.log; status=1 when
# the test binary fails
variant_tests() {
  local label=$1 filter=$2 rc
  shift 2
  env "$@" MOEX_CUDA_TEST_CASES=${CLUSTER_TEST_CASES:-12} timeout ${CLUSTER_TIMEOUT:-300} "$BUILD/moex_tests" \
    --gtest_filter="$filter" > "$OUT/variant.log" 2>&1
  rc=$?
  sed "s/^/[$label] /" "$OUT/variant.log" >> "$OUT/tests.log"
  grep -E "^\[  (FAILED|PASSED) |passed of|Failure" "$OUT/variant.log" | head -10 | sed "s/^/[$label] /"
  [ $rc -ne 0 ] && status=1
  echo "$label tests exit status $rc"
}

if has clusters; then
  stamp clusters
  experts='Dtypes/CudaEquivalence.*/bf16:Dtypes/CudaEquivalence.*/f16:Capturable/*:*DeepGemm*'
  variant_tests clusters "${CLUSTER_FILTER:-$experts}" MOEX_CUDA_TMA_CLUSTER=1 MOEX_CUDA_TMA_N=256 MOEX_CUDA_DEEPGEMM_GROUPED_TILES=1
  # 128-wide clusters (the tile rule's choice from 1024 pairs and 16 rows per expert, which the
  # tests' small cases do not reach unforced)
  variant_tests "clusters 128" "${CLUSTER_FILTER:-$experts}" MOEX_CUDA_TMA_CLUSTER=1
  # the static schedule (the A/B alternative to the default dynamic one)
  variant_tests "static schedule" "$experts" MOEX_CUDA_TMA_DYNAMIC=0
  # deepgemm bf16 on its former 256-wide tiles without clusters (the default is grouped_mm's tile
  # rule since 2026-12-01), and with 128-wide tiles forced
  variant_tests "deepgemm 256-wide tiles" '*DeepGemm*' MOEX_CUDA_DEEPGEMM_GROUPED_TILES=0
  variant_tests "deepgemm 128-wide tiles" '*DeepGemm*' MOEX_CUDA_TMA_N=128
fi

if has pingpong; then
  # the opt-in ping-pong consumers (MOEX_CUDA_TMA_PINGPONG=1) on the bf16 / f16 cases, then memcheck
  stamp pingpong
  set -o pipefail
  MOEX_CUDA_TMA_PINGPONG=1 MOEX_CUDA_TEST_CASES=${PP_TEST_CASES:-12} timeout ${PP_TIMEOUT:-200} "$BUILD/moex_tests" \
    --gtest_filter='Dtypes/CudaEquivalence.*/bf16:Dtypes/CudaEquivalence.*/f16:Capturable/*' 2>&1 |
    sed 's/^/[pingpong] /' | tee -a "$OUT/tests.log" | grep -E "^\[pingpong\] \[  (FAILED|PASSED) |passed of|Failure" | head -20
  rc=$?; [ $rc -ne 0 ] && status=1
  echo "pingpong tests exit status $rc"
  # and in 2-CTA clusters (forced on every TMA GEMM, 128-wide)
  MOEX_CUDA_TMA_PINGPONG=1 MOEX_CUDA_TMA_CLUSTER=1 MOEX_CUDA_TMA_N=128 MOEX_CUDA_TEST_CASES=${PP_TEST_CASES:-12} timeout ${PP_TIMEOUT:-200} \
    "$BUILD/moex_tests" --gtest_filter='Dtypes/CudaEquivalence.*/bf16:Capturable/*' 2>&1 |
    sed 's/^/[pingpong clusters] /' | tee -a "$OUT/tests.log" | grep -E "\[  (FAILED|PASSED) |passed of|Failure" | head -20
  rc=$?; [ $rc -ne 0 ] && status=1
  echo "pingpong cluster tests exit status $rc"
  MOEX_CUDA_TMA_PINGPONG=1 MOEX_CUDA_TEST_CASES=4 timeout ${PP_TIMEOUT:-200} compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$BUILD/moex_tests" --gtest_filter='Dtypes/CudaEquivalence.*/bf16' 2>&1 | tail -3 | sed 's/^/[pingpong memcheck] /'
  set +o pipefail
fi

if has sanitize; then
  stamp sanitize
  # racecheck runs the tests that launch moex's kernels only: on the eager backend's cuBLAS calls it
  # reports hazards inside cuBLAS's own nvjet_* kernels, and excluding those with
  # --kernel-name-exclude crashed compute-sanitizer (H200, 2026-11-30; docs/PERF.md)
  RACE_TESTS='Capturable/CudaGraph.*bf16_none:Capturable/CudaGraph.*f32_none:Layouts/DeepGemmGraph.*'
  {
    echo "### memcheck"
    MOEX_CUDA_TEST_CASES=${SAN_CASES:-24} timeout ${SAN_TIMEOUT:-200} compute-sanitizer --tool memcheck --error-exitcode 9 \
      "$BUILD/moex_tests" --gtest_filter="${SAN_MEMCHECK:-Dtypes/CudaEquivalence.*/bf16:Dtypes/CudaEquivalence.*/f32:Capturable/CudaGraph.*}" 2>&1 | tail -25
    echo "memcheck exit status ${PIPESTATUS[0]}"
    echo "### racecheck"
    MOEX_CUDA_TEST_CASES=${SAN_RACE_CASES:-10} timeout ${SAN_TIMEOUT:-200} compute-sanitizer --tool racecheck --error-exitcode 9 \
      "$BUILD/moex_tests" --gtest_filter="${SAN_RACECHECK:-$RACE_TESTS}" 2>&1 | tail -25
    echo "racecheck exit status ${PIPESTATUS[0]}"
    # the 2-CTA cluster kernels (multicast TMA, remote mbarrier arrivals) forced on every TMA GEMM
    for tool in memcheck racecheck; do
      echo "### $tool, clusters"
      filter="Dtypes/CudaEquivalence.*/bf16:Capturable/CudaGraph.*grouped_mm_bf16_none"
      [ $tool = racecheck ] && filter=$RACE_TESTS
      MOEX_CUDA_TMA_CLUSTER=1 MOEX_CUDA_TMA_N=256 MOEX_CUDA_TEST_CASES=${SAN_CLUSTER_CASES:-4} timeout ${SAN_TIMEOUT:-200} compute-sanitizer --tool $tool \
        --error-exitcode 9 "$BUILD/moex_tests" --gtest_filter="$filter" 2>&1 | tail -25
      echo "$tool (clusters) exit status ${PIPESTATUS[0]}"
    done
  } 2>&1 | tee "$OUT/sanitizer.log" | grep -E "exit status|ERROR SUMMARY|RACECHECK SUMMARY|Invalid|Race" | head -30
fi

if has perf; then
  stamp perf
  MOEX_CUDA_PERF=1 MOEX_CUDA_PERF_TOKENS=${PERF_TOKENS:-$TOKENS} timeout 240 "$BUILD/moex_tests" --gtest_filter='CudaPerf.*' 2>&1 |
    tee "$OUT/perf.log" | grep -E "^PERF"
fi

if has perf256; then
  stamp perf256
  MOEX_CUDA_WGMMA_N=256 MOEX_CUDA_PERF=1 MOEX_CUDA_PERF_TOKENS=${PERF256_TOKENS:-4096,16384} timeout 120 "$BUILD/moex_tests" \
    --gtest_filter='CudaPerf.*' 2>&1 | grep -E "^PERF" | grep -v eager | sed 's/^PERF/PERF256/' | tee -a "$OUT/perf.log"
fi

if has bench; then
  stamp bench
  : > "$OUT/bench.json"
  # batched_mm is the decode backend: time it at T <= 512 only (at 16384 tokens it re-reads each
  # expert's weights once per pair, by design)
  small=$(echo "$TOKENS" | tr ',' '\n' | awk '$1 <= 512' | paste -sd,)
  [ -n "$small" ] && timeout ${BENCH_TIMEOUT:-150} "$BUILD/moex" bench --device cuda --backends batched_mm --shapes "$SHAPES" --tokens "$small" \
    --dtype bf16 --format json --min-time-ms 30 --max-iters 15 --warmup 2 >> "$OUT/bench.json" 2>>"$OUT/perf.log"
  timeout ${BENCH_TIMEOUT:-150} "$BUILD/moex" bench --device cuda --backends grouped_mm,eager --shapes "$SHAPES" --tokens "$TOKENS" \
    --dtype bf16 --format json --min-time-ms 30 --max-iters 15 --warmup 2 >> "$OUT/bench.json" 2>>"$OUT/perf.log"
  grep -c '"ms"' "$OUT/bench.json"
fi

if has quant; then
  stamp quant
  : > "$OUT/quant.json"
  # bf16 and quantized experts timed back to back, shape by shape (same seed: same routing); one
  # call per (shape, kind) so that the weights are generated once
  for shape in $(echo "$SHAPES" | tr ',' ' '); do
    for q in none ${QUANT_KINDS:-fp8}; do
      timeout ${QUANT_TIMEOUT:-150} "$BUILD/moex" bench --device cuda --backends batched_mm,grouped_mm --shapes "$shape" \
        --tokens "${QUANT_TOKENS:-1,8,64,512,4096}" --dtype bf16 --quant $q --format json --min-time-ms 20 --max-iters 10 \
        --warmup 2 >> "$OUT/quant.json" 2>>"$OUT/perf.log"
    done
  done
  python3 - "$OUT" <<'EOF' | tee "$OUT/quant.md"
import json, sys, os
rows = {}
for line in open(os.path.join(sys.argv[1], "quant.json")):
    line = line.strip()
    if not line.startswith("{"): continue
    try: r = json.loads(line)
    except Exception: continue
    if "ms" in r and "shape" in r and not r.get("skipped"):
        rows[(r["shape"], r["T"], r["backend"], r.get("quant", "none"))] = r
kinds = sorted({k[3] for k in rows if k[3] != "none"})
print("| shape | T | backend | bf16 ms | " + " | ".join(f"{q} ms | bf16/{q}" for q in kinds) + " |")
print("|---|---|---|---|" + "---|---|" * len(kinds))
for s, T, b in sorted({(k[0], k[1], k[2]) for k in rows}, key=lambda k: (k[0], k[2], k[1])):
    base = rows.get((s, T, b, "none"))
    cells = []
    for q in kinds:
        v = rows.get((s, T, b, q))
        cells += [f"{v['ms']:.3f}" if v else "—", f"{base['ms'] / v['ms']:.2f}x" if v and base else "—"]
    print(f"| {s} | {T} | {b} | " + (f"{base['ms']:.3f}" if base else "—") + " | " + " | ".join(cells) + " |")
EOF
  grep -c '"ms"' "$OUT/quant.json"
fi

if has hf; then
  stamp hf
  hf_t=${HF_TIMEOUT:-200}
  if [ -n "${DEADLINE:-}" ]; then left=$(( DEADLINE - ($(date +%s) - t0) - 8 )); [ $left -lt $hf_t ] && hf_t=$left; fi
  PYTHONUNBUFFERED=1 SHAPES="$SHAPES" TOKENS="$TOKENS" OUT="$OUT" timeout $hf_t python3 bench/hf_experts_bench.py > "$OUT/hf.json" 2>&1
  grep -c '"ms"' "$OUT/hf.json"
fi

if has hfc; then
  # The reference's compiled variants, appended to hf.json (the table takes the reference's best over
  # all its lines): batched_mm under torch.compile(mode="reduce-overhead"), i.e. replayed as a CUDA
  # graph, at T <= 64 (beyond, its per-pair weight copies outgrow memory), then grouped_mm under
  # torch.compile (default mode) at HFC_GROUPED_TOKENS. Each compile takes seconds to minutes:
  # HFC_TIMEOUT bounds both (DEADLINE too).
  stamp hfc
  hfc_t=${HFC_TIMEOUT:-300}
  if [ -n "${DEADLINE:-}" ]; then left=$(( DEADLINE - ($(date +%s) - t0) - 8 )); [ $left -lt $hfc_t ] && hfc_t=$left; fi
  hfc_end=$(( $(date +%s) + hfc_t ))
  # HFC_BATCHED_MAX_T: the largest T of the CUDA-graph batched_mm (default 64)
  small=$(echo "$TOKENS" | tr ',' '\n' | awk -v m="${HFC_BATCHED_MAX_T:-64}" '$1 <= m' | paste -sd,)
  [ -n "$small" ] && PYTHONUNBUFFERED=1 SHAPES="$SHAPES" TOKENS="$small" BACKENDS=batched_mm COMPILE_MODE=reduce-overhead \
    timeout $(( hfc_end - $(date +%s) > 1 ? hfc_end - $(date +%s) : 1 )) python3 bench/hf_experts_bench.py >> "$OUT/hf.json" 2>> "$OUT/hfc.err"
  PYTHONUNBUFFERED=1 SHAPES="$SHAPES" TOKENS="${HFC_GROUPED_TOKENS:-$TOKENS}" BACKENDS=grouped_mm COMPILE_MODE=default \
    timeout $(( hfc_end - $(date +%s) > 1 ? hfc_end - $(date +%s) : 1 )) python3 bench/hf_experts_bench.py >> "$OUT/hf.json" 2>> "$OUT/hfc.err"
  grep -c 'compile:' "$OUT/hf.json"
fi

if has table; then
  stamp table
  python3 - "$OUT" <<'EOF' | tee "$OUT/side_by_side.md"
import json, sys, os, re
out = sys.argv[1]
def rows(path):
    if not os.path.exists(path): return []
    r = []
    for line in open(path):
        line = line.strip()
        if line.startswith("{"):
            try: r.append(json.loads(line))
            except Exception: pass
    return r
perf = {}
for line in open(os.path.join(out, "perf.log")) if os.path.exists(os.path.join(out, "perf.log")) else []:
    f = line.split()
    if len(f) == 8 and f[0] == "PERF" and f[1] != "shape":
        perf[(f[1], int(f[2]), f[3])] = float(f[4])
moex = {}
for r in rows(os.path.join(out, "bench.json")):
    if "ms" in r and "shape" in r: moex[(r["shape"], r["T"], r["backend"])] = r
hf = {}
for r in rows(os.path.join(out, "hf.json")):
    if "ms" in r: hf[(r["shape"], r["T"], r["backend"])] = r
keys = sorted({(k[0], k[1]) for k in list(moex) + list(hf) + list(perf)}, key=lambda k: (k[0], k[1]))
# dense: the dense cuBLAS GEMMs of the case's FLOPs on random data, timed by moex bench in this run
print("| shape | T | floor ms | moex batched_mm | moex grouped_mm | moex eager | moex graph (best) | HF best | speed-up | moex %floor | dense cuBLAS same FLOPs | moex % of dense |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for s, T in keys:
    m = {b: moex.get((s, T, b)) for b in ("batched_mm", "grouped_mm", "eager")}
    g = {b: perf.get((s, T, b)) for b in ("batched_mm", "grouped_mm")}
    floor = next((v["floor_ms"] for v in m.values() if v), None)
    h = [(v["ms"], k[2]) for k, v in hf.items() if k[0] == s and k[1] == T]
    hb = min(h) if h else None
    cands = [v["ms"] for v in m.values() if v] + [v for v in g.values() if v]
    best = min(cands) if cands else None
    fmt = lambda v: f"{v['ms']:.3f} ({v['tflops']:.0f} TF)" if v else "—"
    gb = min([v for v in g.values() if v], default=None)
    dn = next((v for v in m.values() if v and v.get("dense_ms")), None)
    dense = f"{dn['dense_ms']:.3f} ({dn['dense_tflops']:.0f} TF)" if dn else "—"
    pct_dense = f"{100 * dn['dense_ms'] / best:.0f}%" if dn and best else "—"
    print(f"| {s} | {T} | {floor if floor is not None else '—'} | {fmt(m['batched_mm'])} | {fmt(m['grouped_mm'])} | {fmt(m['eager'])} | "
          f"{f'{gb:.3f}' if gb else '—'} | {f'{hb[0]:.3f} {hb[1]}' if hb else '—'} | "
          f"{f'{hb[0]/best:.2f}x' if hb and best else '—'} | {f'{100*floor/best:.0f}%' if floor and best else '—'} | {dense} | {pct_dense} |")
EOF
fi
stamp done
exit $status
