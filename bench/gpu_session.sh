#!/usr/bin/env bash
# bench/gpu_session.sh — one GPU-machine call that checks and times the quantized / deepgemm /
# model-runtime work together (run from the repository root: `bash bench/gpu_session.sh`):
#
#   build     cmake Release with CUDA into $BUILD (moex, moex_tests, moex_model_bench)
#   tests     the CUDA equivalence suite (MOEX_CUDA_TEST_CASES generated cases per dtype, the
#             quantized cases included), the deepgemm suite, the FP8 tensor-core GEMV suite, the
#             CUDA model-runtime suite
#   promote   deepgemm FP8 accuracy and speed for MOEX_CUDA_FP8_PROMOTE = 1, 2, 4
#   gemv      batched_mm: bf16 vs FP8 (CUDA-core GEMV) vs FP8 (MOEX_CUDA_FP8_MMA_GEMV=1) at T <= 64
#   fp8ckpt   bench/gpu_fp8_ckpt.sh on this build (the reference library loads `moex quantize`
#             output; its FP8 fixture)
# Logs go to $OUT/logs/ and are packed into $OUT/logs.tgz (with the fixture); the summary is on
# stdout. PARTS selects steps (default: all).
set -u
OUT=${OUT:-$PWD/out}
L=$OUT/logs
mkdir -p "$L"
BUILD=${BUILD:-build-gpu}
PARTS=${PARTS:-"build tests promote gemv fp8ckpt"}
has() { [[ " $PARTS " == *" $1 "* ]]; }
t0=$(date +%s)
stamp() { echo "== $1 ($(( $(date +%s) - t0 )) s)"; }
summary() { grep -E "^\[  (FAILED|PASSED) |passed of|passed, worst|generated|worst rel L2|rel L2 [0-9]|Failure" "$1" | head -${2:-30}; }

if has build; then
  stamp build
  { cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEX_CUDA=ON &&
    cmake --build "$BUILD" -j "$(nproc)" --target moex moex_tests moex_model_bench; } > "$L/build.log" 2>&1
  grep -E "error|FAILED" "$L/build.log" | head -20
  [ -x "$BUILD/moex_tests" ] || { echo "build failed"; tail -30 "$L/build.log"; exit 1; }
fi

if has tests; then
  stamp tests
  MOEX_CUDA_TEST_CASES=${CASES:-40} timeout 200 "$BUILD/moex_tests" --gtest_filter='*CudaEquivalence*:Capturable/*:CudaBackends.*' > "$L/cuda.log" 2>&1
  echo "cuda suite exit $?"; summary "$L/cuda.log" 40
  timeout 120 "$BUILD/moex_tests" --gtest_filter='*DeepGemm*' > "$L/deepgemm.log" 2>&1
  echo "deepgemm suite exit $?"; summary "$L/deepgemm.log"
  timeout 90 "$BUILD/moex_tests" --gtest_filter='*CudaFp8MmaGemv*' > "$L/gemv.log" 2>&1
  echo "fp8 mma gemv suite exit $?"; summary "$L/gemv.log" 12
  timeout 120 "$BUILD/moex_tests" --gtest_filter='*CudaModel*' > "$L/model.log" 2>&1
  echo "model suite exit $?"; grep -E "^\[  (FAILED|PASSED) |Failure|Expected" "$L/model.log" | head -12
fi

if has promote; then
  stamp promote
  for p in 2 4; do
    MOEX_CUDA_FP8_PROMOTE=$p timeout 60 "$BUILD/moex_tests" --gtest_filter='Layouts/DeepGemmEquivalence.*/contiguous' 2>&1 |
      grep -E "passed, worst" | sed "s/^/[promote $p] /"
  done
  : > "$L/promote.json"
  for p in 1 2 4; do
    MOEX_CUDA_FP8_PROMOTE=$p timeout 100 "$BUILD/moex" bench --device cuda --backends deepgemm --quant fp8 \
      --shapes ${PROMOTE_SHAPES:-qwen3_30b_a3b,mixtral_8x7b,deepseek_v3} --tokens ${PROMOTE_TOKENS:-4096,16384} --dtype bf16 \
      --format json --min-time-ms 20 --max-iters 8 --warmup 2 2>>"$L/promote.err" | sed "s/^{/{\"promote\": $p, /" >> "$L/promote.json"
  done
  timeout 100 "$BUILD/moex" bench --device cuda --backends deepgemm,grouped_mm --quant none \
    --shapes ${PROMOTE_SHAPES:-qwen3_30b_a3b,mixtral_8x7b,deepseek_v3} --tokens 64,512,4096,16384 --dtype bf16 --format json \
    --min-time-ms 20 --max-iters 8 --warmup 2 2>>"$L/promote.err" | sed 's/^{/{"promote": 0, /' >> "$L/promote.json"
  python3 - "$L/promote.json" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
print("| shape | T | backend | quant | promote | ms | TFLOP/s | % floor |")
print("|---|---|---|---|---|---|---|---|")
for r in rows:
    if "ms" not in r or not r["ms"]: continue
    print(f"| {r['shape']} | {r['T']} | {r['backend']} | {r.get('quant','none')} | {r['promote'] or '-'} | {r['ms']:.3f} | {r['tflops']:.1f} | {r['pct_floor']:.0f} |")
EOF
fi

if has gemv; then
  stamp gemv
  : > "$L/gemv.json"
  for shape in $(echo "${GEMV_SHAPES:-qwen3_30b_a3b,mixtral_8x7b,deepseek_v3}" | tr ',' ' '); do
    for variant in bf16:none:0 fp8_cuda_cores:fp8:0 fp8_mma:fp8:1; do
      IFS=: read -r name q mma <<< "$variant"
      MOEX_CUDA_FP8_MMA_GEMV=$mma timeout 100 "$BUILD/moex" bench --device cuda --backends batched_mm,grouped_mm --shapes "$shape" \
        --tokens 1,8,64 --dtype bf16 --quant "$q" --format json --min-time-ms 20 --max-iters 15 --warmup 3 2>>"$L/gemv.err" |
        sed "s/^{/{\"variant\": \"$name\", /" >> "$L/gemv.json"
    done
  done
  python3 - "$L/gemv.json" <<'EOF'
import json, sys
rows = {}
for l in open(sys.argv[1]):
    if not l.startswith("{"): continue
    r = json.loads(l)
    if r.get("ms"): rows[(r["shape"], r["T"], r["backend"], r["variant"])] = r
print("| shape | T | backend | bf16 ms | fp8 (CUDA cores) ms | fp8 (mma GEMV) ms | bf16 / best fp8 | fp8 % floor |")
print("|---|---|---|---|---|---|---|---|")
for s, T, b in sorted({k[:3] for k in rows}):
    g = lambda v: rows.get((s, T, b, v))
    base, a, m = g("bf16"), g("fp8_cuda_cores"), g("fp8_mma")
    best = min([x for x in (a, m) if x], key=lambda x: x["ms"], default=None)
    f = lambda x: f"{x['ms']:.3f}" if x else "—"
    print(f"| {s} | {T} | {b} | {f(base)} | {f(a)} | {f(m)} | " + (f"{base['ms']/best['ms']:.2f}x" if base and best else "—") +
          f" | " + (f"{best['pct_floor']:.0f}" if best else "—") + " |")
EOF
fi

if has fp8ckpt; then
  stamp fp8ckpt
  OUT=$L SKIP_BUILD=1 BUILD=$BUILD timeout 150 bash bench/gpu_fp8_ckpt.sh 2>&1 | tail -25
fi

stamp pack
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$L"
stamp done
