#!/usr/bin/env bash
# bench/gpu_session43.sh — issue 6's FP8 prefill bar with the wide exact kernels (X = 4 / 5,
# MOEX_CUDA_FP8_X_WIDE=1 / 2, forty-third session), one call on the GPU machine from the repository
# root (`run` with `bash bench/gpu_session43.sh`), through bench/gpu_fp8_decode.sh:
#   build     CUDA Release (moex, moex_tests)
#   sass      HGMMA / F2FP / local-memory counts of the exact kernels, X = 1 and the wide ones
#   tests     TEST_FILTER (default CudaFp8Prefill — every mode, the wide kernels' included —,
#             CudaFp8Decode, CudaEquivalence — its fixed cases include zero weight blocks with scale 0 —,
#             CudaGraph, CudaFp8Route)
#   sanitize  compute-sanitizer memcheck on the bf16 prefill cases (every mode)
#   perf      CUDA-graph replay, bf16 and FP8 grouped_mm at T = 512 / 4096 on the four SPEC §9
#             shapes: the default (X = 1 up GEMM), "wide" (X = 4) and "wide2" (X = 5), AB_ROUNDS
#             (default 3) interleaved rounds → $OUT/fp8_decode.md ("best bf16 / best FP8" per variant;
#             issue 6 asks FP8 prefill no slower than bf16: >= 1.00x at T = 4096)
#   ncu       (STEPS names it, default on) each TMA GEMM kernel of one FP8 grouped_mm forward at
#             NCU_CASE (default qwen3_30b_a3b:4096) per variant: time, tensor-pipe and L2 throughput
#             → $OUT/ncu_x.md (NCU_VARIANTS: "name:ENV=V" list, default base / wide / wide2); with
#             NCU_STALLS=1 also the warp-state and scheduler sections (stall reasons) and per-SASS stall
#             samples of the default up GEMM (X = 1; NCU_STALL_X=6 with NCU_STALL_ENV=MOEX_CUDA_FP8_X_CONV=1:
#             the converting kernel) → $OUT/ncu_stalls.txt, $OUT/stalls_x<X>_source.csv.gz
set -u
export OUT=${OUT:-$PWD/out}
BUILD=${BUILD:-build-gpu}
PARTS=${PARTS:-"build sass tests sanitize perf"} BUILD=$BUILD \
TEST_FILTER=${TEST_FILTER:-"*CudaFp8Prefill*:*CudaFp8Decode*:*CudaEquivalence*:*CudaGraph*:CudaFp8Route.*"} \
SANITIZE_FILTER=${SANITIZE_FILTER:-"Dtypes/CudaFp8Prefill.*/bf16"} SANITIZE_TOOLS=${SANITIZE_TOOLS:-memcheck} \
TOKENS=${TOKENS:-512,4096} COMPARE_OLD=0 PERF_BACKENDS=${PERF_BACKENDS:-grouped_mm} \
AB_VARIANTS=${AB_VARIANTS:-"wide:MOEX_CUDA_FP8_X_WIDE=1 wide2:MOEX_CUDA_FP8_X_WIDE=2"} AB_ROUNDS=${AB_ROUNDS:-3} \
  bash bench/gpu_fp8_decode.sh
if [[ " ${STEPS:-ncu} " == *" ncu "* ]] && command -v ncu > /dev/null; then
  echo "== ncu"
  c=${NCU_CASE:-qwen3_30b_a3b:4096}
  variants=${NCU_VARIANTS:-"base:MOEX_CUDA_FP8_X_WIDE=0 wide:MOEX_CUDA_FP8_X_WIDE=1 wide2:MOEX_CUDA_FP8_X_WIDE=2"}
  for v in $variants; do
    env ${v#*:} MOEX_CUDA_PERF=1 MOEX_CUDA_PERF_QUANT=fp8 MOEX_CUDA_PERF_TOKENS="${c#*:}" \
      MOEX_CUDA_PERF_SHAPES="${c%%:*}" MOEX_CUDA_PERF_BACKENDS=grouped_mm MOEX_CUDA_PERF_REPS=2 timeout 150 \
      ncu --clock-control none --csv --print-units base --kernel-name "regex:grouped_gemm_tma" \
      --metrics gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_bytes.sum \
      "$BUILD/moex_tests" --gtest_filter='CudaPerf.Shapes' > "$OUT/ncu_x_${v%%:*}.csv" 2> /dev/null
  done
  python3 - "$OUT" "$c" $variants <<'PY' | tee "$OUT/ncu_x.md"
import csv, sys, os, re, collections, statistics
print(f"ncu, {sys.argv[2]}, FP8 grouped_mm: each TMA GEMM kernel (median over its launches)")
print("| variant | kernel | µs | tensor pipe % | L2 GB |")
print("|---|---|---|---|---|")
for v in (a.split(":")[0] for a in sys.argv[3:]):
    path = os.path.join(sys.argv[1], f"ncu_x_{v}.csv")
    if not os.path.exists(path): continue
    rows = list(csv.reader(open(path)))
    try: hdr = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
    except StopIteration: print(f"| {v} | no kernels | | | |"); continue
    h = rows[hdr]; ii, ki, mi, vi = h.index("ID"), h.index("Kernel Name"), h.index("Metric Name"), h.index("Metric Value")
    k = {}
    for r in rows[hdr + 1:]:
        if len(r) > vi:
            m = re.search(r"grouped_gemm_tma<([^>]*)>", r[ki])
            k.setdefault(r[ii], {"name": m.group(1) if m else r[ki][:60]})[r[mi]] = float(r[vi].replace(",", ""))
    per = collections.defaultdict(list)
    for d in k.values(): per[d["name"]].append(d)
    for name, ds in per.items():
        med = lambda key: statistics.median(d.get(key, 0) for d in ds)
        print(f"| {v} | {name} | {med('gpu__time_duration.sum') / 1e3:.1f} | "
              f"{med('sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active'):.1f} | {med('lts__t_bytes.sum') / 1e9:.2f} |")
PY
  if [ "${NCU_STALLS:-0}" = 1 ]; then
    env ${NCU_STALL_ENV:-} MOEX_CUDA_PERF=1 MOEX_CUDA_PERF_QUANT=fp8 MOEX_CUDA_PERF_TOKENS="${c#*:}" MOEX_CUDA_PERF_SHAPES="${c%%:*}" \
      MOEX_CUDA_PERF_BACKENDS=grouped_mm MOEX_CUDA_PERF_REPS=1 timeout 200 \
      ncu --clock-control none --kernel-name-base demangled --kernel-name "regex:grouped_gemm_tma<.*\(int\)${NCU_STALL_X:-1}>" --launch-count 1 \
      --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section SourceCounters \
      --metrics "regex:sm__inst_executed_pipe_.*\.avg\.pct_of_peak_sustained_active" \
      --import-source no -f -o "$OUT/stalls" "$BUILD/moex_tests" --gtest_filter='CudaPerf.Shapes' > "$OUT/ncu_stalls.log" 2>&1
    ncu -i "$OUT/stalls.ncu-rep" > "$OUT/ncu_stalls.txt" 2>&1
    # per-SASS-instruction stall samples of the same launch (read on the development machine)
    src="$OUT/stalls_x${NCU_STALL_X:-1}_source.csv"
    ncu -i "$OUT/stalls.ncu-rep" --page source --csv --print-source sass > "$src" 2>&1
    gzip -f "$src"; rm -f "$OUT/stalls.ncu-rep"
    grep -E "Stall|Warp Cycles|Issued|Eligible|Active Warps|Pipe" "$OUT/ncu_stalls.txt" | head -40
  fi
fi
