#!/usr/bin/env bash
# bench/gpu_session42.sh — the forty-second session's call on the GPU machine's 16-core host CPU, from the
# repository root (`run` with command `bash bench/gpu_session42.sh`). CPU only: a CPU-only build, no GPU
# work. Steps (PARTS, default "build tests model cpu"), each writing into $OUT and skipped once DEADLINE
# seconds (default 560) have passed:
#   build  CPU-only Release build of moex and moex_tests into build-cpu (the host's GCC)
#   tests  the CPU tests on the host's AMX CPU in the default dispatch (no MOEX_CPU_* variables): the
#          attention, the kernels, the equivalence harness, the model runtime; then the model's AMX
#          linears against the per-call path, bit for bit, on the real tiles (MOEX_CPU_ISA=avx512_amx)
#   model  bench/model_side_by_side.py at $MODEL_THREADS (default 16) threads → $OUT/model_t<n>.txt, then
#          an interleaved A/B of moex bench-model (grouped_mm) over $MODEL_AB (default: the AMX linears
#          against MOEX_CPU_AMX_LINEARS=0), $MODEL_AB_ROUNDS rounds (default 2), then one run per variant
#          with MOEX_CPU_PROFILE=1 (the stage times) → $OUT/model_ab.txt
#   cpu    bench/gpu_session41.sh's cpu step: the AMX FP8 / FP4 dispatch A/B and issue 8's table → $OUT/cpu/
source "$(dirname "$0")/gpu_common.sh" "build tests model cpu"
BUILD=build-cpu
if has build; then
  stamp build
  { cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEX_CUDA=OFF &&
    cmake --build "$BUILD" -j "$(nproc)" --target moex moex_tests; } > "$OUT/build.log" 2>&1 ||
    { grep -E "error" "$OUT/build.log" | head -30; exit 1; }
  gcc --version | head -1
  "$BUILD/moex" info 2>&1 | grep -i "cpu" | head -3
fi
if has tests && [ "$(left)" -gt 200 ]; then
  gpu_tests 'ModelAttention.*:CpuKernels.*:Dtypes/Equivalence*:Model.*:Fixtures/ReferenceParity.*:ModelSwitching.*' 200
  grep -c "^\[       OK" "$OUT/tests.log"
  stamp "AMX linears, same bits on the tiles"
  MOEX_CPU_ISA=avx512_amx sh tests/amx_linears_same_bits.sh "$BUILD/moex" tests/fixtures "$OUT/amx_bits" 2>&1 | tail -4
  (cd "$BUILD" && ctest -R "amx_model|cli\." 2>&1 | tail -4)
fi
if has model && [ "$(left)" -gt 150 ]; then
  for th in ${MODEL_THREADS:-16}; do
    stamp "model side by side, $th threads"
    timeout 200 python3 bench/model_side_by_side.py --moex "$BUILD/moex" --threads "$th" --prompt-len ${PROMPT_LEN:-256} \
      --new-tokens 32 --repeat 3 > "$OUT/model_t$th.txt" 2>&1
    echo "rc $?"
    grep "^|" "$OUT/model_t$th.txt"
  done
  stamp "model A/B"
  th=${MODEL_THREADS:-16}
  th=${th%% *}
  for r in $(seq ${MODEL_AB_ROUNDS:-2}); do
    for v in ${MODEL_AB-amx:- old:MOEX_CPU_AMX_LINEARS=0}; do
      [ "$(left)" -gt 60 ] || break
      echo "round $r ${v%%:*}: $(env $(envs_of "${v#*:}") OMP_NUM_THREADS=$th "$BUILD/moex" bench-model --model /tmp/moex_qwen3_small \
        --dtype bf16 --prompt-len ${PROMPT_LEN:-256} --new-tokens 32 --backends grouped_mm --repeat 3 2>&1 | grep grouped_mm)"
    done
  done | tee "$OUT/model_ab.txt"
  for v in ${MODEL_AB-amx:- old:MOEX_CPU_AMX_LINEARS=0}; do
    [ "$(left)" -gt 50 ] || break
    echo "profile ${v%%:*}:"
    env $(envs_of "${v#*:}") MOEX_CPU_PROFILE=1 OMP_NUM_THREADS=$th "$BUILD/moex" bench-model --model /tmp/moex_qwen3_small \
      --dtype bf16 --prompt-len ${PROMPT_LEN:-256} --new-tokens 32 --backends grouped_mm --repeat 3 2>&1 | grep -v "^$"
  done | tee -a "$OUT/model_ab.txt"
fi
if has cpu && [ "$(left)" -gt 150 ]; then
  BUILD=$BUILD PARTS=cpu DEADLINE=$(left) OUT=$OUT bash bench/gpu_session41.sh 2>&1 | tail -45
fi
stamp done
