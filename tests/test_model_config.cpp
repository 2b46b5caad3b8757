// config.json / generation_config.json parsing: the six families, composite configs, RoPE variants,
// layer structure, and clear errors for everything malformed or unsupported.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>

#include "moex/config.hpp"
#include "moex/error.hpp"

using namespace moex;
namespace fs = std::filesystem;

namespace {

// Expects parse_model_config(text) to throw with `code` and every fragment in the message.
void expect_config_error(const std::string& text, ErrorCode code, const std::vector<std::string>& frags) {
  try {
    parse_model_config(text, "cfg.json");
    FAIL() << "expected an error for: " << text;
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(e.code(), code) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    EXPECT_NE(m.find("cfg.json"), std::string::npos) << m;
    for (const auto& f : frags) EXPECT_NE(m.find(f), std::string::npos) << "'" << f << "' not in: " << m;
  }
}

// Replaces the first occurrence of `from` in `s`.
std::string edit(std::string s, const std::string& from, const std::string& to) {
  const size_t p = s.find(from);
  EXPECT_NE(p, std::string::npos) << from;
  if (p != std::string::npos) s.replace(p, from.size(), to);
  return s;
}

const std::string kQwen3 = R"({
  "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "dtype": "bfloat16",
  "vocab_size": 128, "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 24,
  "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
  "num_local_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": true, "decoder_sparse_step": 1,
  "mlp_only_layers": [], "rms_norm_eps": 1e-06, "max_position_embeddings": 256, "hidden_act": "silu",
  "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}, "attention_bias": false,
  "sliding_window": null, "use_sliding_window": false, "tie_word_embeddings": false,
  "eos_token_id": [2, 5], "bos_token_id": 1, "pad_token_id": null, "initializer_range": 0.02,
  "router_aux_loss_coef": 0.001, "output_router_logits": false, "use_cache": true
})";

const std::string kQwen2 = R"({"model_type": "qwen2_moe", "vocab_size": 128, "hidden_size": 64,
  "intermediate_size": 96, "moe_intermediate_size": 24, "shared_expert_intermediate_size": 48,
  "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 4, "num_experts": 8,
  "num_experts_per_tok": 2, "decoder_sparse_step": 2, "mlp_only_layers": [3], "rope_theta": 10000,
  "use_sliding_window": true, "sliding_window": 16, "max_window_layers": 3, "eos_token_id": 7})";

const std::string kOlmoe = R"({"model_type": "olmoe", "vocab_size": 128, "hidden_size": 64,
  "intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 4, "num_experts": 8,
  "num_experts_per_tok": 2, "clip_qkv": 8.0, "rope_theta": 10000.0})";

const std::string kMixtral = R"({"model_type": "mixtral", "vocab_size": 128, "hidden_size": 64,
  "intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
  "num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": 32, "rope_theta": 1e6,
  "rms_norm_eps": 1e-5})";

// DeepSeek-V3 in the original hub style: rope_theta + rope_scaling, topk_method, scoring_func.
const std::string kDeepseek = R"({"model_type": "deepseek_v3", "vocab_size": 128, "hidden_size": 64,
  "intermediate_size": 96, "moe_intermediate_size": 24, "num_hidden_layers": 3, "num_attention_heads": 4,
  "num_key_value_heads": 4, "n_shared_experts": 1, "n_routed_experts": 8, "routed_scaling_factor": 2.5,
  "kv_lora_rank": 16, "q_lora_rank": null, "qk_rope_head_dim": 8, "v_head_dim": 16, "qk_nope_head_dim": 16,
  "n_group": 4, "topk_group": 2, "num_experts_per_tok": 2, "first_k_dense_replace": 1, "norm_topk_prob": true,
  "topk_method": "noaux_tc", "scoring_func": "sigmoid", "moe_layer_freq": 1, "rope_theta": 10000,
  "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32,
                   "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
  "max_position_embeddings": 163840, "num_nextn_predict_layers": 1, "ep_size": 1})";

const std::string kGptOss = R"({"model_type": "gpt_oss", "vocab_size": 128, "hidden_size": 64,
  "intermediate_size": 24, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
  "head_dim": 16, "num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": 4,
  "swiglu_limit": 7.0, "attention_bias": true, "max_position_embeddings": 131072,
  "rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                      "beta_slow": 1.0, "truncate": false, "original_max_position_embeddings": 4096}})";

const std::string kQwen3VL = R"({"model_type": "qwen3_vl_moe", "architectures": ["Qwen3VLMoeForConditionalGeneration"],
  "tie_word_embeddings": false, "image_token_id": 120,
  "text_config": {"model_type": "qwen3_vl_moe_text", "vocab_size": 128, "hidden_size": 64,
    "intermediate_size": 96, "moe_intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "num_experts": 8, "num_experts_per_tok": 2,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "eos_token_id": 2,
    "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0, "mrope_section": [4, 2, 2],
                        "mrope_interleaved": true}},
  "vision_config": {"model_type": "qwen3_vl_moe_vision", "depth": 1, "hidden_size": 32}})";

}  // namespace

TEST(ModelConfig, Qwen3Moe) {
  ModelConfig m = parse_model_config(kQwen3);
  EXPECT_FALSE(m.composite());
  EXPECT_EQ(m.model_type, "qwen3_moe");
  EXPECT_EQ(m.dtype, "bfloat16");
  ASSERT_EQ(m.architectures.size(), 1u);
  const TextConfig& t = m.text;
  EXPECT_EQ(t.family, ModelFamily::qwen3_moe);
  EXPECT_EQ(t.vocab_size, 128);
  EXPECT_EQ(t.hidden_size, 64);
  EXPECT_EQ(t.num_hidden_layers, 4);
  EXPECT_EQ(t.num_attention_heads, 4);
  EXPECT_EQ(t.num_key_value_heads, 2);
  EXPECT_EQ(t.head_dim, 16);
  EXPECT_EQ(t.num_experts, 8);  // from the alias num_local_experts
  EXPECT_EQ(t.num_experts_per_tok, 2);
  EXPECT_EQ(t.moe_intermediate_size, 24);
  EXPECT_EQ(t.intermediate_size, 96);
  EXPECT_TRUE(t.norm_topk_prob);
  EXPECT_TRUE(t.qk_norm);
  EXPECT_FALSE(t.qkv_bias);
  EXPECT_DOUBLE_EQ(t.rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(t.rope.theta, 1e6);
  EXPECT_EQ(t.rope.type, "default");
  EXPECT_EQ(t.eos_token_id, (std::vector<int64_t>{2, 5}));
  EXPECT_EQ(t.bos_token_id, 1);
  EXPECT_FALSE(t.pad_token_id.has_value());
  EXPECT_EQ(t.num_moe_layers(), 4);
  for (int l = 0; l < 4; ++l) EXPECT_EQ(t.attention_window(l), 0);
  EXPECT_EQ(m.generation.eos_token_id, (std::vector<int64_t>{2, 5}));
  EXPECT_TRUE(m.quantization_config.empty());
  // head_dim defaults to hidden / heads.
  EXPECT_EQ(parse_model_config(edit(kQwen3, R"("head_dim": 16,)", "")).text.head_dim, 16);
  // eos as a plain integer.
  EXPECT_EQ(parse_model_config(edit(kQwen3, "[2, 5]", "7")).text.eos_token_id, (std::vector<int64_t>{7}));
  // quantization_config is kept as raw JSON.
  ModelConfig q = parse_model_config(edit(kQwen3, R"("dtype")",
                                          R"("quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}, "dtype")"));
  EXPECT_NE(q.quantization_config.find("\"quant_method\":\"fp8\""), std::string::npos) << q.quantization_config;
  // Sliding window (all layers) only when use_sliding_window.
  TextConfig sw = parse_model_config(edit(edit(kQwen3, R"("sliding_window": null)", R"("sliding_window": 8)"),
                                          R"("use_sliding_window": false)", R"("use_sliding_window": true)"))
                      .text;
  EXPECT_EQ(sw.attention_window(0), 8);
  EXPECT_EQ(sw.attention_window(3), 8);
}

TEST(ModelConfig, Qwen2MoeLayerStructure) {
  const TextConfig t = parse_model_config(kQwen2).text;
  EXPECT_EQ(t.family, ModelFamily::qwen2_moe);
  EXPECT_EQ(t.shared_expert_intermediate_size, 48);
  EXPECT_TRUE(t.qkv_bias);  // the reference's default for qwen2_moe
  EXPECT_FALSE(t.o_bias);
  EXPECT_FALSE(t.qk_norm);
  EXPECT_FALSE(t.norm_topk_prob);
  // sparse iff not in mlp_only_layers and (l+1) % 2 == 0: layers 1, 5 (3 is mlp-only)
  std::vector<bool> moe;
  for (int l = 0; l < 6; ++l) moe.push_back(t.is_moe_layer(l));
  EXPECT_EQ(moe, (std::vector<bool>{false, true, false, false, false, true}));
  EXPECT_EQ(t.num_moe_layers(), 2);
  // sliding on even layers below max_window_layers (the reference's default layer_types)
  EXPECT_EQ(t.attention_window(0), 16);
  EXPECT_EQ(t.attention_window(1), 0);
  EXPECT_EQ(t.attention_window(2), 16);
  EXPECT_EQ(t.attention_window(4), 0);
  EXPECT_EQ(t.eos_token_id, (std::vector<int64_t>{7}));
  // explicit layer_types win
  const TextConfig e = parse_model_config(edit(kQwen2, R"("eos_token_id": 7)",
      R"("layer_types": ["full_attention","full_attention","full_attention","full_attention","full_attention","sliding_attention"])"))
                           .text;
  EXPECT_EQ(e.attention_window(0), 0);
  EXPECT_EQ(e.attention_window(5), 16);
}

TEST(ModelConfig, OlmoeMixtral) {
  const TextConfig o = parse_model_config(kOlmoe).text;
  EXPECT_EQ(o.family, ModelFamily::olmoe);
  EXPECT_EQ(o.num_key_value_heads, 4);  // defaults to the attention heads
  EXPECT_EQ(o.moe_intermediate_size, 24);
  EXPECT_TRUE(o.qk_norm);
  ASSERT_TRUE(o.clip_qkv.has_value());
  EXPECT_DOUBLE_EQ(*o.clip_qkv, 8.0);
  EXPECT_DOUBLE_EQ(o.rms_norm_eps, 1e-5);
  EXPECT_FALSE(o.norm_topk_prob);

  const TextConfig x = parse_model_config(kMixtral).text;
  EXPECT_EQ(x.family, ModelFamily::mixtral);
  EXPECT_TRUE(x.norm_topk_prob);
  EXPECT_EQ(x.moe_intermediate_size, 24);
  EXPECT_EQ(x.head_dim, 16);
  EXPECT_EQ(x.attention_window(0), 32);
  EXPECT_EQ(x.attention_window(1), 32);
  EXPECT_EQ(x.num_moe_layers(), 2);
  EXPECT_DOUBLE_EQ(x.rope.theta, 1e6);
  EXPECT_EQ(parse_model_config(edit(kMixtral, R"("sliding_window": 32)", R"("sliding_window": null)")).text.attention_window(0), 0);
}

TEST(ModelConfig, DeepseekV3) {
  const TextConfig d = parse_model_config(kDeepseek).text;
  EXPECT_EQ(d.family, ModelFamily::deepseek_v3);
  EXPECT_EQ(d.num_experts, 8);
  EXPECT_EQ(d.n_group, 4);
  EXPECT_EQ(d.topk_group, 2);
  EXPECT_DOUBLE_EQ(d.routed_scaling_factor, 2.5);
  EXPECT_EQ(d.first_k_dense_replace, 1);
  EXPECT_EQ(d.n_shared_experts, 1);
  EXPECT_EQ(d.q_lora_rank, 0);  // null
  EXPECT_EQ(d.kv_lora_rank, 16);
  EXPECT_EQ(d.qk_nope_head_dim, 16);
  EXPECT_EQ(d.qk_rope_head_dim, 8);
  EXPECT_EQ(d.v_head_dim, 16);
  EXPECT_EQ(d.head_dim, 24);
  EXPECT_TRUE(d.rope_interleave);
  EXPECT_TRUE(d.norm_topk_prob);
  EXPECT_FALSE(d.is_moe_layer(0));
  EXPECT_TRUE(d.is_moe_layer(1));
  EXPECT_TRUE(d.is_moe_layer(2));
  EXPECT_EQ(d.rope.type, "yarn");  // legacy "type" key
  EXPECT_DOUBLE_EQ(d.rope.factor, 40.0);
  EXPECT_EQ(d.rope.original_max_position_embeddings, 4096);
  ASSERT_TRUE(d.rope.mscale_all_dim.has_value());
  EXPECT_DOUBLE_EQ(*d.rope.mscale_all_dim, 1.0);
  EXPECT_TRUE(d.rope.truncate);
  EXPECT_EQ(d.max_position_embeddings, 163840);
  // Errors specific to DeepSeek routing.
  expect_config_error(edit(kDeepseek, R"("n_group": 4)", R"("n_group": 3)"), ErrorCode::parse, {"n_group"});
  expect_config_error(edit(kDeepseek, R"("topk_group": 2)", R"("topk_group": 5)"), ErrorCode::parse, {"topk_group"});
  expect_config_error(edit(kDeepseek, R"("scoring_func": "sigmoid")", R"("scoring_func": "softmax")"), ErrorCode::unsupported,
                      {"scoring_func", "softmax"});
  expect_config_error(edit(kDeepseek, R"("topk_method": "noaux_tc")", R"("topk_method": "greedy")"), ErrorCode::unsupported,
                      {"topk_method"});
  expect_config_error(edit(kDeepseek, R"("kv_lora_rank": 16,)", ""), ErrorCode::parse, {"'kv_lora_rank'", "missing"});
  expect_config_error(edit(kDeepseek, R"("intermediate_size": 96,)", ""), ErrorCode::parse, {"dense MLP", "intermediate_size"});
}

TEST(ModelConfig, GptOss) {
  const TextConfig g = parse_model_config(kGptOss).text;
  EXPECT_EQ(g.family, ModelFamily::gpt_oss);
  EXPECT_TRUE(g.attention_sinks);
  EXPECT_TRUE(g.qkv_bias);
  EXPECT_TRUE(g.o_bias);
  EXPECT_DOUBLE_EQ(g.swiglu_limit, 7.0);
  EXPECT_DOUBLE_EQ(g.swiglu_alpha, 1.702);
  EXPECT_EQ(g.moe_intermediate_size, 24);
  // the reference's default layer_types: sliding, full, sliding, full
  EXPECT_EQ(g.attention_window(0), 4);
  EXPECT_EQ(g.attention_window(1), 0);
  EXPECT_EQ(g.attention_window(2), 4);
  EXPECT_EQ(g.attention_window(3), 0);
  EXPECT_EQ(g.rope.type, "yarn");
  EXPECT_FALSE(g.rope.truncate);
  EXPECT_DOUBLE_EQ(g.rope.theta, 150000.0);
  // Without any RoPE fields the reference's default YaRN applies.
  std::string no_rope = kGptOss.substr(0, kGptOss.find(R"(,
  "rope_parameters")")) + "}";
  const TextConfig d = parse_model_config(no_rope).text;
  EXPECT_EQ(d.rope.type, "yarn");
  EXPECT_DOUBLE_EQ(d.rope.factor, 32.0);
  EXPECT_DOUBLE_EQ(d.rope.theta, 150000.0);
  EXPECT_EQ(d.rope.original_max_position_embeddings, 4096);
  // layer_types of the wrong length or an unknown kind
  expect_config_error(edit(kGptOss, R"("sliding_window": 4,)", R"("sliding_window": 4, "layer_types": ["full_attention"],)"),
                      ErrorCode::parse, {"layer_types has 1 entries", "4"});
  expect_config_error(edit(kGptOss, R"("sliding_window": 4,)",
                           R"("sliding_window": 4, "layer_types": ["full_attention","chunked_attention","full_attention","full_attention"],)"),
                      ErrorCode::unsupported, {"chunked_attention"});
  expect_config_error(edit(kGptOss, R"("sliding_window": 4,)", R"("sliding_window": 0,)"), ErrorCode::parse, {"sliding_window"});
}

TEST(ModelConfig, CompositeQwen3VLMoe) {
  ModelConfig m = parse_model_config(kQwen3VL);
  EXPECT_TRUE(m.composite());
  EXPECT_EQ(m.model_type, "qwen3_vl_moe");
  EXPECT_EQ(m.text_key, "text_config");
  EXPECT_EQ(m.text.model_type, "qwen3_vl_moe_text");
  EXPECT_EQ(m.text.family, ModelFamily::qwen3_moe);
  EXPECT_TRUE(m.text.norm_topk_prob);  // Qwen3-VL-MoE always renormalises
  EXPECT_TRUE(m.text.qk_norm);
  EXPECT_FALSE(m.text.tie_word_embeddings);  // the top level decides
  EXPECT_EQ(m.text.rope.mrope_section, (std::vector<int64_t>{4, 2, 2}));
  EXPECT_TRUE(m.text.rope.mrope_interleaved);
  EXPECT_DOUBLE_EQ(m.text.rope.theta, 500000.0);
  ASSERT_EQ(m.sub_configs.size(), 2u);
  for (const auto& s : m.sub_configs) {
    if (s.key == "text_config") {
      EXPECT_TRUE(s.has_moe);
      EXPECT_EQ(s.model_type, "qwen3_vl_moe_text");
    } else {
      EXPECT_EQ(s.key, "vision_config");
      EXPECT_FALSE(s.has_moe);
      EXPECT_EQ(s.model_type, "qwen3_vl_moe_vision");
    }
  }
  EXPECT_EQ(m.generation.eos_token_id, (std::vector<int64_t>{2}));
  // text_config's model_type may be omitted for a known composite.
  EXPECT_EQ(parse_model_config(edit(kQwen3VL, R"("model_type": "qwen3_vl_moe_text",)", "")).text.family, ModelFamily::qwen3_moe);
  // ... but not for an unknown one.
  expect_config_error(edit(edit(kQwen3VL, R"("model_type": "qwen3_vl_moe_text",)", ""), R"("qwen3_vl_moe")", R"("other_vl")"),
                      ErrorCode::parse, {"text_config has no model_type"});
  // A composite whose text backbone is not a supported MoE family.
  expect_config_error(edit(kQwen3VL, R"("qwen3_vl_moe_text")", R"("llama")"), ErrorCode::unsupported,
                      {"text_config", "unsupported model_type 'llama'"});
  // Errors inside text_config name it.
  expect_config_error(edit(kQwen3VL, R"("hidden_size": 64)", R"("hidden_size": "64")"), ErrorCode::parse,
                      {"text_config", "'hidden_size'", "integer"});
  // mrope sections must cover head_dim / 2.
  expect_config_error(edit(kQwen3VL, "[4, 2, 2]", "[4, 2, 1]"), ErrorCode::parse, {"mrope_section"});
  // qwen3_vl_moe_text is not a top-level model.
  expect_config_error(R"({"model_type": "qwen3_vl_moe_text"})", ErrorCode::unsupported, {"qwen3_vl_moe_text"});
}

TEST(ModelConfig, Errors) {
  expect_config_error(edit(kQwen3, R"("qwen3_moe")", R"("llama")"), ErrorCode::unsupported,
                      {"unsupported model_type 'llama'", "qwen3_moe", "gpt_oss"});
  expect_config_error(edit(kQwen3, R"("model_type": "qwen3_moe",)", ""), ErrorCode::parse, {"'model_type'", "missing"});
  expect_config_error(edit(kQwen3, R"("hidden_size": 64,)", ""), ErrorCode::parse, {"'hidden_size'", "missing"});
  expect_config_error(edit(kQwen3, R"("num_local_experts": 8,)", ""), ErrorCode::parse,
                      {"'num_experts' / 'num_local_experts' / 'n_routed_experts'"});
  expect_config_error(edit(kQwen3, R"("hidden_size": 64)", R"("hidden_size": "64")"), ErrorCode::parse,
                      {"'hidden_size' must be an integer", "string"});
  expect_config_error(edit(kQwen3, R"("hidden_size": 64)", R"("hidden_size": 64.5)"), ErrorCode::parse, {"'hidden_size'"});
  expect_config_error(edit(kQwen3, R"("hidden_size": 64)", R"("hidden_size": 0)"), ErrorCode::parse, {"'hidden_size'", ">= 1"});
  expect_config_error(edit(kQwen3, R"("norm_topk_prob": true)", R"("norm_topk_prob": 1)"), ErrorCode::parse,
                      {"'norm_topk_prob' must be a boolean"});
  expect_config_error(edit(kQwen3, R"("rms_norm_eps": 1e-06)", R"("rms_norm_eps": "small")"), ErrorCode::parse,
                      {"'rms_norm_eps' must be a number"});
  expect_config_error(edit(kQwen3, R"("mlp_only_layers": [])", R"("mlp_only_layers": [9])"), ErrorCode::parse,
                      {"mlp_only_layers"});
  expect_config_error(edit(kQwen3, R"("mlp_only_layers": [])", R"("mlp_only_layers": "none")"), ErrorCode::parse,
                      {"mlp_only_layers", "list of integers"});
  expect_config_error(edit(kQwen3, R"("num_experts_per_tok": 2)", R"("num_experts_per_tok": 9)"), ErrorCode::parse,
                      {"num_experts_per_tok 9 exceeds"});
  expect_config_error(edit(kQwen3, R"("num_key_value_heads": 2)", R"("num_key_value_heads": 3)"), ErrorCode::parse,
                      {"num_key_value_heads"});
  expect_config_error(edit(kQwen3, R"("hidden_act": "silu")", R"("hidden_act": "swiglu_oai")"), ErrorCode::unsupported,
                      {"hidden_act 'swiglu_oai'"});
  expect_config_error(edit(kQwen3, R"("eos_token_id": [2, 5])", R"("eos_token_id": "2")"), ErrorCode::parse,
                      {"eos_token_id"});
  expect_config_error(edit(kQwen3, R"("mlp_only_layers": [])", R"("mlp_only_layers": [1], "intermediate_size": 0)"),
                      ErrorCode::parse, {"intermediate_size"});
  expect_config_error(edit(kQwen3, R"("dtype")", R"("quantization_config": "fp8", "dtype")"), ErrorCode::parse,
                      {"quantization_config"});
  expect_config_error(edit(kQwen3, R"("dtype")", R"("final_logit_softcapping": 30.0, "dtype")"), ErrorCode::unsupported,
                      {"final_logit_softcapping"});
  expect_config_error(R"({"model_type": "qwen3_moe", )", ErrorCode::parse, {"malformed JSON"});
  expect_config_error("[1, 2]", ErrorCode::parse, {"not a JSON object"});
  expect_config_error(std::string(10000, '[') + std::string(10000, ']'), ErrorCode::parse, {"nested deeper"});
  expect_config_error(edit(kQwen2, R"("shared_expert_intermediate_size": 48,)", ""), ErrorCode::parse,
                      {"'shared_expert_intermediate_size'", "missing"});
  expect_config_error(edit(kQwen2, R"("decoder_sparse_step": 2)", R"("decoder_sparse_step": 0)"), ErrorCode::parse,
                      {"decoder_sparse_step"});
  expect_config_error(edit(kQwen3, R"("num_hidden_layers": 4)", R"("num_hidden_layers": 1099511627776)"), ErrorCode::parse,
                      {"num_hidden_layers", "implausibly large"});
}

TEST(ModelConfig, RopeVariants) {
  auto with_rope = [](const std::string& rope) {
    return edit(kQwen3, R"({"rope_theta": 1000000.0, "rope_type": "default"})", rope);
  };
  const RopeConfig lin = parse_model_config(with_rope(R"({"rope_type": "linear", "factor": 2.0})")).text.rope;
  EXPECT_EQ(lin.type, "linear");
  EXPECT_DOUBLE_EQ(lin.factor, 2.0);
  EXPECT_DOUBLE_EQ(lin.theta, 10000.0);  // the family default when rope_parameters has none
  const RopeConfig l3 = parse_model_config(with_rope(
      R"({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64, "rope_theta": 500000.0})"))
                            .text.rope;
  EXPECT_EQ(l3.type, "llama3");
  EXPECT_EQ(l3.original_max_position_embeddings, 64);
  EXPECT_DOUBLE_EQ(l3.theta, 500000.0);
  const RopeConfig y = parse_model_config(with_rope(R"({"rope_type": "yarn", "factor": 4.0})")).text.rope;
  EXPECT_EQ(y.original_max_position_embeddings, 256);  // defaults to max_position_embeddings
  EXPECT_DOUBLE_EQ(y.beta_fast, 32.0);
  EXPECT_EQ(parse_model_config(with_rope(R"({"rope_type": "dynamic", "factor": 2.0})")).text.rope.type, "dynamic");
  // legacy rope_scaling: null is the same as absent
  EXPECT_EQ(parse_model_config(edit(kMixtral, R"("rope_theta": 1e6)", R"("rope_theta": 1e6, "rope_scaling": null)")).text.rope.type,
            "default");

  expect_config_error(with_rope(R"({"rope_type": "longrope", "short_factor": [1], "long_factor": [1]})"), ErrorCode::unsupported,
                      {"RoPE", "longrope"});
  expect_config_error(with_rope(R"({"rope_type": "su"})"), ErrorCode::unsupported, {"'su'"});
  expect_config_error(with_rope(R"({"rope_type": "linear"})"), ErrorCode::parse, {"'factor'", "missing"});
  expect_config_error(with_rope(R"({"rope_type": "yarn", "factor": "4"})"), ErrorCode::parse, {"'factor' must be a number"});
  expect_config_error(with_rope(R"({"rope_type": "default", "mystery_knob": 3})"), ErrorCode::unsupported, {"mystery_knob"});
  expect_config_error(with_rope(R"({"full_attention": {"rope_type": "default"}})"), ErrorCode::unsupported, {"per-layer-type"});
  expect_config_error(with_rope(R"("default")"), ErrorCode::parse, {"rope_parameters", "object"});
  expect_config_error(with_rope(R"({"rope_type": "default", "partial_rotary_factor": 0.5})"), ErrorCode::unsupported,
                      {"partial_rotary_factor"});
}

TEST(ModelConfig, GenerationConfig) {
  GenerationConfig d;
  d.eos_token_id = {2};
  GenerationConfig g = parse_generation_config(
      R"({"bos_token_id": 1, "eos_token_id": [3, 4], "do_sample": true, "temperature": 0.7, "top_k": 20, "top_p": 0.9, "max_new_tokens": 16, "transformers_version": "5"})",
      "gen.json", d);
  EXPECT_EQ(g.eos_token_id, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(g.bos_token_id, 1);
  EXPECT_TRUE(g.do_sample);
  EXPECT_DOUBLE_EQ(g.temperature, 0.7);
  EXPECT_EQ(g.top_k, 20);
  EXPECT_DOUBLE_EQ(g.top_p, 0.9);
  EXPECT_EQ(g.max_new_tokens, 16);
  // Absent fields keep the defaults (from config.json).
  EXPECT_EQ(parse_generation_config("{}", "gen.json", d).eos_token_id, (std::vector<int64_t>{2}));
  EXPECT_THROW(parse_generation_config(R"({"top_p": 0})", "gen.json", d), Error);
  EXPECT_THROW(parse_generation_config(R"({"temperature": "hot"})", "gen.json", d), Error);
  EXPECT_THROW(parse_generation_config(R"({"eos_token_id": 2.5})", "gen.json", d), Error);
  EXPECT_THROW(parse_generation_config("{", "gen.json", d), Error);
}

TEST(ModelConfig, RandomMutationsNeverCrash) {
  // Byte-level mutations of valid configs: every outcome is a config or a moex::Error.
  std::mt19937 rng(99);
  const std::string seeds[] = {kQwen3, kQwen2, kDeepseek, kGptOss, kQwen3VL, kMixtral, kOlmoe};
  int ok = 0, errors = 0;
  for (int it = 0; it < 4000; ++it) {
    std::string s = seeds[rng() % 7];
    for (int k = 0, n = 1 + int(rng() % 3); k < n; ++k) {
      const size_t p = rng() % s.size();
      switch (rng() % 3) {
        case 0: s[p] = "{}[]\":,0123456789-.eatnul"[rng() % 26]; break;
        case 1: s.erase(p, 1 + rng() % 8); break;
        default: s.insert(p, 1, char(rng() % 128)); break;
      }
    }
    try {
      parse_model_config(s, "fuzz.json");
      ++ok;
    } catch (const Error&) {
      ++errors;
    }
  }
  EXPECT_GT(errors, 1000);
  EXPECT_GT(ok, 10);
}

TEST(ModelConfig, FixturesParse) {
  const char* src = std::getenv("MOEX_SOURCE_DIR");
  const fs::path dir = fs::path(src ? src : ".") / "tests" / "fixtures";
  if (!fs::exists(dir)) GTEST_SKIP() << "no fixtures under " << dir;
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!e.is_directory() || !fs::exists(e.path() / "config.json")) continue;
    const ModelConfig m = load_model_config(e.path().string());
    std::string name = e.path().filename().string();
    // variants of a family's fixture carry a suffix (qwen3_moe_fp8: the reference's FP8 checkpoint)
    if (name.size() > 4 && name.compare(name.size() - 4, 4, "_fp8") == 0) {
      EXPECT_TRUE(m.fp8.has_value()) << name;
      name.resize(name.size() - 4);
    }
    if (m.composite()) {
      EXPECT_EQ(m.model_type, name);
    } else {
      EXPECT_EQ(family_name(m.text.family), name);
    }
    EXPECT_TRUE(m.has_generation_config) << name;
    EXPECT_FALSE(m.generation.eos_token_id.empty()) << name;
    EXPECT_GT(m.text.num_moe_layers(), 0) << name;
    ++n;
  }
  if (n == 0) GTEST_SKIP() << "no fixture configs yet";
}
