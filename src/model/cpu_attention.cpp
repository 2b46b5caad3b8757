// model/cpu_attention.cpp — the baseline attention kernel (no fused multiply-add: a · b + c rounded
// twice; compiled with -ffp-contract=off) and cpu_attend's choice of kernel.
#include "model/cpu_attention_impl.hpp"

#include <string_view>

#include "backends/cpu/kernels.hpp"

namespace moex::model {

namespace attention_kernels {
namespace {
struct Baseline {
  static constexpr bool kQueryBlocks = false;
  static KeyLanes fma(KeyLanes a, KeyLanes b, KeyLanes c) { return a * b + c; }
};
}  // namespace

Floats attend_baseline(const float* q, const float* kt, const float* v, int64_t n, int64_t Tk, int64_t pos0, int64_t nh, int64_t nkv,
                       int64_t dq, int64_t dv, double scaling, int64_t window, const float* sinks) {
  return attend_impl<Baseline>(q, kt, v, n, Tk, pos0, nh, nkv, dq, dv, scaling, window, sinks);
}
}  // namespace attention_kernels

Floats cpu_attend(const float* q, const float* kt, const float* v, int64_t n, int64_t Tk, int64_t pos0, int64_t nh, int64_t nkv,
                  int64_t dq, int64_t dv, double scaling, int64_t window, const float* sinks) {
  using Kernel = Floats (*)(const float*, const float*, const float*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                            double, int64_t, const float*);
  // the kernel of the CPU kernels' table's ISA ("avx512*" → AVX-512, "avx2" → AVX2 + FMA)
  static const Kernel kernel = [] {
#if defined(MOEX_X86)
    const std::string_view isa = cpu::kernels().isa;
    if (isa.substr(0, 6) == "avx512") return &attention_kernels::attend_avx512;
    if (isa == "avx2") return &attention_kernels::attend_avx2;
#endif
    return &attention_kernels::attend_baseline;
  }();
  return kernel(q, kt, v, n, Tk, pos0, nh, nkv, dq, dv, scaling, window, sinks);
}

}  // namespace moex::model
