#!/usr/bin/env bash
# bench/gpu_session6.sh — one call on the GPU machine for the sixth session's decode-step work
# (`run` with command `bash bench/gpu_session6.sh`), from the repository root:
#   build   moex, moex_tests, moex_model_bench (CUDA, Release) into $BUILD (skipped when it exists
#           and SKIP_BUILD=1; an incremental rebuild otherwise)
#   tests   the model runtime GPU tests matching $TEST_FILTER
#   xtests  the experts GPU tests matching $XTEST_FILTER (CudaBackends, CudaGraph, CudaEquivalence)
#   ab      moex_model_bench (48-layer random Qwen3-30B-A3B, decode batches $AB_BATCHES) for "base"
#           (the defaults) and every "name:ENV=V[,ENV=V]" item of $AB_VARIANTS, in the same call
#   ncu     each decode kernel of a 4-layer batch-1 model alone under Nsight Compute (NCU_KERNELS
#           regex, NCU_SKIP, NCU_COUNT launches): time, DRAM bytes, rate, registers, occupancy
#   probe   moex_decode_probe (bench/decode_probe.cu): a decode layer's GEMVs as a graph of kernels
#           against one persistent kernel with grid barriers and L2 prefetch of the next phase
# PARTS selects steps (default "build tests ab"). Logs packed in $OUT/s6_logs.tgz.
set -u
OUT=${OUT:-$PWD/out}
export MOEX_SOURCE_DIR=$PWD
BUILD=${BUILD:-build-gpu}
PARTS=${PARTS:-"build tests ab"}
has() { case " $PARTS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
t0=$(date +%s)
stamp() { echo "== $1 ($(( $(date +%s) - t0 )) s)"; }
L=$OUT/logs6
mkdir -p "$L"

if has build && ! { [ "${SKIP_BUILD:-0}" = 1 ] && [ -x "$BUILD/moex_model_bench" ]; }; then
  stamp build
  { cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEX_CUDA=ON &&
    cmake --build "$BUILD" -j "$(nproc)" --target moex moex_tests moex_model_bench moex_decode_probe; } > "$L/build.log" 2>&1 ||
    { grep -E "error" "$L/build.log" | head -30; exit 1; }
fi

if has tests; then
  stamp "model tests"
  timeout ${TEST_TIMEOUT:-200} "$BUILD/moex_tests" \
    --gtest_filter="${TEST_FILTER:-CudaModelDecodeFusion*:CudaModelGraphs*:*CudaModelParity.Bf16*:CudaModelKernels*}" \
    > "$L/tests.log" 2>&1
  echo "tests rc $?"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]|rel L2" "$L/tests.log" | head -40
  grep -B3 -A12 "Failure" "$L/tests.log" | head -60
fi

if has xtests; then
  stamp "experts tests"
  MOEX_CUDA_TEST_CASES=${MOEX_CUDA_TEST_CASES:-20} timeout ${TEST_TIMEOUT:-200} "$BUILD/moex_tests" \
    --gtest_filter="${XTEST_FILTER:-CudaBackends.*:*CudaGraph*:*CudaEquivalence*}" > "$L/xtests.log" 2>&1
  echo "experts tests rc $?"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]" "$L/xtests.log" | head -20
  grep -B3 -A12 "Failure" "$L/xtests.log" | head -40
fi

if has ab; then
  for v in "base:" ${AB_VARIANTS:-}; do
    name=${v%%:*}; envs=${v#*:}
    stamp "model bench [$name]"
    env $(echo "$envs" | tr ',' ' ') timeout 120 "$BUILD/moex_model_bench" --layers 48 --batches ${AB_BATCHES:-1,8} \
      ${BENCH_ARGS:-} --out "$L/e2e_$name.json" 2>&1 | grep -v "^{" | sed "s/^/[$name] /" | tee -a "$L/ab.log"
  done
fi
if has probe; then
  for args in "" "--no-prefetch" "--latency-phases 0" "--latency-phases 0 --no-prefetch" "--blocks-per-sm 2 --threads 512" \
              "--no-weights" "--no-weights --blocks-per-sm 2 --threads 512"; do
    stamp "decode probe [$args]"
    timeout 60 "$BUILD/moex_decode_probe" $args 2>&1 | tee -a "$L/probe.log"
  done
fi
if has ncu; then
  # each decode kernel alone (ncu serialises them: no PDL overlap), a 4-layer model at batch 1:
  # duration, DRAM bytes read and the rate, registers, achieved occupancy
  stamp "ncu"
  timeout 240 ncu --clock-control none --csv --print-units base \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active,launch__grid_size \
    --kernel-name regex:"${NCU_KERNELS:-gemv_kernel|batched_|decode_attention}" \
    --launch-skip ${NCU_SKIP:-0} --launch-count ${NCU_COUNT:-80} \
    "$BUILD/moex_model_bench" --layers 4 --batches 1 --new 4 --out "$L/ncu_bench.json" > "$L/ncu.csv" 2> "$L/ncu.err"
  echo "ncu rc $?"; tail -3 "$L/ncu.err"
  python3 - "$L/ncu.csv" <<'PY'
import csv, sys, re
num = lambda v: float(str(v).replace(",", "") or 0)
rows = list(csv.reader(open(sys.argv[1])))
start = next((i for i, r in enumerate(rows) if r and r[0] == "ID"), None)
if start is None: print("no ncu rows"); sys.exit()
h = rows[start]; I = {k: h.index(k) for k in ("ID", "Kernel Name", "Metric Name", "Metric Value", "Grid Size")}
k = {}
for r in rows[start + 1:]:
    if len(r) < len(h): continue
    d = k.setdefault(r[I["ID"]], {"name": re.sub(r"\(.*", "", r[I["Kernel Name"]]).replace("moex::", "")[:56], "grid": r[I["Grid Size"]]})
    d[r[I["Metric Name"]]] = r[I["Metric Value"]]
print(f"{'id':>4} {'kernel':56} {'us':>7} {'MB':>7} {'GB/s':>6} {'regs':>4} {'occ%':>5} grid")
for i, d in sorted(k.items(), key=lambda x: int(x[0])):
    us = num(d.get("gpu__time_duration.sum", 0)) / 1e3; mb = num(d.get("dram__bytes_read.sum", 0)) / 1e6
    print(f"{i:>4} {d['name']:56} {us:7.2f} {mb:7.2f} {mb / us * 1e3 if us else 0:6.0f} {d.get('launch__registers_per_thread', '?'):>4} "
          f"{num(d.get('sm__warps_active.avg.pct_of_peak_sustained_active', 0)):5.1f} {d['grid']}")
PY
fi
tar czf "$OUT/s6_logs.tgz" -C "$OUT" logs6 && rm -rf "$L"
stamp done
