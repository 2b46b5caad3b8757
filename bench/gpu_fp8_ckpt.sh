#!/usr/bin/env bash
# bench/gpu_fp8_ckpt.sh — FP8 checkpoints against the reference library on the GPU machine
# (`run` with command `bash bench/gpu_fp8_ckpt.sh`; needs python3 with torch + transformers, CUDA;
# no internet). From the repository root:
#
#   1. builds moex (CPU only: the checks are about the checkpoint format) into build-fp8/
#   2. `moex quantize` on the fixtures (per-expert: qwen3_moe, deepseek_v3, mixtral; fused and sharded:
#      qwen3_vl_moe; UE8M0 scales), then bench/fp8_reference_check.py load on each: the reference
#      must load the checkpoint as FP8 on CUDA (FP8Linear / FP8Experts); a forward there may fail
#      offline (its kernels come from the hub: reported as "note"); moex's logits are compared with
#      the reference's FP8-loaded weights dequantized (and with its dequantize=True load)
#   3. bench/fp8_reference_check.py fixture: the reference quantizes a tiny Qwen3-MoE with
#      FineGrainedFP8Config on CUDA → $OUT/fixture_fp8/ (< 1 MB) with logits from the dequantized
#      weights; moex_tests QuantCheckpoint.ReferenceLibraryFp8Fixture runs on it. Commit it with
#        cp -r $OUT/fixture_fp8 tests/fixtures/qwen3_moe_fp8
#
# EMULATE=1 passes --emulate-on-cpu to the Python checks (local runs without a GPU).
# Output: the lines "ok ..." / "FAIL ..." / "note ..." per check and a last line "fp8 checkpoints:
# N FAIL"; logs under $OUT (build.log, <name>.log, fixture.log, test.log) and $OUT/fixture_fp8/.
set -u
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
BUILD=${BUILD:-build-fp8}
fails=0
PYFLAGS=${EMULATE:+--emulate-on-cpu}
# SKIP_BUILD=1 BUILD=<dir> reuses an existing build (e.g. the CUDA one of bench/gpu_check.sh)
if [ -z "${SKIP_BUILD:-}" ]; then
  { cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEX_CUDA=OFF &&
    cmake --build "$BUILD" -j "$(nproc)" --target moex moex_tests; } > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
fi
python3 -c "import torch, transformers; print('# torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"

Q=$(mktemp -d)
for spec in qwen3_moe:128x128:float deepseek_v3:128x128:float mixtral:128x128:ue8m0 qwen3_vl_moe:128x128:float qwen3_vl_moe:32x128:float; do
  IFS=: read -r name block fmt <<< "$spec"
  dir="$Q/${name}_${block}_${fmt}"
  echo "== $name block $block scales $fmt"
  if ! "$BUILD/moex" quantize --in "tests/fixtures/$name" --out "$dir" --block "$block" --scale-fmt "$fmt"; then
    echo "FAIL moex quantize $name"; fails=$((fails + 1)); continue
  fi
  python3 bench/fp8_reference_check.py $PYFLAGS load "$dir" --moex "$BUILD/moex" > "$OUT/${name}_${block}_${fmt}.log" 2>&1
  grep -E "^(ok|FAIL|note)" "$OUT/${name}_${block}_${fmt}.log"
  fails=$((fails + $(grep -c "^FAIL" "$OUT/${name}_${block}_${fmt}.log")))
  grep -q -E "^(ok|FAIL|note)" "$OUT/${name}_${block}_${fmt}.log" || { tail -5 "$OUT/${name}_${block}_${fmt}.log"; fails=$((fails + 1)); }
done

echo "== the reference library's FP8 fixture"
rm -rf "$OUT/fixture_fp8"
python3 bench/fp8_reference_check.py $PYFLAGS fixture "$OUT/fixture_fp8" > "$OUT/fixture.log" 2>&1
grep -E "^(ok|FAIL|note)" "$OUT/fixture.log" || tail -20 "$OUT/fixture.log"
fails=$((fails + $(grep -c "^FAIL" "$OUT/fixture.log")))
if [ -f "$OUT/fixture_fp8/logits_dequantized.safetensors" ]; then
  rm -rf tests/fixtures/qwen3_moe_fp8 && cp -r "$OUT/fixture_fp8" tests/fixtures/qwen3_moe_fp8
  OMP_WAIT_POLICY=passive "$BUILD/moex_tests" --gtest_filter='QuantCheckpoint.*' > "$OUT/test.log" 2>&1
  rc=$?
  grep -E "^\[  (PASSED|FAILED|SKIPPED) " "$OUT/test.log"
  [ $rc -eq 0 ] || { grep -B2 -A6 "Failure" "$OUT/test.log" | head -40; fails=$((fails + 1)); }
  rm -rf tests/fixtures/qwen3_moe_fp8
else
  echo "FAIL no fixture written"; fails=$((fails + 1))
fi
rm -rf "$Q"
echo "fp8 checkpoints: $fails FAIL"
[ "$fails" -eq 0 ]
