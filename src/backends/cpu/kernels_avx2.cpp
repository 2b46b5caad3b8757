// backends/cpu/kernels_avx2.cpp — the kernels for AVX2 + FMA + F16C, 8 f32 lanes.
#include <immintrin.h>

#include "backends/cpu/kernels_impl.hpp"

namespace moex::cpu {
namespace {

struct Avx2 {
  static constexpr int W = 8;
  static constexpr bool kBf16Dot = false;
  static void matmul_nt_bf16_dot(const MatmulArgs&) {}
  using V = __m256;
  static constexpr bool kVectorE4m3 = false;
  static V load_e4m3(const uint8_t*) { return V{}; }
  static V zero() { return _mm256_setzero_ps(); }
  static V set1(float v) { return _mm256_set1_ps(v); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static V load_bf16(const uint16_t* p) {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  static V load_f16(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static float reduce(V v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
  }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static void store_as_bf16(const float* src, uint16_t* dst, int64_t n) { impl::store_as_bf16_scalar(src, dst, n); }
  static void store_as_f16(const float* src, uint16_t* dst, int64_t n) {
    int64_t i = 0;
    for (; i + W <= n; i += W)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                       _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    impl::store_as_f16_scalar(src + i, dst + i, n - i);
  }
};

}  // namespace

const KernelTable& avx2_kernels() {
  static const KernelTable table = impl::make_table<Avx2>("avx2");
  return table;
}

}  // namespace moex::cpu
