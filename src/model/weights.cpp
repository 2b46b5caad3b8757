// model/weights.cpp — checkpoint tensors → ModelWeights for the six families (see weights.hpp).
#include "model/weights.hpp"

#include <cstring>

#include "core/check.hpp"

namespace moex::model {

namespace {

std::string layer_prefix(const std::string& prefix, int64_t l) { return prefix + "layers." + std::to_string(l) + "."; }

// [E, A, B] → [E, B, A]
Tensor transpose_last2(const Tensor& t) {
  const int64_t E = t.size(0), A = t.size(1), B = t.size(2);
  Tensor o = Tensor::empty(t.dtype(), {E, B, A});
  const size_t es = dtype_size(t.dtype());
  const uint8_t* in = static_cast<const uint8_t*>(t.data());
  uint8_t* out = static_cast<uint8_t*>(o.data());
  for (int64_t e = 0; e < E; ++e)
    for (int64_t a = 0; a < A; ++a)
      for (int64_t b = 0; b < B; ++b)
        std::memcpy(out + ((e * B + b) * A + a) * es, in + ((e * A + a) * B + b) * es, es);
  return o;
}

class Loader {
 public:
  Loader(const Checkpoint& ck, DType dt, const LoadProgress& progress) : ck_(ck), dt_(dt), progress_(progress) {
    total_ = ck.size();
  }

  Tensor load(const std::string& name, const std::vector<int64_t>& shape) {
    Tensor t = ck_.load(name, dt_, shape);
    tick();
    return t;
  }
  Linear linear(const std::string& base, int64_t out, int64_t in, bool bias) {
    Linear l;
    l.weight = load(base + ".weight", {out, in});
    if (bias) l.bias = load(base + ".bias", {out});
    return l;
  }
  DenseMlp mlp(const std::string& base, int64_t hidden, int64_t inter, const char* g = "gate_proj",
               const char* u = "up_proj", const char* d = "down_proj") {
    DenseMlp m;
    m.gate = linear(base + "." + g, inter, hidden, false);
    m.up = linear(base + "." + u, inter, hidden, false);
    m.down = linear(base + "." + d, hidden, inter, false);
    return m;
  }
  // Per-expert gate/up/down → gate_up [E, 2I, H] (gate rows then up rows), down [E, H, I].
  void stack_experts(MoeWeights& w, const std::string& base, int64_t E, int64_t H, int64_t I, const char* g,
                     const char* u, const char* d) {
    // Every shape is checked before anything is allocated (a config can claim huge sizes).
    for (int64_t e = 0; e < E; ++e) {
      const std::string pe = base + std::to_string(e) + ".";
      ck_.check_shape(pe + g + ".weight", {I, H});
      ck_.check_shape(pe + u + ".weight", {I, H});
      ck_.check_shape(pe + d + ".weight", {H, I});
    }
    w.gate_up = Tensor::empty(dt_, {E, 2 * I, H});
    uint8_t* gu = static_cast<uint8_t*>(w.gate_up.data());
    const size_t block = size_t(I * H) * dtype_size(dt_);
    std::vector<std::string> down_names;
    for (int64_t e = 0; e < E; ++e) {
      const std::string pe = base + std::to_string(e) + ".";
      for (int half = 0; half < 2; ++half) {
        const std::string name = pe + (half ? u : g) + ".weight";
        ck_.check_shape(name, {I, H});
        const TensorView v = ck_.get(name);
        if (v.dtype != dt_ && !(is_float_activation(v.dtype) || v.dtype == DType::f64))
          detail::fail(ErrorCode::unsupported, "tensor '{}' in checkpoint {} has dtype {}, which cannot be converted to {}",
                       name, ck_.dir(), dtype_name(v.dtype), dtype_name(dt_));
        convert_elements(gu + size_t(2 * e + half) * block, dt_, v.data, v.dtype, I * H);
        tick();
      }
      down_names.push_back(pe + d + ".weight");
    }
    w.down = ck_.load_stacked(down_names, dt_, {H, I});
    for (size_t i = 0; i < down_names.size(); ++i) tick();
  }
  bool has(const std::string& name) const { return ck_.has(name); }
  const Checkpoint& ck() const { return ck_; }
  DType dtype() const { return dt_; }

 private:
  void tick() {
    ++done_;
    if (progress_) progress_(std::min(done_, total_), total_);
  }
  const Checkpoint& ck_;
  DType dt_;
  const LoadProgress& progress_;
  size_t done_ = 0, total_ = 0;
};

AttentionWeights load_attention(Loader& L, const TextConfig& t, const std::string& p) {
  AttentionWeights a;
  const int64_t H = t.hidden_size, nh = t.num_attention_heads, nkv = t.num_key_value_heads, hd = t.head_dim;
  const std::string s = p + "self_attn.";
  if (t.family == ModelFamily::deepseek_v3) {
    const int64_t qk_head = t.qk_nope_head_dim + t.qk_rope_head_dim;
    if (t.q_lora_rank > 0) {
      a.q_a = L.linear(s + "q_a_proj", t.q_lora_rank, H, t.attention_bias);
      a.q_a_norm = L.load(s + "q_a_layernorm.weight", {t.q_lora_rank});
      a.q_b = L.linear(s + "q_b_proj", nh * qk_head, t.q_lora_rank, false);
    } else {
      a.q = L.linear(s + "q_proj", nh * qk_head, H, false);
    }
    a.kv_a = L.linear(s + "kv_a_proj_with_mqa", t.kv_lora_rank + t.qk_rope_head_dim, H, t.attention_bias);
    a.kv_a_norm = L.load(s + "kv_a_layernorm.weight", {t.kv_lora_rank});
    a.kv_b = L.linear(s + "kv_b_proj", nh * (t.qk_nope_head_dim + t.v_head_dim), t.kv_lora_rank, false);
    a.o = L.linear(s + "o_proj", H, nh * t.v_head_dim, t.attention_bias);
    return a;
  }
  a.q = L.linear(s + "q_proj", nh * hd, H, t.qkv_bias);
  a.k = L.linear(s + "k_proj", nkv * hd, H, t.qkv_bias);
  a.v = L.linear(s + "v_proj", nkv * hd, H, t.qkv_bias);
  a.o = L.linear(s + "o_proj", H, nh * hd, t.o_bias);
  if (t.qk_norm) {
    const bool per_head = t.family == ModelFamily::qwen3_moe;
    a.q_norm = L.load(s + "q_norm.weight", {per_head ? hd : nh * hd});
    a.k_norm = L.load(s + "k_norm.weight", {per_head ? hd : nkv * hd});
  }
  if (t.attention_sinks) a.sinks = L.load(s + "sinks", {nh});
  return a;
}

MoeWeights load_moe(Loader& L, const TextConfig& t, const std::string& p) {
  MoeWeights w;
  const int64_t H = t.hidden_size, E = t.num_experts, I = t.moe_intermediate_size;
  const DType dt = L.dtype();
  w.experts.spec = experts_spec(t, dt);

  if (t.family == ModelFamily::gpt_oss) {
    const std::string m = p + "mlp.";
    w.router = L.linear(m + "router", E, H, true);
    w.gate_up = L.load(m + "experts.gate_up_proj", {E, H, 2 * I});
    w.gate_up_bias = L.load(m + "experts.gate_up_proj_bias", {E, 2 * I});
    w.down = L.load(m + "experts.down_proj", {E, I, H});
    w.down_bias = L.load(m + "experts.down_proj_bias", {E, H});
  } else {
    // Mixtral's hub keys live under block_sparse_moe with w1 (gate), w3 (up), w2 (down).
    const bool mixtral_names = t.family == ModelFamily::mixtral && L.has(p + "block_sparse_moe.gate.weight");
    const std::string m = p + (mixtral_names ? "block_sparse_moe." : "mlp.");
    w.router = L.linear(m + "gate", E, H, false);
    if (t.family == ModelFamily::deepseek_v3) w.e_score_correction_bias = L.load(m + "gate.e_score_correction_bias", {E});
    if (L.has(m + "experts.gate_up_proj")) {
      // Fused experts: [E, 2I, H] / [E, H, I] (transformers 5) or [E, H, 2I] / [E, I, H] (hub, transposed).
      const auto& gi = L.ck().info(m + "experts.gate_up_proj");
      const auto& di = L.ck().info(m + "experts.down_proj");
      const std::vector<int64_t> std_gu{E, 2 * I, H}, tr_gu{E, H, 2 * I}, std_d{E, H, I}, tr_d{E, I, H};
      bool transposed;
      if (gi.shape == std_gu && gi.shape != tr_gu) transposed = false;
      else if (gi.shape == tr_gu && gi.shape != std_gu) transposed = true;
      else transposed = di.shape == tr_d && di.shape != std_d;  // H == 2I: the down projection decides
      w.gate_up = L.load(m + "experts.gate_up_proj", transposed ? tr_gu : std_gu);
      w.down = L.load(m + "experts.down_proj", transposed ? tr_d : std_d);
      if (transposed) {
        w.gate_up = transpose_last2(w.gate_up);
        w.down = transpose_last2(w.down);
      }
    } else if (mixtral_names) {
      L.stack_experts(w, m + "experts.", E, H, I, "w1", "w3", "w2");
    } else {
      L.stack_experts(w, m + "experts.", E, H, I, "gate_proj", "up_proj", "down_proj");
    }
    if (t.family == ModelFamily::qwen2_moe && t.shared_expert_intermediate_size > 0) {
      w.shared = L.mlp(m + "shared_expert", H, t.shared_expert_intermediate_size);
      w.shared_gate = L.linear(m + "shared_expert_gate", 1, H, false);
    }
    if (t.family == ModelFamily::deepseek_v3 && t.n_shared_experts > 0)
      w.shared = L.mlp(m + "shared_experts", H, I * t.n_shared_experts);
  }
  w.experts.gate_up = w.gate_up.view();
  w.experts.down = w.down.view();
  if (w.experts.spec.has_bias) {
    w.experts.gate_up_bias = w.gate_up_bias.view();
    w.experts.down_bias = w.down_bias.view();
  }
  return w;
}

}  // namespace

ExpertsSpec experts_spec(const TextConfig& t, DType dtype) {
  ExpertsSpec s;
  s.num_experts = t.num_experts;
  s.hidden = t.hidden_size;
  s.intermediate = t.moe_intermediate_size;
  s.dtype = dtype;
  if (t.family == ModelFamily::gpt_oss) {
    s.has_bias = true;
    s.transposed = true;
    s.interleaved = true;
    s.activation = ActivationSpec::gpt_oss(float(t.swiglu_alpha), float(t.swiglu_limit));
  } else {
    s.activation.kind = parse_activation(t.hidden_act);
  }
  return s;
}

ModelWeights load_weights(const Checkpoint& ck, const ModelConfig& cfg, DType dtype, const LoadProgress& progress) {
  MOEX_CHECK(dtype == DType::f32 || dtype == DType::f16 || dtype == DType::bf16,
             "model dtype must be f32, f16 or bf16, got {}", dtype_name(dtype));
  const TextConfig& t = cfg.text;
  ModelWeights w;
  w.dtype = dtype;
  // Where the decoder's tensors live.
  std::string lm_head = "lm_head.weight";
  if (cfg.composite()) {
    const std::pair<const char*, const char*> candidates[] = {
        {"model.language_model.", "lm_head.weight"},
        {"language_model.model.", "language_model.lm_head.weight"},
        {"model.", "lm_head.weight"}};
    for (const auto& [pre, head] : candidates) {
      if (ck.has(std::string(pre) + "embed_tokens.weight")) {
        w.prefix = pre;
        lm_head = head;
        break;
      }
    }
    if (w.prefix.empty())
      detail::fail(ErrorCode::not_found,
                   "checkpoint {} has no text-model embeddings (looked for model.language_model.embed_tokens.weight, "
                   "language_model.model.embed_tokens.weight, model.embed_tokens.weight)",
                   ck.dir());
  } else {
    w.prefix = "model.";
  }
  Loader L(ck, dtype, progress);
  const int64_t H = t.hidden_size, V = t.vocab_size;
  w.embed = L.load(w.prefix + "embed_tokens.weight", {V, H});
  w.final_norm = L.load(w.prefix + "norm.weight", {H});
  w.tied = t.tie_word_embeddings;
  w.lm_head = w.tied ? w.embed : L.load(lm_head, {V, H});

  w.layers.resize(size_t(t.num_hidden_layers));
  for (int64_t l = 0; l < t.num_hidden_layers; ++l) {
    LayerWeights& lw = w.layers[size_t(l)];
    const std::string p = layer_prefix(w.prefix, l);
    lw.input_norm = L.load(p + "input_layernorm.weight", {H});
    lw.post_attention_norm = L.load(p + "post_attention_layernorm.weight", {H});
    lw.attn = load_attention(L, t, p);
    lw.is_moe = t.is_moe_layer(l);
    if (lw.is_moe) lw.moe = load_moe(L, t, p);
    else lw.mlp = L.mlp(p + "mlp", H, t.intermediate_size);
  }
  return w;
}

}  // namespace moex::model
