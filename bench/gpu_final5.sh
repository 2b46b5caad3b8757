#!/usr/bin/env bash
# bench/gpu_final5.sh — the fifth session's closing calls on the GPU machine, from the repository
# root (`run` with command `PARTS=check bash bench/gpu_final5.sh`, then `PARTS=extra ...` on the
# still-warm machine, which keeps build-gpu):
#   check  bench/gpu_model_check.sh: build, GPU model tests, the CLI on CUDA, moex_model_bench and
#          the reference library's generate on the same model in the same call, the issue-5 table
#   extra  the experts' GPU tests (CudaBackends, CudaGraph), the decode step with the o-projection /
#          post-norm fusion off (MOEX_CUDA_FUSE_NORM=0) for the A/B, the FP8-vs-bf16 decode table
#          (gpu_fp8_decode.sh perf) and an ncu per-kernel profile of the decode step
#          (gpu_profile.sh model part)
set -u
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
PARTS=${PARTS:-"check extra"}
has() { case " $PARTS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
t0=$(date +%s)
stamp() { echo "== $1 ($(( $(date +%s) - t0 )) s)"; }
export MOEX_SOURCE_DIR=$PWD
if has check; then
  stamp "gpu_model_check"
  PARTS="build tests cli bench ref table" bash bench/gpu_model_check.sh 2>&1 | grep -E "^== .*(end|start build)|PASSED|FAILED|Failure|prefill|decode|floor|\|" | tail -60
fi
if has extra; then
  stamp "experts GPU tests"
  timeout 120 build-gpu/moex_tests --gtest_filter='CudaBackends.*:*CudaGraph*' > "$OUT/experts_tests.log" 2>&1
  echo "rc $?"; grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]" "$OUT/experts_tests.log" | head
  stamp "decode without the norm fusion"
  MOEX_CUDA_FUSE_NORM=0 timeout 60 build-gpu/moex_model_bench --layers 48 --batches 1,8 2>&1 | grep -E "decode|floor"
  stamp "fp8 decode timings"
  mkdir -p "$OUT/fp8"
  OUT="$OUT/fp8" SKIP_BUILD=1 BUILD=build-gpu PARTS=perf COMPARE_OLD=0 timeout 60 bash bench/gpu_fp8_decode.sh 2>&1 | tail -15
  mv "$OUT/fp8/fp8_decode.md" "$OUT/" 2>/dev/null; rm -rf "$OUT/fp8"
  stamp "decode profile (ncu)"
  OUT="$OUT" SKIP_BUILD=1 PARTS="model" timeout 200 bash bench/gpu_profile.sh 2>&1 | tail -40
fi
stamp done
