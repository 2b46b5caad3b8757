// backends/cpu/simd_avx512.hpp — the AVX-512 (F/BW/VL/DQ) SIMD traits, 16 f32 lanes. Included only
// by translation units compiled with the AVX-512 flags.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backends/cpu/kernels_impl.hpp"

namespace moex::cpu {

// ---- packed FP4 on f32 FMAs (AVX-512 without BF16; PackedFp4MatmulArgs, [k, 16] panels) -----------
// Per k step one 16-byte row of the panel: byte i holds column i's code in its low nibble and column
// 16 + i's in its high one; widened to 32-bit lanes, one vpermps each (its index is the lane's low 4
// bits: the e2m1 table fills one vector) gives the two vectors of 16 columns, exact in f32. Group sums
// scaled per group, block sums by the activation scale per 128-k block, totals in an L1 buffer:
// 2·MR accumulators + 2·MR block sums + 2 weights + the table, MR ≤ 6.
constexpr int kPackedFp4F32Rows = 6;

// One row's totals over a panel (32 floats, L1) after a 128-k block: total = (first ? 0 : total) + v · m,
// per half of 16 columns (the FP4 kernels and the FP8 pair kernel).
inline void fold_total(float* total, __m512 v0, __m512 m0, __m512 v1, __m512 m1, bool first) {
  const __m512 t0 = first ? _mm512_setzero_ps() : _mm512_load_ps(total);
  const __m512 t1 = first ? _mm512_setzero_ps() : _mm512_load_ps(total + 16);
  _mm512_store_ps(total, _mm512_fmadd_ps(v0, m0, t0));
  _mm512_store_ps(total + 16, _mm512_fmadd_ps(v1, m1, t1));
}

// The FP4 kernels' pass of MR rows over one panel: per 128-k block and group, group_steps(k0, k1, acc)
// adds the products of k in [k0, k1) to acc (MR × 2 vectors, zeroed); the group's sums are scaled by its
// 32 column scales (gscale [groups, 32]), the block's by x's scale into the L1 totals, written to y's
// ncols columns at the end.
template <int MR, class GroupSteps>
inline void fp4_panel_pass(const PackedFp4MatmulArgs& a, int64_t i0, const float* gscale, int ncols, float* y, GroupSteps group_steps) {
  const int64_t blocks = (a.k + 127) / 128, groups = (a.k + a.group - 1) / a.group;
  alignas(64) float total[MR][32];
  for (int64_t kb = 0; kb < blocks; ++kb) {
    __m512 block[MR][2];
    for (int r = 0; r < MR; ++r) block[r][0] = block[r][1] = _mm512_setzero_ps();
    const int64_t g_end = std::min(groups, (kb + 1) * 128 / a.group);
    for (int64_t g = kb * 128 / a.group; g < g_end; ++g) {
      __m512 acc[MR][2];
      for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
      group_steps(g * a.group, std::min(a.k, (g + 1) * a.group), acc);
      const __m512 s0 = _mm512_loadu_ps(gscale + g * 32), s1 = _mm512_loadu_ps(gscale + g * 32 + 16);
      for (int r = 0; r < MR; ++r) {
        block[r][0] = _mm512_fmadd_ps(acc[r][0], s0, block[r][0]);
        block[r][1] = _mm512_fmadd_ps(acc[r][1], s1, block[r][1]);
      }
    }
    for (int r = 0; r < MR; ++r) {
      const __m512 xs = _mm512_set1_ps(a.xs[(i0 + r) * blocks + kb]);
      fold_total(total[r], block[r][0], xs, block[r][1], xs, kb == 0);
    }
  }
  for (int r = 0; r < MR; ++r) {
    if (blocks == 0) std::fill(total[r], total[r] + 32, 0.0f);  // k = 0: no products
    std::memcpy(y + (i0 + r) * a.ldy, total[r], size_t(ncols) * sizeof(float));
  }
}

template <int MR>
inline void packed_fp4_f32_block(const PackedFp4MatmulArgs& a, int64_t i0, int64_t p, int ncols, float* y) {
  const uint8_t* panel = a.panels + p * a.k * 16;
  const __m512 table = _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f);
  const float* xr[MR];
  for (int r = 0; r < MR; ++r) xr[r] = a.x + (i0 + r) * a.ldx;
  fp4_panel_pass<MR>(a, i0, a.group_scales + p * ((a.k + a.group - 1) / a.group) * 32, ncols, y,
                     [&](int64_t k0, int64_t k1, __m512 (&acc)[MR][2]) {
                       for (int64_t k = k0; k < k1; ++k) {
                         const __m512i codes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(panel + k * 16)));
                         const __m512 w0 = _mm512_permutexvar_ps(codes, table);
                         const __m512 w1 = _mm512_permutexvar_ps(_mm512_srli_epi32(codes, 4), table);
                         for (int r = 0; r < MR; ++r) {
                           const __m512 xb = _mm512_set1_ps(xr[r][k]);
                           acc[r][0] = _mm512_fmadd_ps(xb, w0, acc[r][0]);
                           acc[r][1] = _mm512_fmadd_ps(xb, w1, acc[r][1]);
                         }
                       }
                     });
}

template <int MR = kPackedFp4F32Rows>
inline void packed_fp4_f32_rows(int mr, const PackedFp4MatmulArgs& a, int64_t i0, int64_t p, int ncols, float* y) {
  if constexpr (MR > 1) {
    if (mr < MR) {
      packed_fp4_f32_rows<MR - 1>(mr, a, i0, p, ncols, y);
      return;
    }
  }
  packed_fp4_f32_block<MR>(a, i0, p, ncols, y);
}

struct Avx512 {
  static constexpr int W = 16;
  static constexpr bool kBf16Dot = false;
  static void matmul_nt_bf16_dot(const MatmulArgs&) {}
  using V = __m512;
  static constexpr bool kVectorE4m3 = true;
  // 16 e4m3 codes → f32: normals by moving the exponent/mantissa bits into place (+120 to the
  // exponent bias), subnormals as man · 2^-9, the NaN codes as NaN.
  static V load_e4m3(const uint8_t* p) {
    const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(v, _mm512_set1_epi32(0x80)), 24);
    const __m512i em = _mm512_and_si512(v, _mm512_set1_epi32(0x7f));
    const __m512i normal = _mm512_add_epi32(_mm512_slli_epi32(em, 20), _mm512_set1_epi32(120 << 23));
    const __mmask16 sub = _mm512_cmplt_epi32_mask(em, _mm512_set1_epi32(8));
    const __mmask16 nan = _mm512_cmpeq_epi32_mask(em, _mm512_set1_epi32(0x7f));
    const __m512 subv = _mm512_mul_ps(_mm512_cvtepi32_ps(em), _mm512_set1_ps(1.0f / 512.0f));
    __m512i mag = _mm512_mask_blend_epi32(sub, normal, _mm512_castps_si512(subv));
    mag = _mm512_mask_blend_epi32(nan, mag, _mm512_set1_epi32(0x7fc00000));
    return _mm512_castsi512_ps(_mm512_or_si512(mag, sign));
  }
  // The fast form for fp8_block, where e4m3_all_normal says so: 16 e4m3 codes of normal numbers
  // (exponent field 1..15, not the NaN code) → f32 × 2^-56 exactly, in four operations instead of the
  // ~13 above: the sign-extended code shifted so its sign lands in bit 31 and its exponent and
  // mantissa bits in the low exponent / high mantissa bits, plus 64 on the exponent (2^-56 = 2^(64 +
  // 7 − 127)). The caller multiplies its sums by 2^56 (kE4m3ScaledBack): exact, powers of two.
  static V load_e4m3_scaled(const uint8_t* p) {
    const __m512i v = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m512i bits = _mm512_and_si512(_mm512_slli_epi32(v, 20), _mm512_set1_epi32(int32_t(0x87F00000u)));
    return _mm512_castsi512_ps(_mm512_add_epi32(bits, _mm512_set1_epi32(64 << 23)));
  }
  // Whether the n ≤ 128 codes at p are all normal numbers (no zero, subnormal or NaN code).
  static bool e4m3_all_normal(const uint8_t* p, int64_t n) {
    const __m512i low7 = _mm512_set1_epi8(0x7f), eight = _mm512_set1_epi8(8);
    __mmask64 special = 0;
    for (int64_t i = 0; i < n; i += 64) {
      const __mmask64 in = n - i >= 64 ? ~__mmask64(0) : (__mmask64(1) << (n - i)) - 1;
      const __m512i em = _mm512_and_si512(_mm512_maskz_loadu_epi8(in, p + i), low7);
      special |= _mm512_mask_cmplt_epu8_mask(in, em, eight) | _mm512_mask_cmpeq_epi8_mask(in, em, low7);
    }
    return special == 0;
  }
  // quantize_rows (quant_math.hpp) in vectors, with the same results bit for bit: per 128 channels
  // amax (NaN ignored, as std::max ignores it), scale = amax / 448 (1 where amax is 0 or not finite),
  // x / scale clamped to ±448 (NaN kept), then rounded to the nearest e4m3 value (ties to even) as
  // round(q · 2^(3 − e)) · 2^(e − 3) with e = max(exponent of q, −6): three mantissa bits for normals,
  // multiples of 2^-9 below 2^-6. Scalings by powers of two and the rounding to an integer are exact.
  static void quantize_e4m3_rows(float* x, int64_t m, int64_t k, float* scales) {
    const int64_t groups = (k + 127) / 128;
    const __m512 hi = _mm512_set1_ps(448.0f), lo = _mm512_set1_ps(-448.0f), min_exp = _mm512_set1_ps(-6.0f), three = _mm512_set1_ps(3.0f);
    const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    for (int64_t i = 0; i < m; ++i)
      for (int64_t g = 0; g < groups; ++g) {
        float* p = x + i * k + g * 128;
        const int64_t n = std::min<int64_t>(128, k - g * 128);
        auto lanes = [n](int64_t c) { return n - c >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - c)) - 1u); };
        __m512 amax = _mm512_setzero_ps();
        for (int64_t c = 0; c < n; c += 16)  // max_ps returns its second operand where one is NaN
          amax = _mm512_max_ps(_mm512_and_ps(_mm512_maskz_loadu_ps(lanes(c), p + c), abs_mask), amax);
        const float am = _mm512_reduce_max_ps(amax);
        const float scale = am > 0 && std::isfinite(am) ? am / 448.0f : 1.0f;
        scales[i * groups + g] = scale;
        const __m512 sv = _mm512_set1_ps(scale);
        for (int64_t c = 0; c < n; c += 16) {
          const __mmask16 in = lanes(c);
          __m512 q = _mm512_div_ps(_mm512_maskz_loadu_ps(in, p + c), sv);
          q = _mm512_max_ps(lo, _mm512_min_ps(hi, q));  // a NaN q is the second operand: kept
          const __m512 e = _mm512_max_ps(_mm512_getexp_ps(q), min_exp);  // getexp(0) = −inf → −6
          const __m512 r = _mm512_roundscale_ps(_mm512_scalef_ps(q, _mm512_sub_ps(three, e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
          _mm512_mask_storeu_ps(p + c, in, _mm512_scalef_ps(r, _mm512_sub_ps(e, three)));
        }
      }
  }
  // FP4 experts packed as [k, 16] panels (packed_fp4_f32_block); panel-outer, near-equal row blocks
  static void packed_matmul_fp4(const PackedFp4MatmulArgs& a) {
    if (a.m <= 0 || a.n1 <= a.n0) return;
    const int64_t row_blocks = (a.m + kPackedFp4F32Rows - 1) / kPackedFp4F32Rows;
    for (int64_t n = a.n0; n < a.n1; n += 32) {
      const int ncols = int(std::min<int64_t>(32, a.n1 - n));
      for (int64_t b = 0; b < row_blocks; ++b) {
        const int64_t i0 = b * a.m / row_blocks, i1 = (b + 1) * a.m / row_blocks;
        packed_fp4_f32_rows(int(i1 - i0), a, i0, n / 32, ncols, a.y + (n - a.n0));
      }
    }
  }
  static V zero() { return _mm512_setzero_ps(); }
  static V set1(float v) { return _mm512_set1_ps(v); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static V load_bf16(const uint16_t* p) {
    __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
  static V load_f16(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static float reduce(V v) { return _mm512_reduce_add_ps(v); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  // 16 floats → 16 bf16, rounded to nearest even; a NaN keeps a quiet-NaN payload
  static __m256i to_bf16(__m512 v) {
    const __m512i u = _mm512_castps_si512(v);
    __m512i r = _mm512_add_epi32(
        u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1))));
    r = _mm512_mask_or_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), u, _mm512_set1_epi32(0x00400000));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
  }
  static void store_as_bf16(const float* src, uint16_t* dst, int64_t n) {
    int64_t i = 0;
    for (; i + W <= n; i += W) _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), to_bf16(_mm512_loadu_ps(src + i)));
    impl::store_as_bf16_scalar(src + i, dst + i, n - i);
  }
  // e^x for 16 lanes: x clamped to [−104, 89] (e^x is 0 / +inf in f32 beyond, and the reduction
  // stays exact), x = n·ln2 + r with |r| ≤ ln2/2 (ln2 in two parts), e^r by the degree-6 minimax
  // polynomial of Cephes' expf (≈ 1 ulp), then 2^n by vscalefps (which rounds to 0 / overflows to
  // +inf in one step). A NaN x comes out as a finite value: callers let NaN through themselves.
  static __m512 exp_ps(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-104.0f)), _mm512_set1_ps(89.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
  }
  // silu(g) · u = g / (1 + e^−g) · u for 16 lanes (NaN g: NaN / (1 + e))
  static __m512 silu_mul_ps(__m512 g, __m512 u) {
    const __m512 e = exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), g));
    return _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), u);
  }
  static void silu_mul(const float* g, const float* u, float* out, int64_t n) {
    for (int64_t i = 0; i < n; i += W) {
      const __mmask16 m = n - i >= W ? __mmask16(0xffff) : __mmask16((1u << (n - i)) - 1u);
      _mm512_mask_storeu_ps(out + i, m, silu_mul_ps(_mm512_maskz_loadu_ps(m, g + i), _mm512_maskz_loadu_ps(m, u + i)));
    }
  }
  static void store_as_f16(const float* src, uint16_t* dst, int64_t n) {
    int64_t i = 0;
    for (; i + W <= n; i += W)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                          _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    impl::store_as_f16_scalar(src + i, dst + i, n - i);
  }
};

}  // namespace moex::cpu
