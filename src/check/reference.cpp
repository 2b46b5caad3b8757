// check/reference.cpp — the f64 oracle: a plain loop over tokens and slots, no intermediate
// rounding, every layout flag read by index. It is written to be obviously right; the only
// concessions to speed (the GPU suite runs it for ~100 cases per dtype) are the per-expert f64
// weight copies and the tokens in parallel, neither of which changes a result bit.
#include <cmath>

#include "core/check.hpp"
#include "moex/check.hpp"
#include "moex/quant.hpp"

namespace moex::check {

namespace {

double at(const TensorView& t, int64_t i) {
  switch (t.dtype) {
    case DType::f32: return t.ptr<float>()[i];
    case DType::f64: return t.ptr<double>()[i];
    case DType::bf16: return bf16_to_float(t.ptr<uint16_t>()[i]);
    case DType::f16: return f16_to_float(t.ptr<uint16_t>()[i]);
    case DType::i32: return t.ptr<int32_t>()[i];
    case DType::i64: return double(t.ptr<int64_t>()[i]);
    default: detail::fail(ErrorCode::invalid_argument, "reference: unsupported dtype {}", dtype_name(t.dtype));
  }
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// Element (o, i) of expert e's logical [out, in] weight matrix, dequantized when quantized.
double weight_at(const ExpertsSpec& s, const TensorView& w, const TensorView& scale, int64_t e, int64_t out, int64_t in,
                 int64_t o, int64_t i) {
  const QuantSpec& q = s.quant;
  if (q.kind == QuantKind::fp4_group) {
    const int64_t row_bytes = (in + 1) / 2, groups = (in + q.block_k - 1) / q.block_k;
    const uint8_t code = fp4_nibble(w.ptr<uint8_t>() + (e * out + o) * row_bytes, i);
    return double(e2m1_to_float(code)) * ue8m0_to_float(scale.ptr<uint8_t>()[(e * out + o) * groups + i / q.block_k]);
  }
  const int64_t idx = s.transposed ? (e * in + i) * out + o : (e * out + o) * in + i;
  if (q.kind == QuantKind::none) return at(w, idx);
  const int64_t br = (out + q.block_n - 1) / q.block_n, bc = (in + q.block_k - 1) / q.block_k;
  const int64_t si = (e * br + o / q.block_n) * bc + i / q.block_k;
  const double sc = q.scale_format == ScaleFormat::ue8m0 ? double(ue8m0_to_float(scale.ptr<uint8_t>()[si])) : double(scale.ptr<float>()[si]);
  return double(e4m3_to_float(w.ptr<uint8_t>()[idx])) * sc;
}

// Quantized experts quantize their GEMM inputs dynamically: e4m3 per 128 channels (SPEC §6).
void fake_quantize(std::vector<double>& v) {
  std::vector<float> f(v.begin(), v.end());
  std::vector<uint8_t> q(f.size());
  std::vector<float> sc((f.size() + 127) / 128);
  quantize_activation_row(f.data(), int64_t(f.size()), 128, q.data(), sc.data());
  for (size_t i = 0; i < v.size(); ++i) v[i] = double(e4m3_to_float(q[i])) * sc[i / 128];
}

double act_gated(const ActivationSpec& a, double g, double u) {
  switch (a.kind) {
    case Activation::silu: return g * sigmoid(g) * u;
    case Activation::gelu: return 0.5 * g * (1.0 + std::erf(g / std::sqrt(2.0))) * u;
    case Activation::gelu_tanh: return 0.5 * g * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g))) * u;
    case Activation::relu: return (g > 0 ? g : 0.0) * u;
    case Activation::swiglu_clamped: {
      g = std::min(g, double(a.limit));
      u = std::max(std::min(u, double(a.limit)), -double(a.limit));
      return (u + 1.0) * g * sigmoid(double(a.alpha) * g);
    }
  }
  return 0.0;
}

double act_plain(const ActivationSpec& a, double x) {
  switch (a.kind) {
    case Activation::silu: return x * sigmoid(x);
    case Activation::gelu: return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
    case Activation::gelu_tanh: return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
    case Activation::relu: return x > 0 ? x : 0.0;
    case Activation::swiglu_clamped: return x;
  }
  return 0.0;
}

// Expert e's logical [out, in] weight matrix, dequantized to f64: copied once per call for the
// experts the routing hits, so that the loops below are plain dot products, or read through
// weight_at per use when the copy would pass 1 GiB.
class ExpertWeights {
 public:
  ExpertWeights(const ExpertsSpec& s, const TensorView& w, const TensorView& scale, const std::vector<char>& hit, int64_t out,
                int64_t in)
      : s_(s), w_(w), scale_(scale), out_(out), in_(in), dense_(hit.size()) {
    const int64_t E = int64_t(hit.size());
    if (E * out * in * 8 > (int64_t(1) << 30)) return;
    for (int64_t e = 0; e < E; ++e)
      if (hit[size_t(e)]) dense_[size_t(e)].resize(size_t(out * in));
#pragma omp parallel for collapse(2) schedule(static) if (E * out * in > (1 << 16))
    for (int64_t e = 0; e < E; ++e)
      for (int64_t o = 0; o < out; ++o)
        if (hit[size_t(e)])
          for (int64_t i = 0; i < in; ++i) dense_[size_t(e)][size_t(o * in + i)] = weight_at(s, w, scale, e, out, in, o, i);
  }
  // acc + Σ_i v[i] · W[e][o, i], added in order of i
  double dot(int64_t e, int64_t o, const std::vector<double>& v, double acc) const {
    const std::vector<double>& d = dense_[size_t(e)];
    if (!d.empty()) {
      const double* row = d.data() + o * in_;
      for (int64_t i = 0; i < in_; ++i) acc += v[size_t(i)] * row[i];
    } else {
      for (int64_t i = 0; i < in_; ++i) acc += v[size_t(i)] * weight_at(s_, w_, scale_, e, out_, in_, o, i);
    }
    return acc;
  }

 private:
  const ExpertsSpec& s_;
  TensorView w_, scale_;
  int64_t out_, in_;
  std::vector<std::vector<double>> dense_;  // [E] -> [out * in], empty where not hit or too large
};

}  // namespace

// Tokens run in parallel (OpenMP); each token's slots are summed in slot order by one thread, so
// the result does not depend on the thread count.
std::vector<double> reference_forward(const Experts& ex, const ExpertsCall& call) {
  const ExpertsSpec& s = ex.spec;
  MOEX_CHECK(call.hidden.device.is_cpu(), "reference: tensors must be on the CPU");
  const int64_t T = call.hidden.shape[0], K = call.top_k_index.shape[1];
  const int64_t E = s.num_experts, H = s.hidden, I = s.intermediate, R = s.gate_up_rows();
  std::vector<double> out(size_t(T * H), 0.0);
  const bool quant = s.quant.quantized();
  std::vector<char> hit(size_t(E), 0);
  for (int64_t p = 0; p < T * K; ++p) {
    const double ed = at(call.top_k_index, p);
    if (ed >= 0 && ed < double(E)) hit[size_t(ed)] = 1;
  }
  if (T * K > 0) {  // at() rejects unsupported dtypes; do it here, not inside the parallel region
    (void)at(call.hidden, 0);
    (void)at(call.top_k_weights, 0);
    if (s.has_bias) (void)(at(ex.gate_up_bias, 0) + at(ex.down_bias, 0));
  }
  const ExpertWeights gate_up(s, ex.gate_up, ex.gate_up_scale, hit, R, H), down(s, ex.down, ex.down_scale, hit, H, I);
#pragma omp parallel if (T * K * (R * H + H * I) > (1 << 20))
  {
    std::vector<double> up(static_cast<size_t>(R)), hmid(static_cast<size_t>(I)), x(static_cast<size_t>(H));
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t j = 0; j < K; ++j) {
        const double ed = at(call.top_k_index, t * K + j);
        if (ed < 0 || ed >= double(E)) continue;  // dropped slot
        const int64_t e = int64_t(ed);
        for (int64_t h = 0; h < H; ++h) x[size_t(h)] = at(call.hidden, t * H + h);
        if (quant) fake_quantize(x);
        // up[r] = Σ_h x[t, h] · gate_up[e][r, h]   (transposed: gate_up[e][h, r])
        for (int64_t r = 0; r < R; ++r)
          up[size_t(r)] = gate_up.dot(e, r, x, s.has_bias ? at(ex.gate_up_bias, e * R + r) : 0.0);
        for (int64_t i = 0; i < I; ++i) {
          if (!s.has_gate) {
            hmid[size_t(i)] = act_plain(s.activation, up[size_t(i)]);
          } else if (s.interleaved) {
            hmid[size_t(i)] = act_gated(s.activation, up[size_t(2 * i)], up[size_t(2 * i + 1)]);
          } else {
            hmid[size_t(i)] = act_gated(s.activation, up[size_t(i)], up[size_t(I + i)]);
          }
        }
        if (quant) {  // the backends' down GEMM reads h rounded to the activation dtype, then quantized
          for (auto& v : hmid) v = double(round_to(s.dtype, float(v)));
          fake_quantize(hmid);
        }
        const double w = at(call.top_k_weights, t * K + j);
        for (int64_t h = 0; h < H; ++h)
          out[size_t(t * H + h)] += w * down.dot(e, h, hmid, s.has_bias ? at(ex.down_bias, e * H + h) : 0.0);
      }
    }
  }
  return out;
}

}  // namespace moex::check
