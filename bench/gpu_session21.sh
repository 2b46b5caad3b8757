#!/usr/bin/env bash
# bench/gpu_session21.sh — one call on the GPU machine for the twenty-first session, from the repository
# root (`run` with command `bash bench/gpu_session21.sh`): deepgemm's small-batch route (FP8 at <= 6
# pairs per expert, bf16 at T <= 8 and T·K <= E: batched_mm's GEMV kernels, deepgemm.cu
# small_batch_route) against its masked TMA layout, against the memory floor (issue 7's decode bar). Steps:
#   build    moex, moex_tests (CUDA, Release) into $BUILD (incremental when it exists)
#   tests    $TEST_FILTER (default: deepgemm's tests, the FP8 decode path's, the graph replays)
#   sanitize compute-sanitizer memcheck and racecheck on $SANITIZE_FILTER (default deepgemm's graph
#            replays on the small-batch route)
#   decode   moex bench --backends $DEC_BACKENDS (default deepgemm), bf16 and FP8, $DEC_SHAPES at $DEC_TOKENS, per variant of
#            $AB_VARIANTS ("name:ENV=V[,ENV=V]" items after "base"; default "masked:MOEX_DEEPGEMM_SMALL_T=0"),
#            $ROUNDS interleaved rounds; the table gives the median ms and × the bench's memory floor
#   graph    CudaPerf.Shapes: CUDA-graph replays of $G_BACKENDS on $G_SHAPES at $G_TOKENS, bf16 and FP8
# PARTS selects steps (default all). Logs and JSON under $OUT; the last lines are the tables.
source "$(dirname "$0")/gpu_common.sh" "build tests sanitize decode graph"
VARIANTS="base: ${AB_VARIANTS-masked:MOEX_DEEPGEMM_SMALL_T=0}"
ROUNDS=${ROUNDS:-2}

if has build; then gpu_build moex moex_tests; fi
if has tests; then gpu_tests "${TEST_FILTER:-*DeepGemm*:*CudaFp8Decode*:Capturable/CudaGraph.*}" "${TEST_TIMEOUT:-240}"; fi
if has sanitize; then gpu_sanitize "${SANITIZE_FILTER:-Layouts/DeepGemmGraph.*small*}"; fi
if has decode; then
  : > "$OUT/decode.json"
  for r in $(seq 1 "$ROUNDS"); do
    for v in $VARIANTS; do
      name=${v%%:*}; e=${v#*:}
      for q in none fp8; do
        stamp "decode round $r [$name] $q"
        env $(envs_of "$e") timeout ${DEC_TIMEOUT:-100} "$BUILD/moex" bench --device cuda --backends ${DEC_BACKENDS:-deepgemm} \
          --shapes "${DEC_SHAPES:-deepseek_v3,qwen3_30b_a3b,mixtral_8x7b}" --tokens "${DEC_TOKENS:-1,2,4,8,16,64}" \
          --dtype bf16 --quant $q --format json --no-dense --min-time-ms ${MIN_MS:-20} 2>> "$OUT/decode.err" |
          sed "s/^{/{\"variant\": \"$name\", \"round\": $r, /" >> "$OUT/decode.json"
      done
    done
  done
  stamp "decode table"
  python3 - "$OUT/decode.json" <<'PY' | tee "$OUT/decode.md"
import json, sys, statistics, collections
c = collections.defaultdict(list)
for line in open(sys.argv[1]):
    if line.startswith("{"):
        r = json.loads(line)
        if "ms" in r: c[(r["shape"], r.get("quant", "none"), r["T"], r["backend"] + ("" if r["variant"] == "base" else " " + r["variant"]))].append((r["ms"], r.get("floor_ms", 0)))
print("| shape | quant | T | backend [variant] | ms (median) | floor ms | × floor | rounds |")
print("|---|---|---|---|---|---|---|---|")
for (s, q, t, v), xs in sorted(c.items()):
    m = statistics.median(x[0] for x in xs); f = xs[0][1]
    print(f"| {s} | {q} | {t} | {v} | {m:.4f} | {f:.4f} | {m / f if f else 0:.2f}× | {' / '.join(f'{x[0]:.4f}' for x in xs)} |")
PY
fi
if has graph; then
  # CUDA-graph replay of one forward (the host's launch latency out), CudaPerf.Shapes
  stamp graph
  MOEX_CUDA_PERF=1 MOEX_CUDA_PERF_SHAPES="${G_SHAPES:-deepseek_v3}" MOEX_CUDA_PERF_BACKENDS="${G_BACKENDS:-deepgemm,batched_mm}" \
    MOEX_CUDA_PERF_TOKENS="${G_TOKENS:-1,2,4,8,16,32,64}" MOEX_CUDA_PERF_QUANT=none,fp8 MOEX_CUDA_PERF_REPS=${G_REPS:-50} \
    timeout 200 "$BUILD/moex_tests" --gtest_filter=CudaPerf.Shapes > "$OUT/graph.log" 2>&1
  echo "graph rc $?"
  grep "^PERF" "$OUT/graph.log" | tee "$OUT/graph.txt"
fi
stamp done
