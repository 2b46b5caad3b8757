#!/usr/bin/env bash
# bench/gpu_profile.sh — where the time goes, on the GPU machine (`run` with command
# `bash bench/gpu_profile.sh`), from the repository root. Needs ncu (Nsight Compute) with access to
# the hardware counters (the Firecracker machines; KINDS.md); clocks are left alone
# (--clock-control none, METHOD.md).
#
#   1. builds moex, moex_tests, moex_model_bench with CUDA into $BUILD (default build-gpu;
#      SKIP_BUILD=1 reuses it)
#   2. model: per-kernel GPU time of the random Qwen3-30B-A3B model (2 layers) — a 1x2048 prefill and
#      batch-1 decode steps — summed by kernel name ($OUT/model_prefill.txt, model_decode.txt)
#   3. gemm: ncu's SpeedOfLight / memory / warp-state / compute / instruction sections for the
#      grouped GEMMs of the cases that miss their bars (GEMM_CASES, "shape:T:backend:quant" items)
#      → $OUT/gemm_<case>.txt; NCU_KERNELS (default regex:grouped_gemm; e.g. "regex:decode_|grouped_gemm"
#      for the FP8 decode kernels too), NCU_SKIP / NCU_COUNT (default 2 / 2) pick the launches,
#      NCU_EXTRA adds ncu options (e.g. "--section MemoryWorkloadAnalysis_Tables")
#
# Logs: $OUT/profile_logs.tgz. Whole run: ~5 minutes with the build.
set -u
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT" "$OUT/logs"
BUILD=${BUILD:-build-gpu}
PARTS=${PARTS:-"build model gemm"}
GEMM_CASES=${GEMM_CASES:-"qwen3_30b_a3b:512:grouped_mm:none deepseek_v3:16384:grouped_mm:none deepseek_v3:16384:deepgemm:fp8"}
t0=$(date +%s)
stamp() { echo "== $1 ($(( $(date +%s) - t0 )) s)"; }
has() { case " $PARTS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
NCU="ncu --clock-control none"

if has build && [ -z "${SKIP_BUILD:-}" ]; then
  stamp build
  { cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEX_CUDA=ON &&
    cmake --build "$BUILD" -j "$(nproc)" --target moex moex_tests moex_model_bench; } > "$OUT/logs/build.log" 2>&1 ||
    { tail -40 "$OUT/logs/build.log"; exit 1; }
fi

# Sum ncu's per-kernel durations (csv, gpu__time_duration.sum) by kernel name.
summarise() {  # csv_file title
  python3 - "$1" "$2" <<'PY'
import csv, sys, collections
rows = list(csv.reader(open(sys.argv[1])))
hdr = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
h = rows[hdr]; ki, mi, vi = h.index("Kernel Name"), h.index("Metric Name"), h.index("Metric Value")
tot = collections.defaultdict(float); cnt = collections.Counter()
for r in rows[hdr + 1:]:
    if len(r) <= vi or r[mi] != "gpu__time_duration.sum": continue
    name = r[ki].split("(")[0][:90]
    v = float(r[vi].replace(",", ""))
    unit = h[vi]  # values are in the unit row below the header in some versions
    tot[name] += v; cnt[name] += 1
s = sum(tot.values())
print(f"# {sys.argv[2]}: {sum(cnt.values())} kernels, {s/1e3:.1f} us total (ns in csv)")
for k, v in sorted(tot.items(), key=lambda x: -x[1])[:30]:
    print(f"{v/1e3:10.1f} us {100*v/s:5.1f}%  x{cnt[k]:<5d} {k}")
PY
}

if has model; then
  stamp "model prefill (ncu)"
  # prefill only: --new 2 --batches 1, only the first generate's kernels (launch-count bounds it)
  timeout 300 $NCU --metrics gpu__time_duration.sum --csv --launch-count 700 \
    "$BUILD/moex_model_bench" --layers 2 --prompt 2048 --decode-prompt 128 --new 2 --batches 1 \
    > "$OUT/logs/model_ncu.csv" 2> "$OUT/logs/model_ncu.err"
  echo "ncu rc $?"
  summarise "$OUT/logs/model_ncu.csv" "2-layer model: prefill 1x2048 runs then batch-1 decode (first 700 kernels)" | tee "$OUT/model_kernels.txt"
  # the launch sequence (id, us, name) to split prefill from decode steps by eye
  python3 - "$OUT/logs/model_ncu.csv" > "$OUT/model_sequence.txt" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
hdr = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
h = rows[hdr]; ii, ki, mi, vi = h.index("ID"), h.index("Kernel Name"), h.index("Metric Name"), h.index("Metric Value")
for r in rows[hdr + 1:]:
    if len(r) > vi and r[mi] == "gpu__time_duration.sum":
        print(r[ii], f"{float(r[vi].replace(',', ''))/1e3:.1f}", r[ki].split("(")[0][:100])
PY
fi

if has gemm; then
  for c in $GEMM_CASES; do
    IFS=: read -r shape T backend quant <<< "$c"
    stamp "gemm $c (ncu)"
    timeout 200 $NCU -k "${NCU_KERNELS:-regex:grouped_gemm}" --launch-skip "${NCU_SKIP:-2}" --launch-count "${NCU_COUNT:-2}" \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
      --section ComputeWorkloadAnalysis --section LaunchStats --section InstructionStats ${NCU_EXTRA:-} \
      "$BUILD/moex" bench --device cuda --backends "$backend" --shapes "$shape" --tokens "$T" --quant "$quant" \
      --min-time-ms 0 --max-iters 2 --warmup 1 > "$OUT/gemm_${shape}_${T}_${backend}_${quant}.txt" 2>&1
    echo "ncu rc $?"
    grep -E "grouped_gemm|decode_|highest-utilized|Issue Slots Busy|Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|L2 Cache Throughput|L1/TEX Cache Throughput|Registers Per|Achieved Occupancy|Stall|Issued Ipc|Executed Ipc" \
      "$OUT/gemm_${shape}_${T}_${backend}_${quant}.txt" | head -40
  done
fi
tar czf "$OUT/profile_logs.tgz" -C "$OUT" logs && rm -rf "$OUT/logs"
stamp done
