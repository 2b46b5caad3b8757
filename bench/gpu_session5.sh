#!/usr/bin/env bash
# bench/gpu_session5.sh — one call on the GPU machine for the fifth session's decode work
# (`run` with command `bash bench/gpu_session5.sh`), from the repository root:
#   build   moex, moex_tests, moex_model_bench (CUDA, Release) into $BUILD (via gpu_session4.sh)
#   model   the model runtime GPU tests (gpu_session4.sh PARTS=model)
#   tests   the experts GPU tests: CudaBackends, CudaGraph, CudaFp8Decode, CudaEquivalence
#   ab      moex_model_bench (48 layers, decode batches $AB_BATCHES) and `moex bench` (batched_mm,
#           grouped_mm at T = 1, 8, 64) for every "name:ENV=V[,ENV=V]" item of $AB_VARIANTS and the
#           default ("base"), same call: the decode-step and experts timings side by side
#   fp8     CUDA-graph timings bf16 vs FP8 at T <= 64 (bench/gpu_fp8_decode.sh PARTS=perf)
#   gemm    grouped_mm at $GEMM_TOKENS for every item of $GEMM_VARIANTS and "base" (TMA GEMM knobs)
# PARTS selects steps (default "build model tests ab fp8 gemm"). Logs packed in $OUT/s5_logs.tgz.
set -u
OUT=${OUT:-$PWD/out}
export MOEX_SOURCE_DIR=$PWD
BUILD=${BUILD:-build-gpu}
PARTS=${PARTS:-"build model tests ab fp8 gemm"}
has() { case " $PARTS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
t0=$(date +%s)
stamp() { echo "== $1 ($(( $(date +%s) - t0 )) s)"; }
mkdir -p "$OUT/logs5"

s4=""
has build && s4="build"
has model && s4="$s4 model"
if [ -n "$s4" ]; then
  OUT="$OUT" BUILD=$BUILD PARTS="$s4" bash bench/gpu_session4.sh || exit 1
  (cd "$OUT" && tar xzf s4_logs.tgz && mv logs/* logs5/ && rm -rf logs s4_logs.tgz)
fi

if has tests; then
  stamp "experts GPU tests"
  MOEX_CUDA_TEST_CASES=${MOEX_CUDA_TEST_CASES:-20} timeout 240 "$BUILD/moex_tests" \
    --gtest_filter="${TEST_FILTER:-CudaBackends.*:*CudaGraph*:*CudaFp8Decode*:*CudaEquivalence*}" > "$OUT/logs5/tests.log" 2>&1
  echo "tests rc $?"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]|worst" "$OUT/logs5/tests.log" | head -30
  grep -B2 -A10 "Failure" "$OUT/logs5/tests.log" | head -40
fi

if has ab; then
  AB_VARIANTS=${AB_VARIANTS:-"nopdl:MOEX_CUDA_PDL=0"}
  for v in "base:" $AB_VARIANTS; do
    name=${v%%:*}; envs=${v#*:}
    stamp "model bench [$name]"
    env $(echo "$envs" | tr ',' ' ') timeout 120 "$BUILD/moex_model_bench" --layers 48 --batches ${AB_BATCHES:-1,8,64} \
      --out "$OUT/logs5/e2e_$name.json" 2>&1 | grep -v "^{" | sed "s/^/[$name] /" | tee -a "$OUT/logs5/ab.log"
    env $(echo "$envs" | tr ',' ' ') timeout 120 "$BUILD/moex" bench --device cuda --backends batched_mm,grouped_mm \
      --shapes qwen3_30b_a3b,qwen15_moe_a2_7b,mixtral_8x7b,deepseek_v3 --tokens ${AB_TOKENS:-1,8,64} --dtype bf16 \
      --min-time-ms 20 --max-iters 15 --warmup 2 2>&1 | sed "s/^/[$name] /" | tee -a "$OUT/logs5/ab.log" | grep -E "ms|shape" | head -40
  done
fi
if has fp8; then
  stamp "fp8 decode timings"
  OUT="$OUT/logs5" SKIP_BUILD=1 BUILD=$BUILD PARTS=perf COMPARE_OLD=0 bash bench/gpu_fp8_decode.sh 2>&1 | tail -16
fi

if has gemm; then
  # (the fifth session also ran "abox128:MOEX_CUDA_TMA_ABOX=128", a knob since fixed at 32 rows)
  GEMM_VARIANTS=${GEMM_VARIANTS:-"n256:MOEX_CUDA_TMA_N=256"}
  for v in "base:" $GEMM_VARIANTS; do
    name=${v%%:*}; envs=${v#*:}
    stamp "grouped GEMM [$name]"
    env $(echo "$envs" | tr ',' ' ') timeout 120 "$BUILD/moex" bench --device cuda --backends grouped_mm \
      --shapes qwen3_30b_a3b,qwen15_moe_a2_7b,mixtral_8x7b,deepseek_v3 --tokens ${GEMM_TOKENS:-64,512,4096} --dtype bf16 \
      --min-time-ms 20 --max-iters 10 --warmup 2 2>&1 | grep grouped_mm | sed "s/^/[$name] /" | tee -a "$OUT/logs5/gemm.log"
  done
fi
tar czf "$OUT/s5_logs.tgz" -C "$OUT" logs5 && rm -rf "$OUT/logs5"
stamp done
