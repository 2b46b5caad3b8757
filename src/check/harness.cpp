// check/harness.cpp — problem generator, poisoned/guarded outputs and the comparison with the
// f64 reference, shared by the tests and `moex check`.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "core/check.hpp"
#include "moex/check.hpp"
#include "moex/quant.hpp"

namespace moex::check {

namespace {

using Rng = std::mt19937_64;

constexpr int64_t kGuard = 64;  // guard elements on each side of the output

// Poison: a NaN with a payload no computation produces.
void poison_value(DType dt, void* dst) {
  if (dt == DType::f32) {
    const uint32_t v = 0x7fbadbadu;
    std::memcpy(dst, &v, 4);
  } else {
    const uint16_t v = 0x7ffe;
    std::memcpy(dst, &v, 2);
  }
}

void store_value(const TensorView& t, int64_t i, double v) {
  switch (t.dtype) {
    case DType::f32: t.ptr<float>()[i] = float(v); break;
    case DType::bf16: t.ptr<uint16_t>()[i] = float_to_bf16(float(v)); break;
    case DType::f16: t.ptr<uint16_t>()[i] = float_to_f16(float(v)); break;
    case DType::i32: t.ptr<int32_t>()[i] = int32_t(v); break;
    case DType::i64: t.ptr<int64_t>()[i] = int64_t(v); break;
    default: MOEX_ASSERT(false);
  }
}

double load_value(DType dt, const void* base, int64_t i) {
  switch (dt) {
    case DType::f32: return static_cast<const float*>(base)[i];
    case DType::bf16: return bf16_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::f16: return f16_to_float(static_cast<const uint16_t*>(base)[i]);
    default: return 0.0;
  }
}

// Fills a logical [E, out, in] weight tensor stored as [E, out, in] or [E, in, out].
// Integer mode: at most 2 non-zero ±1 per output row, which keeps every intermediate of the
// exact cases representable in bf16 (see generate_cases).
void fill_weights(Rng& rng, const TensorView& t, int64_t E, int64_t out, int64_t in, bool transposed, bool integer, double scale) {
  std::normal_distribution<double> normal(0.0, scale);
  std::uniform_int_distribution<int64_t> pick(0, std::max<int64_t>(in - 1, 0));
  std::bernoulli_distribution coin(0.5);
  for (int64_t e = 0; e < E; ++e)
    for (int64_t o = 0; o < out; ++o) {
      int64_t nz1 = -1, nz2 = -1;
      if (integer) {
        nz1 = pick(rng);
        nz2 = coin(rng) ? pick(rng) : -1;
      }
      for (int64_t i = 0; i < in; ++i) {
        double v = integer ? 0.0 : normal(rng);
        if (integer && (i == nz1 || i == nz2)) v = coin(rng) ? 1.0 : -1.0;
        if (integer && nz1 == nz2 && i == nz1) v = 1.0;
        const int64_t idx = transposed ? (e * in + i) * out + o : (e * out + o) * in + i;
        store_value(t, idx, v);
      }
    }
}

void fill_routing(Rng& rng, const Case& c, const TensorView& idx, const TensorView& w) {
  const int64_t T = c.tokens, K = c.top_k, E = c.spec.num_experts;
  std::vector<int64_t> perm(static_cast<size_t>(E));
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  for (int64_t t = 0; t < T; ++t) {
    std::iota(perm.begin(), perm.end(), 0);
    int64_t pool = E;
    if (c.routing == Routing::empty_experts) pool = std::max(K, E / 2);
    if (c.routing == Routing::one_expert) {
      std::shuffle(perm.begin(), perm.begin() + K, rng);  // experts 0..K-1, expert 0 in every token
    } else if (c.routing == Routing::skewed) {
      // weighted sampling without replacement, weight ∝ 1/(e+1)^3: a few experts take most pairs
      std::vector<double> key(static_cast<size_t>(E));
      for (int64_t e = 0; e < E; ++e) key[size_t(e)] = std::pow(uni(rng), std::pow(double(e + 1), 3.0));
      std::sort(perm.begin(), perm.end(), [&](int64_t a, int64_t b) { return key[size_t(a)] > key[size_t(b)]; });
    } else {
      for (int64_t j = 0; j < K; ++j) {  // partial Fisher–Yates over the pool
        std::uniform_int_distribution<int64_t> d(j, pool - 1);
        std::swap(perm[size_t(j)], perm[size_t(d(rng))]);
      }
    }
    double sum = 0.0;
    std::vector<double> ws(static_cast<size_t>(K));
    for (int64_t j = 0; j < K; ++j) {
      // exact cases: |y| <= 19 per slot; weights in {1, 0.5} keep Σ_K within bf16's 8 bits for K <= 4
      ws[size_t(j)] = c.integer_valued ? (K <= 4 && uni(rng) < 0.5 ? 0.5 : 1.0) : 0.05 + uni(rng);
      sum += ws[size_t(j)];
    }
    for (int64_t j = 0; j < K; ++j) {
      int64_t e = perm[size_t(j)];
      if (c.routing == Routing::dropped && uni(rng) < 0.2) e = uni(rng) < 0.5 ? -1 : E + int64_t(uni(rng) * 3);
      store_value(idx, t * K + j, double(e));
      store_value(w, t * K + j, c.integer_valued ? ws[size_t(j)] : ws[size_t(j)] / sum);
    }
  }
}

// The output buffer with guard elements on both sides, poisoned.
struct GuardedOut {
  Tensor buffer;  // [kGuard + T*H + kGuard]
  int64_t n;
  DType dt;
  Device dev;
  TensorView view(int64_t T, int64_t H) const {
    const char* base = static_cast<const char*>(buffer.data()) + kGuard * int64_t(dtype_size(dt));
    return TensorView(base, dt, {T, H}, dev);
  }
};

std::vector<char> poisoned_host(DType dt, int64_t n) {
  const size_t esz = dtype_size(dt);
  std::vector<char> host(size_t(n) * esz);
  for (int64_t i = 0; i < n; ++i) poison_value(dt, host.data() + size_t(i) * esz);
  return host;
}

// Replaces the plain weights of a quantized case by their FP8 / FP4 codes and scales, keeping the
// plain ones in gate_up_plain / down_plain.
void quantize_instance(Instance& in) {
  const ExpertsSpec& s = in.c.spec;
  const QuantSpec& q = s.quant;
  const int64_t E = s.num_experts, H = s.hidden, I = s.intermediate, R = s.gate_up_rows();
  in.gate_up_plain = in.gate_up;
  in.down_plain = in.down;
  auto quantize = [&](const Tensor& plain, int64_t out, int64_t inn, Tensor& codes, Tensor& scales) {
    std::vector<float> logical(static_cast<size_t>(out * inn));
    auto bc = [](int64_t n, int64_t b) { return (n + b - 1) / b; };
    if (q.kind == QuantKind::fp8_block) {
      MOEX_CHECK(!in.c.zero_weight_blocks || q.scale_format == ScaleFormat::f32, "zero_weight_blocks needs f32 scales (UE8M0 has no zero)");
      codes = s.transposed ? Tensor::empty(DType::fp8_e4m3, {E, inn, out}) : Tensor::empty(DType::fp8_e4m3, {E, out, inn});
      const int64_t br = bc(out, q.block_n), bk = bc(inn, q.block_k);
      scales = Tensor::empty(q.scale_format == ScaleFormat::ue8m0 ? DType::u8 : DType::f32, {E, br, bk});
      std::vector<uint8_t> qc(logical.size());
      for (int64_t e = 0; e < E; ++e) {
        for (int64_t o = 0; o < out; ++o)
          for (int64_t i = 0; i < inn; ++i)
            logical[size_t(o * inn + i)] = float(load_value(plain.dtype(), plain.data(), s.transposed ? (e * inn + i) * out + o : (e * out + o) * inn + i));
        void* sc = static_cast<char*>(scales.data()) + size_t(e * br * bk) * dtype_size(scales.dtype());
        // zero_weight_blocks: blocks (o / block_n + i / block_k + e) % 3 == 0 zeroed in the plain weights too
        auto zeroed = [&](int64_t o, int64_t i) { return (o / q.block_n + i / q.block_k + e) % 3 == 0; };
        if (in.c.zero_weight_blocks)
          for (int64_t o = 0; o < out; ++o)
            for (int64_t i = 0; i < inn; ++i)
              if (zeroed(o, i)) {
                logical[size_t(o * inn + i)] = 0.0f;
                store_value(plain, s.transposed ? (e * inn + i) * out + o : (e * out + o) * inn + i, 0.0);
              }
        quantize_fp8_blocks(logical.data(), out, inn, q.block_n, q.block_k, q.scale_format, qc.data(), sc);
        if (in.c.zero_weight_blocks)
          for (int64_t b = 0; b < br * bk; ++b)
            if (zeroed((b / bk) * q.block_n, (b % bk) * q.block_k)) static_cast<float*>(sc)[b] = 0.0f;
        for (int64_t o = 0; o < out; ++o)
          for (int64_t i = 0; i < inn; ++i)
            codes.ptr<uint8_t>()[s.transposed ? (e * inn + i) * out + o : (e * out + o) * inn + i] = qc[size_t(o * inn + i)];
      }
    } else {
      const int64_t rb = (inn + 1) / 2, groups = bc(inn, q.block_k);
      codes = Tensor::empty(DType::u8, {E, out, rb});
      scales = Tensor::empty(DType::u8, {E, out, groups});
      for (int64_t e = 0; e < E; ++e) {
        for (int64_t k = 0; k < out * inn; ++k) logical[size_t(k)] = float(load_value(plain.dtype(), plain.data(), e * out * inn + k));
        quantize_fp4_groups(logical.data(), out, inn, q.block_k, codes.ptr<uint8_t>() + e * out * rb, scales.ptr<uint8_t>() + e * out * groups);
      }
    }
  };
  quantize(in.gate_up_plain, R, H, in.gate_up, in.gate_up_scale);
  quantize(in.down_plain, H, I, in.down, in.down_scale);
}

}  // namespace

const char* routing_name(Routing r) {
  switch (r) {
    case Routing::random: return "random";
    case Routing::one_expert: return "one_expert";
    case Routing::skewed: return "skewed";
    case Routing::empty_experts: return "empty_experts";
    case Routing::dropped: return "dropped";
  }
  return "?";
}

const char* status_name(Result::Status s) {
  switch (s) {
    case Result::Status::passed: return "passed";
    case Result::Status::failed: return "FAILED";
    case Result::Status::skipped: return "skipped";
  }
  return "?";
}

std::string Case::describe() const {
  return fmt::format("seed={} T={} K={} {} idx={} w={} routing={}{}{}", seed, tokens, top_k, spec.describe(),
                     dtype_name(index_dtype), dtype_name(weights_dtype), routing_name(routing), integer_valued ? " exact" : "",
                     zero_weight_blocks ? " zero-blocks" : "");
}

Tolerance tolerance_for(const Case& c) {
  if (c.integer_valued) return {0.0, "integer-valued inputs: every intermediate is exactly representable, so exact"};
  if (c.spec.quant.quantized())
    return {c.spec.dtype == DType::bf16 ? 4e-3 : 2e-3,
            "quantized experts vs the reference with the same quantization (SPEC §8: 2e-3; bf16 output rounding alone is ~1.1e-3, "
            "so 4e-3 for bf16 activations)"};
  switch (c.spec.dtype) {
    case DType::f32: return {1e-5, "f32 accumulation of f32 products (SPEC §8), no TF32"};
    case DType::f16: return {2e-3, "f16 inputs/intermediate/output rounding (SPEC §8)"};
    default: return {1e-2, "bf16 inputs/intermediate/output rounding (SPEC §8)"};
  }
}

Instance make_instance(const Case& c) {
  const ExpertsSpec& s = c.spec;
  const int64_t E = s.num_experts, H = s.hidden, I = s.intermediate, R = s.gate_up_rows(), T = c.tokens, K = c.top_k;
  MOEX_CHECK(E >= 1 && H >= 1 && I >= 1 && K >= 1 && K <= E && T >= 0, "bad check case: {}", c.describe());
  Rng rng(c.seed);
  Instance in;
  in.c = c;
  const DType dt = s.dtype;
  if (s.transposed) {
    in.gate_up = Tensor::empty(dt, {E, H, R});
    in.down = Tensor::empty(dt, {E, I, H});
  } else {
    in.gate_up = Tensor::empty(dt, {E, R, H});
    in.down = Tensor::empty(dt, {E, H, I});
  }
  const bool integer = c.integer_valued;
  fill_weights(rng, in.gate_up, E, R, H, s.transposed, integer, 1.0 / std::sqrt(double(H)));
  fill_weights(rng, in.down, E, H, I, s.transposed, integer, 1.0 / std::sqrt(double(I)));
  if (s.quant.quantized()) quantize_instance(in);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_int_distribution<int> small(-1, 1);
  auto fill = [&](const Tensor& t, double scale) {
    for (int64_t i = 0; i < t.numel(); ++i) store_value(t, i, integer ? double(small(rng)) : scale * normal(rng));
  };
  if (s.has_bias) {
    in.gate_up_bias = Tensor::empty(dt, {E, R});
    in.down_bias = Tensor::empty(dt, {E, H});
    fill(in.gate_up_bias, 0.1);
    fill(in.down_bias, 0.1);
  }
  in.hidden = Tensor::empty(dt, {T, H});
  fill(in.hidden, 1.0);
  in.top_k_index = Tensor::empty(c.index_dtype, {T, K});
  in.top_k_weights = Tensor::empty(c.weights_dtype, {T, K});
  fill_routing(rng, c, in.top_k_index, in.top_k_weights);
  return in;
}

Experts Instance::plain_experts() const {
  if (!c.spec.quant.quantized()) return experts();
  Experts ex = experts();
  ex.spec.quant = QuantSpec::none();
  ex.gate_up = gate_up_plain;
  ex.down = down_plain;
  ex.gate_up_scale = TensorView();
  ex.down_scale = TensorView();
  return ex;
}

Experts Instance::experts() const {
  Experts ex;
  ex.spec = c.spec;
  ex.gate_up = gate_up;
  ex.down = down;
  if (c.spec.quant.quantized()) {
    ex.gate_up_scale = gate_up_scale;
    ex.down_scale = down_scale;
  }
  if (c.spec.has_bias) {
    ex.gate_up_bias = gate_up_bias;
    ex.down_bias = down_bias;
  }
  return ex;
}

ExpertsCall Instance::call(const TensorView& out) const { return ExpertsCall{hidden, top_k_index, top_k_weights, out}; }

Instance Instance::to(Device dev) const {
  Instance r;
  r.c = c;
  auto mv = [&](const Tensor& t) { return t.view().defined() ? t.to(dev) : Tensor(); };
  r.gate_up = mv(gate_up);
  r.down = mv(down);
  r.gate_up_bias = mv(gate_up_bias);
  r.down_bias = mv(down_bias);
  r.hidden = mv(hidden);
  r.top_k_index = mv(top_k_index);
  r.top_k_weights = mv(top_k_weights);
  r.gate_up_scale = mv(gate_up_scale);
  r.down_scale = mv(down_scale);
  r.gate_up_plain = mv(gate_up_plain);
  r.down_plain = mv(down_plain);
  return r;
}

PreparedCase::PreparedCase(const Case& c, Device dev)
    : host_(make_instance(c)), on_dev_(dev.is_cpu() ? host_ : host_.to(dev)), dev_(dev) {
  const TensorView shape(nullptr, c.spec.dtype, {c.tokens, c.spec.hidden});
  ref_ = reference_forward(host_.experts(), host_.call(shape));
  for (double v : ref_) ref_norm2_ += v * v;
  // FP8 experts must also stay close to the unquantized experts they came from (SPEC §8: 8e-2)
  if (c.spec.quant.kind == QuantKind::fp8_block) plain_ref_ = reference_forward(host_.plain_experts(), host_.call(shape));
}

Result PreparedCase::run(const std::string& name, const RunOptions& opts) const {
  const Case& c = host_.c;
  const int64_t T = c.tokens, H = c.spec.hidden;
  const DType dt = c.spec.dtype;
  const Tolerance tol = tolerance_for(c);
  Result res;
  res.tolerance = tol.rel_l2;
  Problem p = Problem::from(on_dev_.experts(), on_dev_.call(TensorView(nullptr, dt, {T, H}, dev_)));
  p.cpu_threads = opts.num_threads;
  Support sup = ExpertsInterface::global().supports(name, p);
  if (!sup.ok) {
    res.status = Result::Status::skipped;
    res.message = sup.reason;
    return res;
  }
  const int64_t n = T * H + 2 * kGuard;
  const std::vector<char> poison = poisoned_host(dt, n);
  Tensor buf = Tensor::empty(dt, {n}, dev_);
  copy_bytes(buf.data(), dev_, poison.data(), Device::cpu(), poison.size());
  GuardedOut out{buf, n, dt, dev_};
  try {
    experts_forward(name, on_dev_.experts(), on_dev_.call(out.view(T, H)), opts);
  } catch (const Error& e) {
    res.status = Result::Status::failed;
    res.message = std::string("threw: ") + e.what();
    return res;
  }
  std::vector<char> got(poison.size());
  copy_bytes(got.data(), Device::cpu(), buf.data(), dev_, got.size());
  const size_t esz = dtype_size(dt);
  std::string problem;
  // 1. guards untouched
  if (std::memcmp(got.data(), poison.data(), size_t(kGuard) * esz) != 0 ||
      std::memcmp(got.data() + size_t(n - kGuard) * esz, poison.data() + size_t(n - kGuard) * esz, size_t(kGuard) * esz) != 0)
    problem = "wrote outside the output (guard elements changed)";
  // 2. every element written, finite where the reference is finite; error norm
  double err2 = 0.0;
  const char* body = got.data() + size_t(kGuard) * esz;
  for (int64_t i = 0; i < T * H && problem.empty(); ++i) {
    if (std::memcmp(body + size_t(i) * esz, poison.data(), esz) == 0) {
      problem = fmt::format("output element {} (token {}, column {}) was never written", i, i / H, i % H);
      break;
    }
    const double v = load_value(dt, body, i);
    if (!std::isfinite(v) && std::isfinite(ref_[size_t(i)])) {
      problem = fmt::format("output element {} is {} but the reference is {}", i, v, ref_[size_t(i)]);
      break;
    }
    if (c.integer_valued && v != double(round_to(dt, float(ref_[size_t(i)])))) {
      problem = fmt::format("exact case: output element {} is {} but must be exactly {}", i, v, ref_[size_t(i)]);
      break;
    }
    err2 += (v - ref_[size_t(i)]) * (v - ref_[size_t(i)]);
  }
  res.rel_l2 = ref_norm2_ > 0 ? std::sqrt(err2 / ref_norm2_) : std::sqrt(err2);
  if (problem.empty() && !plain_ref_.empty()) {
    double e2 = 0, n2 = 0;
    for (int64_t i = 0; i < T * H; ++i) {
      const double d = load_value(dt, body, i) - plain_ref_[size_t(i)];
      e2 += d * d;
      n2 += plain_ref_[size_t(i)] * plain_ref_[size_t(i)];
    }
    const double rel = n2 > 0 ? std::sqrt(e2 / n2) : std::sqrt(e2);
    if (rel > 8e-2) problem = fmt::format("FP8 output is {:.3e} away from the unquantized reference (bar 8e-2)", rel);
  }
  if (problem.empty() && res.rel_l2 > tol.rel_l2)
    problem = fmt::format("relative L2 error {:.3e} exceeds {:.0e} ({})", res.rel_l2, tol.rel_l2, tol.reason);
  res.status = problem.empty() ? Result::Status::passed : Result::Status::failed;
  res.message = problem;
  return res;
}

std::vector<Result> run_case(const std::vector<std::string>& backends, const Case& c, Device dev, const RunOptions& opts) {
  const PreparedCase prepared(c, dev);
  std::vector<Result> results;
  for (const std::string& name : backends) results.push_back(prepared.run(name, opts));
  return results;
}

Result run_case(const std::string& backend, const Case& c, Device dev, const RunOptions& opts) {
  return run_case(std::vector<std::string>{backend}, c, dev, opts).front();
}

std::vector<Case> generate_cases(uint64_t seed, int count, DType dtype) {
  std::vector<Case> cases;
  Rng rng(seed);
  auto base = [&](int64_t E, int64_t H, int64_t I, int64_t T, int64_t K) {
    Case c;
    c.seed = rng();
    c.spec.num_experts = E;
    c.spec.hidden = H;
    c.spec.intermediate = I;
    c.spec.dtype = dtype;
    c.tokens = T;
    c.top_k = K;
    return c;
  };
  auto add = [&](Case c) {
    if (int(cases.size()) < count) cases.push_back(c);
  };
  // ---- fixed edge cases ----
  add(base(4, 32, 16, 0, 2));                                      // T = 0: empty output
  add(base(4, 32, 16, 1, 1));                                      // T = 1, K = 1
  add(base(4, 48, 24, 9, 4));                                      // K = E
  { Case c = base(8, 64, 32, 33, 2); c.routing = Routing::one_expert; add(c); }       // all tokens on expert 0
  { Case c = base(16, 40, 20, 17, 2); c.routing = Routing::empty_experts; add(c); }   // experts with no tokens
  { Case c = base(8, 56, 40, 23, 3); c.routing = Routing::dropped; add(c); }          // dropped slots
  { Case c = base(6, 129, 67, 19, 2); c.routing = Routing::skewed; add(c); }          // sizes off every tile
  { Case c = base(4, 64, 32, 12, 2); c.spec.transposed = true; add(c); }
  { Case c = base(4, 64, 32, 12, 2); c.spec.transposed = true; c.spec.interleaved = true; c.spec.has_bias = true;
    c.spec.activation = ActivationSpec::gpt_oss(); add(c); }                           // GPT-OSS layout
  { Case c = base(4, 64, 32, 12, 2); c.spec.has_gate = false; c.spec.activation.kind = Activation::gelu; add(c); }
  { Case c = base(4, 64, 32, 12, 2); c.spec.activation.kind = Activation::gelu_tanh; c.index_dtype = DType::i64; add(c); }
  { Case c = base(4, 64, 32, 12, 2); c.spec.activation.kind = Activation::relu; c.weights_dtype = dtype; add(c); }
  // integer-valued exact cases (relu keeps them exact; sparse ±1 weights keep intermediates small)
  auto exact = [&](Case c) {
    c.integer_valued = true;
    c.spec.activation.kind = Activation::relu;
    add(c);
  };
  exact(base(8, 256, 96, 64, 2));
  { Case c = base(8, 64, 32, 31, 3); c.routing = Routing::one_expert; exact(c); }
  { Case c = base(8, 64, 32, 31, 3); c.routing = Routing::dropped; exact(c); }
  { Case c = base(5, 70, 33, 21, 2); c.spec.transposed = true; c.spec.interleaved = true; c.spec.has_bias = true; exact(c); }
  { Case c = base(6, 50, 30, 7, 4); c.spec.has_gate = false; c.routing = Routing::skewed; exact(c); }
  // quantized experts (SPEC §6): FP8 128x128 blocks with f32 and UE8M0 scales, H and I off 128
  // (partial blocks), transposed, 1x128 blocks, FP4 with 1x32 UE8M0 groups
  { Case c = base(6, 300, 200, 21, 2); c.spec.quant = QuantSpec::fp8_block(128, 128, ScaleFormat::f32); add(c); }
  { Case c = base(6, 256, 136, 17, 3); c.spec.quant = QuantSpec::fp8_block(128, 128, ScaleFormat::ue8m0); c.routing = Routing::dropped; add(c); }
  { Case c = base(4, 130, 70, 9, 2); c.spec.quant = QuantSpec::fp8_block(1, 128); c.spec.transposed = true; c.spec.has_bias = true; add(c); }
  { Case c = base(5, 192, 96, 13, 2); c.spec.quant = QuantSpec::fp4_group(32); c.routing = Routing::skewed; add(c); }
  // zero weight blocks with scale 0 (Case::zero_weight_blocks)
  { Case c = base(6, 300, 256, 19, 2); c.spec.quant = QuantSpec::fp8_block(128, 128, ScaleFormat::f32); c.zero_weight_blocks = true; add(c); }
  // ---- random shapes ----
  std::uniform_int_distribution<int> coin(0, 1), pick5(0, 4), pick4(0, 3);
  while (int(cases.size()) < count) {
    const int64_t E = std::uniform_int_distribution<int64_t>(1, 16)(rng);
    const int64_t K = std::uniform_int_distribution<int64_t>(1, std::min<int64_t>(E, 8))(rng);
    const int64_t T = coin(rng) ? std::uniform_int_distribution<int64_t>(0, 8)(rng) : std::uniform_int_distribution<int64_t>(9, 64)(rng);
    const int64_t H = std::uniform_int_distribution<int64_t>(1, 160)(rng);
    const int64_t I = std::uniform_int_distribution<int64_t>(1, 128)(rng);
    Case c = base(E, H, I, T, K);
    c.routing = static_cast<Routing>(pick5(rng));
    c.spec.transposed = coin(rng);
    c.spec.has_bias = coin(rng);
    c.spec.has_gate = pick4(rng) != 0;
    c.spec.interleaved = c.spec.has_gate && coin(rng);
    const Activation acts[] = {Activation::silu, Activation::gelu, Activation::gelu_tanh, Activation::relu, Activation::swiglu_clamped};
    c.spec.activation.kind = acts[pick5(rng)];
    if (!c.spec.has_gate && c.spec.activation.kind == Activation::swiglu_clamped) c.spec.activation.kind = Activation::silu;
    c.index_dtype = coin(rng) ? DType::i32 : DType::i64;
    c.weights_dtype = coin(rng) ? DType::f32 : dtype;
    c.integer_valued = pick5(rng) == 0;
    if (c.integer_valued) c.spec.activation.kind = Activation::relu;
    add(c);
  }
  return cases;
}

}  // namespace moex::check
