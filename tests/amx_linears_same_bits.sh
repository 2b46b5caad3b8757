#!/bin/sh
# tests/amx_linears_same_bits.sh MOEX FIXTURES WORKDIR — run by ctest (amx_model.linears_same_bits) with
# MOEX_CPU_ISA=avx512_amx_model: the model runtime's bf16 logits on the AMX linears path (x packed once,
# tiles of rows × 64 columns) must be the bits of the per-call path (MOEX_CPU_AMX_LINEARS=0), for one and
# two bf16 terms of x and prompts whose rows make one block, a merged short last block, and several.
set -e
moex=$1 fixtures=$2 work=$3
mkdir -p "$work"
ids() { awk -v n="$1" -v a="$2" 'BEGIN { for (i = 0; i < n; ++i) printf "%s%d", (i ? "," : ""), (i * a) % 120 + 1 }'; }
for model in qwen3_moe deepseek_v3 gpt_oss; do
  for prompt in "$(ids 9 37)" "$(ids 264 37)" "$(ids 300 37);$(ids 300 11)"; do
    for terms in 1 2; do
      for amx in 0 1; do
        MOEX_CPU_LINEAR_TERMS=$terms MOEX_CPU_AMX_LINEARS=$amx "$moex" forward --model "$fixtures/$model" --ids "$prompt" \
          --dtype bf16 --out "$work/logits_$amx.safetensors" > "$work/log_$amx.txt" 2>&1 || { cat "$work/log_$amx.txt"; exit 1; }
      done
      if ! cmp -s "$work/logits_0.safetensors" "$work/logits_1.safetensors"; then
        echo "FAILED: $model, $terms term(s), $(echo "$prompt" | tr -cd ',;' | wc -c) separators: the AMX linears path changed the logits"
        exit 1
      fi
    done
  done
  echo "$model: the same bits on both paths"
done
