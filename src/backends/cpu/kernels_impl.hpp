// backends/cpu/kernels_impl.hpp — the matmul and conversion kernels, written once over a small
// SIMD traits class (`Isa`) and included by one .cpp per instruction set.
//
// NOTE: this is the straightforward register-blocked version (no weight packing). The nt kernel
// computes a 4×4 block of dot products with vector accumulators along k, so each weight row is
// read once per 4 rows of x; the nn kernel broadcasts x and runs FMAs along n, 6 rows × 2 vectors.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>

#include "backends/cpu/kernels.hpp"
#include "backends/cpu/quant_math.hpp"

namespace moex::cpu::impl {

// Fetches the cache line at p into L1 ahead of its use. NOTE: GCC treats __builtin_prefetch as a
// call that may touch any memory, and an asm with a memory operand ("m"(*p)) as a read that may
// alias any addressable local, so around either it stores its accumulator array to the stack
// (measured: every k step in the packed kernel, or every group of steps when the prefetches sat
// between groups). The address goes in as a plain register operand: the asm touches no memory
// that the compiler knows of, and the accumulators stay in registers.
inline void prefetch_line(const void* p) {
#if defined(__x86_64__)
  asm volatile("prefetcht0 (%0)" : : "r"(p));
#else
  __builtin_prefetch(p, 0, 3);
#endif
}
// The same into L2 only (data needed after what L1 holds now).
inline void prefetch_line_l2(const void* p) {
#if defined(__x86_64__)
  asm volatile("prefetcht1 (%0)" : : "r"(p));
#else
  __builtin_prefetch(p, 0, 2);
#endif
}

// Bytes per weight element, known at compile time (dtype_size is a function call).
template <DType WD>
constexpr int64_t wsize() {
  return WD == DType::f32 ? 4 : 2;
}

// Loads W lanes of weights of dtype WD starting at p, widened to f32.
template <class Isa, DType WD>
inline typename Isa::V load_w(const void* p, int64_t i) {
  if constexpr (WD == DType::f32) return Isa::load(static_cast<const float*>(p) + i);
  else if constexpr (WD == DType::bf16) return Isa::load_bf16(static_cast<const uint16_t*>(p) + i);
  else return Isa::load_f16(static_cast<const uint16_t*>(p) + i);
}

template <DType WD>
inline float scalar_w(const void* p, int64_t i) {
  if constexpr (WD == DType::f32) return static_cast<const float*>(p)[i];
  else if constexpr (WD == DType::bf16) return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
  else return f16_to_float(static_cast<const uint16_t*>(p)[i]);
}

// ---- nt: y[i, n] = dot(x[i, :], W[n, :]) ------------------------------------------------------
// `prefetch`: the next block's weight rows (or nullptr), fetched into the cache while this block
// computes. NOTE: the prefetch matters because every weight row of a real model is its own 4 KiB
// page (H = 2048 bf16), where the hardware streamer stops; measured 9 → 16 GB/s for one thread.
// Only k in [k0, k1) is summed; with `accumulate` the sums are added to y instead of stored.
template <class Isa, DType WD, int MR, int NR>
inline void nt_block(const MatmulArgs& a, int64_t i0, int64_t n0, const char* prefetch, int64_t k0, int64_t k1, bool accumulate) {
  using V = typename Isa::V;
  constexpr int W = Isa::W;
  V acc[MR][NR];
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < NR; ++c) acc[r][c] = Isa::zero();
  const int64_t kv = k0 + (k1 - k0) / W * W;
  const float* xr[MR];
  for (int r = 0; r < MR; ++r) xr[r] = static_cast<const float*>(a.x) + (i0 + r) * a.ldx;
  const char* wbase = static_cast<const char*>(a.w);
  const void* wr[NR];
  for (int c = 0; c < NR; ++c) wr[c] = wbase + (n0 + c) * a.ldw * wsize<WD>();
  const int64_t row_bytes = a.ldw * wsize<WD>();
  // groups of kGroup vector steps with the prefetches between them (a prefetch inside the innermost
  // loop keeps GCC from holding acc in registers, see prefetch_line)
  constexpr int64_t kGroup = 8;
  for (int64_t kg = k0; kg < kv; kg += kGroup * W) {
    const int64_t kend = std::min(kv, kg + kGroup * W);
    if (prefetch) {  // the same k range of the next block's rows
      const int64_t off = kg * wsize<WD>(), len = (kend - kg) * wsize<WD>();
      for (int c = 0; c < NR; ++c)
        for (int64_t b = 0; b < len; b += 64) prefetch_line(prefetch + c * row_bytes + off + b);
    }
    for (int64_t kk = kg; kk < kend; kk += W) {
      V xv[MR];
      for (int r = 0; r < MR; ++r) xv[r] = Isa::load(xr[r] + kk);
      for (int c = 0; c < NR; ++c) {
        V wv = load_w<Isa, WD>(wr[c], kk);
        for (int r = 0; r < MR; ++r) acc[r][c] = Isa::fma(xv[r], wv, acc[r][c]);
      }
    }
  }
  for (int r = 0; r < MR; ++r) {
    for (int c = 0; c < NR; ++c) {
      float s = Isa::reduce(acc[r][c]);
      for (int64_t kk = kv; kk < k1; ++kk) s += xr[r][kk] * scalar_w<WD>(wr[c], kk);
      float& out = a.y[(i0 + r) * a.ldy + n0 + c];
      out = accumulate ? out + s : s;
    }
  }
}

template <class Isa, DType WD, int MR>
inline void nt_row_block(const MatmulArgs& a, int64_t i0, int64_t n0, int nr, const char* pf, int64_t k0, int64_t k1, bool acc) {
  switch (nr) {
    case 4: nt_block<Isa, WD, MR, 4>(a, i0, n0, pf, k0, k1, acc); break;
    case 3: nt_block<Isa, WD, MR, 3>(a, i0, n0, pf, k0, k1, acc); break;
    case 2: nt_block<Isa, WD, MR, 2>(a, i0, n0, pf, k0, k1, acc); break;
    default: nt_block<Isa, WD, MR, 1>(a, i0, n0, pf, k0, k1, acc); break;
  }
}

// Walks an nt matmul in blocks of MR rows × NR weight rows; `block(i0, n, nr, mr, prefetch)` computes
// one block. The first row block of each weight block prefetches the next weight block (full
// blocks only, inside [n0, n1)).
template <int MR, int NR, class Block>
inline void walk_nt(const MatmulArgs& a, int64_t elem_bytes, Block block) {
  for (int64_t n = a.n0; n < a.n1; n += NR) {
    const int nr = int(std::min<int64_t>(NR, a.n1 - n));
    const char* next = n + 2 * NR <= a.n1 ? static_cast<const char*>(a.w) + (n + NR) * a.ldw * elem_bytes : nullptr;
    for (int64_t i = 0; i < a.m; i += MR) block(i, n, nr, int(std::min<int64_t>(MR, a.m - i)), i == 0 ? next : nullptr);
  }
}

// NOTE: with more than a few rows, k is cut into chunks of kChunk so that the chunk of every x row
// stays in L1 while all weight blocks of the range pass by; otherwise each weight block re-reads
// all x rows from L2, which bounded the f32 kernel at about a third of the FMA rate.
constexpr int64_t kChunk = 512;

template <class Isa, DType WD>
void matmul_nt(const MatmulArgs& a) {
  const int64_t step = a.m > 4 ? kChunk : a.k;
  for (int64_t k0 = 0; k0 < a.k; k0 += step) {
    const int64_t k1 = std::min(a.k, k0 + step);
    walk_nt<4, 4>(a, wsize<WD>(), [&](int64_t i, int64_t n, int nr, int mr, const char* pf) {
      switch (mr) {
        case 4: nt_row_block<Isa, WD, 4>(a, i, n, nr, pf, k0, k1, k0 > 0); break;
        case 3: nt_row_block<Isa, WD, 3>(a, i, n, nr, pf, k0, k1, k0 > 0); break;
        case 2: nt_row_block<Isa, WD, 2>(a, i, n, nr, pf, k0, k1, k0 > 0); break;
        default: nt_row_block<Isa, WD, 1>(a, i, n, nr, pf, k0, k1, k0 > 0); break;
      }
    });
  }
}

// ---- nn: y[i, n0:n1] = Σ_k x[i, k] · W[k, n0:n1] ----------------------------------------------
template <class Isa, DType WD, int MR, int NV>
inline void nn_block(const MatmulArgs& a, int64_t i0, int64_t n) {
  using V = typename Isa::V;
  constexpr int W = Isa::W;
  V acc[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < NV; ++c) acc[r][c] = Isa::zero();
  const char* wbase = static_cast<const char*>(a.w);
  const int64_t esz = wsize<WD>();
  for (int64_t kk = 0; kk < a.k; ++kk) {
    const void* wrow = wbase + (kk * a.ldw) * esz;
    V wv[NV];
    for (int c = 0; c < NV; ++c) wv[c] = load_w<Isa, WD>(wrow, n + c * W);
    for (int r = 0; r < MR; ++r) {
      V xb = Isa::set1(static_cast<const float*>(a.x)[(i0 + r) * a.ldx + kk]);
      for (int c = 0; c < NV; ++c) acc[r][c] = Isa::fma(xb, wv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < NV; ++c) Isa::store(a.y + (i0 + r) * a.ldy + n + c * W, acc[r][c]);
}

template <class Isa, DType WD, int NV>
inline void nn_col_block(const MatmulArgs& a, int64_t n) {
  constexpr int MR = 6;
  int64_t i = 0;
  for (; i + MR <= a.m; i += MR) nn_block<Isa, WD, MR, NV>(a, i, n);
  for (; i + 2 <= a.m; i += 2) nn_block<Isa, WD, 2, NV>(a, i, n);
  for (; i < a.m; ++i) nn_block<Isa, WD, 1, NV>(a, i, n);
}

template <class Isa, DType WD>
void matmul_nn(const MatmulArgs& a) {
  constexpr int W = Isa::W;
  int64_t n = a.n0;
  for (; n + 2 * W <= a.n1; n += 2 * W) nn_col_block<Isa, WD, 2>(a, n);
  for (; n + W <= a.n1; n += W) nn_col_block<Isa, WD, 1>(a, n);
  if (n < a.n1) {  // fewer than W columns left: accumulate row by row over k, vectorisable by the compiler
    const int64_t nc = a.n1 - n;
    const char* wbase = static_cast<const char*>(a.w);
    const int64_t esz = wsize<WD>();
    for (int64_t i = 0; i < a.m; ++i) {
      float acc[64] = {};
      for (int64_t kk = 0; kk < a.k; ++kk) {
        const float xv = static_cast<const float*>(a.x)[i * a.ldx + kk];
        const void* wrow = wbase + (kk * a.ldw + n) * esz;
        for (int64_t c = 0; c < nc; ++c) acc[c] += xv * scalar_w<WD>(wrow, c);
      }
      std::memcpy(a.y + i * a.ldy + n, acc, size_t(nc) * sizeof(float));
    }
  }
}

template <class Isa>
void matmul(const MatmulArgs& a) {
  if (a.m <= 0 || a.n1 <= a.n0) return;
  if (a.k == 0) {
    for (int64_t i = 0; i < a.m; ++i) std::fill(a.y + i * a.ldy + a.n0, a.y + i * a.ldy + a.n1, 0.0f);
    return;
  }
  const bool nt = a.layout == WeightLayout::nt;
  if constexpr (Isa::kBf16Dot) {
    if (a.xdtype == DType::bf16) {  // callers only pass bf16 X with bf16 nt weights to such a table
      Isa::matmul_nt_bf16_dot(a);
      return;
    }
  }
  switch (a.wdtype) {
    case DType::f32: nt ? matmul_nt<Isa, DType::f32>(a) : matmul_nn<Isa, DType::f32>(a); break;
    case DType::bf16: nt ? matmul_nt<Isa, DType::bf16>(a) : matmul_nn<Isa, DType::bf16>(a); break;
    case DType::f16: nt ? matmul_nt<Isa, DType::f16>(a) : matmul_nn<Isa, DType::f16>(a); break;
    default: break;  // callers validate dtypes; quantized weights never reach this kernel
  }
}

template <class Isa>
void to_f32(const void* src, DType dt, float* dst, int64_t n) {
  constexpr int W = Isa::W;
  int64_t i = 0;
  switch (dt) {
    case DType::f32: std::memcpy(dst, src, size_t(n) * 4); return;
    case DType::bf16:
      for (; i + W <= n; i += W) Isa::store(dst + i, load_w<Isa, DType::bf16>(src, i));
      for (; i < n; ++i) dst[i] = scalar_w<DType::bf16>(src, i);
      return;
    case DType::f16:
      for (; i + W <= n; i += W) Isa::store(dst + i, load_w<Isa, DType::f16>(src, i));
      for (; i < n; ++i) dst[i] = scalar_w<DType::f16>(src, i);
      return;
    default: return;
  }
}

template <class Isa>
void from_f32(const float* src, DType dt, void* dst, int64_t n) {
  switch (dt) {
    case DType::f32: std::memcpy(dst, src, size_t(n) * 4); return;
    case DType::bf16: Isa::store_as_bf16(src, static_cast<uint16_t*>(dst), n); return;
    case DType::f16: Isa::store_as_f16(src, static_cast<uint16_t*>(dst), n); return;
    default: return;
  }
}

template <class Isa>
double fma_probe(int64_t iters) {
  constexpr int kChains = 12;  // enough independent chains to cover FMA latency × ports
  typename Isa::V acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = Isa::set1(float(c) * 1e-3f);
  const typename Isa::V a = Isa::set1(0.999999f), b = Isa::set1(1e-7f);
  for (int64_t i = 0; i < iters; ++i)
    for (int c = 0; c < kChains; ++c) acc[c] = Isa::fma(acc[c], a, b);
  float sink = 0;
  for (int c = 0; c < kChains; ++c) sink += Isa::reduce(acc[c]);
  volatile float keep = sink;  // keeps the loop alive
  (void)keep;
  return 2.0 * double(iters) * kChains * Isa::W;
}

// Sums n floats with full-width vector loads, four independent sums (the benchmark's streaming-read
// probe, bench_support.cpp).
template <class Isa>
double read_probe(const float* src, int64_t n) {
  constexpr int64_t W = Isa::W;
  typename Isa::V acc[4] = {Isa::zero(), Isa::zero(), Isa::zero(), Isa::zero()};
  const typename Isa::V one = Isa::set1(1.0f);
  int64_t i = 0;
  for (; i + 4 * W <= n; i += 4 * W)
    for (int c = 0; c < 4; ++c) acc[c] = Isa::fma(Isa::load(src + i + c * W), one, acc[c]);
  double sum = 0;
  for (int c = 0; c < 4; ++c) sum += Isa::reduce(acc[c]);
  for (; i < n; ++i) sum += src[i];
  return sum;
}

// e4m3 code → f32 by table (the ISA traits may do it with vector bit arithmetic instead).
inline float e4m3_scalar(uint8_t v) {
  const uint32_t sign = uint32_t(v & 0x80) << 24, exp = (v >> 3) & 0xf, man = v & 7;
  uint32_t bits;
  if (exp == 15 && man == 7) {
    bits = sign | 0x7fc00000u;
  } else if (exp == 0) {  // subnormal: man · 2^-9
    float f = float(man) * (1.0f / 512.0f);
    std::memcpy(&bits, &f, 4);
    bits |= sign;
  } else {
    bits = sign | ((exp + 120) << 23) | (man << 20);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

template <class Isa>
void e4m3_to_f32(const uint8_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  if constexpr (Isa::kVectorE4m3) {
    for (; i + Isa::W <= n; i += Isa::W) Isa::store(dst + i, Isa::load_e4m3(src + i));
  }
  for (; i < n; ++i) dst[i] = e4m3_scalar(src[i]);
}

// ---- FP8 block-scaled nt matmul (see Fp8MatmulArgs) -----------------------------------------
template <class Isa>
inline typename Isa::V load_e4m3_any(const uint8_t* p) {
  if constexpr (Isa::kVectorE4m3) {
    return Isa::load_e4m3(p);
  } else {
    float tmp[Isa::W];
    for (int i = 0; i < Isa::W; ++i) tmp[i] = e4m3_scalar(p[i]);
    return Isa::load(tmp);
  }
}

// The weight block scale of block row `scale_row` (output row n / a.block_n: the caller divides once
// per call, not per k block — a 64-bit division per row and block cost the m = 1 kernel ~3×).
inline float fp8_weight_scale(const Fp8MatmulArgs& a, int64_t scale_row, int64_t kb, int64_t blocks) {
  const int64_t i = scale_row * blocks + kb;
  if (a.ws_ue8m0) {
    const uint32_t b = static_cast<const uint8_t*>(a.ws)[i];
    if (b == 0 || b == 255) return b == 0 ? 5.877471754111438e-39f : std::numeric_limits<float>::quiet_NaN();
    const uint32_t bits = b << 23;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
  return static_cast<const float*>(a.ws)[i];
}

// The factor that undoes Isa::load_e4m3_scaled's 2^-56.
constexpr float kE4m3ScaledBack = 72057594037927936.0f;  // 2^56

// An MR × NR block of outputs: per 128-wide k block the vector sums of code products are folded
// into vector totals with the block's combined scale, reduced once at the end. Where the ISA has
// the fast e4m3 form and the block's NR weight rows hold normal numbers only (the usual case: zero,
// subnormal and NaN codes are rare in real weights), the codes are converted by it and the block's
// sums taken back by 2^56 before the scale; otherwise by the exact conversion of every code.
template <class Isa, int MR, int NR>
inline void fp8_block(const Fp8MatmulArgs& a, int64_t i0, int64_t n0, const uint8_t* prefetch) {
  using V = typename Isa::V;
  constexpr int W = Isa::W;
  constexpr bool kHasFast = requires(const uint8_t* p) { Isa::load_e4m3_scaled(p); };
  const int64_t blocks = (a.k + 127) / 128;
  // the weight scales' block rows: divided once here for one or two rows (T = 1 decode: 2.0 against
  // 2.8 ms on qwen3_30b_a3b FP8, AMD EPYC VM, 2 threads); per k block for more rows, where four more
  // live registers made the 4 × 4 block slower (T = 256: 287 against 267 ms)
  int64_t scale_row[NR];
  if constexpr (MR <= 2)
    for (int c = 0; c < NR; ++c) scale_row[c] = (n0 + c) / a.block_n;
  V total[MR][NR];
  float tail[MR][NR] = {};
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < NR; ++c) total[r][c] = Isa::zero();
  for (int64_t kb = 0; kb < blocks; ++kb) {
    const int64_t k0 = kb * 128, k1 = std::min<int64_t>(a.k, k0 + 128), kv = k0 + (k1 - k0) / W * W;
    V acc[MR][NR];
    for (int r = 0; r < MR; ++r)
      for (int c = 0; c < NR; ++c) acc[r][c] = Isa::zero();
    if (prefetch)
      for (int c = 0; c < NR; ++c) prefetch_line(prefetch + c * a.ldw + k0), prefetch_line(prefetch + c * a.ldw + k0 + 64);
    bool fast = false;
    if constexpr (kHasFast) {
      fast = true;
      for (int c = 0; c < NR; ++c) fast = fast && Isa::e4m3_all_normal(a.w + (n0 + c) * a.ldw + k0, kv - k0);
    }
    // the block's vector steps with one of the two conversions (a loop each, not a branch per step)
    auto steps = [&](auto convert) {
      for (int64_t kk = k0; kk < kv; kk += W) {
        V xv[MR];
        for (int r = 0; r < MR; ++r) xv[r] = Isa::load(a.x + (i0 + r) * a.ldx + kk);
        for (int c = 0; c < NR; ++c) {
          const V wv = convert(a.w + (n0 + c) * a.ldw + kk);
          for (int r = 0; r < MR; ++r) acc[r][c] = Isa::fma(xv[r], wv, acc[r][c]);
        }
      }
    };
    if constexpr (kHasFast) {
      if (fast) {
        steps([](const uint8_t* q) { return Isa::load_e4m3_scaled(q); });
        for (int r = 0; r < MR; ++r)
          for (int c = 0; c < NR; ++c) acc[r][c] = Isa::fma(acc[r][c], Isa::set1(kE4m3ScaledBack), Isa::zero());
      }
    }
    if (!fast) steps([](const uint8_t* q) { return load_e4m3_any<Isa>(q); });
    for (int c = 0; c < NR; ++c) {
      const float wsc = fp8_weight_scale(a, MR <= 2 ? scale_row[c] : (n0 + c) / a.block_n, kb, blocks);
      for (int r = 0; r < MR; ++r) {
        const float scale = a.xs[(i0 + r) * blocks + kb] * wsc;
        float t = 0;
        for (int64_t kk = kv; kk < k1; ++kk) t += a.x[(i0 + r) * a.ldx + kk] * e4m3_scalar(a.w[(n0 + c) * a.ldw + kk]);
        tail[r][c] += t * scale;
        total[r][c] = Isa::fma(acc[r][c], Isa::set1(scale), total[r][c]);
      }
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < NR; ++c) a.y[(i0 + r) * a.ldy + n0 + c] = Isa::reduce(total[r][c]) + tail[r][c];
}

template <class Isa, int MR>
inline void fp8_rows(const Fp8MatmulArgs& a, int64_t i0, int64_t n0, int nr, const uint8_t* pf) {
  switch (nr) {
    case 4: fp8_block<Isa, MR, 4>(a, i0, n0, pf); break;
    case 3: fp8_block<Isa, MR, 3>(a, i0, n0, pf); break;
    case 2: fp8_block<Isa, MR, 2>(a, i0, n0, pf); break;
    default: fp8_block<Isa, MR, 1>(a, i0, n0, pf); break;
  }
}

template <class Isa>
void fp8_matmul(const Fp8MatmulArgs& a) {
  constexpr int64_t MR = 4, NR = 4;
  for (int64_t n = a.n0; n < a.n1; n += NR) {
    const int nr = int(std::min<int64_t>(NR, a.n1 - n));
    const uint8_t* next = n + 2 * NR <= a.n1 ? a.w + (n + NR) * a.ldw : nullptr;  // the next rows, fetched ahead
    for (int64_t i = 0; i < a.m; i += MR) {
      const uint8_t* pf = i == 0 ? next : nullptr;
      switch (std::min<int64_t>(MR, a.m - i)) {
        case 4: fp8_rows<Isa, 4>(a, i, n, nr, pf); break;
        case 3: fp8_rows<Isa, 3>(a, i, n, nr, pf); break;
        case 2: fp8_rows<Isa, 2>(a, i, n, nr, pf); break;
        default: fp8_rows<Isa, 1>(a, i, n, nr, pf); break;
      }
    }
  }
}

// ---- packed f32: Y = X · P on panels of 32 output columns (see PackedMatmulArgs) -------------
// The register-blocked micro-kernel keeps MR rows × NV vectors of outputs in registers, loads NV
// weight vectors per k step from the contiguous panel and broadcasts one x value per row: MR·NV
// FMAs per NV loads + MR broadcasts (AVX-512: up to 12 rows × 2 vectors = 24 accumulators).
// NOTE: panel-outer order with k in chunks: every row block of x passes over the [chunk, 32] block of
// the panel, so the weights come from DRAM once per call and from the caches for the other row
// blocks. Meanwhile the next chunk of the stream (contiguous: the same panel further along k, or the
// next panel) is prefetched into L2, spread over all row blocks of this chunk so that DRAM stays busy
// the whole time, not only during the first row block (with 16 rows = 2 blocks that halved the
// streaming rate). Chunk length (packed_k_chunk):
// - several row blocks: up to `rows_chunk` k steps. The f32 kernel (packed_f32_k_chunk_rows):
//   - AVX-512 (two 16-column vectors per k step, 128 bytes): kPackedKChunkRows, 256 KiB of an f32
//     panel, from L2. Chunks of 256 (the block in L1) cost each row block a reload of its
//     accumulators and a restart of the stream every 256 steps: on the AMD EPYC (AVX-512) development
//     VM (2 threads, 2026-12-04) small_moe f32 T = 256 took 8.53–8.62 ms with them and 8.17–8.21 ms
//     with whole panels (docs/PERF.md, thirty-sixth session);
//   - AVX2 (two 8-column vectors: a panel's k step is two calls of 64 bytes each):
//     kPackedKChunkRowsAvx2 = 256: the 16 KiB of the chunk a call reads stay in L1 for the next row
//     block (the x rows' 256 k beside them: 1 KiB each). On the AVX2
//     AMD EPYC (Zen 3) development VM, 2 threads, interleaved (2026-12-07, sixty-first session):
//     qwen3_30b_a3b f32 T = 256 151–164 ms against 166–172 ms with whole panels (4 of 4 rounds),
//     small_moe f32 T = 256 10.7–10.8 against 10.8–12.7 ms; the bf16 kernels showed no difference and
//     keep whole panels.
// - one row block (decode): kPackedKChunk, the prefetch distance those paths were tuned with.
// MOEX_CPU_PACKED_KCHUNK=n (≥ 16) sets the first for A/B runs.
constexpr int64_t kPackedKChunk = 256;
constexpr int64_t kPackedKChunkRows = 2048;
constexpr int64_t kPackedKChunkRowsAvx2 = 256;

// The largest row block of a packed kernel: MOEX_CPU_PACKED_ROWS where it is 1 .. max_rows (A/B
// runs), else default_rows.
inline int64_t packed_rows_setting(int max_rows, int default_rows) {
  static const int requested = [] {
    const char* e = std::getenv("MOEX_CPU_PACKED_ROWS");
    return e ? std::atoi(e) : 0;
  }();
  return requested >= 1 && requested <= max_rows ? requested : default_rows;
}

// k steps per chunk for `row_blocks` row blocks; rows_chunk: the chunk of several row blocks.
inline int64_t packed_k_chunk(int64_t row_blocks, int64_t rows_chunk = kPackedKChunkRows) {
  static const int64_t requested = [] {
    const char* e = std::getenv("MOEX_CPU_PACKED_KCHUNK");
    const int v = e ? std::atoi(e) : 0;
    return int64_t(v >= 16 ? v : 0);
  }();
  return row_blocks == 1 ? kPackedKChunk : requested > 0 ? requested : rows_chunk;
}
template <class Isa>
constexpr int64_t packed_f32_k_chunk_rows() {
  return Isa::W >= 16 ? kPackedKChunkRows : kPackedKChunkRowsAvx2;
}

template <class Isa>
constexpr int packed_max_rows() {
  return Isa::W >= 16 ? 12 : 6;  // accumulators + NV weights + 1 broadcast within 32 (AVX-512) or 16 registers
}
// The row block used by default. AVX-512: 7, not 8 or 12. Twelve rows' accumulators fit the 32
// vector registers, but their 12 row pointers do not fit the 16 general ones beside the loop's own:
// GCC kept some on the stack or in xmm registers, 5 extra moves per 24 FMAs (perf annotate). Eight
// still keep one pointer in an xmm register (a vmovq per k step); seven keep all in general registers.
// Measured on the AMD EPYC development VM, 2 threads, interleaved (the VM's noise is ±10 %):
// - 2026-12-01, 12 / 8 rows: small_moe f32 T = 256 11.66 / 10.42 ms (8 faster in 8 of 10 pairs),
//   qwen3_30b_a3b f32 T = 256 119.7 / 115.5 ms (5 of 6);
// - 2026-12-04, 8 / 7 rows with whole-panel chunks: small_moe 8.24–8.37 / 7.67–8.19 ms, qwen3
//   101.0–101.2 / 99.6–100.0 ms (3 of 3 each).
// Not measured on the Intel (AMX) machines.
template <class Isa>
constexpr int packed_default_rows() {
  return Isa::W >= 16 ? 7 : packed_max_rows<Isa>();
}

// The MR × NV accumulators of a packed micro-kernel block over rows y[0..MR) (row stride ldy): zero
// (`first`), or the partial sums stored there. A panel's last ncols < NV·W columns go through tmp, so
// y is never touched past ncols. Called once per block and inlined (acc stays in registers).
template <class Isa, int MR, int NV>
inline void packed_acc_load(typename Isa::V (&acc)[MR][NV], float (&tmp)[MR][NV * Isa::W], const float* y, int64_t ldy,
                            int ncols, bool first) {
  constexpr int W = Isa::W, NC = NV * W;
  if (first) {
    for (int r = 0; r < MR; ++r)
      for (int c = 0; c < NV; ++c) acc[r][c] = Isa::zero();
    return;
  }
  for (int r = 0; r < MR; ++r) {
    const float* yr = y + r * ldy;
    if (ncols != NC) {
      std::fill(tmp[r], tmp[r] + NC, 0.0f);
      std::memcpy(tmp[r], yr, size_t(ncols) * sizeof(float));
      yr = tmp[r];
    }
    for (int c = 0; c < NV; ++c) acc[r][c] = Isa::load(yr + c * W);
  }
}
template <class Isa, int MR, int NV>
inline void packed_acc_store(const typename Isa::V (&acc)[MR][NV], float (&tmp)[MR][NV * Isa::W], float* y, int64_t ldy,
                             int ncols) {
  constexpr int W = Isa::W, NC = NV * W;
  for (int r = 0; r < MR; ++r) {
    float* yr = y + r * ldy;
    if (ncols == NC) {
      for (int c = 0; c < NV; ++c) Isa::store(yr + c * W, acc[r][c]);
    } else {
      for (int c = 0; c < NV; ++c) Isa::store(tmp[r] + c * W, acc[r][c]);
      std::memcpy(yr, tmp[r], size_t(ncols) * sizeof(float));
    }
  }
}

// Rows [i0, i0 + MR) × columns [c0, c0 + ncols) of a panel (c0 relative to the panel, ncols ≤ NV·W), k in
// [k0, k1); `first`: start from zero, else continue the sums stored in y (the same f32 sum in k order).
template <class Isa, int MR, int NV>
// pf: pf_lines cache lines (64 bytes each) to prefetch into L2, spread over the k groups (pf_lines may be 0).
inline void packed_block(const PackedMatmulArgs& a, int64_t i0, const float* panel, int c0, int ncols, float* y, int64_t k0,
                         int64_t k1, bool first, const float* pf, int64_t pf_lines) {
  using V = typename Isa::V;
  constexpr int W = Isa::W, NC = NV * W;
  V acc[MR][NV];
  alignas(64) float tmp[MR][NC];  // partial panels: y goes through here (never touched past ncols)
  packed_acc_load<Isa>(acc, tmp, y + i0 * a.ldy, a.ldy, ncols, first);
  const float* xr[MR];
  for (int r = 0; r < MR; ++r) xr[r] = a.x + (i0 + r) * a.ldx;
  const float* pp = panel + k0 * kPanelCols + c0;
  // the prefetches spread over the k steps: every `stride`-th step issues per_step of them (more
  // than one where a row block streams more lines than it has k steps) — a branch on a counter
  // rather than a loop between k groups, around which GCC kept acc on the stack
  const int64_t steps = k1 - k0;
  const int64_t stride = pf_lines > 0 ? std::max<int64_t>(1, steps / pf_lines) : steps + 1;
  const int64_t per_step = pf_lines > 0 ? (pf_lines + steps - 1) / steps : 0;
  int64_t pf_next = 0, countdown = stride;
  for (int64_t kk = k0; kk < k1; ++kk, pp += kPanelCols) {
    if (--countdown == 0) {
      countdown = stride;
      for (int64_t j = 0; j < per_step && pf_next < pf_lines; ++j) prefetch_line_l2(pf + 16 * pf_next++);
    }
    V wv[NV];
    for (int c = 0; c < NV; ++c) wv[c] = Isa::load(pp + c * W);
    for (int r = 0; r < MR; ++r) {
      const V xb = Isa::set1(xr[r][kk]);
      for (int c = 0; c < NV; ++c) acc[r][c] = Isa::fma(xb, wv[c], acc[r][c]);
    }
  }
  packed_acc_store<Isa>(acc, tmp, y + i0 * a.ldy, a.ldy, ncols);
}

template <class Isa, int NV, int MR = packed_max_rows<Isa>()>
inline void packed_rows(int mr, const PackedMatmulArgs& a, int64_t i0, const float* panel, int c0, int ncols, float* y,
                        int64_t k0, int64_t k1, bool first, const float* pf, int64_t pf_lines) {
  if constexpr (MR > 1) {
    if (mr < MR) {
      packed_rows<Isa, NV, MR - 1>(mr, a, i0, panel, c0, ncols, y, k0, k1, first, pf, pf_lines);
      return;
    }
  }
  packed_block<Isa, MR, NV>(a, i0, panel, c0, ncols, y, k0, k1, first, pf, pf_lines);
}

// One or two rows (decode; a few rows per expert) on an ISA whose micro-kernel column group (2
// vectors) is narrower than a panel (AVX2: 16 of 32 columns): the packed drivers run the whole panel
// in one pass instead — a sequential stream of 128 bytes per k step rather than one pass per column
// group at a 128-byte stride, and 4·rows independent FMA chains (16 columns leave 2·rows, which held
// decode below the memory's rate). Each output is the same chain in the same order, so the same bits.
// Calls block(integral_constant rows, integral_constant vectors per panel) and returns true, or
// returns false where this form does not apply.
template <class Isa, class Block>
inline bool run_whole_panel_rows(int64_t rows, Block&& block) {
  constexpr int NVP = int(kPanelCols / Isa::W);
  if constexpr (NVP <= 2) {
    return false;
  } else {
    if (rows > 2) return false;
    if (rows == 2)
      block(std::integral_constant<int, 2>{}, std::integral_constant<int, NVP>{});
    else
      block(std::integral_constant<int, 1>{}, std::integral_constant<int, NVP>{});
    return true;
  }
}

template <class Isa>
void packed_matmul(const PackedMatmulArgs& a) {
  if (a.m <= 0 || a.n1 <= a.n0) return;
  if (a.k == 0) {
    for (int64_t i = 0; i < a.m; ++i) std::fill(a.y + i * a.ldy, a.y + i * a.ldy + (a.n1 - a.n0), 0.0f);
    return;
  }
  constexpr int NV = 2, NC = NV * Isa::W;  // columns per micro-kernel call; a panel is kPanelCols / NC calls
  static_assert(kPanelCols % NC == 0, "a panel is a whole number of micro-kernel column groups");
  // The largest row block: packed_default_rows, or MOEX_CPU_PACKED_ROWS (1 .. packed_max_rows; A/B).
  static const int64_t MRmax = packed_rows_setting(packed_max_rows<Isa>(), packed_default_rows<Isa>());
  // rows in blocks of near-equal size (16 rows: 8 + 8 rather than 12 + 4)
  const int64_t blocks = (a.m + MRmax - 1) / MRmax;
  const int64_t chunk = packed_k_chunk(blocks, packed_f32_k_chunk_rows<Isa>());
  for (int64_t n = a.n0; n < a.n1; n += kPanelCols) {
    const float* panel = a.panels + (n / kPanelCols) * a.k * kPanelCols;
    const int64_t width = std::min<int64_t>(kPanelCols, a.n1 - n);
    float* yp = a.y + (n - a.n0);
    for (int64_t k0 = 0; k0 < a.k; k0 += chunk) {
      const int64_t k1 = std::min(a.k, k0 + chunk);
      // the next chunk of the stream starts right after this one; its lines are shared out over
      // the row blocks (and the column groups of the first one). One row block: the lines from
      // a.prefetch_ahead bytes past this chunk's start instead, where that is set.
      const int64_t ahead = blocks == 1 ? a.prefetch_ahead : 0;
      const bool stream = blocks > 1 || a.prefetch_ahead >= 0;  // prefetch_ahead < 0: none (one row block)
      const float* next = ahead > 0 && ahead < chunk * kPanelCols * int64_t(sizeof(float))
                              ? panel + k0 * kPanelCols + ahead / int64_t(sizeof(float))
                              : panel + k1 * kPanelCols;
      const int64_t next_lines = std::min(chunk, a.k) * kPanelCols / 16;
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t i0 = b * a.m / blocks, i1 = (b + 1) * a.m / blocks;
        const int64_t l0 = b * next_lines / blocks, l1 = (b + 1) * next_lines / blocks;
        const bool whole = run_whole_panel_rows<Isa>(i1 - i0, [&](auto mr, auto nv) {
          packed_block<Isa, decltype(mr)::value, decltype(nv)::value>(a, i0, panel, 0, int(width), yp, k0, k1, k0 == 0,
                                                                     next + l0 * 16, stream ? l1 - l0 : 0);
        });
        if (whole) continue;
        for (int c0 = 0; c0 < width; c0 += NC)
          packed_rows<Isa, NV>(int(i1 - i0), a, i0, panel, c0, int(std::min<int64_t>(NC, width - c0)), yp + c0, k0, k1, k0 == 0,
                               next + l0 * 16, c0 == 0 && stream ? l1 - l0 : 0);
      }
    }
  }
}

// ---- packed bf16 weights, f32 x: Y = X · P on FMAs (see PackedBf16WideArgs) ----------------------
// packed_block's scheme on the k-pair panels of the vdpbf16ps kernel: MR rows × NV vectors of outputs;
// per pair of k, NV vector loads (W columns × 2 k each) split by Isa::load_bf16_pairs into 2·NV f32
// weight vectors, two broadcast x per row, 2·MR·NV FMAs — the even k's before the odd k's into the
// same accumulator, so each output is the f32 chain of packed_block in k order. Registers (AVX2, 16):
// 2·MR accumulators + 4 weights + 2 broadcasts, so MR ≤ 5 (packed_bf16w_max_rows).
template <class Isa>
constexpr int packed_bf16w_max_rows() {
  return Isa::W >= 16 ? 12 : 5;
}
template <class Isa>
constexpr int packed_bf16w_default_rows() {
  return Isa::W >= 16 ? 7 : 4;
}

// Rows [i0, i0 + MR) × columns [c0, c0 + ncols) of a panel, pairs [p0, p1); first / pf as packed_block.
template <class Isa, int MR, int NV>
inline void packed_bf16w_block(const PackedBf16WideArgs& a, int64_t i0, const uint16_t* panel, int c0, int ncols, float* y,
                               int64_t p0, int64_t p1, bool first, const char* pf, int64_t pf_lines) {
  using V = typename Isa::V;
  constexpr int W = Isa::W, NC = NV * W;
  V acc[MR][NV];
  alignas(64) float tmp[MR][NC];  // partial panels: y goes through here (never touched past ncols)
  packed_acc_load<Isa>(acc, tmp, y + i0 * a.ldy, a.ldy, ncols, first);
  const float* xr[MR];
  for (int r = 0; r < MR; ++r) xr[r] = a.x + (i0 + r) * a.ldx;
  const int64_t whole = a.k / 2, pe = std::min(p1, whole);  // pairs with both k inside
  const uint16_t* pp = panel + p0 * 2 * kPanelCols + 2 * c0;
  const int64_t steps = std::max<int64_t>(1, p1 - p0);
  const int64_t stride = pf_lines > 0 ? std::max<int64_t>(1, steps / pf_lines) : steps + 1;
  const int64_t per_step = pf_lines > 0 ? (pf_lines + steps - 1) / steps : 0;
  int64_t pf_next = 0, countdown = stride;
  for (int64_t j = p0; j < pe; ++j, pp += 2 * kPanelCols) {
    if (--countdown == 0) {
      countdown = stride;
      for (int64_t q = 0; q < per_step && pf_next < pf_lines; ++q) prefetch_line_l2(pf + 64 * pf_next++);
    }
    if constexpr (NV > 2) {
      // few rows, a whole panel: the broadcasts first, then one column group's weights at a time
      V xe[MR], xo[MR];
      for (int r = 0; r < MR; ++r) {
        xe[r] = Isa::set1(xr[r][2 * j]);
        xo[r] = Isa::set1(xr[r][2 * j + 1]);
      }
      for (int c = 0; c < NV; ++c) {
        V we, wo;
        Isa::load_bf16_pairs(pp + 2 * W * c, we, wo);
        for (int r = 0; r < MR; ++r) acc[r][c] = Isa::fma(xo[r], wo, Isa::fma(xe[r], we, acc[r][c]));
      }
    } else {
      V we[NV], wo[NV];
      for (int c = 0; c < NV; ++c) Isa::load_bf16_pairs(pp + 2 * W * c, we[c], wo[c]);
      for (int r = 0; r < MR; ++r) {
        const V xe = Isa::set1(xr[r][2 * j]);
        for (int c = 0; c < NV; ++c) acc[r][c] = Isa::fma(xe, we[c], acc[r][c]);
        const V xo = Isa::set1(xr[r][2 * j + 1]);
        for (int c = 0; c < NV; ++c) acc[r][c] = Isa::fma(xo, wo[c], acc[r][c]);
      }
    }
  }
  if (p1 > whole) {  // odd k: the last pair holds W[c, k − 1] and a zero, which is skipped
    const uint16_t* pl = panel + whole * 2 * kPanelCols + 2 * c0;
    V we[NV], wo[NV];
    for (int c = 0; c < NV; ++c) Isa::load_bf16_pairs(pl + 2 * W * c, we[c], wo[c]);
    for (int r = 0; r < MR; ++r) {
      const V xe = Isa::set1(xr[r][a.k - 1]);
      for (int c = 0; c < NV; ++c) acc[r][c] = Isa::fma(xe, we[c], acc[r][c]);
    }
  }
  packed_acc_store<Isa>(acc, tmp, y + i0 * a.ldy, a.ldy, ncols);
}

template <class Isa, int NV, int MR = packed_bf16w_max_rows<Isa>()>
inline void packed_bf16w_rows(int mr, const PackedBf16WideArgs& a, int64_t i0, const uint16_t* panel, int c0, int ncols, float* y,
                              int64_t p0, int64_t p1, bool first, const char* pf, int64_t pf_lines) {
  if constexpr (MR > 1) {
    if (mr < MR) {
      packed_bf16w_rows<Isa, NV, MR - 1>(mr, a, i0, panel, c0, ncols, y, p0, p1, first, pf, pf_lines);
      return;
    }
  }
  packed_bf16w_block<Isa, MR, NV>(a, i0, panel, c0, ncols, y, p0, p1, first, pf, pf_lines);
}

// packed_matmul's loop (panel-outer, k in chunks every row block passes over, the next chunk
// prefetched spread over the row blocks) in pairs of k: a pair step reads as many bytes as an f32 k step.
template <class Isa>
void packed_matmul_bf16_wide(const PackedBf16WideArgs& a) {
  if (a.m <= 0 || a.n1 <= a.n0) return;
  if (a.k == 0) {
    for (int64_t i = 0; i < a.m; ++i) std::fill(a.y + i * a.ldy, a.y + i * a.ldy + (a.n1 - a.n0), 0.0f);
    return;
  }
  constexpr int NV = 2, NC = NV * Isa::W;
  static_assert(kPanelCols % NC == 0, "a panel is a whole number of micro-kernel column groups");
  // MOEX_CPU_PACKED_ROWS (1 .. packed_bf16w_max_rows) for A/B runs
  static const int64_t MRmax = packed_rows_setting(packed_bf16w_max_rows<Isa>(), packed_bf16w_default_rows<Isa>());
  const int64_t blocks = (a.m + MRmax - 1) / MRmax;
  const int64_t pairs = (a.k + 1) / 2, panel_elems = packed_bf16_panel_elems(a.k);
  const int64_t chunk = (packed_k_chunk(blocks) + 1) / 2;  // in pairs of k
  constexpr int64_t kPairBytes = 2 * kPanelCols * int64_t(sizeof(uint16_t));  // 128: two cache lines
  for (int64_t n = a.n0; n < a.n1; n += kPanelCols) {
    const uint16_t* panel = a.panels + (n / kPanelCols) * panel_elems;
    const int64_t width = std::min<int64_t>(kPanelCols, a.n1 - n);
    float* yp = a.y + (n - a.n0);
    for (int64_t p0 = 0; p0 < pairs; p0 += chunk) {
      const int64_t p1 = std::min(pairs, p0 + chunk);
      const int64_t ahead = blocks == 1 ? a.prefetch_ahead : 0;
      const bool stream = blocks > 1 || a.prefetch_ahead >= 0;  // prefetch_ahead < 0: none (one row block)
      const char* base = reinterpret_cast<const char*>(panel);
      const char* next = ahead > 0 && ahead < chunk * kPairBytes ? base + p0 * kPairBytes + ahead : base + p1 * kPairBytes;
      const int64_t next_lines = std::min(chunk, pairs) * kPairBytes / 64;
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t i0 = b * a.m / blocks, i1 = (b + 1) * a.m / blocks;
        const int64_t l0 = b * next_lines / blocks, l1 = (b + 1) * next_lines / blocks;
        const int64_t pf_lines = stream ? l1 - l0 : 0;
        const bool whole = run_whole_panel_rows<Isa>(i1 - i0, [&](auto mr, auto nv) {
          packed_bf16w_block<Isa, decltype(mr)::value, decltype(nv)::value>(a, i0, panel, 0, int(width), yp, p0, p1, p0 == 0,
                                                                           next + l0 * 64, pf_lines);
        });
        if (whole) continue;
        for (int c0 = 0; c0 < width; c0 += NC)
          packed_bf16w_rows<Isa, NV>(int(i1 - i0), a, i0, panel, c0, int(std::min<int64_t>(NC, width - c0)), yp + c0, p0, p1,
                                     p0 == 0, next + l0 * 64, c0 == 0 ? pf_lines : 0);
      }
    }
  }
}

// ---- packed FP8: see PackedFp8MatmulArgs ---------------------------------------------------------
// MR rows × one panel (2 vectors of 16 columns): per k step one 32-byte row of codes converted to two
// vectors (fast form where the block is all normal: × 2^-56, taken back with the block's scales), one
// broadcast x per row, 2·MR FMAs. Per 128-k block the sums are folded into the totals with x's scale
// × the 32 columns' weight scales. Accumulators + totals: 4·MR vectors, so MR ≤ 6 within 32.
constexpr int kPackedFp8Rows = 6;

template <class Isa, int MR>
inline void packed_fp8_block(const PackedFp8MatmulArgs& a, int64_t i0, int64_t p, int ncols, float* y) {
  using V = typename Isa::V;
  static_assert(Isa::W == 16, "one panel = two vectors of 16 columns");
  const int64_t blocks = (a.k + 127) / 128;
  const uint8_t* panel = a.panels + p * a.k * kPanelCols;
  const float* scales = a.block_scales + p * blocks * kPanelCols;
  const uint8_t* kind = a.block_kind + p * blocks;
  const float* xr[MR];
  for (int r = 0; r < MR; ++r) xr[r] = a.x + (i0 + r) * a.ldx;
  V total[MR][2];
  for (int r = 0; r < MR; ++r) total[r][0] = total[r][1] = Isa::zero();
  for (int64_t kb = 0; kb < blocks; ++kb) {
    const int64_t k0 = kb * 128, k1 = std::min<int64_t>(a.k, k0 + 128);
    V acc[MR][2];
    for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = Isa::zero();
    // the block's k steps with one of the two conversions (a loop each, not a branch per step)
    auto steps = [&](auto convert) {
      const uint8_t* pp = panel + k0 * kPanelCols;
      for (int64_t kk = k0; kk < k1; ++kk, pp += kPanelCols) {
        const V w0 = convert(pp), w1 = convert(pp + 16);
        for (int r = 0; r < MR; ++r) {
          const V xb = Isa::set1(xr[r][kk]);
          acc[r][0] = Isa::fma(xb, w0, acc[r][0]);
          acc[r][1] = Isa::fma(xb, w1, acc[r][1]);
        }
      }
    };
    const bool normal = kind[kb] == kFp8BlockNormal;
    if (normal)
      steps([](const uint8_t* q) { return Isa::load_e4m3_scaled(q); });
    else
      steps([](const uint8_t* q) { return Isa::load_e4m3(q); });
    const V back = Isa::set1(normal ? kE4m3ScaledBack : 1.0f);
    const V s0 = Isa::load(scales + kb * kPanelCols), s1 = Isa::load(scales + kb * kPanelCols + 16);
    for (int r = 0; r < MR; ++r) {
      const V xs = Isa::set1(a.xs[(i0 + r) * blocks + kb]);
      // (sums × 2^56 exactly) × (x scale × weight scale), as the in-place kernel folds them
      const V sc0 = Isa::fma(s0, xs, Isa::zero()), sc1 = Isa::fma(s1, xs, Isa::zero());
      total[r][0] = Isa::fma(Isa::fma(acc[r][0], back, Isa::zero()), sc0, total[r][0]);
      total[r][1] = Isa::fma(Isa::fma(acc[r][1], back, Isa::zero()), sc1, total[r][1]);
    }
  }
  for (int r = 0; r < MR; ++r) {
    float* yr = y + (i0 + r) * a.ldy;
    if (ncols == kPanelCols) {
      Isa::store(yr, total[r][0]);
      Isa::store(yr + 16, total[r][1]);
    } else {
      alignas(64) float tmp[kPanelCols];
      Isa::store(tmp, total[r][0]);
      Isa::store(tmp + 16, total[r][1]);
      std::memcpy(yr, tmp, size_t(ncols) * sizeof(float));
    }
  }
}

template <class Isa, int MR = kPackedFp8Rows>
inline void packed_fp8_rows(int mr, const PackedFp8MatmulArgs& a, int64_t i0, int64_t p, int ncols, float* y) {
  if constexpr (MR > 1) {
    if (mr < MR) {
      packed_fp8_rows<Isa, MR - 1>(mr, a, i0, p, ncols, y);
      return;
    }
  }
  packed_fp8_block<Isa, MR>(a, i0, p, ncols, y);
}

template <class Isa>
void packed_fp8_matmul(const PackedFp8MatmulArgs& a) {
  if (a.m <= 0 || a.n1 <= a.n0) return;
  const int64_t blocks_of_rows = (a.m + kPackedFp8Rows - 1) / kPackedFp8Rows;  // near-equal row blocks
  for (int64_t n = a.n0; n < a.n1; n += kPanelCols) {
    const int ncols = int(std::min<int64_t>(kPanelCols, a.n1 - n));
    for (int64_t b = 0; b < blocks_of_rows; ++b) {
      const int64_t i0 = b * a.m / blocks_of_rows, i1 = (b + 1) * a.m / blocks_of_rows;
      packed_fp8_rows<Isa>(int(i1 - i0), a, i0, n / kPanelCols, ncols, a.y + (n - a.n0));
    }
  }
}

// ---- gated SiLU: out = g / (1 + e^−g) · u -------------------------------------------------------
// ISAs with a vector form provide Isa::silu_mul; the others run this scalar loop (std::exp).
template <class Isa>
void silu_mul(const float* g, const float* u, float* out, int64_t n) {
  if constexpr (requires { Isa::silu_mul(g, u, out, n); }) {
    Isa::silu_mul(g, u, out, n);
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  }
}

template <class Isa>
KernelTable make_table(const char* name) {
  double (*dot_probe)(int64_t) = nullptr;
  if constexpr (requires { Isa::bf16_dot_probe(int64_t(1)); }) dot_probe = &Isa::bf16_dot_probe;
  void (*packed_bf16)(const PackedBf16MatmulArgs&) = nullptr;
  if constexpr (requires { Isa::kPackedBf16; })
    if constexpr (Isa::kPackedBf16) packed_bf16 = &Isa::packed_matmul_bf16;
  // the packed FP8 kernel: on vdpbf16ps with k-pair panels where the ISA has one, else on FMAs
  void (*packed_fp8)(const PackedFp8MatmulArgs&) = nullptr;
  bool fp8_pairs = false;
  if constexpr (requires { Isa::kPackedFp8Pairs; }) {
    packed_fp8 = &Isa::packed_matmul_fp8_pairs;
    fp8_pairs = true;
  } else if constexpr (requires { &Isa::packed_matmul_fp8; }) {
    packed_fp8 = &Isa::packed_matmul_fp8;  // the ISA's own [k, 32] kernel (AVX2: four vectors of 8)
  } else if constexpr (Isa::W == 16 && requires(const uint8_t* q) { Isa::load_e4m3_scaled(q); }) {
    packed_fp8 = &packed_fp8_matmul<Isa>;
  }
  void (*quantize)(float*, int64_t, int64_t, float*) = &cpu::quantize_rows;
  void (*packed_fp4)(const PackedFp4MatmulArgs&) = nullptr;
  if constexpr (requires { &Isa::packed_matmul_fp4; }) packed_fp4 = &Isa::packed_matmul_fp4;
  bool fp4_pairs = false;
  if constexpr (requires { Isa::kPackedFp4Pairs; }) fp4_pairs = Isa::kPackedFp4Pairs;
  if constexpr (requires(float* f) { Isa::quantize_e4m3_rows(f, int64_t(1), int64_t(1), f); }) quantize = &Isa::quantize_e4m3_rows;
  void (*packed_gated)(const PackedBf16GatedArgs&) = nullptr;
  if constexpr (requires { Isa::kPackedBf16; })
    if constexpr (Isa::kPackedBf16) packed_gated = &Isa::packed_gated_bf16;
  // bf16 panels with f32 x on FMAs: the ISAs whose traits split bf16 pairs (AVX2), not the vdpbf16ps ones
  void (*packed_bf16_wide)(const PackedBf16WideArgs&) = nullptr;
  if constexpr (!Isa::kBf16Dot && requires(const uint16_t* p, typename Isa::V& v) { Isa::load_bf16_pairs(p, v, v); })
    packed_bf16_wide = &packed_matmul_bf16_wide<Isa>;
  return KernelTable{name,           Isa::kBf16Dot,        &matmul<Isa>,         &to_f32<Isa>,
                     &from_f32<Isa>, &fma_probe<Isa>,      &e4m3_to_f32<Isa>,    &fp8_matmul<Isa>,
                     &packed_matmul<Isa>, &silu_mul<Isa>,  &read_probe<Isa>,     dot_probe,
                     packed_bf16,    packed_fp8,           fp8_pairs,            quantize,
                     packed_fp4,     fp4_pairs,            packed_gated,         packed_bf16_wide};
}

// Scalar rounding loops shared by the traits (the compiler vectorises the bf16 one).
inline void store_as_bf16_scalar(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = float_to_bf16(src[i]);
}
inline void store_as_f16_scalar(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = float_to_f16(src[i]);
}

}  // namespace moex::cpu::impl
