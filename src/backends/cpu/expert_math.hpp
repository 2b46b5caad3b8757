// backends/cpu/expert_math.hpp — the pieces of one expert's computation that every CPU backend
// shares: reading an expert's weights in place, the two projections on a block of rows, the
// gated activation, and the fixed-order reduction over the K slots (SPEC §1 numerics contract).
#pragma once
#include <cmath>
#include <omp.h>

#include <cstdint>

#include "backends/cpu/kernels.hpp"
#include "backends/cpu/packed_weights.hpp"
#include "backends/cpu/quant_math.hpp"
#include "moex/experts.hpp"

namespace moex::cpu {

// Element i of a tensor of dtype f32/f16/bf16 as f32.
inline float load_scalar(const void* base, DType dt, int64_t i) {
  switch (dt) {
    case DType::bf16: return bf16_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::f16: return f16_to_float(static_cast<const uint16_t*>(base)[i]);
    default: return static_cast<const float*>(base)[i];
  }
}

// The activation of one (gate, up) pair in f32.
inline float gated_act(const ActivationSpec& a, float g, float u) {
  switch (a.kind) {
    case Activation::silu: return g / (1.0f + std::exp(-g)) * u;
    case Activation::gelu: return 0.5f * g * (1.0f + std::erf(g * 0.70710678118654752f)) * u;
    case Activation::gelu_tanh: {
      const float c = 0.79788456080286536f;  // sqrt(2/pi)
      return 0.5f * g * (1.0f + std::tanh(c * (g + 0.044715f * g * g * g))) * u;
    }
    case Activation::relu: return (g > 0.0f ? g : (g == g ? 0.0f : g)) * u;
    case Activation::swiglu_clamped: {
      g = std::fmin(g, a.limit);
      u = std::fmax(std::fmin(u, a.limit), -a.limit);
      return (u + 1.0f) * (g / (1.0f + std::exp(-a.alpha * g)));
    }
  }
  return 0.0f;
}
// The activation without a gate (has_gate = false): h = act(x).
inline float plain_act(const ActivationSpec& a, float x) {
  switch (a.kind) {
    case Activation::silu: return x / (1.0f + std::exp(-x));
    case Activation::gelu: return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f));
    case Activation::gelu_tanh: return 0.5f * x * (1.0f + std::tanh(0.79788456080286536f * (x + 0.044715f * x * x * x)));
    case Activation::relu: return x > 0.0f ? x : (x == x ? 0.0f : x);
    case Activation::swiglu_clamped: return x;  // rejected by validation (needs a gate)
  }
  return 0.0f;
}

// One expert's weights, addressed in place (no copies).
struct ExpertView {
  const ExpertsSpec* spec;
  const void* gate_up;       // [R, H] (nt) or [H, R] (nn)
  const void* down;          // [H, I] (nt) or [I, H] (nn)
  const void* gate_up_bias;  // [R] or nullptr
  const void* down_bias;     // [H] or nullptr
  QuantMatrix gate_up_q{}, down_q{};  // quantized experts only
  const PackedExpert* packed = nullptr;  // f32 / bf16 experts with packed copies (prepared for this call)
};
// `packed`: the packed weights of ex (PackedWeights::of), already prepared for expert e, or nullptr.
ExpertView expert_view(const Experts& ex, int64_t e, const PackedWeights* packed = nullptr);

// The dtype the GEMM operands x and h are kept in: bf16 where the kernels multiply bf16 directly
// (bf16 experts, default layout, a CPU with AVX512_BF16), f32 otherwise. Either way h holds values
// already rounded to the activation dtype, so both choices compute the same products.
DType operand_dtype(const KernelTable& kt, const ExpertsSpec& s);

// Quantized experts (spec.quant): x and h are the e4m3 codes of quantize_rows (f32) with their
// scales `xs`, and each call needs `scratch` (kQuantScratch floats, one per thread).
struct QuantOperand {
  const float* scales = nullptr;
  float* scratch = nullptr;
};

// gu[m, n0:n1] = x[m, H] · gate_upᵀ (+ bias), f32. n ranges over the R = gate_up_rows() outputs.
// x is [m, H] of dtype xdt (see operand_dtype).
void up_projection(const KernelTable& kt, const ExpertView& ev, const void* x, DType xdt, int64_t m, float* gu, int64_t n0,
                   int64_t n1, QuantOperand q = {});
// The up projection with the gated activation fused in: h[0:m, c0:c1] = act(x · gate_upᵀ)[:, c0:c1]
// for one expert, computing only the gate and up columns those h columns need, in chunks of 64
// rows through `scratch` ([64, 2·(c1−c0)] floats), so no [m, 2I] intermediate is written.
// h rows have width I (row stride I) and dtype hdt. SiLU-gated bf16 experts packed for the packed bf16
// kernel skip the scratch: KernelTable::packed_gated_bf16 writes h from its registers, the same bits.
// Not for quantized experts. x_vnni (optional): the m
// bf16 rows of x packed once by pack_x_vnni (kernels.hpp) for the AMX kernel, which then reads them
// instead of repacking x in every call (one per column tile and per gate / up half).
void up_activation(const KernelTable& kt, const ExpertView& ev, const void* x, DType xdt, int64_t m, void* h, DType hdt,
                   int64_t c0, int64_t c1, float* scratch, const uint16_t* x_vnni = nullptr);
constexpr int64_t kFusedRows = 64;  // rows per chunk of up_activation

// h[m, I] = act(gu[m, R]), rounded to the activation dtype, stored as hdt (f32 or bf16).
void activation_rows(const KernelTable& kt, const ExpertsSpec& s, const float* gu, int64_t m, void* h, DType hdt);
// y[m, n0:n1] = h[m, I] · downᵀ (+ bias), f32; h of dtype hdt; h_vnni as up_activation's x_vnni.
void down_projection(const KernelTable& kt, const ExpertView& ev, const void* h, DType hdt, int64_t m, float* y, int64_t n0,
                     int64_t n1, QuantOperand q = {}, const uint16_t* h_vnni = nullptr);

// out[t] = Σ_j w[t, j] · y[row(t, j)] in slot order, dropped slots skipped, rounded once to the
// activation dtype. row_of(p) gives the row of pair p = t*K + j in y [rows, H], or -1.
// (The routing weight is applied here, after the down projection, in f32.)
template <class RowOf>
void reduce_slots(const KernelTable& kt, const ExpertsCall& call, int64_t H, const float* y, RowOf row_of, int threads,
                  float* scratch /* [threads, H] */);

// Routing weight of pair p as f32.
inline float routing_weight(const ExpertsCall& call, int64_t p) {
  return load_scalar(call.top_k_weights.data, call.top_k_weights.dtype, p);
}
// Expert of pair p, or -1 when the slot is dropped.
inline int64_t expert_of(const ExpertsCall& call, int64_t p, int64_t E) {
  int64_t e = call.top_k_index.dtype == DType::i32 ? int64_t(call.top_k_index.ptr<int32_t>()[p])
                                                     : call.top_k_index.ptr<int64_t>()[p];
  return (e >= 0 && e < E) ? e : -1;
}

template <class RowOf>
void reduce_slots(const KernelTable& kt, const ExpertsCall& call, int64_t H, const float* y, RowOf row_of, int threads,
                  float* scratch) {
  const int64_t T = call.hidden.shape[0], K = call.top_k_index.shape[1];
  const size_t esz = dtype_size(call.out.dtype);
  char* out = static_cast<char*>(call.out.data);
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    float* acc = scratch + int64_t(omp_get_thread_num()) * H;
    for (int64_t h = 0; h < H; ++h) acc[h] = 0.0f;
    for (int64_t j = 0; j < K; ++j) {
      const int64_t row = row_of(t * K + j);
      if (row < 0) continue;
      const float w = routing_weight(call, t * K + j);
      const float* yr = y + row * H;
#pragma omp simd
      for (int64_t h = 0; h < H; ++h) acc[h] += w * yr[h];
    }
    kt.from_f32(acc, call.out.dtype, out + t * H * int64_t(esz), H);
  }
}

}  // namespace moex::cpu
