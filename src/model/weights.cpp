// model/weights.cpp — checkpoint tensors → ModelWeights for the six families (see weights.hpp).
#include "model/weights.hpp"

#include <cmath>
#include <cstring>
#include <numeric>

#include "core/check.hpp"
#include "moex/quant.hpp"

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

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t numel_of(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// The scale of an FP8 weight: "X.weight" → "X.weight_scale_inv"; "X.gate_up_proj" → "X.gate_up_proj_scale_inv".
std::string scale_name_of(const std::string& weight) { return weight + "_scale_inv"; }

// Block scales [lead..., rows, cols] as f32 plus the matching block grid.
struct ScaleGrid {
  std::vector<float> values;
  int64_t rows = 0, cols = 0;
  int which = 0;  // index of the candidate grid that matched
};

// The source scale-block row of a matrix row.
using RowMap = std::function<int64_t(int64_t row)>;

// FP8 block scales stored over a matrix, re-laid out as [E, ceil(rows / block_n), cols_blocks] in the
// descriptor's format: out[e, j, c] = src[e, row_map(j · block_n), c].
Tensor reblock_scales(const ScaleGrid& src, int64_t E, int64_t rows, int64_t block_n, const RowMap& row_map, bool ue8m0,
                      const std::string& what) {
  const int64_t nr = ceil_div(rows, block_n), nc = src.cols;
  Tensor out = Tensor::empty(ue8m0 ? DType::ue8m0 : DType::f32, {E, nr, nc});
  for (int64_t e = 0; e < E; ++e)
    for (int64_t j = 0; j < nr; ++j) {
      const int64_t sr = row_map(j * block_n);
      for (int64_t c = 0; c < nc; ++c) {
        const float v = src.values[size_t((e * src.rows + sr) * nc + c)];
        const int64_t o = (e * nr + j) * nc + c;
        if (ue8m0) {
          const uint8_t b = v > 0 ? float_to_ue8m0_ceil(v) : uint8_t(0);
          if (!(v > 0) || ue8m0_to_float(b) != v)
            detail::fail(ErrorCode::parse, "{}: scale {} is not a power of two but scale_fmt is \"ue8m0\"", what, v);
          out.ptr<uint8_t>()[o] = b;
        } else {
          out.ptr<float>()[o] = v;
        }
      }
    }
  return out;
}

class Loader {
 public:
  Loader(const Checkpoint& ck, DType dt, const LoadProgress& progress, const std::optional<Fp8QuantConfig>& fp8)
      : ck_(ck), dt_(dt), progress_(progress), fp8_(fp8) {
    total_ = ck.size();
  }

  bool is_fp8(const std::string& name) const { return ck_.has(name) && ck_.info(name).dtype == DType::fp8_e4m3; }

  // An e4m3 tensor is only meaningful with its quantization config.
  const Fp8QuantConfig& require_fp8(const std::string& name) const {
    if (!fp8_)
      detail::fail(ErrorCode::parse, "tensor '{}' in checkpoint {} is F8_E4M3 but config.json has no quantization_config",
                   name, ck_.dir());
    return *fp8_;
  }

  // Reads the scale tensor `name` of [lead..., rows, cols] matrices whose scale grid is one of
  // `grids` ({rows, cols} each). Accepts the grid's exact shape, or the grid flattened to one
  // dimension (the reference saves a single-row grid that way) when exactly one candidate has that
  // element count. Values are converted to f32 (float scales) or decoded (UE8M0 scales).
  ScaleGrid read_scales(const std::string& name, const std::vector<int64_t>& lead,
                        const std::vector<std::pair<int64_t, int64_t>>& grids, const std::string& weight) {
    const Fp8QuantConfig& q = require_fp8(weight);
    if (!ck_.has(name))
      detail::fail(ErrorCode::not_found, "FP8 weight '{}' in checkpoint {} has no scale tensor '{}'", weight, ck_.dir(), name);
    const SafetensorsTensorInfo& info = ck_.info(name);
    std::string expected;
    int match = -1;
    for (size_t i = 0; i < grids.size(); ++i) {
      std::vector<int64_t> full = lead, flat = lead;
      full.push_back(grids[i].first);
      full.push_back(grids[i].second);
      flat.push_back(grids[i].first * grids[i].second);
      expected += (expected.empty() ? "" : " or ") + shape_to_string(full);
      if (info.shape == full) {
        match = int(i);
        break;
      }
      if (info.shape == flat && match < 0) {
        bool unique = true;
        for (size_t k = 0; k < grids.size(); ++k)
          if (k != i && grids[k].first * grids[k].second == grids[i].first * grids[i].second) unique = false;
        if (unique) match = int(i);
      }
    }
    if (match < 0)
      detail::fail(ErrorCode::parse, "scale tensor '{}' in checkpoint {} has shape {} but weight '{}' with block {}x{} implies {}",
                   name, ck_.dir(), shape_to_string(info.shape), weight, q.block_n, q.block_k, expected);
    ScaleGrid g;
    g.rows = grids[size_t(match)].first;
    g.cols = grids[size_t(match)].second;
    g.which = match;
    const int64_t n = numel_of(info.shape);
    g.values.resize(size_t(n));
    const TensorView v = ck_.get(name);
    if (info.dtype == DType::ue8m0 || info.dtype == DType::u8) {
      if (!q.ue8m0_scales)
        detail::fail(ErrorCode::parse, "scale tensor '{}' in checkpoint {} is {} (UE8M0) but quantization_config's scale_fmt is \"float\"",
                     name, ck_.dir(), info.st_dtype);
      const uint8_t* b = static_cast<const uint8_t*>(v.data);
      for (int64_t i = 0; i < n; ++i) g.values[size_t(i)] = ue8m0_to_float(b[i]);
    } else if (info.dtype && (is_float_activation(*info.dtype) || *info.dtype == DType::f64)) {
      convert_elements(g.values.data(), DType::f32, v.data, v.dtype, n);
    } else {
      detail::fail(ErrorCode::parse, "scale tensor '{}' in checkpoint {} has dtype {} (expected F32, BF16, F16 or F8_E8M0)", name,
                   ck_.dir(), info.st_dtype);
    }
    for (float x : g.values)
      if (!std::isfinite(x) || x < 0)
        detail::fail(ErrorCode::parse, "scale tensor '{}' in checkpoint {} holds {} (scales must be finite and >= 0)", name,
                     ck_.dir(), x);
    tick();
    return g;
  }

  // One FP8 [rows, cols] linear weight dequantized to the model dtype (only experts run quantized).
  Tensor load_fp8_dequantized(const std::string& name, const std::vector<int64_t>& shape) {
    const Fp8QuantConfig& q = require_fp8(name);
    ck_.check_shape(name, shape);
    MOEX_CHECK(shape.size() == 2, "FP8 tensor '{}' in checkpoint {} must be a matrix, the config implies {}", name, ck_.dir(),
               shape_to_string(shape));
    const int64_t rows = shape[0], cols = shape[1];
    const ScaleGrid g = read_scales(scale_name_of(name), {}, {{ceil_div(rows, q.block_n), ceil_div(cols, q.block_k)}}, name);
    std::vector<float> w(static_cast<size_t>(rows * cols));
    dequantize_fp8_blocks(static_cast<const uint8_t*>(ck_.get(name).data), g.values.data(), ScaleFormat::f32, rows, cols,
                          int(q.block_n), int(q.block_k), w.data());
    Tensor t = convert_tensor(TensorView(w.data(), DType::f32, {rows, cols}), dt_);
    tick();
    return t;
  }

  Tensor load(const std::string& name, const std::vector<int64_t>& shape) {
    if (is_fp8(name)) return load_fp8_dequantized(name, shape);
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

  void tick() {
    ++done_;
    if (progress_) progress_(std::min(done_, total_), total_);
  }

 private:
  const Checkpoint& ck_;
  DType dt_;
  const LoadProgress& progress_;
  const std::optional<Fp8QuantConfig>& fp8_;
  size_t done_ = 0, total_ = 0;
};

// Copies the e4m3 bytes of `name` (checked to be [rows, cols] F8_E4M3) to `dst`.
void copy_fp8(Loader& L, const std::string& name, int64_t rows, int64_t cols, uint8_t* dst) {
  L.ck().check_shape(name, {rows, cols});
  if (!L.is_fp8(name))
    detail::fail(ErrorCode::parse, "tensor '{}' in checkpoint {} is {} but the other experts of its layer are F8_E4M3", name,
                 L.ck().dir(), L.ck().info(name).st_dtype);
  std::memcpy(dst, L.ck().get(name).data, size_t(rows * cols));
  L.tick();
}

// FP8 routed experts of one layer → the descriptor layout (see load_weights in weights.hpp):
//   gate_up [E, 2I, H] e4m3 (gate rows, then up rows), down [E, H, I] e4m3,
//   gate_up_scale [E, ceil(2I / bn'), ceil(H / bk)], down_scale [E, ceil(H / bn'), ceil(I / bk)].
// `names` gives per-expert keys {gate, up, down} (prefix + e + "." + name + ".weight"), or is empty
// for the fused keys `gate_up_proj` / `down_proj` [E, 2I, H] / [E, H, I].
void load_fp8_experts(Loader& L, MoeWeights& w, const std::string& base, int64_t E, int64_t H, int64_t I,
                      const std::vector<std::string>& names, bool dequantize) {
  const std::string first = names.empty() ? base + "gate_up_proj" : base + "0." + names[0] + ".weight";
  const Fp8QuantConfig& q = L.require_fp8(first);
  const int64_t bn = q.block_n, bk = q.block_k;
  const int64_t kh = ceil_div(H, bk), ki = ceil_div(I, bk), half_rows = ceil_div(I, bn);
  // Every shape is checked before anything is allocated (a config can claim huge sizes).
  const std::string what = "FP8 experts under '" + base + "' in checkpoint " + L.ck().dir();
  for (int64_t e = 0; e < E && !names.empty(); ++e) {
    const std::string pe = base + std::to_string(e) + ".";
    L.ck().check_shape(pe + names[0] + ".weight", {I, H});
    L.ck().check_shape(pe + names[1] + ".weight", {I, H});
    L.ck().check_shape(pe + names[2] + ".weight", {H, I});
  }
  w.gate_up = Tensor::empty(DType::fp8_e4m3, {E, 2 * I, H});
  w.down = Tensor::empty(DType::fp8_e4m3, {E, H, I});
  uint8_t* gu = w.gate_up.ptr<uint8_t>();
  uint8_t* dn = w.down.ptr<uint8_t>();
  ScaleGrid gu_s, dn_s;
  bool per_half = true;  // gate and up have their own scale grids
  if (names.empty()) {
    const std::string g = base + "gate_up_proj", d = base + "down_proj";
    if (L.ck().info(g).shape == std::vector<int64_t>{E, H, 2 * I} && H != 2 * I)
      detail::fail(ErrorCode::unsupported, "{}: FP8 fused experts must be stored [E, 2I, H] / [E, H, I] (found '{}' {})", what, g,
                   shape_to_string(L.ck().info(g).shape));
    L.ck().check_shape(g, {E, 2 * I, H});
    L.ck().check_shape(d, {E, H, I});
    if (!L.is_fp8(d)) detail::fail(ErrorCode::parse, "{}: '{}' is F8_E4M3 but '{}' is not", what, g, d);
    // The fused grid (blocks over all 2I rows) or one grid per half (the reference allocates at least 2 rows).
    gu_s = L.read_scales(scale_name_of(g), {E}, {{ceil_div(2 * I, bn), kh}, {2 * half_rows, kh}}, g);
    per_half = gu_s.which == 1;
    dn_s = L.read_scales(scale_name_of(d), {E}, {{ceil_div(H, bn), ki}}, d);
    std::memcpy(gu, L.ck().get(g).data, size_t(E * 2 * I * H));
    std::memcpy(dn, L.ck().get(d).data, size_t(E * H * I));
    L.tick();
    L.tick();
  } else {
    // Per-expert e4m3 weights with per-expert scales (the hub's DeepSeek-V3 layout), or with the fused
    // scales `gate_up_proj_scale_inv` / `down_proj_scale_inv` [E, ·, ·] (what the reference's
    // save_pretrained writes: it splits the weights back per expert but not their scales).
    const bool fused_scales = !L.has(scale_name_of(first)) && L.has(base + "gate_up_proj_scale_inv");
    if (fused_scales) {
      gu_s = L.read_scales(base + "gate_up_proj_scale_inv", {E}, {{ceil_div(2 * I, bn), kh}, {2 * half_rows, kh}},
                           base + "{e}." + names[0] + ".weight");
      per_half = gu_s.which == 1;
      dn_s = L.read_scales(base + "down_proj_scale_inv", {E}, {{ceil_div(H, bn), ki}}, base + "{e}." + names[2] + ".weight");
    } else {
      gu_s.rows = 2 * half_rows;
      gu_s.cols = kh;
      gu_s.values.resize(size_t(E * gu_s.rows * kh));
      dn_s.rows = ceil_div(H, bn);
      dn_s.cols = ki;
      dn_s.values.resize(size_t(E * dn_s.rows * ki));
    }
    for (int64_t e = 0; e < E; ++e) {
      const std::string pe = base + std::to_string(e) + ".";
      for (int half = 0; half < 2; ++half) {
        const std::string name = pe + names[size_t(half)] + ".weight";
        copy_fp8(L, name, I, H, gu + (2 * e + half) * I * H);
        if (fused_scales) continue;
        const ScaleGrid s = L.read_scales(scale_name_of(name), {}, {{half_rows, kh}}, name);
        std::copy(s.values.begin(), s.values.end(), gu_s.values.begin() + (e * gu_s.rows + half * half_rows) * kh);
      }
      const std::string name = pe + names[2] + ".weight";
      copy_fp8(L, name, H, I, dn + e * H * I);
      if (fused_scales) continue;
      const ScaleGrid s = L.read_scales(scale_name_of(name), {}, {{dn_s.rows, ki}}, name);
      std::copy(s.values.begin(), s.values.end(), dn_s.values.begin() + e * dn_s.rows * ki);
    }
  }
  // Separate gate/up grids with I % bn != 0: re-block to gcd(I, bn) rows so that no block straddles the halves.
  const int64_t block_n = per_half && I % bn != 0 ? std::gcd(I, bn) : bn;
  const RowMap gu_rows = per_half ? RowMap([=](int64_t r) { return r < I ? r / bn : half_rows + (r - I) / bn; })
                                  : RowMap([=](int64_t r) { return r / bn; });
  const bool ue8m0 = q.ue8m0_scales;
  w.gate_up_scale = reblock_scales(gu_s, E, 2 * I, block_n, gu_rows, ue8m0, what);
  w.down_scale = reblock_scales(dn_s, E, H, block_n, [=](int64_t r) { return r / bn; }, ue8m0, what);
  QuantSpec spec = QuantSpec::fp8_block(int(block_n), int(bk), ue8m0 ? ScaleFormat::ue8m0 : ScaleFormat::f32);
  if (q.static_activations) spec.activation_scheme = ActivationScheme::static_;
  if (!dequantize) {
    w.experts.spec.quant = spec;
    return;
  }
  // "dequantize": bf16 (the model dtype) experts, one expert matrix at a time through f32.
  const DType dt = L.dtype();
  const ScaleFormat fmt = spec.scale_format;
  const size_t ss = ue8m0 ? 1 : 4;
  auto dequant = [&](const Tensor& qw, const Tensor& sc, int64_t rows, int64_t cols) {
    Tensor out = Tensor::empty(dt, {E, rows, cols});
    std::vector<float> buf(static_cast<size_t>(rows * cols));
    const int64_t srows = sc.size(1) * sc.size(2);
    for (int64_t e = 0; e < E; ++e) {
      dequantize_fp8_blocks(qw.ptr<uint8_t>() + e * rows * cols, static_cast<const uint8_t*>(sc.data()) + size_t(e * srows) * ss, fmt,
                            rows, cols, int(block_n), int(bk), buf.data());
      convert_elements(static_cast<uint8_t*>(out.data()) + size_t(e * rows * cols) * dtype_size(dt), dt, buf.data(), DType::f32,
                       rows * cols);
    }
    return out;
  };
  w.gate_up = dequant(w.gate_up, w.gate_up_scale, 2 * I, H);
  w.down = dequant(w.down, w.down_scale, H, I);
  w.gate_up_scale = Tensor();
  w.down_scale = Tensor();
}

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

MoeWeights load_moe(Loader& L, const TextConfig& t, const std::string& p, bool dequantize) {
  MoeWeights w;
  const int64_t H = t.hidden_size, E = t.num_experts, I = t.moe_intermediate_size;
  const DType dt = L.dtype();
  w.experts.spec = experts_spec(t, dt);

  if (t.family == ModelFamily::gpt_oss) {
    const std::string m = p + "mlp.";
    w.router = L.linear(m + "router", E, H, true);
    if (L.is_fp8(m + "experts.gate_up_proj") || L.is_fp8(m + "experts.down_proj"))
      detail::fail(ErrorCode::unsupported,
                   "checkpoint {}: FP8 gpt_oss experts (with biases) are not supported (the reference's FP8 experts have no "
                   "biases either); keep them unquantized (modules_to_not_convert)",
                   L.ck().dir());
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
    const std::vector<std::string> per_expert =
        mixtral_names ? std::vector<std::string>{"w1", "w3", "w2"} : std::vector<std::string>{"gate_proj", "up_proj", "down_proj"};
    if (L.is_fp8(m + "experts.gate_up_proj")) {
      load_fp8_experts(L, w, m + "experts.", E, H, I, {}, dequantize);
    } else if (L.is_fp8(m + "experts.0." + per_expert[0] + ".weight")) {
      load_fp8_experts(L, w, m + "experts.", E, H, I, per_expert, dequantize);
    } else if (L.has(m + "experts.gate_up_proj")) {
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
  if (w.experts.spec.quant.quantized()) {
    w.experts.gate_up_scale = w.gate_up_scale.view();
    w.experts.down_scale = w.down_scale.view();
  }
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

ModelWeights load_weights(const Checkpoint& ck, const ModelConfig& cfg, DType dtype, const LoadProgress& progress,
                          bool dequantize_experts) {
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
  Loader L(ck, dtype, progress, cfg.fp8);
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
    if (lw.is_moe) lw.moe = load_moe(L, t, p, dequantize_experts);
    else lw.mlp = L.mlp(p + "mlp", H, t.intermediate_size);
  }
  return w;
}

}  // namespace moex::model
