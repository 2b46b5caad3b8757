#!/usr/bin/env bash
# bench/gpu_session25.sh — one call on the GPU machine for the twenty-fifth session, from the
# repository root (`run` with command `bash bench/gpu_session25.sh`): built to test and time the
# decode kernels that request their weight slices by bulk copies before waiting for the previous
# kernel (the model's bulk GEMV, batched_mm's bulk down kernel; issue 5). Both were slower and were
# removed (docs/PERF.md, twenty-fifth session; the switches MOEX_CUDA_GEMV_BULK,
# MOEX_CUDA_DOWN_BULK_MAX_T and MOEX_CUDA_CARVEOUT the calls set existed at commits 12a2823..2dab521
# only). Every step writes into $OUT
# as it goes and is skipped once DEADLINE seconds (default 520) have passed. Steps (PARTS, default all):
#   build     moex, moex_tests, moex_model_bench (CUDA, Release) into $BUILD
#   tests     $TEST_FILTER (default: the new bit-for-bit tests, the model's GPU kernels, graphs, bf16
#             parity, the GEMV linears, the experts' graph replays and equivalence)
#   ab        moex_model_bench (48-layer random Qwen3-30B-A3B, decode with switching and graphs at
#             $AB_BATCHES, default 1) for "base" and every "name:ENV=V[,ENV=V]" of $AB_VARIANTS,
#             the list $AB_ROUNDS times (default 2), interleaved → $OUT/ab.log
#   xperf     bench/gpu_fp8_decode.sh's graph-replay table (bf16 and FP8 experts) at $XTOKENS
#             (default 1) on $XSHAPES with $XVARIANTS → $OUT/xperf.txt
#   ncu       each decode kernel of a 4-layer batch-1 model alone (ncu, --clock-control none) → $OUT/ncu.txt
#   sanitize  compute-sanitizer memcheck and racecheck on $SANITIZE_FILTER
source "$(dirname "$0")/gpu_common.sh" "build tests ab xperf ncu sanitize"
DEADLINE=${DEADLINE:-520}
if has build; then
  gpu_build moex moex_tests moex_model_bench
  stamp built
  # registers, spills and the bulk copies of the new kernels
  for o in src/model/cuda_kernels.cu src/backends/cuda/batched_gemv.cu; do
    cuobjdump -res-usage "$BUILD/CMakeFiles/moex_lib.dir/$o.o" 2>/dev/null | grep -A1 -E "bulk" | grep -oE "Function [^:]*|REG:[0-9]+|STACK:[0-9]+|SHARED:[0-9]+|LOCAL:[0-9]+" | paste -sd' ' | sed 's/Function/\nFunction/g' | head -20
  done
  echo "UBLKCP in the model kernels: $(cuobjdump -sass "$BUILD/CMakeFiles/moex_lib.dir/src/model/cuda_kernels.cu.o" 2>/dev/null | grep -c UBLKCP)"
fi
if has tests && [ "$(left)" -gt 60 ]; then
  gpu_tests "${TEST_FILTER:-CudaBatched.*:CudaModelKernels.*:CudaModelGraphs*:*CudaModelParity.Bf16*:CudaModelLinear.*:Capturable/CudaGraph.*:CudaBackends.*}" \
    "$(( $(left) - 40 ))"
fi
if has ab && [ "$(left)" -gt 60 ]; then
  for round in $(seq 1 "${AB_ROUNDS:-2}"); do
    for v in "base:-" ${AB_VARIANTS:-}; do
      [ "$(left)" -gt 40 ] || break
      name=${v%%:*}
      stamp "model bench [$name] round $round"
      env $(envs_of "${v#*:}") timeout 90 "$BUILD/moex_model_bench" --layers 48 --prompt 64 --batches "${AB_BATCHES:-1}" \
        --variants "${AB_DECODE:-switch+graphs}" ${BENCH_ARGS:-} --out "$OUT/e2e_${name}_$round.json" 2>&1 |
        grep -E "^decode|^#|error" | sed "s/^/[$name] /" | tee -a "$OUT/ab.log"
    done
  done
fi
if has xperf && [ "$(left)" -gt 60 ]; then
  stamp xperf
  timeout "$(( $(left) - 30 ))" env PARTS=perf SKIP_BUILD=1 COMPARE_OLD=0 TOKENS="${XTOKENS:-1}" AB_ROUNDS="${XROUNDS:-2}" \
    SHAPES="${XSHAPES:-qwen3_30b_a3b,qwen15_moe_a2_7b}" AB_VARIANTS="${XVARIANTS:-nodown:MOEX_CUDA_DOWN_BULK_MAX_T=0}" \
    bash bench/gpu_fp8_decode.sh > "$OUT/xperf.txt" 2>&1
  echo "xperf rc $?"
  grep -E "^\|" "$OUT/xperf.txt" | head -20
  for f in "$OUT"/perf_*.log; do  # every variant's bf16 and FP8 batched_mm times, round by round
    [ -e "$f" ] && grep -E "^PERF .* batched_mm" "$f" | sed "s|^|$(basename "$f" .log) |"
  done
fi
if has ncu && [ "$(left)" -gt 60 ]; then
  stamp ncu
  timeout "$(( $(left) - 30 ))" ncu --clock-control none --csv --print-units base \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__registers_per_thread,launch__grid_size \
    --kernel-name regex:"${NCU_KERNELS:-gemv|batched_|decode_attention}" --launch-skip "${NCU_SKIP:-4}" \
    --launch-count "${NCU_COUNT:-50}" "$BUILD/moex_model_bench" --layers 4 --prompt 16 --batches 1 --new 4 \
    --variants switch_no_graphs > "$OUT/ncu.csv" 2> "$OUT/ncu.err"
  echo "ncu rc $?"
  python3 - "$OUT/ncu.csv" <<'PY' | tee "$OUT/ncu.txt"
import csv, sys, re
num = lambda v: float(str(v).replace(",", "") or 0)
rows = list(csv.reader(open(sys.argv[1])))
start = next((i for i, r in enumerate(rows) if r and r[0] == "ID"), None)
if start is None: print("no ncu rows"); sys.exit()
h = rows[start]; I = {k: h.index(k) for k in ("ID", "Kernel Name", "Metric Name", "Metric Value")}
k = {}
for r in rows[start + 1:]:
    if len(r) < len(h): continue
    d = k.setdefault(r[I["ID"]], {"name": re.sub(r"\(.*", "", r[I["Kernel Name"]]).replace("moex::", "")[:60]})
    d[r[I["Metric Name"]]] = r[I["Metric Value"]]
print(f"{'id':>4} {'kernel':60} {'us':>7} {'MB':>7} {'GB/s':>6} {'regs':>4} grid")
for i, d in sorted(k.items(), key=lambda x: int(x[0])):
    us = num(d.get("gpu__time_duration.sum", 0)) / 1e3; mb = num(d.get("dram__bytes_read.sum", 0)) / 1e6
    print(f"{i:>4} {d['name']:60} {us:7.2f} {mb:7.2f} {mb / us * 1e3 if us else 0:6.0f} {d.get('launch__registers_per_thread', '?'):>4} {d.get('launch__grid_size', '?')}")
PY
fi
if has sanitize && [ "$(left)" -gt 30 ]; then
  for tool in memcheck racecheck; do
    [ "$(left)" -gt 20 ] || break
    stamp "$tool"
    timeout "$(( $(left) - 10 ))" compute-sanitizer --tool $tool --error-exitcode 9 "$BUILD/moex_tests" \
      --gtest_filter="${SANITIZE_FILTER:-CudaBatched.*:CudaModelKernels.BulkGemv*}" > "$OUT/$tool.log" 2>&1
    echo "$tool rc $?"
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" "$OUT/$tool.log" | head -4
  done
fi
stamp done
