#!/usr/bin/env bash
# bench/gpu_session29.sh — one call on the GPU machine for the twenty-ninth session, from the repository
# root (`run` with command `bash bench/gpu_session29.sh`): the whole GPU suite on the current tree, then
# the same-day tables of the two expert issues that had not been re-measured on it. Every step writes
# into $OUT as it goes and is skipped once DEADLINE seconds (default 570) have passed. Steps (PARTS,
# default "build tests side fp8", in this order):
#   build  moex, moex_tests (CUDA, Release) into $BUILD (cmake arguments: $CMAKE_EXTRA); with BUILD2 set,
#          $BUILD2_TARGETS (default moex) into $BUILD2 at the same time (cmake arguments: $CMAKE_EXTRA2),
#          for sweep variants that run another build ("name@dir:ENV")
#   tests  $TEST_FILTER (default: every CUDA test but the timed one) -> $OUT/tests.log
#   side   issue 7's side by side (bench/gpu_session18.sh PARTS=side: moex deepgemm / grouped_mm bf16
#          and FP8, the dense cuBLAS GEMM of the same FLOPs, the reference library's experts backends)
#          -> $OUT/side.md
#   fp8    issue 6's table (bench/gpu_fp8_decode.sh PARTS=perf: bf16 and FP8 batched_mm / grouped_mm,
#          CUDA-graph replay, T = $FP8_TOKENS, default 1,8,64,512,4096) -> $OUT/fp8_decode.md
#   sweep  (not in the default) issue 7: `moex bench --device cuda --backends $SWEEP_BACKENDS --dtype bf16
#          --quant $SWEEP_QUANT` (default none; fp8 for FP8 experts) on $SWEEP_SHAPES x $SWEEP_TOKENS
#          for "base" and every "name:ENV=V[,ENV=V]" of
#          $SWEEP_VARIANTS (the TMA grouped GEMM's existing switches; "name@dir:ENV" runs dir/moex instead
#          of $BUILD/moex), $SWEEP_ROUNDS rounds interleaved
#          -> $OUT/sweep.json, medians in $OUT/sweep.md
source "$(dirname "$0")/gpu_common.sh" "build tests side fp8"
DEADLINE=${DEADLINE:-570}
if has build; then
  if [ -n "${BUILD2:-}" ]; then
    ( OUT=$OUT/build2; mkdir -p "$OUT"; BUILD=$BUILD2; CMAKE_EXTRA=${CMAKE_EXTRA2:-}; gpu_build ${BUILD2_TARGETS:-moex} ) &
    build2=$!
  fi
  gpu_build moex moex_tests
  if [ -n "${BUILD2:-}" ]; then wait "$build2" || { echo "the build of $BUILD2 failed"; exit 1; }; fi
  stamp built
fi
if has tests && [ "$(left)" -gt 60 ]; then
  gpu_tests "${TEST_FILTER:-*Cuda*:-CudaPerf.*}" "$(( $(left) - 30 ))"
  grep -c "^\[       OK \]" "$OUT/tests.log" | sed 's/^/tests OK: /'
fi
if has side && [ "$(left)" -gt 210 ]; then
  stamp "issue 7 side by side"
  mkdir -p "$OUT/side"
  OUT=$OUT/side BUILD=$BUILD PARTS=side DEADLINE=$(( $(left) - 5 )) bash bench/gpu_session18.sh 2>&1 | tail -20
fi
if has fp8 && [ "$(left)" -gt 60 ]; then
  stamp "issue 6 table"
  mkdir -p "$OUT/fp8"
  OUT=$OUT/fp8 BUILD=$BUILD PARTS=perf SKIP_BUILD=1 COMPARE_OLD=0 TOKENS=${FP8_TOKENS:-1,8,64,512,4096} \
    timeout "$(( $(left) - 5 ))" bash bench/gpu_fp8_decode.sh 2>&1 | tail -30
fi
if has sweep && [ "$(left)" -gt 30 ]; then
  stamp "sweep"
  : > "$OUT/sweep.json"
  for round in $(seq 1 "${SWEEP_ROUNDS:-2}"); do
    for v in "base:-" ${SWEEP_VARIANTS:-}; do
      [ "$(left)" -gt 25 ] || break
      name=${v%%:*} dir=$BUILD
      if [[ $name == *@* ]]; then dir=${name#*@} name=${name%%@*}; fi
      env $(envs_of "${v#*:}") timeout 60 "$dir/moex" bench --device cuda --backends "${SWEEP_BACKENDS:-deepgemm,grouped_mm}" \
        --shapes "${SWEEP_SHAPES:-qwen3_30b_a3b}" --tokens "${SWEEP_TOKENS:-4096,16384}" --dtype bf16 --quant "${SWEEP_QUANT:-none}" --no-dense --format json \
        --min-time-ms 40 --max-iters 20 --warmup 2 2>> "$OUT/sweep.err" | sed "s/^{/{\"variant\": \"$name\", /" >> "$OUT/sweep.json"
    done
  done
  python3 - "$OUT/sweep.json" <<'PY' | tee "$OUT/sweep.md"
import json, sys, statistics, collections
runs = collections.defaultdict(list)
order = []
for line in open(sys.argv[1]):
    d = json.loads(line)
    if "ms" not in d or d.get("status", "ok") not in ("ok", None): continue
    key = (d["shape"], d["T"], d["backend"])
    if key not in order: order.append(key)
    runs[(d["variant"],) + key].append((d["ms"], d.get("tflops", 0)))
variants = []
for k in runs:
    if k[0] not in variants: variants.append(k[0])
print("| variant | " + " | ".join(f"{s} T={t} {b}" for s, t, b in order) + " |")
print("|---|" + "---|" * len(order))
for v in variants:
    cells = []
    for key in order:
        r = runs.get((v,) + key)
        cells.append("—" if not r else f"{statistics.median(x[0] for x in r):.3f} ({statistics.median(x[1] for x in r):.0f}) [{' / '.join(f'{x[0]:.3f}' for x in r)}]")
    print(f"| {v} | " + " | ".join(cells) + " |")
PY
fi
stamp done
