#!/usr/bin/env bash
# bench/gpu_model_check.sh — the model runtime on the GPU in one call (issue 5), run from the
# repository root on the device machine: `bash bench/gpu_model_check.sh` (results under $OUT).
#
#   1. build (cmake Release, CUDA on, Ninja, -j16): moex, moex_tests, moex_model_bench
#   2. GPU model tests: moex_tests --gtest_filter='*CudaModel*' in three groups (parity of every fixture for every
#      CUDA backend, f32 and bf16 bars of SPEC §8; decode-stage switching per step; CUDA graphs;
#      GEMM prefill attention and the decode GEMV against the other paths); memcheck when one fails
#   3. the CLI on CUDA: moex generate / forward / bench-model --device cuda on a fixture
#   4. moex_model_bench (random Qwen3-30B-A3B shape, bf16): prefill 1x2048, decode batch 1/8/64,
#      with and without switching / graphs, the batch-1 memory floor
#   5. bench/model_e2e_reference.py: the same model in transformers, the same measurements
#   6. a side-by-side table (side_by_side.md) with the issue-5 targets
#
# Every step runs even when an earlier one failed (its exit status is logged). Files under $OUT:
# progress.log, build.log, tests.log, cli.log, moex_e2e.json, ref_e2e.json, side_by_side.md.
# PARTS selects steps (default: all but profile): PARTS="build tests cli bench ref profile table".
# Whole default run < 8 minutes.
set -u
OUT=${OUT:-$PWD/out}
export MOEX_SOURCE_DIR=$PWD
export PATH=$PATH:/usr/local/cuda/bin
mkdir -p "$OUT"
BUILD=${BUILD:-build-gpu}
PARTS=${PARTS:-"build tests cli bench ref table"}
LAYERS=${LAYERS:-48}
has() { [[ " $PARTS " == *" $1 "* ]]; }
t0=$(date +%s)
log() { echo "== [$(date +%H:%M:%S) +$(( $(date +%s) - t0 ))s] $*" | tee -a "$OUT/progress.log"; }
# run NAME TIMEOUT CMD...: runs with a timeout, appends its exit status to progress.log
run() {
  local name=$1 limit=$2
  shift 2
  log "start $name: $*"
  timeout "$limit" "$@"
  local rc=$?
  log "end $name: exit $rc"
  return $rc
}

if has build; then
  { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true; } 2>&1 | tee -a "$OUT/progress.log"
  run configure 120 cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEX_CUDA=ON > "$OUT/build.log" 2>&1
  run build 400 cmake --build "$BUILD" -j 16 --target moex moex_tests moex_model_bench >> "$OUT/build.log" 2>&1
  grep -E "error|FAILED" "$OUT/build.log" | head -30 | tee -a "$OUT/progress.log"
fi

if has tests; then
  if [ -x "$BUILD/moex_tests" ]; then
    # three processes: a sticky CUDA error in one group does not hide the others' results
    failed=0
    for f in '*CudaModelParity.F32*' '*CudaModelParity.Bf16*' 'CudaModelSwitching*:CudaModelGraphs*:CudaModelErrors*:CudaModelAttention*:CudaModelLinear*:CudaModelRouters*:CudaModelFp8*:CudaModelKernels*:CudaAttentionKernels*'; do
      run "tests $f" 150 "$BUILD/moex_tests" --gtest_filter="$f" >> "$OUT/tests.log" 2>&1 || failed=1
    done
    grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|rel L2|error" "$OUT/tests.log" | head -120 | tee -a "$OUT/progress.log"
    if [ $failed -ne 0 ] && command -v compute-sanitizer > /dev/null; then
      # a failure: memcheck on the small graph/switching tests for out-of-bounds accesses
      run memcheck 120 compute-sanitizer --tool memcheck --print-limit 20 "$BUILD/moex_tests" \
        --gtest_filter='CudaModelGraphs*:CudaModelSwitching.Prefill*' >> "$OUT/tests.log" 2>&1
      grep -E "ERROR SUMMARY|Invalid|at 0x|by thread" "$OUT/tests.log" | head -30 | tee -a "$OUT/progress.log"
    fi
  else
    log "tests: no $BUILD/moex_tests"
  fi
fi

if has cli; then
  if [ -x "$BUILD/moex" ]; then
    {
      echo "# expected (CPU / reference): [[1, 5, 9, 13, 2, 7, 45, 19, 61, 99, 43, 8, 127, 8], [3, 4, 8, 123, 22, 68, 53, 74, 27, 52, 32]]"
      run cli_generate 60 "$BUILD/moex" generate --device cuda --model tests/fixtures/qwen3_moe --ids "1,5,9,13,2,7;3,4,8" \
        --max-new-tokens 8 --experts-implementation grouped_mm
      run cli_generate_sample 60 "$BUILD/moex" generate --device cuda --model tests/fixtures/mixtral --ids "1,2,3" \
        --max-new-tokens 6 --do-sample --temperature 0.8 --top-k 20 --top-p 0.9 --seed 3
      run cli_forward 60 "$BUILD/moex" forward --device cuda --model tests/fixtures/deepseek_v3 --ids "1,2,3;4,5,6" \
        --out "$BUILD/cli_forward_cuda.safetensors" --dtype bf16 && ls -l "$BUILD/cli_forward_cuda.safetensors"
      run cli_bench_model 120 "$BUILD/moex" bench-model --device cuda --model tests/fixtures/qwen3_moe --dtype bf16 --batch 4 \
        --prompt-len 32 --new-tokens 16 --backends grouped_mm,batched_mm,eager
      run cli_info 60 "$BUILD/moex" info --model tests/fixtures/qwen3_vl_moe
    } > "$OUT/cli.log" 2>&1
    tail -40 "$OUT/cli.log" | tee -a "$OUT/progress.log"
  fi
fi

if has bench; then
  if [ -x "$BUILD/moex_model_bench" ]; then
    run moex_model_bench 180 "$BUILD/moex_model_bench" --layers "$LAYERS" --out "$OUT/moex_e2e.json" 2>&1 | tee -a "$OUT/progress.log"
  else
    log "bench: no $BUILD/moex_model_bench"
  fi
fi

if has ref; then
  run reference 240 python3 bench/model_e2e_reference.py --layers "$LAYERS" --out "$OUT/ref_e2e.json" --deadline 150 2>&1 |
    grep -vE "^\s*$" | tail -30 | tee -a "$OUT/progress.log"
fi

if has profile; then
  # optional (PARTS="... profile"): where a decode step's time goes, per kernel (nsys), on a 8-layer model
  if command -v nsys > /dev/null && [ -x "$BUILD/moex_model_bench" ]; then
    run nsys 240 nsys profile -o "$BUILD/model_bench_profile" --force-overwrite true --stats=false \
      "$BUILD/moex_model_bench" --layers 8 --batches 1 --prompt 256 --new 32 > /dev/null 2>&1
    nsys stats --report cuda_gpu_kern_sum --format csv "$BUILD/model_bench_profile.nsys-rep" 2>/dev/null |
      head -40 | tee -a "$OUT/progress.log"
  else
    log "profile: nsys or $BUILD/moex_model_bench missing"
  fi
fi

if has table; then
  python3 - "$OUT" <<'EOF' 2>&1 | tee "$OUT/side_by_side.md" | tee -a "$OUT/progress.log"
import json, os, sys
out = sys.argv[1]
def load(n):
    try:
        return json.load(open(os.path.join(out, n)))
    except Exception as e:
        print(f"({n}: {e})")
        return None
m, r = load("moex_e2e.json"), load("ref_e2e.json")
print("| measure | moex | reference | ratio | target |")
print("| --- | --- | --- | --- | --- |")
def row(name, a, b, target=""):
    ratio = f"{a / b:.2f}x" if a and b else "-"
    fa = f"{a:.0f}" if a else "-"
    fb = f"{b:.0f}" if b else "-"
    print(f"| {name} | {fa} | {fb} | {ratio} | {target} |")
if m or r:
    row("prefill 1x2048 tok/s", m and m.get("prefill_tok_s"), r and r.get("prefill_tok_s"), ">= 2x")
    rd = {d["batch"]: d for d in (r or {}).get("decode", [])}
    for d in (m or {}).get("decode", []):
        if d["variant"] != "switch+graphs":
            continue
        b = d["batch"]
        row(f"decode batch {b} tok/s", d.get("decode_tok_s"), rd.get(b, {}).get("decode_tok_s"),
            (">= 5x" if b == 1 else "") + (f" (moex skipped: {d['skipped']})" if "skipped" in d else ""))
    if m:
        print()
        print(f"copy bandwidth {m['copy_bandwidth_GBs']:.0f} GB/s; batch-1 step reads {m['decode_step_weight_bytes'] / 1e9:.2f} GB "
              f"-> floor {m['floor_ms']:.3f} ms (target: step within 2x)")
        print("| variant | batch | step ms | tok/s | x floor | graph replays |")
        print("| --- | --- | --- | --- | --- | --- |")
        for d in m.get("decode", []):
            if "skipped" in d:
                print(f"| {d['variant']} | {d['batch']} | skipped: {d['skipped']} | | | |")
                continue
            print(f"| {d['variant']} | {d['batch']} | {d['step_ms']:.3f} | {d['decode_tok_s']:.0f} | "
                  f"{d['step_ms'] / m['floor_ms']:.2f} | {d['graph_replays']} |")
EOF
fi
log "done"
