// core/experts.cpp — names of activations and a one-line description of an experts descriptor.
#include <fmt/format.h>

#include "core/check.hpp"
#include "moex/experts.hpp"

namespace moex {

std::string_view activation_name(Activation a) {
  switch (a) {
    case Activation::silu: return "silu";
    case Activation::gelu: return "gelu";
    case Activation::gelu_tanh: return "gelu_pytorch_tanh";
    case Activation::relu: return "relu";
    case Activation::swiglu_clamped: return "swiglu_clamped";
  }
  return "?";
}

Activation parse_activation(std::string_view s) {
  if (s == "silu" || s == "swish") return Activation::silu;
  if (s == "gelu") return Activation::gelu;
  if (s == "gelu_pytorch_tanh" || s == "gelu_tanh" || s == "gelu_new") return Activation::gelu_tanh;
  if (s == "relu") return Activation::relu;
  if (s == "swiglu_clamped" || s == "gpt_oss") return Activation::swiglu_clamped;
  detail::fail(ErrorCode::invalid_argument,
               "unknown activation '{}' (valid: silu, gelu, gelu_pytorch_tanh, relu, swiglu_clamped)", s);
}

std::string ExpertsSpec::describe() const {
  std::string s = fmt::format("E={} H={} I={} {} {}", num_experts, hidden, intermediate, dtype_name(dtype),
                              activation_name(activation.kind));
  if (!has_gate) s += " no-gate";
  if (has_bias) s += " bias";
  if (transposed) s += " transposed";
  if (interleaved) s += " interleaved";
  if (quant.kind == QuantKind::fp8_block) s += fmt::format(" fp8[{}x{}]", quant.block_n, quant.block_k);
  if (quant.kind == QuantKind::fp4_group) s += fmt::format(" fp4[1x{}]", quant.block_k);
  return s;
}

}  // namespace moex
