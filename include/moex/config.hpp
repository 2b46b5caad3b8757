// moex/config.hpp — the model configuration of a checkpoint in the reference library's format:
// `config.json` (+ `generation_config.json`) parsed into a typed struct for the six MoE families
// of SPEC §3 (qwen2_moe, qwen3_moe, olmoe, mixtral, deepseek_v3, gpt_oss) and composite configs
// whose `text_config` is one of them (e.g. qwen3_vl_moe).
//
// Every field that changes the math is read; an unsupported model_type, a missing required field,
// a field of the wrong JSON type, a value out of range, or a RoPE scaling type / option this
// runtime does not implement is a moex::Error (ErrorCode::parse, or ErrorCode::unsupported for a
// well-formed value we do not implement) naming the file and the field — never silently ignored.
// Fields that do not change the math (initializer_range, dropout, router aux-loss coefficients,
// ...) are ignored.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace moex {

enum class ModelFamily { qwen2_moe, qwen3_moe, olmoe, mixtral, deepseek_v3, gpt_oss };

std::string_view family_name(ModelFamily f);
// The supported top-level / text model types, for messages.
std::string supported_model_types();

// RoPE parameters (`rope_parameters` of transformers 5, or the older `rope_theta` + `rope_scaling`).
struct RopeConfig {
  double theta = 10000.0;
  std::string type = "default";  // default | linear | dynamic | yarn | llama3
  double factor = 1.0;           // linear, dynamic, yarn, llama3
  int64_t original_max_position_embeddings = 0;  // yarn, llama3 (defaults to max_position_embeddings)
  // yarn
  double beta_fast = 32.0, beta_slow = 1.0;
  std::optional<double> mscale, mscale_all_dim, attention_factor;
  bool truncate = true;
  // llama3
  double low_freq_factor = 1.0, high_freq_factor = 4.0;
  // multimodal RoPE (Qwen3-VL): sections of the rotary half-dimension per position axis. With text-only
  // input all axes carry the same position and the result equals plain RoPE.
  std::vector<int64_t> mrope_section;
  bool mrope_interleaved = false;
  double partial_rotary_factor = 1.0;
};

// The decoder (text) model: everything the forward pass needs.
struct TextConfig {
  std::string model_type;  // as written: "qwen3_moe", "qwen3_vl_moe_text", ...
  ModelFamily family = ModelFamily::qwen3_moe;

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;  // attention head dim (DeepSeek-V3: qk_nope_head_dim + qk_rope_head_dim)
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  std::string hidden_act = "silu";  // silu | gelu | gelu_pytorch_tanh | relu (GPT-OSS: clamped SwiGLU)
  bool tie_word_embeddings = false;

  // dense MLP (dense layers of qwen2/qwen3 mlp_only_layers, DeepSeek first_k_dense_replace); 0 = none
  int64_t intermediate_size = 0;

  // routed experts
  int64_t num_experts = 0;           // num_experts | num_local_experts | n_routed_experts
  int64_t num_experts_per_tok = 0;   // K
  int64_t moe_intermediate_size = 0; // I of one expert (mixtral/olmoe/gpt_oss: intermediate_size)
  bool norm_topk_prob = false;       // renormalise the top-K weights (mixtral, gpt_oss: always)
  int64_t decoder_sparse_step = 1;   // qwen2/qwen3: layer sparse iff (layer+1) % step == 0
  std::vector<int64_t> mlp_only_layers;
  int64_t shared_expert_intermediate_size = 0;  // qwen2_moe: sigmoid-gated shared expert (0 = none)

  // deepseek_v3
  int64_t n_group = 1, topk_group = 1;
  double routed_scaling_factor = 1.0;
  int64_t first_k_dense_replace = 0;
  int64_t n_shared_experts = 0;
  int64_t q_lora_rank = 0;  // 0: q_proj is a plain Linear (no q compression)
  int64_t kv_lora_rank = 0, qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  bool rope_interleave = false;  // DeepSeek-V3: RoPE on interleaved (even, odd) pairs

  // gpt_oss clamped SwiGLU
  double swiglu_alpha = 1.702, swiglu_limit = 7.0;

  // attention
  RopeConfig rope;
  bool attention_bias = false;  // as written (DeepSeek-V3: q_a / kv_a / o projections)
  bool qkv_bias = false;        // q/k/v projections have biases (qwen2_moe: qkv_bias)
  bool o_bias = false;          // o projection has a bias
  bool qk_norm = false;         // RMSNorm on q and k (qwen3_moe: per head; olmoe: over the projection)
  std::optional<double> clip_qkv;  // olmoe: clamp q, k, v to [-clip, clip]
  bool attention_sinks = false;    // gpt_oss
  int64_t sliding_window = 0;      // window of "sliding_attention" layers (0 = none)
  std::vector<std::string> layer_types;  // one per layer: "full_attention" | "sliding_attention"

  std::vector<int64_t> eos_token_id;  // int or list in the file
  std::optional<int64_t> bos_token_id, pad_token_id;

  // Layer structure.
  bool is_moe_layer(int64_t layer) const;
  int64_t num_moe_layers() const;
  // 0 = full causal attention; otherwise the sliding window of the layer.
  int64_t attention_window(int64_t layer) const;
  // Width of the routed expert's gate/up input and down output (= hidden_size).
  int64_t expert_hidden() const { return hidden_size; }
};

// A sub-config of a composite config (`text_config`, `vision_config`, ...).
struct SubConfigInfo {
  std::string key;         // "text_config", "vision_config", ...
  std::string model_type;  // as written, may be empty
  bool has_moe = false;    // only the text backbone has MoE layers here; others report `eager`
};

struct GenerationConfig {
  std::vector<int64_t> eos_token_id;
  std::optional<int64_t> bos_token_id, pad_token_id;
  bool do_sample = false;
  double temperature = 1.0;
  int64_t top_k = 50;
  double top_p = 1.0;
  std::optional<int64_t> max_new_tokens;
};

// `quantization_config` of an FP8 checkpoint in the reference library's format (SPEC §6,
// FineGrainedFP8Config): {"quant_method": "fp8", "weight_block_size": [bn, bk], "activation_scheme":
// "dynamic" | "static", "scale_fmt": "float" | "ue8m0" (absent = float), "modules_to_not_convert": [...]}.
// Weights of quantized linears are e4m3 `X.weight` with `X.weight_scale_inv` [ceil(out/bn), ceil(in/bk)];
// fused experts `gate_up_proj` / `down_proj` with `gate_up_proj_scale_inv` / `down_proj_scale_inv`.
// Any other quant_method, a block size that is not two positive integers, an unknown scale format or
// activation scheme, or `expert_dtype` other than "fp8" is an error.
struct Fp8QuantConfig {
  int64_t block_n = 128, block_k = 128;  // weight_block_size: [out, in] of one scale block
  bool ue8m0_scales = false;             // scale_fmt "ue8m0": power-of-two scales
  bool static_activations = false;       // activation_scheme "static" (one scale per tensor)
  std::vector<std::string> modules_to_not_convert;  // as written (e.g. "lm_head", "mlp.gate")
};
// Parses the text of a `quantization_config` object; `source` names it in messages.
Fp8QuantConfig parse_fp8_quant_config(std::string_view json_text, std::string_view source = "quantization_config");
// The JSON object the reference library writes for `c` (keys sorted as json.dumps(sort_keys) does).
std::string fp8_quant_config_json(const Fp8QuantConfig& c);

struct ModelConfig {
  std::string source;      // the config.json path (or label) used in messages
  std::string model_type;  // top-level model_type
  std::vector<std::string> architectures;
  TextConfig text;         // the decoder: the model itself, or its text_config
  std::string text_key;    // "" when the top level is the decoder, else "text_config"
  std::vector<SubConfigInfo> sub_configs;  // every sub-config present (empty for plain models)
  std::string dtype;       // "dtype" / "torch_dtype" as written ("float32", "bfloat16", ...), may be empty
  std::string quantization_config;  // raw JSON text of `quantization_config`, empty if none
  std::optional<Fp8QuantConfig> fp8; // parsed `quantization_config` (the only kind supported: fp8)
  GenerationConfig generation;      // from generation_config.json, else from config.json's token ids
  bool has_generation_config = false;

  bool composite() const { return !text_key.empty(); }
};

// Parses the text of a config.json. `source` names it in error messages.
ModelConfig parse_model_config(std::string_view config_json, std::string_view source = "config.json");
// Parses the text of a generation_config.json on top of `defaults`.
GenerationConfig parse_generation_config(std::string_view json_text, std::string_view source,
                                         GenerationConfig defaults = {});
// Reads DIR/config.json and, if present, DIR/generation_config.json.
ModelConfig load_model_config(const std::string& dir);

}  // namespace moex
