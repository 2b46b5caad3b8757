// model/cpu_attention_avx512.cpp — the attention kernel with AVX-512 (compiled with -mavx512f
// -ffp-contract=off): each 16-float multiply-add one vfmadd, blocks of several queries.
#include <immintrin.h>

#include "model/cpu_attention_impl.hpp"

namespace moex::model::attention_kernels {
namespace {
struct Avx512 {
  static constexpr bool kQueryBlocks = true;  // 32 vector registers: up to kRowsMax rows per block
  static KeyLanes fma(KeyLanes a, KeyLanes b, KeyLanes c) { return KeyLanes(_mm512_fmadd_ps(__m512(a), __m512(b), __m512(c))); }
};
}  // namespace

Floats attend_avx512(const float* q, const float* kt, const float* v, int64_t n, int64_t Tk, int64_t pos0, int64_t nh, int64_t nkv,
                     int64_t dq, int64_t dv, double scaling, int64_t window, const float* sinks) {
  return attend_impl<Avx512>(q, kt, v, n, Tk, pos0, nh, nkv, dq, dv, scaling, window, sinks);
}

}  // namespace moex::model::attention_kernels
