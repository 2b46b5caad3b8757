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
  static constexpr bool kVectorE4m3 = true;
  // 8 e4m3 codes → f32 (Avx512::load_e4m3's arithmetic on 8 lanes): normals by moving the exponent /
  // mantissa bits into place (+120 to the exponent bias), zero / subnormals as man · 2^-9, NaN as NaN.
  static V load_e4m3(const uint8_t* p) {
    const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0x80)), 24);
    const __m256i em = _mm256_and_si256(v, _mm256_set1_epi32(0x7f));
    const __m256i normal = _mm256_add_epi32(_mm256_slli_epi32(em, 20), _mm256_set1_epi32(120 << 23));
    const __m256i sub = _mm256_cmpgt_epi32(_mm256_set1_epi32(8), em);  // exponent field 0
    const __m256i nan = _mm256_cmpeq_epi32(em, _mm256_set1_epi32(0x7f));
    const __m256 subv = _mm256_mul_ps(_mm256_cvtepi32_ps(em), _mm256_set1_ps(1.0f / 512.0f));
    __m256i mag = _mm256_blendv_epi8(normal, _mm256_castps_si256(subv), sub);
    mag = _mm256_blendv_epi8(mag, _mm256_set1_epi32(0x7fc00000), nan);
    return _mm256_castsi256_ps(_mm256_or_si256(mag, sign));
  }
  // The fast form for fp8_block where e4m3_all_normal holds (see Avx512::load_e4m3_scaled): 8 codes of
  // normal numbers → f32 × 2^-56 exactly in four operations; the caller takes its sums back by 2^56.
  static V load_e4m3_scaled(const uint8_t* p) {
    const __m256i v = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    const __m256i bits = _mm256_and_si256(_mm256_slli_epi32(v, 20), _mm256_set1_epi32(int32_t(0x87F00000u)));
    return _mm256_castsi256_ps(_mm256_add_epi32(bits, _mm256_set1_epi32(64 << 23)));
  }
  // Whether the n ≤ 128 codes at p are all normal numbers (no zero, subnormal or NaN code).
  static bool e4m3_all_normal(const uint8_t* p, int64_t n) {
    const __m256i low7 = _mm256_set1_epi8(0x7f), eight = _mm256_set1_epi8(8);
    int64_t i = 0;
    int special = 0;
    for (; i + 32 <= n; i += 32) {
      const __m256i em = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i)), low7);
      // em ≤ 127: the signed byte compare is the unsigned one
      special |= _mm256_movemask_epi8(_mm256_or_si256(_mm256_cmpgt_epi8(eight, em), _mm256_cmpeq_epi8(em, low7)));
    }
    for (; i < n; ++i) {
      const int em = p[i] & 0x7f;
      special |= em < 8 || em == 0x7f;
    }
    return special == 0;
  }
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
