// examples/quickstart.cpp — the README's example: run the experts of a small MoE layer with two
// backends, and register a backend of your own. Built and run by the tests so it cannot rot.
#include <cmath>
#include <cstdio>

#include "moex/moex.hpp"

int main() {
  using namespace moex;
  const int64_t T = 4, K = 2, E = 8, H = 64, I = 32;

  // 1. Describe the experts: SwiGLU, gate_up [E, 2I, H] and down [E, H, I] in bf16.
  Experts ex;
  ex.spec.num_experts = E;
  ex.spec.hidden = H;
  ex.spec.intermediate = I;
  ex.spec.dtype = DType::bf16;
  ex.spec.activation = ActivationSpec::silu();
  Tensor gate_up = Tensor::empty(DType::bf16, {E, 2 * I, H}), down = Tensor::empty(DType::bf16, {E, H, I});
  for (int64_t i = 0; i < gate_up.numel(); ++i) gate_up.ptr<uint16_t>()[i] = float_to_bf16(0.05f * std::sin(0.1f * float(i)));
  for (int64_t i = 0; i < down.numel(); ++i) down.ptr<uint16_t>()[i] = float_to_bf16(0.05f * std::cos(0.1f * float(i)));
  ex.gate_up = gate_up;
  ex.down = down;

  // 2. Route the tokens (Mixtral-style: softmax, top-K, renormalise).
  Tensor hidden = Tensor::empty(DType::bf16, {T, H}), logits = Tensor::empty(DType::f32, {T, E});
  for (int64_t i = 0; i < hidden.numel(); ++i) hidden.ptr<uint16_t>()[i] = float_to_bf16(std::sin(float(i)));
  for (int64_t i = 0; i < logits.numel(); ++i) logits.ptr<float>()[i] = std::cos(1.7f * float(i));
  Tensor idx = Tensor::empty(DType::i32, {T, K}), weights = Tensor::empty(DType::f32, {T, K});
  RouterConfig router;
  router.kind = RouterKind::mixtral;
  router.num_experts = E;
  router.top_k = K;
  route(router, logits.ptr<float>(), T, idx.ptr<int32_t>(), weights.ptr<float>());

  // 3. Run the experts with two backends; they agree to rounding.
  Tensor out_grouped = Tensor::empty(DType::bf16, {T, H}), out_eager = Tensor::empty(DType::bf16, {T, H});
  experts_forward("grouped_mm", ex, ExpertsCall{hidden, idx, weights, out_grouped});
  experts_forward("eager", ex, ExpertsCall{hidden, idx, weights, out_eager});
  double diff = 0;
  for (int64_t i = 0; i < T * H; ++i)
    diff = std::fmax(diff, std::fabs(bf16_to_float(out_grouped.ptr<uint16_t>()[i]) - bf16_to_float(out_eager.ptr<uint16_t>()[i])));
  std::printf("grouped_mm vs eager: max |diff| = %.3g\n", diff);

  // 4. Register a backend of your own; it is selectable by name like the built-in ones.
  ExpertsInterface::global().register_backend(
      "my_backend",
      [](const Experts& e, const ExpertsCall& call, const RunContext& ctx) {
        RunOptions o = ctx.options;
        experts_forward("grouped_mm", e, call, o);  // your kernels go here
      },
      [](const Problem& p) { return p.device.is_cpu() ? Support::yes() : Support::no("my_backend runs on the CPU only"); });
  experts_forward("my_backend", ex, ExpertsCall{hidden, idx, weights, out_eager});

  // 5. Unsupported backends say why.
  try {
    experts_forward("deepgemm", ex, ExpertsCall{hidden, idx, weights, out_eager});
  } catch (const Error& e) {
    std::printf("deepgemm: %s\n", e.what());
  }
  return diff < 0.05 ? 0 : 1;
}
