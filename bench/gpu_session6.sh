#!/usr/bin/env bash
# bench/gpu_session6.sh — one call on the GPU machine for the sixth session's decode-step work
# (`run` with command `bash bench/gpu_session6.sh`), from the repository root:
#   build   moex, moex_tests, moex_model_bench (CUDA, Release) into $BUILD (skipped when it exists
#           and SKIP_BUILD=1; an incremental rebuild otherwise)
#   tests   the model runtime GPU tests matching $TEST_FILTER
#   xtests  the experts GPU tests matching $XTEST_FILTER (CudaBackends, CudaGraph, CudaEquivalence)
#   ab      moex_model_bench (48-layer random Qwen3-30B-A3B, decode batches $AB_BATCHES) for "base"
#           (the defaults) and every "name:ENV=V[,ENV=V]" item of $AB_VARIANTS, in the same call
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
tar czf "$OUT/s6_logs.tgz" -C "$OUT" logs6 && rm -rf "$L"
stamp done
