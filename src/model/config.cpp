// model/config.cpp — config.json / generation_config.json → moex::ModelConfig.
//
// Defaults mirror the reference library's config classes (transformers 5.x) for fields a file may
// omit; the dimensions of the model are required. Every type mismatch is an error.
#include "moex/config.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/check.hpp"
#include "core/files.hpp"

namespace moex {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string_view family_name(ModelFamily f) {
  switch (f) {
    case ModelFamily::qwen2_moe: return "qwen2_moe";
    case ModelFamily::qwen3_moe: return "qwen3_moe";
    case ModelFamily::olmoe: return "olmoe";
    case ModelFamily::mixtral: return "mixtral";
    case ModelFamily::deepseek_v3: return "deepseek_v3";
    case ModelFamily::gpt_oss: return "gpt_oss";
  }
  return "?";
}

namespace {

struct TextType {
  const char* model_type;
  ModelFamily family;
};
// Decoder model types (top level, or inside text_config).
const TextType kTextTypes[] = {
    {"qwen2_moe", ModelFamily::qwen2_moe},     {"qwen3_moe", ModelFamily::qwen3_moe},
    {"olmoe", ModelFamily::olmoe},             {"mixtral", ModelFamily::mixtral},
    {"deepseek_v3", ModelFamily::deepseek_v3}, {"gpt_oss", ModelFamily::gpt_oss},
    {"qwen3_vl_moe_text", ModelFamily::qwen3_moe},
};
// Composite model types whose text_config may omit its model_type.
const std::pair<const char*, const char*> kCompositeText[] = {{"qwen3_vl_moe", "qwen3_vl_moe_text"}};

constexpr int kMaxJsonDepth = 64;
constexpr int64_t kMaxLayers = 1 << 16;

std::string type_name(const json& v) {
  if (v.is_boolean()) return "boolean " + v.dump();
  if (v.is_number()) return "number " + v.dump();
  if (v.is_string()) return "string " + v.dump();
  if (v.is_array()) return "array";
  if (v.is_object()) return "object";
  return "null";
}

// A JSON object plus where it came from, with typed, checked accessors.
class Obj {
 public:
  Obj(const json& j, std::string where) : j_(j), where_(std::move(where)) {}
  const std::string& where() const { return where_; }
  const json& raw() const { return j_; }

  // Present and not null.
  bool has(const char* k) const {
    auto it = j_.find(k);
    return it != j_.end() && !it->is_null();
  }
  const json& at(const char* k) const { return *j_.find(k); }

  [[noreturn]] void type_error(const char* k, const char* want) const {
    detail::fail(ErrorCode::parse, "{}: field '{}' must be {}, got {}", where_, k, want, type_name(at(k)));
  }
  [[noreturn]] void missing(const char* k) const {
    detail::fail(ErrorCode::parse, "{}: required field '{}' is missing", where_, k);
  }
  [[noreturn]] void bad_value(const char* k, const std::string& why) const {
    detail::fail(ErrorCode::parse, "{}: field '{}' = {} {}", where_, k, at(k).dump(), why);
  }

  int64_t get_int(const char* k) const {
    const json& v = at(k);
    if (v.is_number_integer()) return v.get<int64_t>();
    if (v.is_number_float()) {
      const double d = v.get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e15) return int64_t(d);
    }
    type_error(k, "an integer");
  }
  int64_t req_int(const char* k) const {
    if (!has(k)) missing(k);
    return get_int(k);
  }
  int64_t opt_int(const char* k, int64_t def) const { return has(k) ? get_int(k) : def; }
  std::optional<int64_t> opt_int(const char* k) const {
    return has(k) ? std::optional<int64_t>(get_int(k)) : std::nullopt;
  }
  // The first present key of several aliases; `name` lists them in messages.
  int64_t req_int_alias(std::initializer_list<const char*> ks) const {
    for (const char* k : ks)
      if (has(k)) return get_int(k);
    std::string names;
    for (const char* k : ks) names += (names.empty() ? "'" : " / '") + std::string(k) + "'";
    detail::fail(ErrorCode::parse, "{}: required field {} is missing", where_, names);
  }
  int64_t pos_int(const char* k, int64_t v, int64_t min = 1) const {
    if (v < min) detail::fail(ErrorCode::parse, "{}: field '{}' = {} must be >= {}", where_, k, v, min);
    return v;
  }
  double get_num(const char* k) const {
    const json& v = at(k);
    if (!v.is_number()) type_error(k, "a number");
    return v.get<double>();
  }
  double opt_num(const char* k, double def) const { return has(k) ? get_num(k) : def; }
  std::optional<double> opt_num(const char* k) const {
    return has(k) ? std::optional<double>(get_num(k)) : std::nullopt;
  }
  bool opt_bool(const char* k, bool def) const {
    if (!has(k)) return def;
    const json& v = at(k);
    if (!v.is_boolean()) type_error(k, "a boolean");
    return v.get<bool>();
  }
  std::string opt_str(const char* k, const std::string& def) const {
    if (!has(k)) return def;
    const json& v = at(k);
    if (!v.is_string()) type_error(k, "a string");
    return v.get<std::string>();
  }
  std::vector<int64_t> opt_int_list(const char* k) const {
    std::vector<int64_t> out;
    if (!has(k)) return out;
    const json& v = at(k);
    if (!v.is_array()) type_error(k, "a list of integers");
    for (const json& e : v) {
      if (!e.is_number_integer()) type_error(k, "a list of integers");
      out.push_back(e.get<int64_t>());
    }
    return out;
  }
  // An integer or a list of integers (eos_token_id); null = empty.
  std::vector<int64_t> int_or_list(const char* k) const {
    if (!has(k)) return {};
    const json& v = at(k);
    if (v.is_number_integer()) return {v.get<int64_t>()};
    if (v.is_array()) return opt_int_list(k);
    type_error(k, "an integer or a list of integers");
  }
  std::vector<std::string> opt_str_list(const char* k) const {
    std::vector<std::string> out;
    if (!has(k)) return out;
    const json& v = at(k);
    if (!v.is_array()) type_error(k, "a list of strings");
    for (const json& e : v) {
      if (!e.is_string()) type_error(k, "a list of strings");
      out.push_back(e.get<std::string>());
    }
    return out;
  }

 private:
  const json& j_;
  std::string where_;
};

json parse_json(std::string_view text, std::string_view source) {
  int depth = 0;
  bool in_str = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_str) {
      if (c == '\\') ++i;
      else if (c == '"') in_str = false;
    } else if (c == '"') {
      in_str = true;
    } else if (c == '{' || c == '[') {
      if (++depth > kMaxJsonDepth) detail::fail(ErrorCode::parse, "{}: malformed JSON: nested deeper than {}", source, kMaxJsonDepth);
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  try {
    return json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    detail::fail(ErrorCode::parse, "{}: malformed JSON: {}", source, e.what());
  }
}

const TextType* find_text_type(const std::string& t) {
  for (const auto& e : kTextTypes)
    if (t == e.model_type) return &e;
  return nullptr;
}

RopeConfig parse_rope(const Obj& o, double default_theta, int64_t max_pos) {
  RopeConfig r;
  // transformers 5 writes `rope_parameters`; older files `rope_theta` + `rope_scaling`.
  const char* key = o.has("rope_parameters") ? "rope_parameters" : (o.has("rope_scaling") ? "rope_scaling" : nullptr);
  r.theta = o.opt_num("rope_theta", default_theta);
  r.partial_rotary_factor = o.opt_num("partial_rotary_factor", 1.0);
  if (key) {
    if (!o.at(key).is_object()) o.type_error(key, "an object");
    const Obj p(o.at(key), o.where() + ": " + key);
    for (auto it = p.raw().begin(); it != p.raw().end(); ++it)
      if (it.value().is_object())
        detail::fail(ErrorCode::unsupported, "{}: per-layer-type RoPE parameters ('{}') are not supported", p.where(),
                     it.key());
    r.theta = p.opt_num("rope_theta", r.theta);
    r.partial_rotary_factor = p.opt_num("partial_rotary_factor", r.partial_rotary_factor);
    r.type = p.opt_str("rope_type", p.opt_str("type", "default"));
    auto need_factor = [&] {
      if (!p.has("factor")) p.missing("factor");
      r.factor = p.get_num("factor");
      if (!(r.factor >= 1.0 || r.type == "linear") || !(r.factor > 0))
        detail::fail(ErrorCode::parse, "{}: RoPE factor {} is out of range", p.where(), r.factor);
    };
    static const char* types[] = {"default", "linear", "dynamic", "yarn", "llama3"};
    if (std::find_if(std::begin(types), std::end(types), [&](const char* t) { return r.type == t; }) == std::end(types))
      detail::fail(ErrorCode::unsupported, "{}: RoPE type '{}' is not supported (supported: default, linear, dynamic, yarn, llama3)",
                   p.where(), r.type);
    static const char* known[] = {"rope_type", "type", "rope_theta", "partial_rotary_factor", "factor",
                                  "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale",
                                  "mscale_all_dim", "attention_factor", "truncate", "low_freq_factor",
                                  "high_freq_factor", "mrope_section", "mrope_interleaved"};
    for (auto it = p.raw().begin(); it != p.raw().end(); ++it) {
      if (std::find_if(std::begin(known), std::end(known), [&](const char* k) { return it.key() == k; }) ==
          std::end(known))
        detail::fail(ErrorCode::unsupported, "{}: RoPE option '{}' is not supported", p.where(), it.key());
    }
    if (r.type == "default") {
      // nothing else
    } else if (r.type == "linear" || r.type == "dynamic") {
      need_factor();
    } else if (r.type == "yarn") {
      need_factor();
      r.original_max_position_embeddings = p.opt_int("original_max_position_embeddings", max_pos);
      r.beta_fast = p.opt_num("beta_fast", 32.0);
      r.beta_slow = p.opt_num("beta_slow", 1.0);
      r.mscale = p.opt_num("mscale");
      r.mscale_all_dim = p.opt_num("mscale_all_dim");
      r.attention_factor = p.opt_num("attention_factor");
      r.truncate = p.opt_bool("truncate", true);
    } else if (r.type == "llama3") {
      need_factor();
      r.original_max_position_embeddings = p.opt_int("original_max_position_embeddings", max_pos);
      r.low_freq_factor = p.opt_num("low_freq_factor", 1.0);
      r.high_freq_factor = p.opt_num("high_freq_factor", 4.0);
    } else {
      detail::fail(ErrorCode::unsupported, "{}: RoPE type '{}' is not supported (supported: default, linear, dynamic, yarn, llama3)",
                   p.where(), r.type);
    }
    r.mrope_section = p.opt_int_list("mrope_section");
    r.mrope_interleaved = p.opt_bool("mrope_interleaved", false);
    if ((r.type == "yarn" || r.type == "llama3") && r.original_max_position_embeddings <= 0)
      detail::fail(ErrorCode::parse, "{}: original_max_position_embeddings must be positive", p.where());
  }
  if (!(r.theta > 0)) detail::fail(ErrorCode::parse, "{}: rope_theta {} must be positive", o.where(), r.theta);
  if (!(r.partial_rotary_factor > 0 && r.partial_rotary_factor <= 1))
    detail::fail(ErrorCode::parse, "{}: partial_rotary_factor {} must be in (0, 1]", o.where(), r.partial_rotary_factor);
  return r;
}

TextConfig parse_text(const Obj& o, const std::string& model_type) {
  const TextType* tt = find_text_type(model_type);
  if (!tt)
    detail::fail(ErrorCode::unsupported, "{}: unsupported model_type '{}' (supported: {})", o.where(), model_type,
                 supported_model_types());
  TextConfig c;
  c.model_type = model_type;
  c.family = tt->family;
  const ModelFamily f = c.family;
  const bool vl = model_type == "qwen3_vl_moe_text";

  c.vocab_size = o.pos_int("vocab_size", o.req_int("vocab_size"));
  c.hidden_size = o.pos_int("hidden_size", o.req_int("hidden_size"));
  c.num_hidden_layers = o.pos_int("num_hidden_layers", o.req_int("num_hidden_layers"));
  if (c.num_hidden_layers > kMaxLayers)
    detail::fail(ErrorCode::parse, "{}: num_hidden_layers {} is implausibly large (limit {})", o.where(), c.num_hidden_layers,
                 kMaxLayers);
  c.num_attention_heads = o.pos_int("num_attention_heads", o.req_int("num_attention_heads"));
  const bool kv_defaults_to_heads = f == ModelFamily::olmoe || f == ModelFamily::deepseek_v3;
  c.num_key_value_heads = kv_defaults_to_heads ? o.opt_int("num_key_value_heads", c.num_attention_heads)
                                               : o.req_int("num_key_value_heads");
  o.pos_int("num_key_value_heads", c.num_key_value_heads);
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    detail::fail(ErrorCode::parse, "{}: num_attention_heads {} is not a multiple of num_key_value_heads {}", o.where(),
                 c.num_attention_heads, c.num_key_value_heads);

  // Experts.
  c.num_experts = o.pos_int("num_experts", o.req_int_alias({"num_experts", "num_local_experts", "n_routed_experts"}));
  c.num_experts_per_tok = o.pos_int("num_experts_per_tok", o.req_int("num_experts_per_tok"));
  if (c.num_experts_per_tok > c.num_experts)
    detail::fail(ErrorCode::parse, "{}: num_experts_per_tok {} exceeds the number of experts {}", o.where(),
                 c.num_experts_per_tok, c.num_experts);
  const bool expert_size_is_intermediate =
      f == ModelFamily::mixtral || f == ModelFamily::olmoe || f == ModelFamily::gpt_oss;
  if (expert_size_is_intermediate) {
    c.moe_intermediate_size = o.pos_int("intermediate_size", o.req_int("intermediate_size"));
  } else {
    c.moe_intermediate_size = o.pos_int("moe_intermediate_size", o.req_int("moe_intermediate_size"));
    c.intermediate_size = o.opt_int("intermediate_size", 0);
  }

  c.hidden_act = o.opt_str("hidden_act", "silu");
  if (c.hidden_act == "swish") c.hidden_act = "silu";
  static const char* acts[] = {"silu", "gelu", "gelu_pytorch_tanh", "relu"};
  if (std::find_if(std::begin(acts), std::end(acts), [&](const char* a) { return c.hidden_act == a; }) == std::end(acts))
    detail::fail(ErrorCode::unsupported, "{}: hidden_act '{}' is not supported (supported: silu, gelu, gelu_pytorch_tanh, relu)",
                 o.where(), c.hidden_act);
  c.tie_word_embeddings = o.opt_bool("tie_word_embeddings", vl);

  // Per-family defaults of the reference's config classes.
  double eps = 1e-6, theta = 10000.0;
  int64_t max_pos = 32768;
  switch (f) {
    case ModelFamily::qwen2_moe: break;
    case ModelFamily::qwen3_moe: if (vl) { theta = 500000.0; max_pos = 128000; } break;
    case ModelFamily::olmoe: eps = 1e-5; max_pos = 4096; break;
    case ModelFamily::mixtral: eps = 1e-5; theta = 1e6; max_pos = 131072; break;
    case ModelFamily::deepseek_v3: max_pos = 4096; break;
    case ModelFamily::gpt_oss: eps = 1e-5; theta = 150000.0; max_pos = 131072; break;
  }
  c.rms_norm_eps = o.opt_num("rms_norm_eps", eps);
  if (!(c.rms_norm_eps > 0)) o.bad_value("rms_norm_eps", "must be positive");
  c.max_position_embeddings = o.pos_int("max_position_embeddings", o.opt_int("max_position_embeddings", max_pos));

  // head_dim
  if (f == ModelFamily::gpt_oss) c.head_dim = o.opt_int("head_dim", 64);
  else c.head_dim = o.opt_int("head_dim", c.hidden_size / c.num_attention_heads);
  if (f != ModelFamily::deepseek_v3 && !o.has("head_dim") && c.hidden_size % c.num_attention_heads != 0)
    detail::fail(ErrorCode::parse, "{}: hidden_size {} is not a multiple of num_attention_heads {} and head_dim is not given",
                 o.where(), c.hidden_size, c.num_attention_heads);

  // Routing and layer structure.
  switch (f) {
    case ModelFamily::qwen2_moe:
    case ModelFamily::qwen3_moe:
      c.norm_topk_prob = vl ? true : o.opt_bool("norm_topk_prob", false);  // Qwen3-VL-MoE always renormalises
      c.decoder_sparse_step = o.opt_int("decoder_sparse_step", 1);
      if (c.decoder_sparse_step < 1) o.bad_value("decoder_sparse_step", "must be >= 1");
      c.mlp_only_layers = o.opt_int_list("mlp_only_layers");
      for (int64_t l : c.mlp_only_layers)
        if (l < 0 || l >= c.num_hidden_layers) o.bad_value("mlp_only_layers", "has a layer outside [0, num_hidden_layers)");
      if (f == ModelFamily::qwen2_moe) {
        c.shared_expert_intermediate_size = o.req_int("shared_expert_intermediate_size");
        o.pos_int("shared_expert_intermediate_size", c.shared_expert_intermediate_size, 0);
      }
      break;
    case ModelFamily::olmoe:
      c.norm_topk_prob = o.opt_bool("norm_topk_prob", false);
      break;
    case ModelFamily::mixtral:
    case ModelFamily::gpt_oss:
      c.norm_topk_prob = true;  // mixtral renormalises; gpt_oss softmaxes over the K selected logits
      break;
    case ModelFamily::deepseek_v3: {
      c.norm_topk_prob = o.opt_bool("norm_topk_prob", true);
      c.n_group = o.opt_int("n_group", 8);
      c.topk_group = o.opt_int("topk_group", 4);
      o.pos_int("n_group", c.n_group);
      o.pos_int("topk_group", c.topk_group);
      if (c.num_experts % c.n_group != 0)
        detail::fail(ErrorCode::parse, "{}: n_routed_experts {} is not a multiple of n_group {}", o.where(), c.num_experts,
                     c.n_group);
      if (c.topk_group > c.n_group)
        detail::fail(ErrorCode::parse, "{}: topk_group {} exceeds n_group {}", o.where(), c.topk_group, c.n_group);
      if (c.num_experts / c.n_group < 2)
        detail::fail(ErrorCode::parse, "{}: each of the n_group {} groups needs at least 2 experts (group score = top-2 sum)",
                     o.where(), c.n_group);
      if (c.num_experts_per_tok > c.topk_group * (c.num_experts / c.n_group))
        detail::fail(ErrorCode::parse, "{}: num_experts_per_tok {} exceeds the experts in topk_group {} groups", o.where(),
                     c.num_experts_per_tok, c.topk_group);
      c.routed_scaling_factor = o.opt_num("routed_scaling_factor", 2.5);
      c.first_k_dense_replace = o.opt_int("first_k_dense_replace", 3);
      if (c.first_k_dense_replace < 0) o.bad_value("first_k_dense_replace", "must be >= 0");
      c.n_shared_experts = o.opt_int("n_shared_experts", 1);
      if (c.n_shared_experts < 0) o.bad_value("n_shared_experts", "must be >= 0");
      c.q_lora_rank = o.opt_int("q_lora_rank", 0);
      if (c.q_lora_rank < 0) o.bad_value("q_lora_rank", "must be >= 0 (or null)");
      c.kv_lora_rank = o.pos_int("kv_lora_rank", o.req_int("kv_lora_rank"));
      c.qk_nope_head_dim = o.pos_int("qk_nope_head_dim", o.req_int("qk_nope_head_dim"), 0);
      c.qk_rope_head_dim = o.pos_int("qk_rope_head_dim", o.req_int("qk_rope_head_dim"));
      c.v_head_dim = o.pos_int("v_head_dim", o.req_int("v_head_dim"));
      c.head_dim = c.qk_nope_head_dim + c.qk_rope_head_dim;
      c.rope_interleave = o.opt_bool("rope_interleave", true);
      if (o.opt_str("scoring_func", "sigmoid") != "sigmoid")
        detail::fail(ErrorCode::unsupported, "{}: scoring_func '{}' is not supported for deepseek_v3 (only sigmoid)",
                     o.where(), o.opt_str("scoring_func", ""));
      if (o.opt_str("topk_method", "noaux_tc") != "noaux_tc")
        detail::fail(ErrorCode::unsupported, "{}: topk_method '{}' is not supported for deepseek_v3 (only noaux_tc)",
                     o.where(), o.opt_str("topk_method", ""));
      if (o.opt_int("moe_layer_freq", 1) != 1)
        detail::fail(ErrorCode::unsupported, "{}: moe_layer_freq {} is not supported (only 1)", o.where(),
                     o.opt_int("moe_layer_freq", 1));
      break;
    }
  }
  o.pos_int("head_dim", c.head_dim);
  if (f == ModelFamily::gpt_oss) {
    c.swiglu_alpha = o.opt_num("swiglu_alpha", 1.702);
    c.swiglu_limit = o.opt_num("swiglu_limit", 7.0);
    if (!(c.swiglu_limit > 0)) o.bad_value("swiglu_limit", "must be positive");
    c.attention_sinks = true;
  }

  // Attention projections and norms.
  switch (f) {
    case ModelFamily::qwen2_moe:
      c.attention_bias = o.opt_bool("qkv_bias", true);
      c.qkv_bias = c.attention_bias;
      c.o_bias = false;
      break;
    case ModelFamily::qwen3_moe:
    case ModelFamily::olmoe:
    case ModelFamily::gpt_oss:
    case ModelFamily::deepseek_v3:
      c.attention_bias = o.opt_bool("attention_bias", f == ModelFamily::gpt_oss);
      c.qkv_bias = c.o_bias = c.attention_bias;
      break;
    case ModelFamily::mixtral:
      c.attention_bias = false;
      break;
  }
  c.qk_norm = f == ModelFamily::qwen3_moe || f == ModelFamily::olmoe;
  if (f == ModelFamily::olmoe) {
    c.clip_qkv = o.opt_num("clip_qkv");
    if (c.clip_qkv && !(*c.clip_qkv > 0)) o.bad_value("clip_qkv", "must be positive (or null)");
  }

  // Sliding windows: which layers, and how wide.
  const int64_t L = c.num_hidden_layers;
  c.layer_types.assign(size_t(L), "full_attention");
  switch (f) {
    case ModelFamily::gpt_oss: {
      c.sliding_window = o.opt_int("sliding_window", 128);
      for (int64_t i = 0; i < L; ++i) c.layer_types[size_t(i)] = (i + 1) % 2 ? "sliding_attention" : "full_attention";
      if (o.has("layer_types")) c.layer_types = o.opt_str_list("layer_types");
      break;
    }
    case ModelFamily::qwen2_moe: {
      const bool use = o.opt_bool("use_sliding_window", false);
      c.sliding_window = use ? o.opt_int("sliding_window", 4096) : 0;
      const int64_t max_window_layers = o.opt_int("max_window_layers", 28);
      for (int64_t i = 0; i < L; ++i)
        if ((i + 1) % 2 && i < max_window_layers && use) c.layer_types[size_t(i)] = "sliding_attention";
      if (o.has("layer_types")) c.layer_types = o.opt_str_list("layer_types");
      break;
    }
    case ModelFamily::qwen3_moe: {
      if (!vl && o.opt_bool("use_sliding_window", false)) {
        c.sliding_window = o.opt_int("sliding_window", 4096);
        c.layer_types.assign(size_t(L), "sliding_attention");
      }
      break;
    }
    case ModelFamily::mixtral: {
      if (o.has("sliding_window")) {
        c.sliding_window = o.get_int("sliding_window");
        c.layer_types.assign(size_t(L), "sliding_attention");
      }
      break;
    }
    case ModelFamily::olmoe:
    case ModelFamily::deepseek_v3: break;
  }
  if (int64_t(c.layer_types.size()) != L)
    detail::fail(ErrorCode::parse, "{}: layer_types has {} entries but num_hidden_layers is {}", o.where(),
                 c.layer_types.size(), L);
  bool any_sliding = false;
  for (const auto& t : c.layer_types) {
    if (t == "sliding_attention") any_sliding = true;
    else if (t != "full_attention")
      detail::fail(ErrorCode::unsupported, "{}: layer type '{}' is not supported (full_attention, sliding_attention)",
                   o.where(), t);
  }
  if (any_sliding && c.sliding_window <= 0)
    detail::fail(ErrorCode::parse, "{}: sliding_attention layers need a positive sliding_window (got {})", o.where(),
                 c.sliding_window);
  if (!any_sliding) c.sliding_window = 0;

  // Dense MLP layers need intermediate_size.
  bool dense = false;
  for (int64_t l = 0; l < L; ++l) dense = dense || !c.is_moe_layer(l);
  if (dense && !expert_size_is_intermediate && c.intermediate_size <= 0)
    detail::fail(ErrorCode::parse, "{}: the config has dense MLP layers but no positive 'intermediate_size'", o.where());

  c.rope = parse_rope(o, theta, c.max_position_embeddings);
  if (f == ModelFamily::gpt_oss && !o.has("rope_parameters") && !o.has("rope_scaling")) {
    // The reference's GptOssConfig default.
    c.rope.type = "yarn";
    c.rope.factor = 32.0;
    c.rope.beta_fast = 32.0;
    c.rope.beta_slow = 1.0;
    c.rope.truncate = false;
    c.rope.original_max_position_embeddings = 4096;
  }
  if (c.rope.partial_rotary_factor != 1.0)
    detail::fail(ErrorCode::unsupported, "{}: partial_rotary_factor {} is not supported for {}", o.where(),
                 c.rope.partial_rotary_factor, model_type);
  if (!c.rope.mrope_section.empty()) {
    int64_t sum = 0;
    for (int64_t s : c.rope.mrope_section) sum += s;
    if (sum * 2 != c.head_dim)
      detail::fail(ErrorCode::parse, "{}: mrope_section sums to {} but head_dim / 2 is {}", o.where(), sum, c.head_dim / 2);
  }
  const int64_t rope_dim = f == ModelFamily::deepseek_v3 ? c.qk_rope_head_dim : c.head_dim;
  if (rope_dim % 2) detail::fail(ErrorCode::parse, "{}: the rotary dimension {} must be even", o.where(), rope_dim);

  // Fields that would change the math and that none of these families implement.
  for (const char* k : {"attn_logit_softcapping", "final_logit_softcapping", "logits_scaling", "embedding_multiplier",
                        "residual_multiplier", "attention_multiplier"})
    if (o.has(k)) detail::fail(ErrorCode::unsupported, "{}: field '{}' is not supported for {}", o.where(), k, model_type);

  c.eos_token_id = o.int_or_list("eos_token_id");
  c.bos_token_id = o.opt_int("bos_token_id");
  c.pad_token_id = o.opt_int("pad_token_id");
  return c;
}

}  // namespace

std::string supported_model_types() {
  std::string s;
  for (const auto& e : kTextTypes) s += (s.empty() ? "" : ", ") + std::string(e.model_type);
  for (const auto& e : kCompositeText) s += ", " + std::string(e.first) + " (composite)";
  return s;
}

bool TextConfig::is_moe_layer(int64_t layer) const {
  if (layer < 0 || layer >= num_hidden_layers || num_experts <= 0) return false;
  switch (family) {
    case ModelFamily::qwen2_moe:
    case ModelFamily::qwen3_moe:
      if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end()) return false;
      return (layer + 1) % decoder_sparse_step == 0;
    case ModelFamily::deepseek_v3: return layer >= first_k_dense_replace;
    case ModelFamily::olmoe:
    case ModelFamily::mixtral:
    case ModelFamily::gpt_oss: return true;
  }
  return true;
}

int64_t TextConfig::num_moe_layers() const {
  int64_t n = 0;
  for (int64_t l = 0; l < num_hidden_layers; ++l) n += is_moe_layer(l);
  return n;
}

int64_t TextConfig::attention_window(int64_t layer) const {
  if (layer < 0 || layer >= int64_t(layer_types.size())) return 0;
  return layer_types[size_t(layer)] == "sliding_attention" ? sliding_window : 0;
}

GenerationConfig parse_generation_config(std::string_view text, std::string_view source, GenerationConfig g) {
  const json j = parse_json(text, source);
  if (!j.is_object()) detail::fail(ErrorCode::parse, "{}: not a JSON object", source);
  const Obj o(j, std::string(source));
  if (o.has("eos_token_id")) g.eos_token_id = o.int_or_list("eos_token_id");
  if (o.has("bos_token_id")) g.bos_token_id = o.get_int("bos_token_id");
  if (o.has("pad_token_id")) g.pad_token_id = o.get_int("pad_token_id");
  g.do_sample = o.opt_bool("do_sample", g.do_sample);
  g.temperature = o.opt_num("temperature", g.temperature);
  if (!(g.temperature >= 0)) o.bad_value("temperature", "must be >= 0");
  if (o.has("top_k")) g.top_k = o.get_int("top_k");
  if (g.top_k < 0) o.bad_value("top_k", "must be >= 0");
  g.top_p = o.opt_num("top_p", g.top_p);
  if (!(g.top_p > 0 && g.top_p <= 1)) o.bad_value("top_p", "must be in (0, 1]");
  if (o.has("max_new_tokens")) g.max_new_tokens = o.pos_int("max_new_tokens", o.get_int("max_new_tokens"), 0);
  return g;
}

Fp8QuantConfig parse_fp8_quant_config(std::string_view text, std::string_view source) {
  const json j = parse_json(text, source);
  if (!j.is_object()) detail::fail(ErrorCode::parse, "{}: not a JSON object", source);
  const Obj o(j, std::string(source));
  if (!o.has("quant_method")) o.missing("quant_method");
  const std::string method = o.opt_str("quant_method", "");
  if (method != "fp8")
    detail::fail(ErrorCode::unsupported, "{}: quant_method '{}' is not supported (only \"fp8\", fine-grained FP8)", source, method);
  Fp8QuantConfig c;
  if (!o.has("weight_block_size"))
    detail::fail(ErrorCode::unsupported, "{}: weight_block_size is missing or null; per-tensor FP8 scales are not supported "
                 "(give a block size such as [128, 128])", source);
  const std::vector<int64_t> block = o.opt_int_list("weight_block_size");
  if (block.size() != 2 || block[0] < 1 || block[1] < 1)
    o.bad_value("weight_block_size", "must be two positive integers [out, in]");
  c.block_n = block[0];
  c.block_k = block[1];
  const std::string scheme = o.opt_str("activation_scheme", "dynamic");
  if (scheme != "dynamic" && scheme != "static") o.bad_value("activation_scheme", "must be \"dynamic\" or \"static\"");
  c.static_activations = scheme == "static";
  const std::string fmt = o.opt_str("scale_fmt", "float");
  if (fmt != "float" && fmt != "ue8m0") o.bad_value("scale_fmt", "must be \"float\" or \"ue8m0\"");
  c.ue8m0_scales = fmt == "ue8m0";
  const std::string expert_dtype = o.opt_str("expert_dtype", "fp8");
  if (expert_dtype != "fp8")
    detail::fail(ErrorCode::unsupported, "{}: expert_dtype '{}' is not supported by the checkpoint loader (only \"fp8\")", source,
                 expert_dtype);
  c.modules_to_not_convert = o.opt_str_list("modules_to_not_convert");
  if (o.has("modules_to_convert"))
    detail::fail(ErrorCode::unsupported, "{}: modules_to_convert (FP8 embeddings) is not supported", source);
  return c;
}

std::string fp8_quant_config_json(const Fp8QuantConfig& c) {
  json j = json::object();
  j["activation_scheme"] = c.static_activations ? "static" : "dynamic";
  j["dequantize"] = false;
  j["expert_dtype"] = "fp8";
  j["modules_to_convert"] = nullptr;
  j["modules_to_not_convert"] = c.modules_to_not_convert.empty() ? json(nullptr) : json(c.modules_to_not_convert);
  j["quant_method"] = "fp8";
  j["scale_fmt"] = c.ue8m0_scales ? "ue8m0" : "float";
  j["weight_block_size"] = {c.block_n, c.block_k};
  return j.dump();
}

ModelConfig parse_model_config(std::string_view text, std::string_view source) {
  const json j = parse_json(text, source);
  if (!j.is_object()) detail::fail(ErrorCode::parse, "{}: not a JSON object", source);
  const Obj top(j, std::string(source));
  ModelConfig m;
  m.source = std::string(source);
  if (!top.has("model_type")) top.missing("model_type");
  m.model_type = top.opt_str("model_type", "");
  m.architectures = top.opt_str_list("architectures");
  m.dtype = top.opt_str("dtype", top.opt_str("torch_dtype", ""));
  if (top.has("quantization_config")) {
    if (!top.at("quantization_config").is_object()) top.type_error("quantization_config", "an object");
    m.quantization_config = top.at("quantization_config").dump();
    m.fp8 = parse_fp8_quant_config(m.quantization_config, std::string(source) + ": quantization_config");
  }

  // Sub-configs: every object-valued "*_config" field except quantization_config.
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    if (k == "quantization_config" || k.size() < 7 || k.compare(k.size() - 7, 7, "_config") != 0) continue;
    if (it.value().is_null()) continue;
    if (!it.value().is_object()) top.type_error(k.c_str(), "an object");
    SubConfigInfo s;
    s.key = k;
    auto mt = it.value().find("model_type");
    if (mt != it.value().end() && !mt->is_null()) {
      if (!mt->is_string())
        detail::fail(ErrorCode::parse, "{}: field '{}.model_type' must be a string, got {}", source, k, type_name(*mt));
      s.model_type = mt->get<std::string>();
    }
    m.sub_configs.push_back(std::move(s));
  }

  if (top.has("text_config")) {
    m.text_key = "text_config";
    const Obj t(top.at("text_config"), std::string(source) + ": text_config");
    std::string tt = t.opt_str("model_type", "");
    if (tt.empty())
      for (const auto& [comp, text_type] : kCompositeText)
        if (m.model_type == comp) tt = text_type;
    if (tt.empty())
      detail::fail(ErrorCode::parse, "{}: text_config has no model_type (composite '{}')", source, m.model_type);
    m.text = parse_text(t, tt);
    // The composite's own tie flag, when given, decides (the LM head belongs to the top-level model).
    if (top.has("tie_word_embeddings")) m.text.tie_word_embeddings = top.opt_bool("tie_word_embeddings", false);
    if (m.text.eos_token_id.empty()) m.text.eos_token_id = top.int_or_list("eos_token_id");
    if (!m.text.bos_token_id) m.text.bos_token_id = top.opt_int("bos_token_id");
    if (!m.text.pad_token_id) m.text.pad_token_id = top.opt_int("pad_token_id");
    for (auto& s : m.sub_configs)
      if (s.key == "text_config") s.has_moe = m.text.num_moe_layers() > 0;
  } else {
    if (!find_text_type(m.model_type) || m.model_type == "qwen3_vl_moe_text")
      detail::fail(ErrorCode::unsupported, "{}: unsupported model_type '{}' (supported: {})", source, m.model_type,
                   supported_model_types());
    m.text = parse_text(top, m.model_type);
  }
  m.generation.eos_token_id = m.text.eos_token_id;
  m.generation.bos_token_id = m.text.bos_token_id;
  m.generation.pad_token_id = m.text.pad_token_id;
  return m;
}

ModelConfig load_model_config(const std::string& dir) {
  const fs::path d(dir);
  const fs::path cfg = d / "config.json";
  std::error_code ec;
  if (!fs::exists(cfg, ec)) detail::fail(ErrorCode::io, "no config.json in checkpoint directory {}", dir);
  ModelConfig m = parse_model_config(detail::read_text_file(cfg.string()), cfg.string());
  const fs::path gen = d / "generation_config.json";
  if (fs::exists(gen, ec)) {
    m.generation = parse_generation_config(detail::read_text_file(gen.string()), gen.string(), m.generation);
    m.has_generation_config = true;
  }
  return m;
}

}  // namespace moex
