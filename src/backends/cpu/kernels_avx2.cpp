// backends/cpu/kernels_avx2.cpp — the kernels for AVX2 + FMA + F16C, 8 f32 lanes.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

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
  // FP8 experts packed as [k, 32] panels (packed_fp8_block below)
  static void packed_matmul_fp8(const PackedFp8MatmulArgs& a);
  // FP4 experts packed as [k, 16] panels (packed_fp4_block below)
  static void packed_matmul_fp4(const PackedFp4MatmulArgs& a);
  static constexpr bool kPackedFp4Pairs = false;
  static V zero() { return _mm256_setzero_ps(); }
  static V set1(float v) { return _mm256_set1_ps(v); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static V load_bf16(const uint16_t* p) {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  // 16 bf16 at p — 8 columns' (k, k + 1) pairs of a packed bf16 panel row — as the f32 vectors of the
  // even k (the low halves shifted up) and the odd k (the high halves, low bits cleared): exact.
  static void load_bf16_pairs(const uint16_t* p, V& even, V& odd) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    even = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    odd = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(int32_t(0xffff0000u))));
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

// ---- packed FP4 on f32 FMAs ([k, 16] panels, PackedFp4MatmulArgs) ---------------------------------
// Per k step the panel's 16 bytes: byte i holds column i's code in its low nibble and column 16 + i's
// in its high one. Widened to 32-bit lanes (bytes 0..7 and 8..15), each nibble's magnitude comes from
// one vpermps over the 8 e2m1 magnitudes (its index is the lane's low 3 bits) and its sign from bit 3:
// four vectors of 8 columns, exact in f32. Per column the operations and their order are the AVX-512
// f32 kernel's (packed_fp4_f32_block: group sums in k order, scaled per group, block sums by the
// activation scale per 128-k block), so both give the same results bit for bit. The block sums and
// totals live in L1 buffers: 4·MR accumulators + 4 weights + the table + the sign mask + one
// broadcast fit the 16 registers for MR ≤ 2 (two_row_blocks).

inline __m256 e2m1_lanes(__m256i codes, __m256 magnitudes) {
  const __m256 mag = _mm256_permutevar8x32_ps(magnitudes, codes);
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(codes, _mm256_set1_epi32(8)), 28);
  return _mm256_or_ps(mag, _mm256_castsi256_ps(sign));
}

template <int MR>
void packed_fp4_block(const PackedFp4MatmulArgs& a, int64_t i0, int64_t p, int ncols, float* y) {
  const int64_t blocks = (a.k + 127) / 128, groups = (a.k + a.group - 1) / a.group;
  const uint8_t* panel = a.panels + p * a.k * 16;
  const float* gscale = a.group_scales + p * groups * kPanelCols;
  const __m256 magnitudes = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
  const float* xr[MR];
  for (int r = 0; r < MR; ++r) xr[r] = a.x + (i0 + r) * a.ldx;
  alignas(32) float block[MR][kPanelCols], total[MR][kPanelCols];
  for (int64_t kb = 0; kb < blocks; ++kb) {
    for (int r = 0; r < MR; ++r) std::fill(block[r], block[r] + kPanelCols, 0.0f);
    const int64_t g_end = std::min(groups, (kb + 1) * 128 / a.group);
    for (int64_t g = kb * 128 / a.group; g < g_end; ++g) {
      __m256 acc[MR][4];
      for (int r = 0; r < MR; ++r)
        for (int j = 0; j < 4; ++j) acc[r][j] = _mm256_setzero_ps();
      const int64_t k1 = std::min(a.k, (g + 1) * a.group);
      for (int64_t k = g * a.group; k < k1; ++k) {
        const __m256i lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(panel + k * 16)));
        const __m256i hi = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(panel + k * 16 + 8)));
        const __m256 w[4] = {e2m1_lanes(lo, magnitudes), e2m1_lanes(hi, magnitudes),  // columns 0..7, 8..15
                             e2m1_lanes(_mm256_srli_epi32(lo, 4), magnitudes),         // 16..23
                             e2m1_lanes(_mm256_srli_epi32(hi, 4), magnitudes)};        // 24..31
        for (int r = 0; r < MR; ++r) {
          const __m256 xb = _mm256_set1_ps(xr[r][k]);
          for (int j = 0; j < 4; ++j) acc[r][j] = _mm256_fmadd_ps(xb, w[j], acc[r][j]);
        }
      }
      for (int r = 0; r < MR; ++r)
        for (int j = 0; j < 4; ++j)
          _mm256_store_ps(block[r] + 8 * j, _mm256_fmadd_ps(acc[r][j], _mm256_loadu_ps(gscale + g * kPanelCols + 8 * j),
                                                            _mm256_load_ps(block[r] + 8 * j)));
    }
    for (int r = 0; r < MR; ++r) {
      const __m256 xs = _mm256_set1_ps(a.xs[(i0 + r) * blocks + kb]);
      for (int j = 0; j < 4; ++j) {
        const __m256 t = kb == 0 ? _mm256_setzero_ps() : _mm256_load_ps(total[r] + 8 * j);
        _mm256_store_ps(total[r] + 8 * j, _mm256_fmadd_ps(_mm256_load_ps(block[r] + 8 * j), xs, t));
      }
    }
  }
  for (int r = 0; r < MR; ++r) {
    if (blocks == 0) std::fill(total[r], total[r] + kPanelCols, 0.0f);  // k = 0: no products
    std::memcpy(y + (i0 + r) * a.ldy, total[r], size_t(ncols) * sizeof(float));
  }
}

// The AVX2 FP8 / FP4 kernels' outer loops: panel-outer, near-equal row blocks of one or two rows;
// block(rows, i0, panel index, ncols, y) runs one.
template <class Args, class Block>
void two_row_blocks(const Args& a, Block block) {
  if (a.m <= 0 || a.n1 <= a.n0) return;
  const int64_t row_blocks = (a.m + 1) / 2;
  for (int64_t n = a.n0; n < a.n1; n += kPanelCols) {
    const int ncols = int(std::min<int64_t>(kPanelCols, a.n1 - n));
    for (int64_t b = 0; b < row_blocks; ++b) {
      const int64_t i0 = b * a.m / row_blocks, i1 = (b + 1) * a.m / row_blocks;
      block(int(i1 - i0), i0, n / kPanelCols, ncols, a.y + (n - a.n0));
    }
  }
}

void Avx2::packed_matmul_fp4(const PackedFp4MatmulArgs& a) {
  two_row_blocks(a, [&](int rows, int64_t i0, int64_t p, int ncols, float* y) {
    if (rows == 2) packed_fp4_block<2>(a, i0, p, ncols, y);
    else packed_fp4_block<1>(a, i0, p, ncols, y);
  });
}

// ---- packed FP8 on f32 FMAs ([k, 32] panels, PackedFp8MatmulArgs) --------------------------------
// Per k step the panel's 32 codes, four vectors of 8 columns: blocks of normal codes (Fp8BlockKind)
// by the fast form (× 2^-56, three operations after the widening), the others by the exact
// conversion. Per column the operations and their order are packed_fp8_block's (the 16-lane tables'
// f32 kernel): the same results bit for bit. Totals in an L1 buffer: 4·MR accumulators + 4 weights +
// one broadcast + 2 constants, MR ≤ 2 (two_row_blocks).

template <int MR>
void packed_fp8_block(const PackedFp8MatmulArgs& a, int64_t i0, int64_t p, int ncols, float* y) {
  const int64_t blocks = (a.k + 127) / 128;
  const uint8_t* panel = a.panels + p * a.k * kPanelCols;
  const float* scales = a.block_scales + p * blocks * kPanelCols;
  const uint8_t* kind = a.block_kind + p * blocks;
  const float* xr[MR];
  for (int r = 0; r < MR; ++r) xr[r] = a.x + (i0 + r) * a.ldx;
  alignas(32) float total[MR][kPanelCols];
  for (int r = 0; r < MR; ++r) std::fill(total[r], total[r] + kPanelCols, 0.0f);
  for (int64_t kb = 0; kb < blocks; ++kb) {
    const int64_t k0 = kb * 128, k1 = std::min<int64_t>(a.k, k0 + 128);
    __m256 acc[MR][4];
    for (int r = 0; r < MR; ++r)
      for (int j = 0; j < 4; ++j) acc[r][j] = _mm256_setzero_ps();
    auto steps = [&](auto convert) {  // one loop per conversion, not a branch per step
      for (int64_t kk = k0; kk < k1; ++kk) {
        const uint8_t* pp = panel + kk * kPanelCols;
        const __m256 w[4] = {convert(pp), convert(pp + 8), convert(pp + 16), convert(pp + 24)};
        for (int r = 0; r < MR; ++r) {
          const __m256 xb = _mm256_set1_ps(xr[r][kk]);
          for (int j = 0; j < 4; ++j) acc[r][j] = _mm256_fmadd_ps(xb, w[j], acc[r][j]);
        }
      }
    };
    const bool normal = kind[kb] == kFp8BlockNormal;
    if (normal)
      steps([](const uint8_t* q) { return Avx2::load_e4m3_scaled(q); });
    else
      steps([](const uint8_t* q) { return Avx2::load_e4m3(q); });
    const __m256 back = _mm256_set1_ps(normal ? impl::kE4m3ScaledBack : 1.0f);
    for (int r = 0; r < MR; ++r) {
      const __m256 xs = _mm256_set1_ps(a.xs[(i0 + r) * blocks + kb]);
      for (int j = 0; j < 4; ++j) {
        // (sums × 2^56 exactly) × (weight scale × x scale), as packed_fp8_block folds them
        const __m256 sc = _mm256_fmadd_ps(_mm256_loadu_ps(scales + kb * kPanelCols + 8 * j), xs, _mm256_setzero_ps());
        const __m256 sums = _mm256_fmadd_ps(acc[r][j], back, _mm256_setzero_ps());
        _mm256_store_ps(total[r] + 8 * j, _mm256_fmadd_ps(sums, sc, _mm256_load_ps(total[r] + 8 * j)));
      }
    }
  }
  for (int r = 0; r < MR; ++r) std::memcpy(y + (i0 + r) * a.ldy, total[r], size_t(ncols) * sizeof(float));
}

void Avx2::packed_matmul_fp8(const PackedFp8MatmulArgs& a) {
  two_row_blocks(a, [&](int rows, int64_t i0, int64_t p, int ncols, float* y) {
    if (rows == 2) packed_fp8_block<2>(a, i0, p, ncols, y);
    else packed_fp8_block<1>(a, i0, p, ncols, y);
  });
}


}  // namespace

const KernelTable& avx2_kernels() {
  static const KernelTable table = impl::make_table<Avx2>("avx2");
  return table;
}

}  // namespace moex::cpu
