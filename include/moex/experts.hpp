// moex/experts.hpp — the experts descriptor (shapes, layout flags, activation, dtype,
// quantization) and the buffers of one experts forward call. See SPEC §1.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include "moex/tensor.hpp"

namespace moex {

enum class Activation {
  silu,            // SwiGLU: silu(g) * u
  gelu,            // exact erf GELU
  gelu_tanh,       // "gelu_pytorch_tanh"
  relu,
  swiglu_clamped,  // GPT-OSS: g = min(g, limit); u = clamp(u, -limit, limit); h = (u + 1) * g * sigmoid(alpha * g)
};

struct ActivationSpec {
  Activation kind = Activation::silu;
  float alpha = 1.702f;  // swiglu_clamped only
  float limit = 7.0f;    // swiglu_clamped only

  static ActivationSpec silu() { return {Activation::silu}; }
  static ActivationSpec gpt_oss(float alpha = 1.702f, float limit = 7.0f) {
    return {Activation::swiglu_clamped, alpha, limit};
  }
};
std::string_view activation_name(Activation a);
// "silu"/"swish", "gelu", "gelu_pytorch_tanh"/"gelu_tanh", "relu", "swiglu_clamped"/"gpt_oss"; throws on others.
Activation parse_activation(std::string_view s);

// Quantization of the expert weights (SPEC §6). The experts issue for FP8/FP4 fills in the
// quantized kinds; every backend of this version answers "not supported" for them.
enum class QuantKind { none, fp8_block, fp4_group };
enum class ScaleFormat { f32, ue8m0 };
enum class ActivationScheme { dynamic, static_ };
struct QuantSpec {
  QuantKind kind = QuantKind::none;
  int block_n = 128, block_k = 128;  // weight block (out × in) of one scale
  ScaleFormat scale_format = ScaleFormat::f32;
  ActivationScheme activation_scheme = ActivationScheme::dynamic;

  static QuantSpec none() { return {}; }
  static QuantSpec fp8_block(int bn = 128, int bk = 128, ScaleFormat f = ScaleFormat::f32) {
    return {QuantKind::fp8_block, bn, bk, f, ActivationScheme::dynamic};
  }
  static QuantSpec fp4_group(int group = 32) {
    return {QuantKind::fp4_group, 1, group, ScaleFormat::ue8m0, ActivationScheme::dynamic};
  }
  bool quantized() const { return kind != QuantKind::none; }
};

// What the experts are, independent of where their weights live.
//   gate_up: [E, 2I, H] (or [E, H, 2I] when transposed); [E, I, H] when has_gate is false
//   down:    [E, H, I]  (or [E, I, H] when transposed)
struct ExpertsSpec {
  int64_t num_experts = 0;   // E
  int64_t hidden = 0;        // H
  int64_t intermediate = 0;  // I
  bool has_gate = true;      // false: gate_up is an up projection only, h = act(x·upᵀ + b)
  bool has_bias = false;     // gate_up_bias [E, 2I] and down_bias [E, H]
  bool transposed = false;   // weights stored [E, in, out] instead of [E, out, in]
  bool interleaved = false;  // gate/up rows alternate g, u, g, u (GPT-OSS) instead of [gate; up]
  ActivationSpec activation{};
  DType dtype = DType::bf16;  // the activation dtype; also the weight dtype when not quantized
  QuantSpec quant{};

  int64_t gate_up_rows() const { return has_gate ? 2 * intermediate : intermediate; }
  // One line: "E=8 H=64 I=32 bf16 silu gate bias transposed interleaved"
  std::string describe() const;
};

// The experts: descriptor + weight buffers.
struct Experts {
  ExpertsSpec spec;
  TensorView gate_up;       // see ExpertsSpec
  TensorView down;
  TensorView gate_up_bias;  // [E, gate_up_rows] when spec.has_bias
  TensorView down_bias;     // [E, H] when spec.has_bias
  TensorView gate_up_scale; // quantized experts only (SPEC §6)
  TensorView down_scale;
};

// The buffers of one forward call.
struct ExpertsCall {
  TensorView hidden;         // [T, H] activation dtype
  TensorView top_k_index;    // [T, K] i32 or i64; < 0 or >= E is a dropped slot
  TensorView top_k_weights;  // [T, K] f32 or the activation dtype
  TensorView out;            // [T, H] activation dtype, written entirely
};

}  // namespace moex
