// model/cpu_attention_avx2.cpp — the attention kernel with AVX2 + FMA (compiled with -mavx2 -mfma
// -ffp-contract=off): each 16-float multiply-add as two fused 8-float ones.
#include <immintrin.h>

#include "model/cpu_attention_impl.hpp"

namespace moex::model::attention_kernels {
namespace {
typedef float Floats8 __attribute__((vector_size(32)));
struct Avx2 {
  static constexpr bool kQueryBlocks = false;  // 16 vector registers: one query per block
  static KeyLanes fma(KeyLanes a, KeyLanes b, KeyLanes c) {
    const Floats8 lo = Floats8(_mm256_fmadd_ps(__m256(__builtin_shufflevector(a, a, 0, 1, 2, 3, 4, 5, 6, 7)),
                                               __m256(__builtin_shufflevector(b, b, 0, 1, 2, 3, 4, 5, 6, 7)),
                                               __m256(__builtin_shufflevector(c, c, 0, 1, 2, 3, 4, 5, 6, 7))));
    const Floats8 hi = Floats8(_mm256_fmadd_ps(__m256(__builtin_shufflevector(a, a, 8, 9, 10, 11, 12, 13, 14, 15)),
                                               __m256(__builtin_shufflevector(b, b, 8, 9, 10, 11, 12, 13, 14, 15)),
                                               __m256(__builtin_shufflevector(c, c, 8, 9, 10, 11, 12, 13, 14, 15))));
    return __builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  }
};
}  // namespace

Floats attend_avx2(const float* q, const float* kt, const float* v, int64_t n, int64_t Tk, int64_t pos0, int64_t nh, int64_t nkv,
                   int64_t dq, int64_t dv, double scaling, int64_t window, const float* sinks) {
  return attend_impl<Avx2>(q, kt, v, n, Tk, pos0, nh, nkv, dq, dv, scaling, window, sinks);
}

}  // namespace moex::model::attention_kernels
