#!/usr/bin/env bash
# bench/gpu_session8.sh — one call on the GPU machine for the grouped GEMM's throughput work
# (`run` with command `bash bench/gpu_session8.sh`), from the repository root:
#   build   moex and moex_tests (CUDA, Release) into $BUILD
#   xtests  the experts GPU tests ($XTEST_FILTER) once per "name:ENV=V[,ENV=V]" item of
#           $XTEST_VARIANTS ("base:" = the defaults), each under a timeout
#   ab      `moex bench --device cuda` of $AB_BACKENDS over the four SPEC shapes at $AB_TOKENS for
#           "base" and every item of $AB_VARIANTS, in the same call; a table of ms per variant
#   ncu     Nsight Compute sections (speed of light, compute and memory workload) of the grouped
#           GEMM kernels and the dense cuBLAS GEMM of the bench's ceiling, per "shape:T:variant" item
#           of $NCU_CASES (variant names from $AB_VARIANTS)
#   hf      the reference library's backends ($HF_BACKENDS) on the same shapes and $AB_TOKENS
#           (bench/hf_experts_bench.py), then a side-by-side table: moex's best of the "base"
#           variant against the reference's best, with TFLOP/s and % of the dense cuBLAS rate that
#           `moex bench` measured in the same call
#   san     compute-sanitizer memcheck (then racecheck) of the experts GPU tests ($SAN_FILTER, $SAN_CASES
#           cases) with the variables of $SAN_ENV (e.g. MOEX_CUDA_TMA_CLUSTER=1), each under $SAN_TIMEOUT
# PARTS selects steps (default "build xtests ab"). Logs packed in $OUT/s8_logs.tgz after every step,
# so that a call cut by its time limit still brings back what ran.
set -u
OUT=${OUT:-$PWD/out}
export MOEX_SOURCE_DIR=$PWD
BUILD=${BUILD:-build-gpu}
PARTS=${PARTS:-"build xtests ab"}
SHAPES=${SHAPES:-qwen3_30b_a3b,qwen15_moe_a2_7b,mixtral_8x7b,deepseek_v3}
has() { case " $PARTS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
t0=$(date +%s)
stamp() {
  [ -d "$OUT/logs8" ] && tar czf "$OUT/s8_logs.tgz" -C "$OUT" logs8
  echo "== $1 ($(( $(date +%s) - t0 )) s)"
}
L=$OUT/logs8
mkdir -p "$L"
envs_of() {  # variant name -> its "ENV=V ENV=V" list (from AB_VARIANTS / XTEST_VARIANTS)
  for v in "base:" ${AB_VARIANTS:-} ${XTEST_VARIANTS:-}; do
    [ "${v%%:*}" = "$1" ] && { echo "${v#*:}" | tr ',' ' '; return; }
  done
}

if has build; then
  stamp build
  { cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEX_CUDA=ON &&
    cmake --build "$BUILD" -j "$(nproc)" --target moex moex_tests; } > "$L/build.log" 2>&1 ||
    { grep -E "error" "$L/build.log" | head -30; exit 1; }
fi

if has xtests; then
  for v in ${XTEST_VARIANTS:-"base:"}; do
    name=${v%%:*}
    stamp "experts tests [$name]"
    env $(envs_of "$name") MOEX_CUDA_TEST_CASES=${MOEX_CUDA_TEST_CASES:-20} timeout ${TEST_TIMEOUT:-200} "$BUILD/moex_tests" \
      --gtest_filter="${XTEST_FILTER:-*CudaEquivalence*:*CudaGraph*:*DeepGemm*}" > "$L/xtests_$name.log" 2>&1
    echo "[$name] experts tests rc $?"
    grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]" "$L/xtests_$name.log" | head -20
    grep -B3 -A12 "Failure" "$L/xtests_$name.log" | head -40
  done
fi

if has ab; then
  : > "$L/ab.json"
  for v in "base:" ${AB_VARIANTS:-}; do
    name=${v%%:*}
    stamp "bench [$name]"
    env $(envs_of "$name") timeout ${AB_TIMEOUT:-150} "$BUILD/moex" bench --device cuda --backends ${AB_BACKENDS:-grouped_mm} \
      --shapes "$SHAPES" --tokens ${AB_TOKENS:-512,4096,16384} --dtype bf16 --format json --min-time-ms 30 --max-iters 10 \
      --warmup 2 ${AB_FLAGS:-} 2> "$L/ab_$name.err" | sed "s/^{/{\"variant\": \"$name\", /" >> "$L/ab.json"
    echo "[$name] rc ${PIPESTATUS[0]}"; tail -2 "$L/ab_$name.err"
  done
  python3 - "$L/ab.json" <<'PY' | tee "$L/ab.md"
import json, sys
r, names, ceil = {}, [], {}
for l in open(sys.argv[1]):
    if not l.startswith("{"): continue
    try: d = json.loads(l)
    except Exception: continue
    if "ms" not in d: 
        if any(k in d for k in ("copy_gbps", "dense_tflops")): ceil[d.get("variant")] = d
        continue
    v = d["variant"]
    if v not in names: names.append(v)
    r[(d["shape"], d["T"], d.get("backend", "?"), v)] = (d["ms"], d.get("tflops"))
for v, d in ceil.items(): print(v, {k: d[k] for k in d if k != "variant"})
print("| shape | T | backend | " + " | ".join(f"{n} ms (TF)" for n in names) + " |")
print("|---|---|---|" + "---|" * len(names))
for (s, T, b) in sorted({k[:3] for k in r}, key=lambda k: (k[0], k[1], k[2])):
    cells = []
    for n in names:
        x = r.get((s, T, b, n))
        cells.append("—" if not x else (f"{x[0]:.3f} ({x[1]:.0f})" if x[1] else f"{x[0]:.3f}"))
    print(f"| {s} | {T} | {b} | " + " | ".join(cells) + " |")
PY
fi

if has ncu; then
  for c in ${NCU_CASES:-"mixtral_8x7b:16384:base"}; do
    IFS=: read -r shape T name <<< "$c"
    stamp "ncu $c"
    env $(envs_of "$name") timeout 200 ncu --clock-control none -k regex:"${NCU_KERNELS:-grouped_gemm_tma|nvjet|gemm}" \
      --launch-skip ${NCU_SKIP:-0} --launch-count ${NCU_COUNT:-6} \
      --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section LaunchStats --section WarpStateStats \
      "$BUILD/moex" bench --device cuda --backends ${NCU_BACKEND:-grouped_mm} --shapes "$shape" --tokens "$T" --dtype bf16 \
      --min-time-ms 1 --max-iters 1 --warmup 0 > "$L/ncu_${shape}_${T}_$name.txt" 2>&1
    echo "ncu rc $?"
    grep -E "^  [a-zA-Z_].*\(|Duration|SM Frequency|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|DRAM Throughput|Executed Ipc A|Registers Per|Grid Size|Cluster Size|Warp Cycles Per Issued|Max Bandwidth|L1/TEX Hit|L2 Hit|Mem Busy|Issue Slots Busy" \
      "$L/ncu_${shape}_${T}_$name.txt" | head -80
  done
fi
if has san; then
  for tool in memcheck racecheck; do
    stamp "compute-sanitizer $tool [${SAN_ENV:-}]"
    env ${SAN_ENV:-} MOEX_CUDA_TEST_CASES=${SAN_CASES:-4} timeout ${SAN_TIMEOUT:-120} compute-sanitizer --tool $tool --error-exitcode 9 \
      "$BUILD/moex_tests" --gtest_filter="${SAN_FILTER:-*CudaEquivalence*/bf16:*CudaGraph*grouped_mm_bf16*}" > "$L/san_$tool.log" 2>&1
    echo "$tool rc $?"
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Invalid|Race|^\[  (PASSED|FAILED) " "$L/san_$tool.log" | head -10
  done
fi
if has hf; then
  stamp "reference library"
  PYTHONUNBUFFERED=1 SHAPES="$SHAPES" TOKENS="${AB_TOKENS:-512,4096,16384}" BACKENDS="${HF_BACKENDS:-eager,grouped_mm}" OUT="$L" \
    timeout ${HF_TIMEOUT:-150} python3 bench/hf_experts_bench.py > "$L/hf.json" 2> "$L/hf.err"
  echo "hf rc $? ($(grep -c '"ms"' "$L/hf.json") cases)"
  python3 - "$L/ab.json" "$L/hf.json" <<'PY' | tee "$L/side_by_side.md"
import json, sys
def lines(p):
    for l in open(p):
        if l.startswith("{"):
            try: yield json.loads(l)
            except Exception: pass
moex, hf, dense = {}, {}, None
for d in lines(sys.argv[1]):
    if d.get("variant") != "base": continue
    if "peak_gflops" in d: dense = d["peak_gflops"] / 1e3
    elif "ms" in d: moex[(d["shape"], d["T"], d["backend"])] = d
for d in lines(sys.argv[2]):
    if "ms" in d: hf[(d["shape"], d["T"], d["backend"])] = d
print(f"dense cuBLAS bf16: {dense:.0f} TFLOP/s (75 %: {0.75 * dense:.0f}, 85 %: {0.85 * dense:.0f})")
print("| shape | T | moex grouped_mm | moex deepgemm | moex eager | HF best | speed-up | moex best % of dense |")
print("|---|---|---|---|---|---|---|---|")
for s, T in sorted({k[:2] for k in moex}):
    m = {b: moex.get((s, T, b)) for b in ("grouped_mm", "deepgemm", "eager")}
    best = min((v for v in m.values() if v), key=lambda v: v["ms"])
    h = min(((v["ms"], k[2]) for k, v in hf.items() if k[:2] == (s, T)), default=None)
    f = lambda v: "%.3f (%.0f TF)" % (v["ms"], v["tflops"]) if v else "—"
    hb = "%.3f %s" % h if h else "—"
    up = "%.2fx" % (h[0] / best["ms"]) if h else "—"
    print(f"| {s} | {T} | {f(m['grouped_mm'])} | {f(m['deepgemm'])} | {f(m['eager'])} | {hb} | {up} | "
          f"{100 * best['tflops'] / dense:.0f}% ({best['backend']}) |")
PY
fi
tar czf "$OUT/s8_logs.tgz" -C "$OUT" logs8
stamp done
