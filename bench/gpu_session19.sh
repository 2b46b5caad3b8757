#!/usr/bin/env bash
# bench/gpu_session19.sh — one call on the GPU machine for the nineteenth session
# (`run` with command `bash bench/gpu_session19.sh`), from the repository root:
#   build   moex, moex_tests (CUDA, Release) into $BUILD (incremental when it exists)
#   tests   $TEST_FILTER (default the deepgemm / FP8 prefill / FP8 model tests) once per env setting
#           of $TEST_ENVS (space-separated; "-" = no extra env; "A=1,B=2" sets two)
#   ab      moex bench ($AB_BACKENDS, $AB_SHAPES x $AB_TOKENS, $AB_DTYPE, --quant $AB_QUANT) once per
#           variant of $AB_VARIANTS ("name:ENV=V,ENV2=V2" or "base"), $AB_ROUNDS interleaved rounds
#           -> $OUT/ab.json and the table $OUT/ab.md (median ms per variant, ratio to the first)
#   sanitize compute-sanitizer memcheck on $SANITIZE_FILTER (default deepgemm's FP8 graph tests: the
#           256-wide QGMMA tiles with h quantized in the up GEMM's epilogue) -> $OUT/memcheck.log
#   kernels per-kernel GPU time (ncu, gpu__time_duration only) of one forward of each case of
#           $KERNEL_CASES ("shape:T:backend:quant", default deepseek_v3:16384:deepgemm:fp8), summed by
#           kernel name -> $OUT/kernels_<case>.txt
# PARTS selects steps (default "build tests ab"); DEADLINE (s, default 560) skips steps that would
# start after it. Logs in $OUT.
set -u
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export MOEX_SOURCE_DIR=$PWD
BUILD=${BUILD:-build-gpu}
PARTS=${PARTS:-"build tests ab"}
DEADLINE=${DEADLINE:-560}
has() { [[ " $PARTS " == *" $1 "* ]]; }
t0=$(date +%s)
left() { echo $(( DEADLINE - ($(date +%s) - t0) )); }
stamp() { echo "== $1 ($(( $(date +%s) - t0 )) s)"; }
# "A=1,B=2" -> "A=1 B=2" for env; "-" -> nothing
envs_of() { [ "$1" = "-" ] && return; echo "${1//,/ }"; }

if has build; then
  stamp build
  { cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEX_CUDA=ON &&
    cmake --build "$BUILD" -j "$(nproc)" --target ${BUILD_TARGETS:-moex moex_tests}; } > "$OUT/build.log" 2>&1 ||
    { grep -E "error" "$OUT/build.log" | head -30; exit 1; }
fi

if has tests; then
  i=0
  for e in ${TEST_ENVS:--}; do
    i=$((i + 1))
    [ "$(left)" -gt 60 ] || { echo "tests [$e] skipped: past DEADLINE"; break; }
    stamp "tests [$e]"
    env $(envs_of "$e") timeout ${TEST_TIMEOUT:-150} "$BUILD/moex_tests" \
      --gtest_filter="${TEST_FILTER:-*DeepGemm*:*CudaFp8Prefill*:CudaModelFp8*}" > "$OUT/tests_$i.log" 2>&1
    echo "tests [$e] rc $?"
    grep -E "^\[  PASSED|^\[  FAILED|^\[  SKIPPED|passed, worst|tests ran" "$OUT/tests_$i.log" | head -30
    grep -B3 -A12 "Failure" "$OUT/tests_$i.log" | head -40
  done
fi

if has sanitize && [ "$(left)" -gt 60 ]; then
  stamp "memcheck [${SANITIZE_FILTER:-Layouts/DeepGemmGraph.*fp8*}]"
  timeout $(( $(left) - 30 )) compute-sanitizer --tool memcheck --error-exitcode 9 "$BUILD/moex_tests" \
    --gtest_filter="${SANITIZE_FILTER:-Layouts/DeepGemmGraph.*fp8*}" > "$OUT/memcheck.log" 2>&1
  echo "memcheck rc $?"
  grep -E "ERROR SUMMARY|Invalid|PASSED|FAILED" "$OUT/memcheck.log" | head -8
fi

if has ab; then
  : > "$OUT/ab.json"
  for r in $(seq 1 "${AB_ROUNDS:-2}"); do
    for v in ${AB_VARIANTS:-base}; do
      [ "$(left)" -gt 40 ] || break
      name=${v%%:*}; e=-; [[ "$v" == *:* ]] && e=${v#*:}
      stamp "bench round $r $name"
      env $(envs_of "$e") timeout 120 "$BUILD/moex" bench --device cuda --backends "${AB_BACKENDS:-deepgemm}" \
        --shapes "${AB_SHAPES:-deepseek_v3,qwen3_30b_a3b,mixtral_8x7b}" --tokens "${AB_TOKENS:-4096,16384}" \
        --dtype "${AB_DTYPE:-bf16}" --quant "${AB_QUANT:-fp8}" --format json --min-time-ms 20 --max-iters 10 --warmup 2 \
        2>> "$OUT/ab.err" | sed "s/^{/{\"variant\": \"$name\", \"round\": $r, /" >> "$OUT/ab.json"
    done
  done
  python3 - "$OUT/ab.json" "${AB_VARIANTS:-base}" <<'PY' | tee "$OUT/ab.md"
import json, sys, statistics
names = [v.split(":")[0] for v in sys.argv[2].split()]
cell = {}
for line in open(sys.argv[1]):
    if line.startswith("{"):
        try: r = json.loads(line)
        except Exception: continue
        if "ms" in r and "shape" in r:
            cell.setdefault((r["shape"], r["T"], r["backend"], r.get("quant", "")), {}).setdefault(r["variant"], []).append((r["ms"], r.get("tflops", 0)))
print("| shape | T | backend | " + " | ".join(f"{n} ms (TFLOP/s)" for n in names) + " | " + " | ".join(f"{names[0]} / {n}" for n in names[1:]) + " |")
print("|---|---|---|" + "---|" * (2 * len(names) - 1))
for (s, t, b, q), v in cell.items():
    med = {n: (statistics.median(x[0] for x in v[n]), statistics.median(x[1] for x in v[n]), [x[0] for x in v[n]]) for n in names if n in v}
    cols = [f"{med[n][0]:.3f} ({med[n][1]:.0f}) [{' / '.join(f'{x:.3f}' for x in med[n][2])}]" if n in med else "—" for n in names]
    ratios = [f"{med[names[0]][0] / med[n][0]:.3f}" if n in med and names[0] in med else "" for n in names[1:]]
    print(f"| {s} | {t} | {b} | " + " | ".join(cols) + " | " + " | ".join(ratios) + " |")
PY
fi
if has kernels; then
  for c in ${KERNEL_CASES:-deepseek_v3:16384:deepgemm:fp8}; do
    [ "$(left)" -gt 40 ] || break
    IFS=: read -r shape T backend quant <<< "$c"
    stamp "kernels $c (ncu)"
    # warmup 1 + 3 timed forwards (the bench's minimum), no dense comparator: the last quarter of the
    # launches is one forward
    timeout 120 ncu --clock-control none --metrics gpu__time_duration.sum --csv "$BUILD/moex" bench --device cuda \
      --backends "$backend" --shapes "$shape" --tokens "$T" --dtype bf16 --quant "$quant" --min-time-ms 0 --max-iters 3 \
      --warmup 1 --no-dense > "$OUT/kernels_${c//:/_}.csv" 2> "$OUT/kernels_${c//:/_}.err"
    echo "ncu rc $?"
    python3 - "$OUT/kernels_${c//:/_}.csv" <<'PY' | tee "$OUT/kernels_${c//:/_}.txt"
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if r]
hdr = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
h = rows[hdr]; ii, ki, mi, vi = h.index("ID"), h.index("Kernel Name"), h.index("Metric Name"), h.index("Metric Value")
seq = [(int(r[ii]), r[ki].split("(")[0][:80], float(r[vi].replace(",", "")) / 1e3) for r in rows[hdr + 1:]
       if len(r) > vi and r[mi] == "gpu__time_duration.sum"]
# four alike forwards: the last quarter of the launches is one
last = seq[3 * len(seq) // 4:] if len(seq) % 4 == 0 else seq
print(f"# {len(seq)} launches; the last {len(last)} (one forward if 4 divides the count): {sum(x[2] for x in last):.1f} us")
for i, name, us in last:
    print(f"{us:10.1f} us  {name}")
PY
  done
fi
stamp done
