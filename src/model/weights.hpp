// model/weights.hpp — the weights of a decoder model, loaded from a checkpoint for a parsed config:
// every tensor the config implies is looked up under the reference library's names, shape-checked
// ("tensor X in checkpoint D has shape [..] but the config implies [..]"), converted to the model
// dtype and, for per-expert keys, stacked into the experts layout of SPEC §1:
//   gate_up [E, 2I, H] (gate rows, then up rows), down [E, H, I].
// GPT-OSS fused experts are used as stored (transposed, interleaved gate/up, biases); Qwen3-VL-MoE
// fused experts are accepted in both the hub layout ([E, H, 2I] / [E, I, H]) and the layout
// transformers 5 writes ([E, 2I, H] / [E, H, I]) and normalised to the latter.
//
// Private to the library (the model runtime builds on it); tests include it through src/.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "moex/config.hpp"
#include "moex/experts.hpp"
#include "moex/safetensors.hpp"
#include "moex/tensor.hpp"

namespace moex::model {

// A weight [out, in] repacked for the CPU's packed kernels (pack_linears_for_cpu), on huge pages where
// they fit: bf16 panels [ceil(out / 32), ceil(in / 2), 32, 2] (PackedBf16MatmulArgs) or f32 panels
// [ceil(out / 32), in, 32] (PackedMatmulArgs).
struct PackedLinear {
  std::unique_ptr<char[], void (*)(void*)> storage{nullptr, nullptr};
  DType dtype = DType::bf16;  // bf16 or f32, as the weight
  int64_t out = 0, in = 0;
  // the packed kernel's prefetch_ahead where one row block streams the panels (decode steps):
  // cpu::stream_prefetch_ahead of all the model's packed linears together. On the AMD EPYC
  // development VM (no software prefetch there) decode took 0.90× the time of one chunk ahead; bf16
  // panels read by AVX2's wide kernel prefetch 1 KiB ahead on AMD too (cpu::kWideBf16PrefetchAhead).
  int64_t prefetch_ahead = 0;
  const uint16_t* bf16() const { return reinterpret_cast<const uint16_t*>(storage.get()); }
  const float* f32() const { return reinterpret_cast<const float*>(storage.get()); }
};

// y = x · weightᵀ + bias; weight [out, in]. bias undefined when absent. packed: the weight's panels
// for the CPU kernels, or null (then the weight is read in place).
struct Linear {
  Tensor weight;
  Tensor bias;
  std::shared_ptr<const PackedLinear> packed;
  bool defined() const { return weight.numel() > 0; }
  bool has_bias() const { return bias.numel() > 0; }
};

// A dense gated MLP: down(act(gate(x)) * up(x)).
struct DenseMlp {
  Linear gate, up, down;
  bool defined() const { return gate.defined(); }
};

struct AttentionWeights {
  // GQA attention (all families except deepseek_v3)
  Linear q, k, v, o;
  Tensor q_norm, k_norm;  // qwen3_moe: [head_dim]; olmoe: [heads * head_dim] / [kv_heads * head_dim]
  Tensor sinks;           // gpt_oss: [heads]
  // DeepSeek-V3 multi-head latent attention (o is shared with the above)
  Linear q_a, q_b;        // q_lora_rank > 0; otherwise `q` is the plain projection [heads * qk_head, H]
  Tensor q_a_norm;        // [q_lora_rank]
  Linear kv_a;            // kv_a_proj_with_mqa [kv_lora_rank + qk_rope_head_dim, H]
  Tensor kv_a_norm;       // [kv_lora_rank]
  Linear kv_b;            // [heads * (qk_nope_head_dim + v_head_dim), kv_lora_rank]
};

struct MoeWeights {
  Linear router;                    // [E, H] (+ bias [E] for gpt_oss)
  Tensor e_score_correction_bias;   // deepseek_v3: [E]
  Tensor gate_up, down, gate_up_bias, down_bias;  // owning storage of `experts`
  Tensor gate_up_scale, down_scale;                // FP8 experts: block scales (f32 or UE8M0), see load_weights
  Experts experts;                  // descriptor + views of the above (spec.dtype = model dtype)
  DenseMlp shared;                  // qwen2_moe shared_expert / deepseek_v3 shared_experts
  Linear shared_gate;               // qwen2_moe: [1, H], output scaled by sigmoid
};

struct LayerWeights {
  Tensor input_norm, post_attention_norm;  // [H]
  AttentionWeights attn;
  bool is_moe = false;
  DenseMlp mlp;    // dense layers
  MoeWeights moe;  // MoE layers
};

struct ModelWeights {
  DType dtype = DType::f32;
  std::string prefix;  // "model." or "model.language_model." (composite)
  Tensor embed;        // [V, H]
  Tensor final_norm;   // [H]
  Tensor lm_head;      // [V, H]; shares embed's storage when tied
  std::shared_ptr<const PackedLinear> lm_head_packed;  // pack_linears_for_cpu, or null
  bool tied = false;
  std::vector<LayerWeights> layers;
};

// Called after each tensor: (tensors loaded so far, total).
using LoadProgress = std::function<void(size_t done, size_t total)>;

// Loads every weight of `cfg.text` from `ck` as `dtype` (f32, f16 or bf16). Errors: a missing tensor
// (ErrorCode::not_found, naming it and the checkpoint), a tensor of the wrong shape (naming both
// shapes), a dtype that cannot be converted.
//
// FP8 checkpoints (`cfg.fp8`, SPEC §6): e4m3 routed experts stay quantized (QuantSpec fp8_block with
// the checkpoint's scale format and activation scheme), unless `dequantize_experts` turns them into
// `dtype`. Every other e4m3 linear (attention, dense and shared MLPs, ...) is dequantized to `dtype`
// at load: the runtime runs only the experts quantized. Gate and up projections that carry their own
// scale grids (per-expert keys, or a fused scale with 2·ceil(I/bn) rows) are stacked into one
// [2I, H] matrix; when I is not a multiple of the block height bn the scales are re-blocked exactly
// to block height gcd(I, bn) (every such block lies inside one source block of one half), for down too.
ModelWeights load_weights(const Checkpoint& ck, const ModelConfig& cfg, DType dtype, const LoadProgress& progress = {},
                          bool dequantize_experts = false);

// The experts descriptor a family's checkpoints imply (without buffers): layout flags, activation.
ExpertsSpec experts_spec(const TextConfig& t, DType dtype);

}  // namespace moex::model
