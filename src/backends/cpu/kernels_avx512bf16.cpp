// backends/cpu/kernels_avx512bf16.cpp — AVX-512 plus AVX512_BF16: the nt matmul of bf16 activations
// with bf16 weights runs on `vdpbf16ps` (pairs of bf16 products summed into f32 lanes), reading
// both operands as stored — half the bytes of widened f32 and twice the flops per instruction.
// On CPUs with AMX (Sapphire Rapids and later) the same products of blocks of >= kAmxMinRows rows
// run on the tile unit instead (`avx512_amx` table). Everything else is the plain AVX-512 path.
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backends/cpu/simd_avx512.hpp"

namespace moex::cpu {
namespace {

// y[i0+r, n0+c] = Σ_k x[i0+r, k] · W[n0+c, k] for an MR×NR block, vector accumulators along k.
template <int MR, int NR>
inline void dot_block(const MatmulArgs& a, int64_t i0, int64_t n0, const char* prefetch) {
  __m512 acc[MR][NR];
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < NR; ++c) acc[r][c] = _mm512_setzero_ps();
  const uint16_t* xr[MR];
  const uint16_t* wr[NR];
  for (int r = 0; r < MR; ++r) xr[r] = static_cast<const uint16_t*>(a.x) + (i0 + r) * a.ldx;
  for (int c = 0; c < NR; ++c) wr[c] = static_cast<const uint16_t*>(a.w) + (n0 + c) * a.ldw;
  const int64_t kv = a.k / 32 * 32;
  // groups of 8 steps with the prefetches between them (see impl::prefetch_line)
  for (int64_t kg = 0; kg < kv; kg += 8 * 32) {
    const int64_t kend = std::min(kv, kg + 8 * 32);
    // The next weight block over the same k range, one 64-byte line per row per step (see nt_block),
    // into L2, not L1: prefetcht0 held 13 % of this function's samples (the L1 miss buffers fill
    // while the block's own loads need them) and small_moe bf16 T = 16 / 256 ran 2.0 / 7.9 ms against
    // 1.1-1.4 / 6.0-6.5 with prefetcht1; qwen3 bf16 T = 1 / 16 / 256 3.0-3.5 / 35-42 / 99-108 against
    // 2.6 / 29-31 / 88-90 (AMD EPYC VM, 2 threads, interleaved runs, 2026-12-01).
    if (prefetch)
      for (int c = 0; c < NR; ++c)
        for (int64_t kk = kg; kk < kend; kk += 32) impl::prefetch_line_l2(prefetch + (c * a.ldw + kk) * 2);
    for (int64_t kk = kg; kk < kend; kk += 32) {
      __m512i xv[MR];
      for (int r = 0; r < MR; ++r) xv[r] = _mm512_loadu_si512(xr[r] + kk);
      for (int c = 0; c < NR; ++c) {
        const __m512i wv = _mm512_loadu_si512(wr[c] + kk);
        for (int r = 0; r < MR; ++r) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], (__m512bh)xv[r], (__m512bh)wv);
      }
    }
  }
  if (kv < a.k) {  // the last k % 32 elements: masked loads fill the rest with zeros
    const __mmask32 m = __mmask32((uint64_t(1) << (a.k - kv)) - 1);
    __m512i xv[MR];
    for (int r = 0; r < MR; ++r) xv[r] = _mm512_maskz_loadu_epi16(m, xr[r] + kv);
    for (int c = 0; c < NR; ++c) {
      const __m512i wv = _mm512_maskz_loadu_epi16(m, wr[c] + kv);
      for (int r = 0; r < MR; ++r) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], (__m512bh)xv[r], (__m512bh)wv);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < NR; ++c) a.y[(i0 + r) * a.ldy + n0 + c] = _mm512_reduce_add_ps(acc[r][c]);
}

template <int MR>
inline void dot_rows(const MatmulArgs& a, int64_t i0, int64_t n, int nr, const char* pf) {
  switch (nr) {
    case 4: dot_block<MR, 4>(a, i0, n, pf); break;
    case 3: dot_block<MR, 3>(a, i0, n, pf); break;
    case 2: dot_block<MR, 2>(a, i0, n, pf); break;
    default: dot_block<MR, 1>(a, i0, n, pf); break;
  }
}

// ---- packed bf16: Y = X · P on vdpbf16ps (see PackedBf16MatmulArgs) --------------------------
// MR rows × 2 vectors (one 32-column panel) of f32 accumulators; per pair of k: the panel's two
// 64-byte vectors, one broadcast 32-bit word (two bf16 of x) per row, 2·MR vdpbf16ps — no
// horizontal sums, and 2 vector loads per 2·MR products where the nt dot kernel above needs 8 per 16
// (its x and weight rows both stream through L1). The order is the f32 packed kernel's
// (impl::packed_matmul): panel-outer, k in chunks (impl::packed_k_chunk: whole panels up to 2048 k
// where there are several row blocks, 128 pairs = 16 KiB for decode) over which every row block
// passes, the next chunk prefetched into L2 spread over the row blocks; blocks of at most 7 rows, as
// the f32 kernel's, for the general registers (8 rows: 50.2–50.5 ms, 7 rows: 49.8–50.0 ms on
// qwen3_30b_a3b bf16 T = 256, small_moe bf16 T = 256 4.17–4.27 / 4.13–4.21 ms, both with whole
// panels, the AMD EPYC development VM at 2 threads, 2026-12-04).
constexpr int kPackedBf16Rows = 7;
constexpr int kPackedBf16MaxRows = 8;

inline __m512i x_pair(const uint16_t* row, int64_t j) {
  int32_t v;
  std::memcpy(&v, row + 2 * j, 4);  // x[2j] in the low half, as W[c, 2j] in the panel
  return _mm512_set1_epi32(v);
}

template <int MR>
inline void packed_bf16_block(const PackedBf16MatmulArgs& a, int64_t i0, const uint16_t* panel, int ncols, float* y, int64_t p0,
                              int64_t p1, bool first, const char* pf, int64_t pf_lines) {
  __m512 acc[MR][2];
  alignas(64) float tmp[MR][32];  // partial panels: y goes through here (never touched past ncols)
  const bool full = ncols == 32;
  if (first) {
    for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  } else {
    for (int r = 0; r < MR; ++r) {
      const float* yr = y + (i0 + r) * a.ldy;
      if (!full) {
        std::fill(tmp[r], tmp[r] + 32, 0.0f);
        std::memcpy(tmp[r], yr, size_t(ncols) * sizeof(float));
        yr = tmp[r];
      }
      acc[r][0] = _mm512_loadu_ps(yr);
      acc[r][1] = _mm512_loadu_ps(yr + 16);
    }
  }
  const uint16_t* xr[MR];
  for (int r = 0; r < MR; ++r) xr[r] = a.x + (i0 + r) * a.ldx;
  const int64_t whole = a.k / 2, pe = std::min(p1, whole);  // pairs with both k inside
  const uint16_t* pp = panel + p0 * 64;
  // the prefetches spread over the pair steps, as in impl::packed_block
  const int64_t steps = std::max<int64_t>(1, p1 - p0);
  const int64_t stride = pf_lines > 0 ? std::max<int64_t>(1, steps / pf_lines) : steps + 1;
  const int64_t per_step = pf_lines > 0 ? (pf_lines + steps - 1) / steps : 0;
  int64_t pf_next = 0, countdown = stride;
  for (int64_t j = p0; j < pe; ++j, pp += 64) {
    if (--countdown == 0) {
      countdown = stride;
      for (int64_t q = 0; q < per_step && pf_next < pf_lines; ++q) impl::prefetch_line_l2(pf + 64 * pf_next++);
    }
    const __m512i w0 = _mm512_loadu_si512(pp), w1 = _mm512_loadu_si512(pp + 32);
    for (int r = 0; r < MR; ++r) {
      const __m512i xb = x_pair(xr[r], j);
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], (__m512bh)xb, (__m512bh)w0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], (__m512bh)xb, (__m512bh)w1);
    }
  }
  if (p1 > whole) {  // odd k: the last pair is (x[k − 1], 0) against (W[c, k − 1], 0)
    const uint16_t* pl = panel + whole * 64;
    const __m512i w0 = _mm512_loadu_si512(pl), w1 = _mm512_loadu_si512(pl + 32);
    for (int r = 0; r < MR; ++r) {
      const __m512i xb = _mm512_set1_epi32(int32_t(xr[r][a.k - 1]));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], (__m512bh)xb, (__m512bh)w0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], (__m512bh)xb, (__m512bh)w1);
    }
  }
  for (int r = 0; r < MR; ++r) {
    float* yr = y + (i0 + r) * a.ldy;
    if (full) {
      _mm512_storeu_ps(yr, acc[r][0]);
      _mm512_storeu_ps(yr + 16, acc[r][1]);
    } else {
      _mm512_store_ps(tmp[r], acc[r][0]);
      _mm512_store_ps(tmp[r] + 16, acc[r][1]);
      std::memcpy(yr, tmp[r], size_t(ncols) * sizeof(float));
    }
  }
}

template <int MR = kPackedBf16MaxRows>
inline void packed_bf16_rows(int mr, const PackedBf16MatmulArgs& a, int64_t i0, const uint16_t* panel, int ncols, float* y,
                             int64_t p0, int64_t p1, bool first, const char* pf, int64_t pf_lines) {
  if constexpr (MR > 1) {
    if (mr < MR) {
      packed_bf16_rows<MR - 1>(mr, a, i0, panel, ncols, y, p0, p1, first, pf, pf_lines);
      return;
    }
  }
  packed_bf16_block<MR>(a, i0, panel, ncols, y, p0, p1, first, pf, pf_lines);
}

void packed_matmul_bf16_impl(const PackedBf16MatmulArgs& a) {
  if (a.m <= 0 || a.n1 <= a.n0) return;
  if (a.k == 0) {
    for (int64_t i = 0; i < a.m; ++i) std::fill(a.y + i * a.ldy, a.y + i * a.ldy + (a.n1 - a.n0), 0.0f);
    return;
  }
  const int64_t pairs = (a.k + 1) / 2, panel_elems = packed_bf16_panel_elems(a.k);
  // near-equal row blocks of at most kPackedBf16Rows, or MOEX_CPU_PACKED_ROWS (1 .. 8; A/B)
  static const int64_t rows_max = impl::packed_rows_setting(kPackedBf16MaxRows, kPackedBf16Rows);
  const int64_t blocks = (a.m + rows_max - 1) / rows_max;
  const int64_t chunk = (impl::packed_k_chunk(blocks) + 1) / 2;  // in pairs of k
  for (int64_t n = a.n0; n < a.n1; n += kPanelCols) {
    const uint16_t* panel = a.panels + (n / kPanelCols) * panel_elems;
    const int width = int(std::min<int64_t>(kPanelCols, a.n1 - n));
    float* yp = a.y + (n - a.n0);
    for (int64_t p0 = 0; p0 < pairs; p0 += chunk) {
      const int64_t p1 = std::min(pairs, p0 + chunk);
      // the next chunk of the stream starts right after this one (this panel further along k, or the
      // next panel); its lines are shared out over the row blocks. One row block: the lines from
      // a.prefetch_ahead bytes past this chunk's start instead, where that is set.
      const int64_t ahead = blocks == 1 ? a.prefetch_ahead : 0;
      const bool stream = blocks > 1 || a.prefetch_ahead >= 0;  // prefetch_ahead < 0: none (one row block)
      const char* next = ahead > 0 && ahead < chunk * 128
                             ? reinterpret_cast<const char*>(panel + p0 * 64) + ahead
                             : reinterpret_cast<const char*>(panel + p1 * 64);
      const int64_t next_lines = std::min(chunk, pairs) * 2;
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t i0 = b * a.m / blocks, i1 = (b + 1) * a.m / blocks;
        const int64_t l0 = b * next_lines / blocks, l1 = (b + 1) * next_lines / blocks;
        packed_bf16_rows(int(i1 - i0), a, i0, panel, width, yp, p0, p1, p0 == 0, next + l0 * 64, stream ? l1 - l0 : 0);
      }
    }
  }
}

// ---- the gated up projection in one pass (see PackedBf16GatedArgs) ----------------------------
// MR rows × (2 gate + 2 up) vectors of f32 accumulators (24 at 6 rows, + 4 weight vectors and a
// broadcast: 29 of the 32 registers); per pair of k: both panels' two 64-byte vectors, one broadcast
// per row, 4·MR vdpbf16ps — the x pair serves the gate and the up columns. The whole k in one pass
// (the chain of every output as packed_bf16_block's, whose k chunks reload exact f32 partial sums),
// then per row Avx512::silu_mul_ps and Avx512::to_bf16 (what silu_mul and store_as_bf16 apply).
constexpr int kGatedRows = 6;

template <int MR>
inline void gated_bf16_block(const PackedBf16GatedArgs& a, int64_t i0, const uint16_t* gp, const uint16_t* up, int ncols,
                             uint16_t* h, const char* pf, int64_t pf_lines) {
  __m512 g[MR][2], u[MR][2];
  for (int r = 0; r < MR; ++r) g[r][0] = g[r][1] = u[r][0] = u[r][1] = _mm512_setzero_ps();
  const uint16_t* xr[MR];
  for (int r = 0; r < MR; ++r) xr[r] = a.x + (i0 + r) * a.ldx;
  const int64_t whole = a.k / 2, pairs = (a.k + 1) / 2;
  const int64_t stride = pf_lines > 0 ? std::max<int64_t>(1, pairs / pf_lines) : pairs + 1;
  const int64_t per_step = pf_lines > 0 ? (pf_lines + pairs - 1) / pairs : 0;
  int64_t pf_next = 0, countdown = stride;
  for (int64_t j = 0; j < whole; ++j) {
    if (--countdown == 0) {
      countdown = stride;
      for (int64_t q = 0; q < per_step && pf_next < pf_lines; ++q) impl::prefetch_line_l2(pf + 64 * pf_next++);
    }
    const __m512i g0 = _mm512_loadu_si512(gp + j * 64), g1 = _mm512_loadu_si512(gp + j * 64 + 32);
    const __m512i u0 = _mm512_loadu_si512(up + j * 64), u1 = _mm512_loadu_si512(up + j * 64 + 32);
    for (int r = 0; r < MR; ++r) {
      const __m512i xb = x_pair(xr[r], j);
      g[r][0] = _mm512_dpbf16_ps(g[r][0], (__m512bh)xb, (__m512bh)g0);
      g[r][1] = _mm512_dpbf16_ps(g[r][1], (__m512bh)xb, (__m512bh)g1);
      u[r][0] = _mm512_dpbf16_ps(u[r][0], (__m512bh)xb, (__m512bh)u0);
      u[r][1] = _mm512_dpbf16_ps(u[r][1], (__m512bh)xb, (__m512bh)u1);
    }
  }
  if (pairs > whole) {  // odd k: the last pair is (x[k − 1], 0) against (W[c, k − 1], 0)
    const __m512i g0 = _mm512_loadu_si512(gp + whole * 64), g1 = _mm512_loadu_si512(gp + whole * 64 + 32);
    const __m512i u0 = _mm512_loadu_si512(up + whole * 64), u1 = _mm512_loadu_si512(up + whole * 64 + 32);
    for (int r = 0; r < MR; ++r) {
      const __m512i xb = _mm512_set1_epi32(int32_t(xr[r][a.k - 1]));
      g[r][0] = _mm512_dpbf16_ps(g[r][0], (__m512bh)xb, (__m512bh)g0);
      g[r][1] = _mm512_dpbf16_ps(g[r][1], (__m512bh)xb, (__m512bh)g1);
      u[r][0] = _mm512_dpbf16_ps(u[r][0], (__m512bh)xb, (__m512bh)u0);
      u[r][1] = _mm512_dpbf16_ps(u[r][1], (__m512bh)xb, (__m512bh)u1);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < 2 && 16 * v < ncols; ++v) {
      const int n = std::min(16, ncols - 16 * v);
      _mm256_mask_storeu_epi16(h + (i0 + r) * a.ldh + 16 * v, __mmask16(n == 16 ? 0xffff : (1u << n) - 1u),
                               Avx512::to_bf16(Avx512::silu_mul_ps(g[r][v], u[r][v])));
    }
}

template <int MR = kGatedRows>
inline void gated_bf16_rows(int mr, const PackedBf16GatedArgs& a, int64_t i0, const uint16_t* gp, const uint16_t* up, int ncols,
                            uint16_t* h, const char* pf, int64_t pf_lines) {
  if constexpr (MR > 1) {
    if (mr < MR) {
      gated_bf16_rows<MR - 1>(mr, a, i0, gp, up, ncols, h, pf, pf_lines);
      return;
    }
  }
  gated_bf16_block<MR>(a, i0, gp, up, ncols, h, pf, pf_lines);
}

void packed_gated_bf16_impl(const PackedBf16GatedArgs& a) {
  if (a.m <= 0 || a.n1 <= a.n0) return;
  const int64_t panel_elems = packed_bf16_panel_elems(a.k), blocks = (a.m + kGatedRows - 1) / kGatedRows;
  for (int64_t n = a.n0; n < a.n1; n += kPanelCols) {
    const int64_t p = n / kPanelCols;
    const uint16_t* gp = a.gate_panels + p * panel_elems;
    const uint16_t* up = a.up_panels + p * panel_elems;
    const int width = int(std::min<int64_t>(kPanelCols, a.n1 - n));
    // the next column's panels (both halves) into L2, their lines shared out over the row blocks; one
    // row block (decode) with prefetch_ahead < 0: none (on the AMD EPYC development VM software
    // prefetches slow the decode stream, see PackedMatrix::prefetch_ahead)
    const bool last = n + kPanelCols >= a.n1, stream = blocks > 1 || a.prefetch_ahead >= 0;
    const int64_t lines = last || !stream ? 0 : panel_elems * 2 / 64;
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t i0 = b * a.m / blocks, i1 = (b + 1) * a.m / blocks;
      const int64_t l0 = b * 2 * lines / blocks, l1 = (b + 1) * 2 * lines / blocks;
      // lines [0, lines) of the next gate panel, then [lines, 2·lines) of the next up panel
      const char* next = l0 < lines ? reinterpret_cast<const char*>(gp + panel_elems) + l0 * 64
                                    : reinterpret_cast<const char*>(up + panel_elems) + (l0 - lines) * 64;
      const int64_t count = l0 < lines ? std::min(l1, lines) - l0 : l1 - l0;
      gated_bf16_rows(int(i1 - i0), a, i0, gp, up, width, a.h + (n - a.n0), next, count);
    }
  }
}

// ---- packed FP8 on vdpbf16ps (see PackedFp8MatmulArgs, k-pair panels) ------------------------
// Every e4m3 value is a bf16 value, and so is every activation code: converted to bf16, the products
// are exact in f32 and vdpbf16ps sums two of them per lane, at twice the rate of the f32 FMAs the
// AVX-512 kernel (impl::packed_fp8_block) needs after its conversion. The weights are converted × 2^-8
// so that the normal codes take three operations: the sign-extended code shifted left by 4 puts the
// exponent and mantissa bits at bits 10..4 of the bf16 (and copies of the sign at 15..11), then bits
// 14..11 are set to 0111 (exponent + 112 = the bias difference 120 − 8). Products stay far above
// vdpbf16ps's flush-to-zero: |x| ≥ 2^-9, |w| ≥ 2^-17 after the scaling.

// 32 codes (16 columns × one k pair) → 32 bf16 × 2^-8, for blocks of normal codes only.
inline __m512i e4m3_pairs_normal(const uint8_t* p) {
  const __m512i w = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  // select: bits where the mask (0x7800) is set from 0x3800, the rest from w << 4 (imm 0xB8: b ? c : a)
  return _mm512_ternarylogic_epi32(_mm512_slli_epi16(w, 4), _mm512_set1_epi16(0x7800), _mm512_set1_epi16(0x3800), 0xB8);
}

// The same for blocks with zero and subnormal codes but no NaN: those lanes (exponent field 0) take
// m · 2^-17 with the code's sign from a table, indexed by the low five bits of w | w >> 3 — m in bits
// 0..2, and for a negative code (w = 0xFF80 | m after the sign extension) the sign in bit 4.
inline __m512i e4m3_pairs_small(const uint8_t* p) {
  const __m512i w = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  const __m512i normal = _mm512_ternarylogic_epi32(_mm512_slli_epi16(w, 4), _mm512_set1_epi16(0x7800), _mm512_set1_epi16(0x3800), 0xB8);
  const __mmask32 sub = _mm512_testn_epi16_mask(w, _mm512_set1_epi16(0x78));
  // bf16 of ±m · 2^-17: + at 0..7, − at 16..23
  const __m512i table = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, int16_t(0xB860), int16_t(0xB840), int16_t(0xB820), int16_t(0xB800),
                                         int16_t(0xB7C0), int16_t(0xB780), int16_t(0xB700), int16_t(0x8000), 0, 0, 0, 0, 0, 0, 0, 0,
                                         0x3860, 0x3840, 0x3820, 0x3800, 0x37C0, 0x3780, 0x3700, 0);
  return _mm512_mask_permutexvar_epi16(normal, sub, _mm512_or_si512(w, _mm512_srli_epi16(w, 3)), table);
}

// The same for any code: zero and subnormal codes (m · 2^-9, so m · 2^-17 here) from a table of the
// eight magnitudes with the code's sign, the NaN codes as NaN.
inline __m512i e4m3_pairs_any(const uint8_t* p) {
  const __m512i w = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  const __m512i normal = _mm512_ternarylogic_epi32(_mm512_slli_epi16(w, 4), _mm512_set1_epi16(0x7800), _mm512_set1_epi16(0x3800), 0xB8);
  const __m512i mag = _mm512_and_si512(w, _mm512_set1_epi16(0x7f));
  const __mmask32 sub = _mm512_cmplt_epu16_mask(mag, _mm512_set1_epi16(8));
  const __mmask32 nan = _mm512_cmpeq_epi16_mask(mag, _mm512_set1_epi16(0x7f));
  // bf16 of m · 2^-17, m = 0..7, in the first eight words (vpermw reads the index's low 5 bits)
  const __m512i table = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x3860, 0x3840,
                                         0x3820, 0x3800, 0x37C0, 0x3780, 0x3700, 0);
  const __m512i subv = _mm512_or_si512(_mm512_permutexvar_epi16(mag, table), _mm512_and_si512(w, _mm512_set1_epi16(int16_t(0x8000))));
  return _mm512_mask_mov_epi16(_mm512_mask_mov_epi16(normal, sub, subv), nan, _mm512_set1_epi16(0x7fc0));
}

// The prefetches of one row block's pass over a panel (see packed_pairs_driver): its pair steps
// j < lines fetch the line at `at` + stride · j into L2.
struct PairPrefetch {
  const char* at = nullptr;
  int64_t lines = 0, stride = 64;
  void step(int64_t j) const {
    if (j < lines) impl::prefetch_line_l2(at + stride * j);
  }
};

// The x operand of the FP8 / FP4 pair kernels: x's codes as bf16 pairs [m, ceil(k / 2)] (an odd k's
// last pair: (x[k − 1], 0)) in a per-thread buffer. Exact: each e4m3 code is a bf16 value. m · k
// conversions against m · k · (n1 − n0) products.
inline const uint32_t* x_code_pairs(const float* x, int64_t ldx, int64_t m, int64_t k) {
  const int64_t pairs = (k + 1) / 2;
  thread_local std::vector<uint32_t> xbuf;
  xbuf.resize(size_t(m * pairs));
  for (int64_t i = 0; i < m; ++i) {
    uint16_t* row = reinterpret_cast<uint16_t*>(xbuf.data() + i * pairs);
    Avx512::store_as_bf16(x + i * ldx, row, k);
    if (k % 2) row[k] = 0;
  }
  return xbuf.data();
}

// The outer loops of the FP8 / FP4 pair kernels: panel by panel over columns [n0, n1), each panel
// passed by near-equal row blocks of at most rows_max rows; rows(mr, i0, panel index, ncols, y, pf)
// runs one block. The next panel's lines are prefetched into L2, shared out over the row blocks'
// passes, one per pair step: while the later blocks read this panel from L2, the next one comes from
// memory. One row block: the same where prefetch_ahead is 0, none where it is negative, else the line
// prefetch_ahead bytes past each step's.
template <class Rows>
void packed_pairs_driver(int64_t m, int64_t k, int64_t n0, int64_t n1, const void* panels, int64_t panel_bytes, int64_t rows_max,
                         int64_t prefetch_ahead, float* y, int64_t ldy, Rows rows) {
  if (k == 0) {  // no products: zeros (the blocks would write their unset totals)
    for (int64_t i = 0; i < m; ++i) std::fill(y + i * ldy, y + i * ldy + (n1 - n0), 0.0f);
    return;
  }
  const int64_t pairs = (k + 1) / 2, step_bytes = panel_bytes / std::max<int64_t>(1, pairs), lines = (panel_bytes + 63) / 64;
  const int64_t row_blocks = (m + rows_max - 1) / rows_max;
  for (int64_t n = n0; n < n1; n += kPanelCols) {
    const int ncols = int(std::min<int64_t>(kPanelCols, n1 - n));
    const char* panel = static_cast<const char*>(panels) + (n / kPanelCols) * panel_bytes;
    const bool last = n + kPanelCols >= n1;
    for (int64_t b = 0; b < row_blocks; ++b) {
      const int64_t i0 = b * m / row_blocks, i1 = (b + 1) * m / row_blocks;
      PairPrefetch pf;
      if (!last && (row_blocks > 1 || prefetch_ahead == 0)) {
        const int64_t l0 = b * lines / row_blocks, l1 = (b + 1) * lines / row_blocks;
        pf = {panel + panel_bytes + 64 * l0, l1 - l0, 64};
      } else if (row_blocks == 1 && prefetch_ahead > 0) {  // (not past the call's last panel)
        pf = {panel + prefetch_ahead, last ? std::max<int64_t>(0, (panel_bytes - prefetch_ahead) / step_bytes) : pairs, step_bytes};
      }
      rows(int(i1 - i0), i0, n / kPanelCols, ncols, y + (n - n0), pf);
    }
  }
}

// The row-block dispatch shared by both: Block<MR>::run for MR = mr (1 .. MaxRows).
template <template <int> class Block, int MR, class... A>
inline void packed_pairs_rows(int mr, A&&... args) {
  if constexpr (MR > 1) {
    if (mr < MR) {
      packed_pairs_rows<Block, MR - 1>(mr, args...);
      return;
    }
  }
  Block<MR>::run(args...);
}

// A pair kernel (PackedFp8MatmulArgs or PackedFp4MatmulArgs): x's code pairs, then the driver over
// panels of bytes_per_pair · ceil(k / 2) bytes, row blocks of at most rows_max through Block<MR>.
template <template <int> class Block, int MaxRows, class Args>
void packed_pairs_matmul(const Args& a, int64_t bytes_per_pair, int64_t rows_max) {
  if (a.m <= 0 || a.n1 <= a.n0) return;
  const uint32_t* xpairs = x_code_pairs(a.x, a.ldx, a.m, a.k);
  packed_pairs_driver(a.m, a.k, a.n0, a.n1, a.panels, (a.k + 1) / 2 * bytes_per_pair, rows_max, a.prefetch_ahead, a.y, a.ldy,
                      [&](int mr, int64_t i0, int64_t p, int ncols, float* y, const PairPrefetch& pf) {
                        packed_pairs_rows<Block, MaxRows>(mr, a, xpairs, i0, p, ncols, y, pf);
                      });
}

// MR rows × one panel: per k pair one 64-byte row of the panel (32 columns × 2 codes) converted to two
// vectors (each row block converts them again: converting each panel once into a per-thread bf16
// buffer that the row blocks load was ~13 % slower at qwen3_30b_a3b T = 256, FP8 and FP4 alike, on the
// AMD EPYC VM — 128 bytes per pair step from L2 cost more than the conversion; docs/PERF.md,
// thirty-eighth session), one broadcast pair of x per row, 2·MR vdpbf16ps; per 128-k block (64 pairs) the sums are
// folded into the totals with 2^8 × x's scale × the columns' weight scales. The totals live in an L1
// buffer, not registers (a load and a store per row and block against 128 vdpbf16ps), so that 2·MR
// accumulators + 2 weights + 2 constants allow MR up to 12 and the conversion is shared by more rows.
constexpr int kPackedFp8Bf16MaxRows = 12;
constexpr int kPackedFp8Bf16Rows = 8;

template <int MR>
struct PackedFp8Block {
  static void run(const PackedFp8MatmulArgs& a, const uint32_t* xpairs, int64_t i0, int64_t p, int ncols, float* y,
                  const PairPrefetch& pf) {
    const int64_t blocks = (a.k + 127) / 128, pairs = (a.k + 1) / 2;
    const uint8_t* panel = a.panels + p * pairs * 64;
    const float* scales = a.block_scales + p * blocks * kPanelCols;
    const uint8_t* kind = a.block_kind + p * blocks;
    const uint32_t* xr[MR];
    for (int r = 0; r < MR; ++r) xr[r] = xpairs + (i0 + r) * pairs;
    alignas(64) float total[MR][kPanelCols];
    for (int64_t kb = 0; kb < blocks; ++kb) {
      const int64_t j0 = kb * 64, j1 = std::min(pairs, j0 + 64);
      __m512 acc[MR][2];
      for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
      // the block's pair steps with one of the three conversions (a loop each, not a branch per step)
      auto steps = [&](auto convert) {
        const uint8_t* pp = panel + j0 * 64;
        for (int64_t j = j0; j < j1; ++j, pp += 64) {
          pf.step(j);
          const __m512i w0 = convert(pp), w1 = convert(pp + 32);
          for (int r = 0; r < MR; ++r) {
            const __m512i xb = _mm512_set1_epi32(int32_t(xr[r][j]));
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], (__m512bh)xb, (__m512bh)w0);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], (__m512bh)xb, (__m512bh)w1);
          }
        }
      };
      if (kind[kb] == kFp8BlockNormal)
        steps([](const uint8_t* q) { return e4m3_pairs_normal(q); });
      else if (kind[kb] == kFp8BlockSmall)
        steps([](const uint8_t* q) { return e4m3_pairs_small(q); });
      else
        steps([](const uint8_t* q) { return e4m3_pairs_any(q); });
      const __m512 s0 = _mm512_loadu_ps(scales + kb * kPanelCols), s1 = _mm512_loadu_ps(scales + kb * kPanelCols + 16);
      for (int r = 0; r < MR; ++r) {
        const __m512 xs = _mm512_set1_ps(a.xs[(i0 + r) * blocks + kb] * 256.0f);  // × 2^8: exact
        fold_total(total[r], acc[r][0], _mm512_mul_ps(s0, xs), acc[r][1], _mm512_mul_ps(s1, xs), kb == 0);
      }
    }
    for (int r = 0; r < MR; ++r) std::memcpy(y + (i0 + r) * a.ldy, total[r], size_t(ncols) * sizeof(float));
  }
};

void packed_matmul_fp8_bf16_impl(const PackedFp8MatmulArgs& a) {
  // near-equal row blocks of at most kPackedFp8Bf16Rows, or MOEX_CPU_PACKED_ROWS (1 .. 12; A/B)
  static const int64_t rows_max = impl::packed_rows_setting(kPackedFp8Bf16MaxRows, kPackedFp8Bf16Rows);
  packed_pairs_matmul<PackedFp8Block, kPackedFp8Bf16MaxRows>(a, 64, rows_max);
}

// ---- packed FP4 on vdpbf16ps (see PackedFp4MatmulArgs) ------------------------------------------
// The e2m1 values are bf16 values too: per k pair, 32 bytes of the panel widened to 16-bit lanes
// give, by the low nibbles and (shifted by 4) the high ones, the indices of two table lookups
// (vpermw: 16 values, the table repeated in both halves because the index's bit 4 is the high
// nibble's low bit) — the two vectors of pairs for columns 0..15 and 16..31. The group scales
// (powers of two) are applied per group to the group's sums, the activation scale per 128-k block.
// 2·MR accumulators + 2·MR block sums + 2 weights + the table: MR ≤ 6.
constexpr int kPackedFp4Rows = 6;

template <int MR>
struct PackedFp4Block {
  static void run(const PackedFp4MatmulArgs& a, const uint32_t* xpairs, int64_t i0, int64_t p, int ncols, float* y,
                  const PairPrefetch& pf) {
    const int64_t pairs = (a.k + 1) / 2, groups = (a.k + a.group - 1) / a.group;
    const uint8_t* panel = a.panels + p * pairs * 32;
    // bf16 of the e2m1 values 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives (codes 8..15), twice
    const __m512i table = _mm512_set_epi16(
        int16_t(0xC0C0), int16_t(0xC080), int16_t(0xC040), int16_t(0xC000), int16_t(0xBFC0), int16_t(0xBF80), int16_t(0xBF00),
        int16_t(0x8000), 0x40C0, 0x4080, 0x4040, 0x4000, 0x3FC0, 0x3F80, 0x3F00, 0, int16_t(0xC0C0), int16_t(0xC080),
        int16_t(0xC040), int16_t(0xC000), int16_t(0xBFC0), int16_t(0xBF80), int16_t(0xBF00), int16_t(0x8000), 0x40C0, 0x4080,
        0x4040, 0x4000, 0x3FC0, 0x3F80, 0x3F00, 0);
    const uint32_t* xr[MR];
    for (int r = 0; r < MR; ++r) xr[r] = xpairs + (i0 + r) * pairs;
    // groups are even: a group's k range is whole pairs
    fp4_panel_pass<MR>(a, i0, a.group_scales + p * groups * kPanelCols, ncols, y, [&](int64_t k0, int64_t k1, __m512 (&acc)[MR][2]) {
      const int64_t j1 = (k1 + 1) / 2;
      const uint8_t* pp = panel + (k0 / 2) * 32;
      for (int64_t j = k0 / 2; j < j1; ++j, pp += 32) {
        pf.step(j);
        const __m512i codes = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(pp)));
        const __m512i w0 = _mm512_permutexvar_epi16(codes, table);
        const __m512i w1 = _mm512_permutexvar_epi16(_mm512_srli_epi16(codes, 4), table);
        for (int r = 0; r < MR; ++r) {
          const __m512i xb = _mm512_set1_epi32(int32_t(xr[r][j]));
          acc[r][0] = _mm512_dpbf16_ps(acc[r][0], (__m512bh)xb, (__m512bh)w0);
          acc[r][1] = _mm512_dpbf16_ps(acc[r][1], (__m512bh)xb, (__m512bh)w1);
        }
      }
    });
  }
};

void packed_matmul_fp4_bf16_impl(const PackedFp4MatmulArgs& a) {
  static const int64_t rows_max = impl::packed_rows_setting(kPackedFp4Rows, kPackedFp4Rows);  // (MOEX_CPU_PACKED_ROWS 1 .. 6)
  packed_pairs_matmul<PackedFp4Block, kPackedFp4Rows>(a, 32, rows_max);
}

struct Avx512Bf16 : Avx512 {
  static constexpr bool kBf16Dot = true;
  static constexpr bool kPackedBf16 = true;
  static void packed_matmul_bf16(const PackedBf16MatmulArgs& a) { packed_matmul_bf16_impl(a); }
  static void packed_gated_bf16(const PackedBf16GatedArgs& a) { packed_gated_bf16_impl(a); }
  // FP8 panels in k pairs, on vdpbf16ps (packed_matmul_fp8_bf16_impl)
  static constexpr bool kPackedFp8Pairs = true;
  static void packed_matmul_fp8_pairs(const PackedFp8MatmulArgs& a) { packed_matmul_fp8_bf16_impl(a); }
  // FP4 panels in k pairs (PackedFp4MatmulArgs), on vdpbf16ps
  static constexpr bool kPackedFp4Pairs = true;
  static void packed_matmul_fp4(const PackedFp4MatmulArgs& a) { packed_matmul_fp4_bf16_impl(a); }
  // The benchmark's bf16 peak probe: 12 independent vdpbf16ps chains (64 flops per instruction).
  // It issues at the rate of a 512-bit FMA on the AMD EPYC development VM, so the bf16 peak is twice
  // the f32 one there (2026-12-01, one idle core: 227-232 vs 115 GFLOP/s).
  static double bf16_dot_probe(int64_t iters) {
    constexpr int kChains = 12;
    __m512 acc[kChains];
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(float(c) * 1e-3f);
    __m512i a = _mm512_set1_epi16(0x3f80);  // bf16 1.0 pairs
    const __m512i b = _mm512_set1_epi16(0x3380);  // bf16 ~6e-8 pairs
    for (int64_t i = 0; i < iters; ++i) {
      for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], (__m512bh)a, (__m512bh)b);
      asm volatile("" : "+v"(a));  // keeps the operands in registers and the loop from folding
    }
    float sink = 0;
    for (int c = 0; c < kChains; ++c) sink += _mm512_reduce_add_ps(acc[c]);
    volatile float keep = sink;
    (void)keep;
    return 64.0 * double(iters) * kChains;
  }
  static void matmul_nt_bf16_dot(const MatmulArgs& a) {
    impl::walk_nt<4, 4>(a, 2, [&](int64_t i, int64_t n, int nr, int mr, const char* pf) {
      switch (mr) {
        case 4: dot_rows<4>(a, i, n, nr, pf); break;
        case 3: dot_rows<3>(a, i, n, nr, pf); break;
        case 2: dot_rows<2>(a, i, n, nr, pf); break;
        default: dot_rows<1>(a, i, n, nr, pf); break;
      }
    });
  }
};

// ---- AMX ------------------------------------------------------------------------------------
// The kernels are written against a tile interface (Tiles: configure, zero, load, store, dot) so that
// a scalar model of the tile operations (AmxTileModel) runs them on CPUs without AMX: the tests check
// their logic everywhere, the hardware (AmxTileUnit) where there is AMX.

struct alignas(64) TileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

void configure_tiles() {
  thread_local bool configured = false;  // the tile configuration is per thread
  if (configured) return;
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  _tile_loadconfig(&cfg);
  configured = true;
}

// The hardware's tiles (configure_tiles: 8 tiles of 16 rows × 64 bytes). The intrinsics paste their
// tile number into the instruction's text, so each number the kernel uses is spelt out.
struct AmxTileUnit {
  static void configure() { configure_tiles(); }
  template <int T>
  static void zero() {
    static_assert(T >= 0 && T < 4, "accumulator tiles 0..3");
    if constexpr (T == 0) _tile_zero(0);
    else if constexpr (T == 1) _tile_zero(1);
    else if constexpr (T == 2) _tile_zero(2);
    else _tile_zero(3);
  }
  template <int T>
  static void load(const void* p, int64_t stride) {
    static_assert(T >= 4 && T < 8, "operand tiles 4..7");
    if constexpr (T == 4) _tile_loadd(4, p, stride);
    else if constexpr (T == 5) _tile_loadd(5, p, stride);
    else if constexpr (T == 6) _tile_loadd(6, p, stride);
    else _tile_loadd(7, p, stride);
  }
  template <int T>
  static void store(void* p, int64_t stride) {
    static_assert(T >= 0 && T < 4, "accumulator tiles 0..3");
    if constexpr (T == 0) _tile_stored(0, p, stride);
    else if constexpr (T == 1) _tile_stored(1, p, stride);
    else if constexpr (T == 2) _tile_stored(2, p, stride);
    else _tile_stored(3, p, stride);
  }
  // the products the kernels use: A in 4..5, B in 6..7, C = 2 · (A − 4) + (B − 6) (the pair kernels)
  // or C = (A − 4) + 2 · (B − 6) (the bf16 kernel)
  template <int C, int A, int B>
  static void dot() {
    static_assert(A >= 4 && A < 6 && B >= 6 && B < 8 && (C == 2 * (A - 4) + (B - 6) || C == (A - 4) + 2 * (B - 6)),
                  "a tile product the kernels use");
    constexpr int code = C * 100 + A * 10 + B;
    if constexpr (code == 46) _tile_dpbf16ps(0, 4, 6);
    else if constexpr (code == 147) _tile_dpbf16ps(1, 4, 7);
    else if constexpr (code == 256) _tile_dpbf16ps(2, 5, 6);
    else if constexpr (code == 357) _tile_dpbf16ps(3, 5, 7);
    else if constexpr (code == 156) _tile_dpbf16ps(1, 5, 6);
    else if constexpr (code == 247) _tile_dpbf16ps(2, 4, 7);
    else static_assert(code == 46, "unreachable");
  }
};

// A scalar model of the same operations, TDPBF16PS as the ISA describes it: per C element, per pair
// k of the A row and B row k, C += A[2k]·B[2k], then C += A[2k+1]·B[2k+1], in f32.
struct AmxTileModel {
  struct State {
    alignas(64) uint8_t t[8][16][64];
  };
  static State& state() {
    thread_local State s;
    return s;
  }
  static float bf16(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    const uint32_t u = uint32_t(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  static void configure() {}
  template <int T>
  static void zero() { std::memset(state().t[T], 0, sizeof(state().t[T])); }
  template <int T>
  static void load(const void* p, int64_t stride) {
    for (int r = 0; r < 16; ++r) std::memcpy(state().t[T][r], static_cast<const uint8_t*>(p) + r * stride, 64);
  }
  template <int T>
  static void store(void* p, int64_t stride) {
    for (int r = 0; r < 16; ++r) std::memcpy(static_cast<uint8_t*>(p) + r * stride, state().t[T][r], 64);
  }
  template <int C, int A, int B>
  static void dot() {
    State& s = state();
    for (int m = 0; m < 16; ++m)
      for (int n = 0; n < 16; ++n) {
        float c;
        std::memcpy(&c, &s.t[C][m][4 * n], 4);
        for (int k = 0; k < 16; ++k) {
          c += bf16(&s.t[A][m][4 * k]) * bf16(&s.t[B][k][4 * n]);
          c += bf16(&s.t[A][m][4 * k + 2]) * bf16(&s.t[B][k][4 * n + 2]);
        }
        std::memcpy(&s.t[C][m][4 * n], &c, 4);
      }
  }
};

// ---- AMX bf16: the nt matmul ----------------------------------------------------------------
// C^T[n, m] = W[n, :] · X[m, :] on 16×16 f32 tiles: A = 16 weight rows × 32 k (loaded in place from
// the nt weights), B = 16 activation rows packed in the VNNI layout [k/2][16 rows][2], so that the
// weights, the large operand, are read as stored and only the small activations are repacked.
// Each output is summed over k in chunk order by one accumulator tile whatever m (results do not
// depend on how rows are blocked).

constexpr int64_t kAmxPrefetch = 256;  // elements ahead along k (512 bytes: 8 chunks)

template <class Tiles>
void amx_matmul(const MatmulArgs& a) {
  Tiles::configure();
  const int64_t m = a.m, k = a.k, chunks = (k + 31) / 32, mblocks = (m + 15) / 16;
  const uint16_t* w = static_cast<const uint16_t*>(a.w);
  // X in VNNI ([mblock][chunk][16 k-pairs][16 rows][2], pack_x_vnni): the caller's, or packed here
  const uint16_t* xv = a.x_vnni;
  if (!xv) {
    thread_local std::vector<uint16_t> packed;
    packed.resize(size_t(vnni_elems(m, k)));
    pack_x_vnni(static_cast<const uint16_t*>(a.x), a.ldx, m, k, packed.data());
    xv = packed.data();
  }
  // C^T tiles → rows of y: row r of y is column r of each tile, 16 floats 64 bytes apart, gathered
  // into one vector per tile (a scalar loop with its index arithmetic took ~20 % of this kernel on
  // small_moe at T = 256)
  alignas(64) float ct[4][256];
  const __m512i col = _mm512_set_epi32(240, 224, 208, 192, 176, 160, 144, 128, 112, 96, 80, 64, 48, 32, 16, 0);
  const auto write_rows = [&](int64_t mb, int64_t n, int64_t nb, const float* lo, const float* hi) {
    const int64_t rows = std::min<int64_t>(16, m - mb * 16);
    const __mmask16 lo_mask = nb >= 16 ? __mmask16(0xffff) : __mmask16((1u << nb) - 1);
    const __mmask16 hi_mask = nb <= 16 ? __mmask16(0) : nb >= 32 ? __mmask16(0xffff) : __mmask16((1u << (nb - 16)) - 1);
    for (int64_t r = 0; r < rows; ++r) {
      float* yr = a.y + (mb * 16 + r) * a.ldy + n;
      const __m512i at = _mm512_add_epi32(col, _mm512_set1_epi32(int(r)));
      _mm512_mask_storeu_ps(yr, lo_mask, _mm512_i32gather_ps(at, lo, 4));
      if (hi_mask) _mm512_mask_storeu_ps(yr + 16, hi_mask, _mm512_i32gather_ps(at, hi, 4));
    }
  };
  alignas(64) uint16_t wpad[2][512];
  // Per block of 32 weight rows (two 16-row A tiles, tmm4 / tmm5) and pair of 16-row blocks of X
  // (tmm6 / tmm7): four accumulators tmm0..3, so that each weight tile loaded serves two row blocks.
  for (int64_t n = a.n0; n < a.n1; n += 32) {
    const int64_t nb = std::min<int64_t>(32, a.n1 - n);
    for (int64_t mb = 0; mb < mblocks; mb += 2) {
      const bool two = mb + 1 < mblocks;
      Tiles::template zero<0>();
      Tiles::template zero<1>();
      Tiles::template zero<2>();
      Tiles::template zero<3>();
      for (int64_t c = 0; c < chunks; ++c) {
        const int64_t k0 = c * 32;
        if (mb == 0) {  // weight rows are separate pages: fetch kAmxPrefetch ahead by hand, in this
                        // block's rows, then in the next block's (short rows: k = 768 streamed at
                        // 19 GB/s when each block started cold, 23 with this, docs/PERF.md)
          const int64_t ahead = k0 + kAmxPrefetch;
          if (ahead < k) {
            for (int64_t rr = 0; rr < nb; ++rr) impl::prefetch_line(w + (n + rr) * a.ldw + ahead);
          } else if (n + 32 < a.n1 && ahead - k < k) {
            const int64_t nn = n + 32, nbn = std::min<int64_t>(32, a.n1 - nn);
            for (int64_t rr = 0; rr < nbn; ++rr) impl::prefetch_line(w + (nn + rr) * a.ldw + (ahead - k));
          }
        }
        if (nb == 32 && k0 + 32 <= k) {
          Tiles::template load<4>(w + n * a.ldw + k0, a.ldw * 2);
          Tiles::template load<5>(w + (n + 16) * a.ldw + k0, a.ldw * 2);
        } else {  // partial block: copy into zero-padded 16×32 tiles (never read past a row)
          std::memset(wpad, 0, sizeof(wpad));
          const int64_t kn = std::min<int64_t>(32, k - k0);
          for (int64_t rr = 0; rr < nb; ++rr)
            std::memcpy(&wpad[rr / 16][(rr % 16) * 32], w + (n + rr) * a.ldw + k0, size_t(kn) * 2);
          Tiles::template load<4>(wpad[0], 64);
          Tiles::template load<5>(wpad[1], 64);
        }
        Tiles::template load<6>(xv + (mb * chunks + c) * 512, 64);
        Tiles::template dot<0, 4, 6>();
        Tiles::template dot<1, 5, 6>();
        if (two) {
          Tiles::template load<7>(xv + ((mb + 1) * chunks + c) * 512, 64);
          Tiles::template dot<2, 4, 7>();
          Tiles::template dot<3, 5, 7>();
        }
      }
      Tiles::template store<0>(ct[0], 64);
      Tiles::template store<1>(ct[1], 64);
      write_rows(mb, n, nb, ct[0], ct[1]);
      if (two) {
        Tiles::template store<2>(ct[2], 64);
        Tiles::template store<3>(ct[3], 64);
        write_rows(mb + 1, n, nb, ct[2], ct[3]);
      }
    }
  }
}

// ---- AMX FP8 / FP4 (PackedFp8MatmulArgs / PackedFp4MatmulArgs, k-pair panels) ------------------
// The tile unit's view of the k-pair panels: one pair of a panel (64 bytes: 32 columns × 2 codes),
// converted to bf16 × 2^-8 by e4m3_pairs_* (32 bytes → 16 columns × 2 k), is one row of a B tile in
// the VNNI layout [16 pairs][16 columns][2] — columns 0..15 in one tile, 16..31 in another — so the 16
// pairs of one 32-k chunk make two B tiles. A tiles: 16 rows of x's codes as bf16 (exact), C tiles
// C[row][column] in f32. Per 128-k block the panel's 64 pairs are converted once into an L1 buffer
// (8 KiB) that every 32-row block of x then multiplies (4 chunks × 4 TDPBF16PS), and the C tiles are
// folded into the rows' totals with 2^8 × x's scale × the columns' weight scales, as in the
// vdpbf16ps kernel: there every row block converts the panel again (MR ≤ 12 rows share it), here all
// rows share one conversion and the products run on the tile unit.
//
// Each output is, per 128-k block, one f32 chain in k order (chunk by chunk, a pair's even k before
// its odd one in the ISA's description) for every m: rows do not depend on the batch. The products
// (codes × codes × 2^-8, exact in f32 and far above the tile unit's flush-to-zero) are those of the
// vdpbf16ps kernel; the sums may round in another order.

// The driver of the AMX pair kernels (FP8 and FP4): per panel of columns [n0, n1) and 128-k block,
// convert(p, kb, j0, j1, wb, prefetch) writes the block's pairs [j0, j1) of panel p as bf16 B-tile
// rows into wb (asking L2 for the `prefetch` lines: prefetch.step(j − j0) at pair j),
// fold_scales(p, kb, s0, s1) gives the columns' factors of the block's fold (beside x's scale). Panels for which on_tiles(p) is false
// are left to elsewhere(column, end column).
template <class Tiles, class Convert, class FoldScales, class OnTiles, class Elsewhere>
void amx_pairs_matmul(const float* x, int64_t ldx, const float* xs, int64_t m, int64_t k, int64_t n0, int64_t n1, float* y, int64_t ldy,
                      const uint8_t* panels, int64_t pair_bytes, Convert convert, FoldScales fold_scales, OnTiles on_tiles,
                      Elsewhere elsewhere) {
  if (m <= 0 || n1 <= n0) return;
  if (k == 0) {  // no products: zeros
    for (int64_t i = 0; i < m; ++i) std::fill(y + i * ldy, y + i * ldy + (n1 - n0), 0.0f);
    return;
  }
  Tiles::configure();
  const int64_t pairs = (k + 1) / 2, blocks = (k + 127) / 128, mblocks = (m + 15) / 16;
  // x's codes as bf16 pairs [mblocks · 16 rows][blocks · 64 pairs], zero past m and k (the A tiles
  // read whole 16 × 32-k tiles; zero x meets the zeroed B rows past the panel's end)
  const int64_t xpairs_ld = blocks * 64, xstride = xpairs_ld * 4;  // A row stride in bytes
  thread_local std::vector<uint32_t> xbuf;
  xbuf.assign(size_t(mblocks * 16 * xpairs_ld), 0u);
  for (int64_t i = 0; i < m; ++i) Avx512::store_as_bf16(x + i * ldx, reinterpret_cast<uint16_t*>(xbuf.data() + i * xpairs_ld), k);
  // the rows' totals over one panel [mblocks · 16][32] and one block's C tiles
  thread_local std::vector<float> totals;
  totals.resize(size_t(mblocks * 16 * kPanelCols));
  alignas(64) float ct[4][256];
  // one 128-k block of the panel as B tiles: [4 chunks][2 column halves][16 pairs][16 columns][2]
  alignas(64) uint16_t wb[4][2][512];
  const int64_t panel_bytes = pairs * pair_bytes;
  for (int64_t n = n0; n < n1; n += kPanelCols) {
    const int64_t p = n / kPanelCols;
    const int ncols = int(std::min<int64_t>(kPanelCols, n1 - n));
    if (!on_tiles(p)) {
      elsewhere(n, n + ncols);
      continue;
    }
    const uint8_t* panel = panels + p * panel_bytes;
    for (int64_t kb = 0; kb < blocks; ++kb) {
      const int64_t j0 = kb * 64, j1 = std::min(pairs, j0 + 64), chunks = (j1 - j0 + 15) / 16;
      // the lines the stream reads next (this panel's next block, or the next panel's first one),
      // asked of L2 one per pair step while this block converts
      PairPrefetch next;
      if (kb + 1 < blocks)
        next = {reinterpret_cast<const char*>(panel + j1 * pair_bytes), (std::min(pairs, j1 + 64) - j1) * pair_bytes / 64, 64};
      else if (n + kPanelCols < n1)
        next = {reinterpret_cast<const char*>(panel + panel_bytes), std::min<int64_t>(64, pairs) * pair_bytes / 64, 64};
      convert(p, kb, j0, j1, wb, next);
      const int64_t tail = (j1 - j0) % 16;  // pair rows of the last chunk past the panel's end: zero
      if (tail)
        for (int h = 0; h < 2; ++h) std::memset(wb[chunks - 1][h] + tail * 32, 0, size_t(16 - tail) * 64);
      __m512 s0, s1;
      fold_scales(p, kb, s0, s1);
      // the rows of 16-row block mb: totals (+)= C · x scale · the columns' factors
      const auto fold = [&](int64_t mb, const float* c0, const float* c1) {
        const int64_t rows = std::min<int64_t>(16, m - mb * 16);
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t i = mb * 16 + r;
          float* t = totals.data() + i * kPanelCols;
          const __m512 xsv = _mm512_set1_ps(xs[i * blocks + kb]);
          const __m512 t0 = kb == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(t);
          const __m512 t1 = kb == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(t + 16);
          _mm512_storeu_ps(t, _mm512_fmadd_ps(_mm512_load_ps(c0 + r * 16), _mm512_mul_ps(s0, xsv), t0));
          _mm512_storeu_ps(t + 16, _mm512_fmadd_ps(_mm512_load_ps(c1 + r * 16), _mm512_mul_ps(s1, xsv), t1));
        }
      };
      // pairs of 16-row blocks: each B tile loaded serves two A tiles (four accumulators)
      for (int64_t mb = 0; mb < mblocks; mb += 2) {
        const bool two = mb + 1 < mblocks;
        Tiles::template zero<0>();
        Tiles::template zero<1>();
        if (two) {
          Tiles::template zero<2>();
          Tiles::template zero<3>();
        }
        for (int64_t c = 0; c < chunks; ++c) {
          Tiles::template load<6>(wb[c][0], 64);
          Tiles::template load<7>(wb[c][1], 64);
          Tiles::template load<4>(xbuf.data() + mb * 16 * xpairs_ld + j0 + c * 16, xstride);
          Tiles::template dot<0, 4, 6>();
          Tiles::template dot<1, 4, 7>();
          if (two) {
            Tiles::template load<5>(xbuf.data() + (mb + 1) * 16 * xpairs_ld + j0 + c * 16, xstride);
            Tiles::template dot<2, 5, 6>();
            Tiles::template dot<3, 5, 7>();
          }
        }
        Tiles::template store<0>(ct[0], 64);
        Tiles::template store<1>(ct[1], 64);
        fold(mb, ct[0], ct[1]);
        if (two) {
          Tiles::template store<2>(ct[2], 64);
          Tiles::template store<3>(ct[3], 64);
          fold(mb + 1, ct[2], ct[3]);
        }
      }
    }
    for (int64_t i = 0; i < m; ++i) std::memcpy(y + i * ldy + (n - n0), totals.data() + i * kPanelCols, size_t(ncols) * sizeof(float));
  }
}

// FP8: the codes × 2^-8 (e4m3_pairs_*, by the block's kind), folded with 2^8 × the block's column
// scales. Every panel on the tiles.
template <class Tiles>
void amx_fp8_matmul(const PackedFp8MatmulArgs& a) {
  const int64_t blocks = (a.k + 127) / 128;
  auto convert = [&](int64_t p, int64_t kb, int64_t j0, int64_t j1, uint16_t (&wb)[4][2][512], const PairPrefetch& pf) {
    const uint8_t* panel = a.panels + p * ((a.k + 1) / 2) * 64;
    auto rows = [&](auto pair_to_bf16) {
      const uint8_t* pp = panel + j0 * 64;
      for (int64_t j = j0; j < j1; ++j, pp += 64) {
        pf.step(j - j0);
        const int64_t c = (j - j0) / 16, r = (j - j0) % 16;
        _mm512_store_si512(wb[c][0] + r * 32, pair_to_bf16(pp));
        _mm512_store_si512(wb[c][1] + r * 32, pair_to_bf16(pp + 32));
      }
    };
    const uint8_t kind = a.block_kind[p * blocks + kb];
    if (kind == kFp8BlockNormal)
      rows([](const uint8_t* q) { return e4m3_pairs_normal(q); });
    else if (kind == kFp8BlockSmall)
      rows([](const uint8_t* q) { return e4m3_pairs_small(q); });
    else
      rows([](const uint8_t* q) { return e4m3_pairs_any(q); });
  };
  auto fold_scales = [&](int64_t p, int64_t kb, __m512& s0, __m512& s1) {
    const float* sc = a.block_scales + (p * blocks + kb) * kPanelCols;
    const __m512 two8 = _mm512_set1_ps(256.0f);  // × 2^8: exact
    s0 = _mm512_mul_ps(_mm512_loadu_ps(sc), two8);
    s1 = _mm512_mul_ps(_mm512_loadu_ps(sc + 16), two8);
  };
  amx_pairs_matmul<Tiles>(a.x, a.ldx, a.xs, a.m, a.k, a.n0, a.n1, a.y, a.ldy, a.panels, 64, convert, fold_scales,
                          [](int64_t) { return true; }, [](int64_t, int64_t) {});
}

// FP4: the group scales (powers of two) go into the weights, exactly — each e2m1 value (two
// significant bits) times 2^e is a bf16 value: the e2m1 value's bf16 from the vpermw table with e
// added to its exponent field (zero codes left zero) — so that a whole 128-k block sums on the tiles
// and folds with x's scale alone. A panel takes this path when every group scale of it is 2^e with
// |e| ≤ kAmxFp4MaxExp (or 0, the padding columns): the weights are then normal bf16 values and the
// products and 128-term sums of them with e4m3 codes stay far from f32's flush-to-zero and overflow.
// Other panels (scales of 2^-100 and below, or 2^100 and above, or not powers of two) run on the
// vdpbf16ps kernel, which scales each group's sums; the choice is per panel, whatever m or the column
// range. FP4 checkpoints' scales sit near 2^0 (MXFP4).
constexpr int kAmxFp4MaxExp = 100;

// The 32 exponent steps of one group's column scales as bf16 exponent-field increments, for the
// two halves of a pair row (columns 0..15 and 16..31, each column's twice: its k pair). False where a
// scale is out of range.
inline bool fp4_scale_steps(const float* scales, __m512i& d0, __m512i& d1) {
  const __m512i bits0 = _mm512_castps_si512(_mm512_loadu_ps(scales)), bits1 = _mm512_castps_si512(_mm512_loadu_ps(scales + 16));
  const __m512i mant_mask = _mm512_set1_epi32(0x807fffff);  // sign and mantissa: zero for +2^e
  const __m512i e0 = _mm512_sub_epi32(_mm512_srli_epi32(bits0, 23), _mm512_set1_epi32(127));
  const __m512i e1 = _mm512_sub_epi32(_mm512_srli_epi32(bits1, 23), _mm512_set1_epi32(127));
  const __mmask16 pad0 = _mm512_testn_epi32_mask(bits0, bits0), pad1 = _mm512_testn_epi32_mask(bits1, bits1);
  const __m512i lim = _mm512_set1_epi32(kAmxFp4MaxExp);
  const __mmask16 ok0 = _mm512_testn_epi32_mask(bits0, mant_mask) & _mm512_cmple_epi32_mask(_mm512_abs_epi32(e0), lim);
  const __mmask16 ok1 = _mm512_testn_epi32_mask(bits1, mant_mask) & _mm512_cmple_epi32_mask(_mm512_abs_epi32(e1), lim);
  if (__mmask16(ok0 | pad0) != 0xffff || __mmask16(ok1 | pad1) != 0xffff) return false;
  // per column lane: e << 7 in both 16-bit halves (the pair's two k); padding columns: 0
  const __m512i s0 = _mm512_maskz_slli_epi32(__mmask16(~pad0), e0, 7), s1 = _mm512_maskz_slli_epi32(__mmask16(~pad1), e1, 7);
  d0 = _mm512_or_si512(_mm512_and_si512(s0, _mm512_set1_epi32(0xffff)), _mm512_slli_epi32(s0, 16));
  d1 = _mm512_or_si512(_mm512_and_si512(s1, _mm512_set1_epi32(0xffff)), _mm512_slli_epi32(s1, 16));
  return true;
}

template <class Tiles>
void amx_fp4_matmul(const PackedFp4MatmulArgs& a) {
  const int64_t pairs = (a.k + 1) / 2, groups = (a.k + a.group - 1) / a.group, npanels = (a.n1 + kPanelCols - 1) / kPanelCols;
  // which panels of this call run on the tiles (their scales all in range)
  thread_local std::vector<uint8_t> tiles_ok;
  tiles_ok.assign(size_t(npanels), 0);
  for (int64_t p = a.n0 / kPanelCols; p < npanels; ++p) {
    bool ok = true;
    for (int64_t g = 0; g < groups && ok; ++g) {
      __m512i d0, d1;
      ok = fp4_scale_steps(a.group_scales + (p * groups + g) * kPanelCols, d0, d1);
    }
    tiles_ok[size_t(p)] = ok;
  }
  // bf16 of the e2m1 values 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives (codes 8..15), twice (see
  // PackedFp4Block)
  const __m512i table = _mm512_set_epi16(
      int16_t(0xC0C0), int16_t(0xC080), int16_t(0xC040), int16_t(0xC000), int16_t(0xBFC0), int16_t(0xBF80), int16_t(0xBF00),
      int16_t(0x8000), 0x40C0, 0x4080, 0x4040, 0x4000, 0x3FC0, 0x3F80, 0x3F00, 0, int16_t(0xC0C0), int16_t(0xC080), int16_t(0xC040),
      int16_t(0xC000), int16_t(0xBFC0), int16_t(0xBF80), int16_t(0xBF00), int16_t(0x8000), 0x40C0, 0x4080, 0x4040, 0x4000, 0x3FC0,
      0x3F80, 0x3F00, 0);
  const __m512i magnitude = _mm512_set1_epi16(0x7fff);
  auto convert = [&](int64_t p, int64_t kb, int64_t j0, int64_t j1, uint16_t (&wb)[4][2][512], const PairPrefetch& pf) {
    const uint8_t* pp = a.panels + p * pairs * 32 + j0 * 32;
    int64_t g_now = -1;
    __m512i d0 = _mm512_setzero_si512(), d1 = _mm512_setzero_si512();
    for (int64_t j = j0; j < j1; ++j, pp += 32) {
      pf.step(j - j0);
      const int64_t g = 2 * j / a.group;  // groups are even: a pair lies in one group
      if (g != g_now) {
        fp4_scale_steps(a.group_scales + (p * groups + g) * kPanelCols, d0, d1);  // checked in range above
        g_now = g;
      }
      const __m512i codes = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(pp)));
      const __m512i w0 = _mm512_permutexvar_epi16(codes, table);
      const __m512i w1 = _mm512_permutexvar_epi16(_mm512_srli_epi16(codes, 4), table);
      const int64_t c = (j - j0) / 16, r = (j - j0) % 16;
      _mm512_store_si512(wb[c][0] + r * 32, _mm512_mask_add_epi16(w0, _mm512_test_epi16_mask(w0, magnitude), w0, d0));
      _mm512_store_si512(wb[c][1] + r * 32, _mm512_mask_add_epi16(w1, _mm512_test_epi16_mask(w1, magnitude), w1, d1));
    }
  };
  auto fold_scales = [](int64_t, int64_t, __m512& s0, __m512& s1) { s0 = s1 = _mm512_set1_ps(1.0f); };
  auto on_tiles = [&](int64_t p) { return tiles_ok[size_t(p)] != 0; };
  auto elsewhere = [&](int64_t c0, int64_t c1) {
    PackedFp4MatmulArgs b = a;
    b.y = a.y + (c0 - a.n0);
    b.n0 = c0;
    b.n1 = c1;
    packed_matmul_fp4_bf16_impl(b);
  };
  amx_pairs_matmul<Tiles>(a.x, a.ldx, a.xs, a.m, a.k, a.n0, a.n1, a.y, a.ldy, a.panels, 32, convert, fold_scales, on_tiles, elsewhere);
}

// The avx512_amx table's kernels on the tiles (AmxTileUnit), or on the scalar model of them
// (AmxTileModel: the avx512_amx_model table, for tests of the whole experts path without AMX).
template <class Tiles>
struct AmxOn : Avx512Bf16 {
  static constexpr bool kPackedBf16 = false;  // the tiles read the nt weights in place (not measured packed)
  static void matmul_nt_bf16_dot(const MatmulArgs& a) {
    if (a.m >= kAmxMinRows)
      amx_matmul<Tiles>(a);
    else
      Avx512Bf16::matmul_nt_bf16_dot(a);
  }
  static void packed_matmul_fp8_pairs(const PackedFp8MatmulArgs& a) {
    if (amx_quant_rows(a.m))
      amx_fp8_matmul<Tiles>(a);
    else
      packed_matmul_fp8_bf16_impl(a);
  }
  static void packed_matmul_fp4(const PackedFp4MatmulArgs& a) {
    if (amx_quant_rows(a.m))
      amx_fp4_matmul<Tiles>(a);
    else
      packed_matmul_fp4_bf16_impl(a);
  }
};

}  // namespace

// The avx512_amx table's FP8 and FP4 experts on the tiles (amx_fp8_matmul, amx_fp4_matmul) for calls of
// >= kAmxMinRows rows, the vdpbf16ps kernels below that. Measured on the H200 host (Intel Xeon, AMX),
// 2026-12-05, FP8 experts, grouped_mm, one interleaved round, ms, vdpbf16ps / tiles: qwen3_30b_a3b
// T = 256 (~16 rows per expert) 26.6 / 11.6 at 16 threads, 141.8 / 44.9 at 2; small_moe T = 256 (~32
// rows) 2.28 / 0.90 at 16; at T <= 16 (1-2 rows per expert) the tiles were 0-20 % slower (qwen3 T = 1
// 0.385 / 0.468 at 16 threads). MOEX_CPU_AMX_QUANT=1: the tiles for every call; 0: never.
int amx_quant_mode() {
  static const int mode = [] {
    const char* e = std::getenv("MOEX_CPU_AMX_QUANT");
    return e && std::strcmp(e, "1") == 0 ? 1 : e && std::strcmp(e, "0") == 0 ? 0 : -1;
  }();
  return mode;
}
bool amx_quant_enabled() { return amx_quant_mode() != 0; }
bool amx_quant_rows(int64_t m) {
  const int mode = amx_quant_mode();
  return mode == 1 || (mode < 0 && m >= kAmxMinRows);
}

const KernelTable& avx512_bf16_kernels() {
  static const KernelTable table = impl::make_table<Avx512Bf16>("avx512_bf16");
  return table;
}

bool amx_available() {
  // Linux hands out the AMX tile state only on request (once per process).
  static const bool ok = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
  return ok;
}

void matmul_bf16_amx(const MatmulArgs& a, bool tile_model) {
  if (tile_model)
    amx_matmul<AmxTileModel>(a);
  else
    amx_matmul<AmxTileUnit>(a);
}

void packed_matmul_fp8_amx(const PackedFp8MatmulArgs& a, bool tile_model) {
  if (tile_model)
    amx_fp8_matmul<AmxTileModel>(a);
  else
    amx_fp8_matmul<AmxTileUnit>(a);
}
void packed_matmul_fp4_amx(const PackedFp4MatmulArgs& a, bool tile_model) {
  if (tile_model)
    amx_fp4_matmul<AmxTileModel>(a);
  else
    amx_fp4_matmul<AmxTileUnit>(a);
}

const KernelTable& avx512_amx_kernels() {
  static const KernelTable table = impl::make_table<AmxOn<AmxTileUnit>>("avx512_amx");
  return table;
}

const KernelTable& avx512_amx_model_kernels() {
  static const KernelTable table = impl::make_table<AmxOn<AmxTileModel>>("avx512_amx_model");
  return table;
}

}  // namespace moex::cpu
