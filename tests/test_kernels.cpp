// The CPU micro-kernels of every instruction set this CPU has, against a plain loop.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>

#include "backends/cpu/kernels.hpp"
#include "backends/cpu/packed_weights.hpp"
#include "backends/cpu/quant_math.hpp"
#include "core/memory.hpp"
#include "moex/moex.hpp"
#include "moex/quant.hpp"

using namespace moex;
using namespace moex::cpu;

namespace {

#if defined(MOEX_X86)
// What this CPU runs: the AVX-512 tables, AVX512_BF16 (which the AMX kernels' conversions and row
// gathers need, so also their tile model), and the tile unit itself.
bool cpu_has_avx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512dq");
}
bool cpu_has_avx512_bf16() { return cpu_has_avx512() && __builtin_cpu_supports("avx512bf16"); }
bool cpu_has_amx() { return cpu_has_avx512_bf16() && __builtin_cpu_supports("amx-bf16") && amx_available(); }
// An AMX table whose FP8 / FP4 calls take the tiles or vdpbf16ps by their row count (the default;
// MOEX_CPU_AMX_QUANT=1 or 0 sends every call one way)
bool amx_split(const KernelTable& kt) {
  return std::string(kt.isa).rfind("avx512_amx", 0) == 0 && amx_quant_rows(kAmxMinRows) && !amx_quant_rows(kAmxMinRows - 1);
}
#endif

std::vector<const KernelTable*> tables() {
  std::vector<const KernelTable*> t{&generic_kernels()};
#if defined(MOEX_X86)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) t.push_back(&avx2_kernels());
  if (cpu_has_avx512()) t.push_back(&avx512_kernels());
  if (cpu_has_avx512_bf16()) {
    t.push_back(&avx512_bf16_kernels());
    t.push_back(&avx512_amx_model_kernels());  // the AMX table's logic on the scalar tile model
  }
  if (cpu_has_amx()) t.push_back(&avx512_amx_kernels());
#endif
  return t;
}

// MatmulArgs of y[:, n0:n1] = x · wᵀ for bf16 rows x [m, k] (row stride ldx) and nt bf16 weights w [n, k].
MatmulArgs bf16_nt_args(const uint16_t* x, int64_t ldx, int64_t m, int64_t k, const uint16_t* w, float* y, int64_t ldy, int64_t n0,
                        int64_t n1) {
  MatmulArgs a;
  a.x = x;
  a.xdtype = DType::bf16;
  a.ldx = ldx;
  a.m = m;
  a.k = k;
  a.w = w;
  a.wdtype = DType::bf16;
  a.layout = WeightLayout::nt;
  a.ldw = k;
  a.y = y;
  a.ldy = ldy;
  a.n0 = n0;
  a.n1 = n1;
  return a;
}

}  // namespace

TEST(CpuKernels, MatmulAllIsasLayoutsDtypes) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  for (const KernelTable* kt : tables()) {
    for (DType wd : {DType::f32, DType::bf16, DType::f16}) {
      for (WeightLayout layout : {WeightLayout::nt, WeightLayout::nn}) {
        for (int iter = 0; iter < 12; ++iter) {
          const int64_t m = 1 + rng() % 13, n = 1 + rng() % 70, k = 1 + rng() % 90;
          std::vector<float> x(size_t(m * k)), wf(size_t(n * k));
          for (auto& v : x) v = nd(rng);
          for (auto& v : wf) v = round_to(wd, nd(rng));
          std::vector<uint8_t> w(size_t(n * k) * dtype_size(wd));
          for (int64_t i = 0; i < n * k; ++i) {
            if (wd == DType::f32) reinterpret_cast<float*>(w.data())[i] = wf[size_t(i)];
            else if (wd == DType::bf16) reinterpret_cast<uint16_t*>(w.data())[i] = float_to_bf16(wf[size_t(i)]);
            else reinterpret_cast<uint16_t*>(w.data())[i] = float_to_f16(wf[size_t(i)]);
          }
          const int64_t n0 = rng() % n, n1 = n0 + 1 + rng() % (n - n0);
          std::vector<float> y(size_t(m * n), -777.0f);
          MatmulArgs a;
          a.x = x.data();
          a.ldx = k;
          a.m = m;
          a.k = k;
          a.w = w.data();
          a.wdtype = wd;
          a.layout = layout;
          a.ldw = layout == WeightLayout::nt ? k : n;  // nt: W [n, k]; nn: W [k, n]
          a.y = y.data();
          a.ldy = n;
          a.n0 = n0;
          a.n1 = n1;
          kt->matmul(a);
          for (int64_t i = 0; i < m; ++i)
            for (int64_t c = 0; c < n; ++c) {
              const float got = y[size_t(i * n + c)];
              if (c < n0 || c >= n1) {
                ASSERT_EQ(got, -777.0f) << "column outside [n0, n1) was written";
                continue;
              }
              double ref = 0;
              for (int64_t kk = 0; kk < k; ++kk)
                ref += double(x[size_t(i * k + kk)]) *
                       double(layout == WeightLayout::nt ? wf[size_t(c * k + kk)] : wf[size_t(kk * n + c)]);
              ASSERT_NEAR(got, ref, 1e-4 * (1 + std::fabs(ref))) << kt->isa << " " << dtype_name(wd) << " m" << m << " n" << n << " k" << k;
            }
        }
      }
    }
  }
}

TEST(CpuKernels, Bf16DotMatchesWidenedProducts) {
  // bf16 activations × bf16 weights (nt) on tables with vdpbf16ps: same sums as f32 FMA of the
  // widened values, up to f32 summation order; k off every multiple of 32.
  std::mt19937 rng(17);
  std::normal_distribution<float> nd;
  for (const KernelTable* kt : tables()) {
    if (!kt->bf16_dot) continue;
    for (int iter = 0; iter < 40; ++iter) {
      const int64_t m = 1 + rng() % 40, n = 1 + rng() % 70, k = 1 + rng() % 200;
      std::vector<uint16_t> xb(static_cast<size_t>(m * k)), wb(static_cast<size_t>(n * k));
      for (auto& v : xb) v = float_to_bf16(nd(rng));
      for (auto& v : wb) v = float_to_bf16(nd(rng));
      std::vector<float> y(static_cast<size_t>(m * n), -777.0f);
      kt->matmul(bf16_nt_args(xb.data(), k, m, k, wb.data(), y.data(), n, 0, n));
      for (int64_t i = 0; i < m; ++i)
        for (int64_t c = 0; c < n; ++c) {
          double ref = 0, mag = 0;
          for (int64_t kk = 0; kk < k; ++kk) {
            const double p = double(bf16_to_float(xb[size_t(i * k + kk)])) * bf16_to_float(wb[size_t(c * k + kk)]);
            ref += p;
            mag += std::fabs(p);
          }
          ASSERT_NEAR(y[size_t(i * n + c)], ref, 1e-5 * (1 + mag)) << kt->isa << " m" << m << " n" << n << " k" << k;
        }
    }
  }
}

TEST(CpuKernels, PrepackedVnniRowsGiveTheSameProducts) {
  // MatmulArgs::x_vnni (rows packed once by pack_x_vnni, as grouped_mm does per expert on AMX) gives
  // bit-identical results to the kernel packing x itself; on every table (only AMX reads it), with m,
  // k off the tile sizes (odd k included) and rows starting at a packed 16-row block.
  std::mt19937 rng(23);
  std::normal_distribution<float> nd;
  for (const KernelTable* kt : tables()) {
    std::printf("table %s%s\n", kt->isa, kt->bf16_dot ? "" : " (no bf16 matmul: skipped)");
    if (!kt->bf16_dot) continue;
    for (int iter = 0; iter < 30; ++iter) {
      const int64_t m = 1 + rng() % 70, n = 1 + rng() % 80, k = 1 + rng() % 300, ldx = k + rng() % 3;
      std::vector<uint16_t> xb(static_cast<size_t>(m * ldx)), wb(static_cast<size_t>(n * k));
      for (auto& v : xb) v = float_to_bf16(nd(rng));
      for (auto& v : wb) v = float_to_bf16(nd(rng));
      std::vector<uint16_t> xv(static_cast<size_t>(vnni_elems(m, k)), 0xFFFF);
      pack_x_vnni(xb.data(), ldx, m, k, xv.data());
      // rows 16·j.. of the packed block: the rows of x from 16·j
      const int64_t r0 = m > 16 ? 16 * int64_t(rng() % uint64_t((m - 1) / 16 + 1)) : 0;
      std::vector<float> y0(static_cast<size_t>(m * n), -777.0f), y1 = y0;
      MatmulArgs a = bf16_nt_args(xb.data() + r0 * ldx, ldx, m - r0, k, wb.data(), y0.data(), n, 0, n);
      kt->matmul(a);
      a.y = y1.data();
      a.x_vnni = xv.data() + vnni_elems(r0, k);
      kt->matmul(a);
      for (size_t q = 0; q < y0.size(); ++q)
        ASSERT_EQ(y0[q], y1[q]) << kt->isa << " m" << m << " r0 " << r0 << " n" << n << " k" << k << " at " << q;
    }
  }
  EXPECT_EQ(vnni_elems(17, 33), 2 * 2 * 512);
}

TEST(CpuKernels, E4m3ToF32AllCodes) {
  std::vector<uint8_t> codes(256 + 7);
  for (size_t i = 0; i < codes.size(); ++i) codes[i] = uint8_t(i);
  for (const KernelTable* kt : tables()) {
    std::vector<float> out(codes.size());
    kt->e4m3_to_f32(codes.data(), out.data(), int64_t(codes.size()));
    for (size_t i = 0; i < codes.size(); ++i) {
      const float want = e4m3_to_float(codes[i]);
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(out[i])) << kt->isa << " code " << i;
      } else {
        EXPECT_EQ(out[i], want) << kt->isa << " code " << i;
        EXPECT_EQ(std::signbit(out[i]), std::signbit(want)) << kt->isa << " code " << i;
      }
    }
  }
}

// A random FP8 block-scaled product for the kernel tests: weight codes w [n, k] whose 128-k blocks
// hold normal codes only, any code but NaN (zeros and subnormals; or only those and the smallest
// normals), or also one NaN code (the row's
// outputs are then NaN: nan_row); activation codes x [m, k] with scales xs; weight scales per
// block_n × 128 block as f32 (wsf) and, when ue8m0, as UE8M0 bytes (wsu) of the same values.
namespace {

// Runs check(i, j, got) on each output of y [m, ldy] (column 0 = output n0) below column n, and
// asserts that the columns past n kept the -777 poison; stops at the first fatal failure.
template <class Check>
void check_outputs(const std::vector<float>& y, int64_t m, int64_t n, int64_t n0, int64_t ldy, const char* isa, Check check) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t jc = 0; jc < ldy; ++jc) {
      const float got = y[size_t(i * ldy + jc)];
      const int64_t j = n0 + jc;
      if (j >= n)
        ASSERT_EQ(got, -777.0f) << isa << ": column past n1 was written";
      else
        check(i, j, got);
      if (::testing::Test::HasFatalFailure()) return;
    }
}

struct Fp8Problem {
  int64_t m, n, k, block_n, blocks;
  bool ue8m0;
  std::vector<uint8_t> w, wsu;
  std::vector<bool> nan_row;
  std::vector<float> x, xs, wsf;

  // normal_kinds of the four block kinds (0..4) hold normal codes only; the others are split between
  // "any but NaN" and "one NaN code".
  Fp8Problem(std::mt19937& rng, int64_t m_, int64_t n_, int64_t k_, int64_t block_n_, bool ue8m0_, int normal_kinds)
      : m(m_), n(n_), k(k_), block_n(block_n_), blocks((k_ + 127) / 128), ue8m0(ue8m0_) {
    // small_codes: zeros, subnormals and the lowest binade of normals, so that a wrong subnormal
    // value is not lost beside large products
    std::vector<uint8_t> normal_codes, any_codes, small_codes;
    for (int c = 0; c < 256; ++c) {
      if ((c & 0x7f) == 0x7f) continue;
      any_codes.push_back(uint8_t(c));
      if ((c & 0x7f) >= 8) normal_codes.push_back(uint8_t(c));
      if ((c & 0x7f) < 16) small_codes.push_back(uint8_t(c));
    }
    std::uniform_real_distribution<float> unit(0.5f, 2.0f);
    w.resize(size_t(n * k));
    nan_row.assign(size_t(n), false);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t kb = 0; kb < blocks; ++kb) {
        const int kind = int(rng() % 4);
        const bool normal = kind < normal_kinds, with_nan = !normal && kind % 2 == 1;
        const auto& pool = normal ? normal_codes : rng() % 2 ? any_codes : small_codes;
        const int64_t k0 = kb * 128, k1 = std::min(k, k0 + 128);
        for (int64_t c = k0; c < k1; ++c) w[size_t(r * k + c)] = pool[rng() % pool.size()];
        if (with_nan && rng() % 4 == 0) {
          w[size_t(r * k + k0 + int64_t(rng() % uint32_t(k1 - k0)))] = rng() % 2 ? 0x7f : 0xff;
          nan_row[size_t(r)] = true;
        }
      }
    x.resize(size_t(m * k));
    xs.resize(size_t(m * blocks));
    for (auto& v : x) v = e4m3_to_float(any_codes[rng() % any_codes.size()]);
    for (auto& v : xs) v = unit(rng);
    wsf.resize(size_t((n + block_n - 1) / block_n * blocks));
    wsu.resize(wsf.size());
    for (size_t i = 0; i < wsf.size(); ++i) {
      wsu[i] = uint8_t(118 + rng() % 12);
      wsf[i] = ue8m0 ? ue8m0_to_float(wsu[i]) : unit(rng) * 1e-3f;
    }
  }
  const void* scales() const { return ue8m0 ? static_cast<const void*>(wsu.data()) : static_cast<const void*>(wsf.data()); }

  // Checks y [m, ldy] (column 0 = output n0) against the f64 reference; nothing written past n.
  void check(const std::vector<float>& y, int64_t n0, int64_t ldy, const char* isa) const {
    check_outputs(y, m, n, n0, ldy, isa, [&](int64_t i, int64_t j, float got) {
      if (nan_row[size_t(j)]) {
        ASSERT_TRUE(std::isnan(got)) << isa << " row " << j << " holds a NaN code";
        return;
      }
      double ref = 0, mag = 0;
      for (int64_t kb = 0; kb < blocks; ++kb) {
        double part = 0, part_mag = 0;
        for (int64_t c = kb * 128; c < std::min(k, kb * 128 + 128); ++c) {
          const double p = double(x[size_t(i * k + c)]) * e4m3_to_float(w[size_t(j * k + c)]);
          part += p;
          part_mag += std::fabs(p);
        }
        const double scale = double(xs[size_t(i * blocks + kb)]) * wsf[size_t((j / block_n) * blocks + kb)];
        ref += part * scale;
        mag += part_mag * scale;
      }
      ASSERT_NEAR(got, ref, 1e-5 * (1e-30 + mag)) << isa << " m" << m << " n" << n << " k" << k << " [" << i << ", " << j << "]";
    });
  }
};

}  // namespace

// fp8_matmul against an f64 loop of the same codes and scales: weight blocks of normal codes only
// (AVX-512's fast conversion, sums taken back by 2^56), blocks with zero and subnormal codes, and
// blocks with a NaN code (the exact conversion; the row's outputs NaN), for f32 and UE8M0 weight
// scales, per-row and 128-row scale blocks, k with partial 128-blocks and 16-lane tails.
TEST(CpuKernels, Fp8MatmulMatchesLoopForEveryKindOfCode) {
  std::mt19937 rng(53);
  for (const KernelTable* kt : tables()) {
    for (int iter = 0; iter < 24; ++iter) {
      const Fp8Problem pr(rng, 1 + rng() % 9, 1 + rng() % 37, 1 + rng() % 400, iter % 2 ? 1 : 128, iter % 4 >= 2, 2);
      const int64_t ldy = pr.n + 2;
      std::vector<float> y(size_t(pr.m * ldy), -777.0f);
      Fp8MatmulArgs a;
      a.x = pr.x.data();
      a.ldx = pr.k;
      a.xs = pr.xs.data();
      a.m = pr.m;
      a.k = pr.k;
      a.w = pr.w.data();
      a.ldw = pr.k;
      a.ws = pr.scales();
      a.ws_ue8m0 = pr.ue8m0;
      a.block_n = pr.block_n;
      a.y = y.data();
      a.ldy = ldy;
      a.n0 = 0;
      a.n1 = pr.n;
      kt->fp8_matmul(a);
      pr.check(y, 0, ldy, kt->isa);
    }
  }
}

// The packed FP8 kernel against the same f64 loop as the in-place one, on weights packed by
// pack_rows_fp8: blocks of normal codes only (the fast conversion), with zero / subnormal codes and
// with a NaN code; partial last panels and k blocks; a column range starting on a later panel; f32
// and UE8M0 scales on per-row and 128-row scale blocks.
// One call of kt's packed FP8 / FP4 kernel: x [m, k] codes (row stride k) with scales xs [m, ceil(k / 128)]
// over columns [n0, n1), into a fresh y [m, ldy] poisoned with -777 (columns the kernel must not write keep it).
// The kernel is kt's, or any callable taking the arguments (the AMX kernels' two forms); fill sets the
// format's own fields.
template <class Args, class Kernel, class Fill>
std::vector<float> packed_call(const Kernel& kernel, const float* x, const float* xs, int64_t m, int64_t k, int64_t n0, int64_t n1,
                               int64_t ldy, Fill fill) {
  std::vector<float> y(size_t(m * ldy), -777.0f);
  Args a;
  a.x = x;
  a.ldx = k;
  a.xs = xs;
  a.m = m;
  a.k = k;
  a.y = y.data();
  a.ldy = ldy;
  a.n0 = n0;
  a.n1 = n1;
  fill(a);
  if constexpr (!std::is_same_v<Kernel, KernelTable>)
    kernel(a);
  else if constexpr (std::is_same_v<Args, PackedFp8MatmulArgs>)
    kernel.packed_matmul_fp8(a);
  else
    kernel.packed_matmul_fp4(a);
  return y;
}
template <class Kernel>
std::vector<float> packed_fp8_call(const Kernel& kernel, const float* x, const float* xs, int64_t m, int64_t k, const uint8_t* panels,
                                   const float* block_scales, const uint8_t* kinds, int64_t n0, int64_t n1, int64_t ldy) {
  return packed_call<PackedFp8MatmulArgs>(kernel, x, xs, m, k, n0, n1, ldy, [&](PackedFp8MatmulArgs& a) {
    a.panels = panels;
    a.block_scales = block_scales;
    a.block_kind = kinds;
  });
}
template <class Kernel>
std::vector<float> packed_fp4_call(const Kernel& kernel, const float* x, const float* xs, int64_t m, int64_t k, const uint8_t* panels,
                                   const float* group_scales, int64_t group, int64_t n0, int64_t n1, int64_t ldy) {
  return packed_call<PackedFp4MatmulArgs>(kernel, x, xs, m, k, n0, n1, ldy, [&](PackedFp4MatmulArgs& a) {
    a.panels = panels;
    a.group_scales = group_scales;
    a.group = group;
  });
}

TEST(CpuKernels, PackedFp8MatmulMatchesLoopForEveryKindOfCode) {
  std::mt19937 rng(61);
  bool ran = false;
  for (const KernelTable* kt : tables()) {
    if (!kt->packed_matmul_fp8) continue;
    ran = true;
    for (int iter = 0; iter < 16; ++iter) {
      // the first four: normal codes only, so that whole panels take the fast form; then 3 in 4 blocks
      const Fp8Problem pr(rng, 1 + rng() % 14, 1 + rng() % 100, 1 + rng() % 400, iter % 2 ? 1 : 128, iter % 4 >= 2, iter < 4 ? 4 : 3);
      const QuantSpec q = QuantSpec::fp8_block(int(pr.block_n), 128, pr.ue8m0 ? ScaleFormat::ue8m0 : ScaleFormat::f32);
      const int64_t panels = (pr.n + kPanelCols - 1) / kPanelCols;
      std::vector<uint8_t> codes(size_t(panels * fp8_panel_bytes(pr.k, kt->packed_fp8_pairs))), flags(size_t(panels * pr.blocks));
      std::vector<float> block_scales(size_t(panels * pr.blocks * kPanelCols));
      pack_rows_fp8(pr.w.data(), pr.scales(), q, pr.k, 0, pr.n, kt->packed_fp8_pairs, codes.data(), block_scales.data(), flags.data());
      if (iter < 4) {
        for (uint8_t f : flags) ASSERT_EQ(f, 1) << "blocks of normal codes only are flagged for the fast form";
      }
      const int64_t n0 = (rng() % uint32_t(pr.n)) / kPanelCols * kPanelCols, ldy = pr.n - n0 + 3;
      const auto y = packed_fp8_call(*kt, pr.x.data(), pr.xs.data(), pr.m, pr.k, codes.data(), block_scales.data(), flags.data(), n0,
                                     pr.n, ldy);
      pr.check(y, n0, ldy, kt->isa);
    }
  }
  if (!ran) GTEST_SKIP() << "no kernel table with the packed FP8 kernel on this CPU";
}

// Each table's quantize_rows against the scalar one (quant_math), bit for bit: normal values of many
// magnitudes, rows holding 448 (scale 1) with exact ties between e4m3 values (normal and subnormal),
// zeros of both signs, NaN and infinities, groups of all zeros, and k with partial 16-lane and
// 128-channel tails.
TEST(CpuKernels, QuantizeRowsMatchesScalarBitForBit) {
  std::mt19937 rng(67);
  std::normal_distribution<float> nd;
  const float ties[] = {1.0625f, 1.1875f, -1.3125f, 0x1p-10f, 0x3p-10f, -0x5p-10f, 0x1.1p-6f, 0x1.dp7f, 440.0f, 0x1p-12f};
  for (const KernelTable* kt : tables()) {
    for (int iter = 0; iter < 40; ++iter) {
      const int64_t m = 1 + rng() % 4, k = 1 + rng() % 700, groups = (k + 127) / 128;
      std::vector<float> x(size_t(m * k));
      const float mag = std::ldexp(1.0f, int(rng() % 60) - 30);
      for (auto& v : x) v = nd(rng) * mag;
      for (int64_t i = 0; i < m; ++i) {
        float* row = x.data() + i * k;
        switch (iter % 5) {
          case 1:  // scale 1: the ties land on x / scale exactly
            row[0] = 448.0f;
            for (int64_t c = 1; c < k; ++c) row[c] = ties[rng() % std::size(ties)] * (rng() % 2 ? 1.0f : -1.0f);
            break;
          case 2:
            row[rng() % k] = NAN;
            row[rng() % k] = 0.0f;
            row[rng() % k] = -0.0f;
            break;
          case 3:
            row[rng() % k] = rng() % 2 ? INFINITY : -INFINITY;
            break;
          case 4:
            std::fill(row, row + std::min<int64_t>(k, 128), 0.0f);
            break;
        }
      }
      std::vector<float> want = x, got = x, ws(size_t(m * groups)), gs(size_t(m * groups));
      quantize_rows(want.data(), m, k, ws.data());
      kt->quantize_rows(got.data(), m, k, gs.data());
      for (size_t i = 0; i < want.size(); ++i) {
        uint32_t a, b;
        std::memcpy(&a, &want[i], 4);
        std::memcpy(&b, &got[i], 4);
        if (std::isnan(want[i])) {
          ASSERT_TRUE(std::isnan(got[i])) << kt->isa << " at " << i;
        } else {
          ASSERT_EQ(a, b) << kt->isa << " iter " << iter << " at " << i << ": " << want[i] << " vs " << got[i];
        }
      }
      for (size_t i = 0; i < ws.size(); ++i) ASSERT_EQ(ws[i], gs[i]) << kt->isa << " scale " << i;
    }
  }
}

namespace {

// The f64 reference of one FP4 product output: Σ_c codes[i, c] · deq[j, c] · xs[i, c / 128] and Σ of the
// products' magnitudes (the tolerance's scale), for codes [m, k], dequantized weights deq [n, k].
std::pair<double, double> fp4_reference(const std::vector<float>& codes, const std::vector<float>& deq, const std::vector<float>& xs,
                                        int64_t i, int64_t j, int64_t k) {
  const int64_t blocks = (k + 127) / 128;
  double ref = 0, mag = 0;
  for (int64_t c = 0; c < k; ++c) {
    const double p = double(codes[size_t(i * k + c)]) * deq[size_t(j * k + c)] * xs[size_t(i * blocks + c / 128)];
    ref += p;
    mag += std::fabs(p);
  }
  return {ref, mag};
}

}  // namespace

// The FP4 path of quant_matmul (e2m1 codes two per byte, low nibble first, UE8M0 scales per group of
// 1, 16 or 32; odd K, so rows end on half a byte) against an f64 loop over the same dequantized
// weights (dequantize_fp4_groups) and e4m3 activation codes.
TEST(CpuKernels, Fp4MatmulMatchesLoopForEveryGroupSize) {
  std::mt19937 rng(59);
  std::normal_distribution<float> nd;
  std::uniform_real_distribution<float> unit(0.5f, 2.0f);
  for (const KernelTable* kt : tables()) {
    for (const int group : {1, 16, 32}) {
      const int64_t m = 1 + rng() % 5, n = 1 + rng() % 70, k = 2 * (rng() % 150) + 1 + (group == 1 ? 0 : 128);
      const int64_t row_bytes = (k + 1) / 2, groups = (k + group - 1) / group, blocks = (k + 127) / 128;
      std::vector<float> wf(size_t(n * k));
      for (auto& v : wf) v = nd(rng);
      std::vector<uint8_t> packed(size_t(n * row_bytes)), scales(size_t(n * groups));
      quantize_fp4_groups(wf.data(), n, k, group, packed.data(), scales.data());
      std::vector<float> deq(wf.size());
      dequantize_fp4_groups(packed.data(), scales.data(), n, k, group, deq.data());
      std::vector<float> codes(size_t(m * k)), xs(size_t(m * blocks));
      for (auto& v : codes) v = e4m3_to_float(uint8_t(rng() % 0x7f) | uint8_t(rng() % 2 ? 0x80 : 0));
      for (auto& v : xs) v = unit(rng);
      cpu::QuantMatrix qm{QuantSpec::fp4_group(group), packed.data(), scales.data(), n, k, false};
      const int64_t n0 = int64_t(rng() % uint32_t(n)), ldy = n + 1;
      std::vector<float> y(size_t(m * ldy), -777.0f), scratch(size_t(cpu::kQuantScratch));
      cpu::quant_matmul(*kt, qm, codes.data(), xs.data(), m, y.data(), ldy, n0, n, scratch.data());
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < ldy; ++j) {
          const float got = y[size_t(i * ldy + j)];
          if (j < n0 || j >= n) {
            ASSERT_EQ(got, -777.0f) << kt->isa << ": column outside [n0, n1) was written";
            continue;
          }
          const auto [ref, mag] = fp4_reference(codes, deq, xs, i, j, k);
          ASSERT_NEAR(got, ref, 1e-5 * (1e-30 + mag)) << kt->isa << " group " << group << " m" << m << " n" << n << " k" << k;
        }
    }
  }
}

namespace {

// A packed-FP4 kernel problem: weights [n, k] (normal values over nine binades) quantized to e2m1 with
// UE8M0 scales per `group` channels (with odd_scales, one scale byte 0 = 2^-127 and one 255 = NaN: that
// row's outputs NaN), their dequantized values for the f64 loop, e4m3 activation codes x [m, k] with
// scales xs per 128 channels.
struct Fp4Problem {
  int64_t m, n, k, group, groups, blocks;
  std::vector<uint8_t> packed, scales;
  std::vector<float> deq, x, xs;

  Fp4Problem(std::mt19937& rng, int64_t m_, int64_t n_, int64_t k_, int group_, bool odd_scales)
      : m(m_), n(n_), k(k_), group(group_), groups((k_ + group_ - 1) / group_), blocks((k_ + 127) / 128) {
    std::normal_distribution<float> nd;
    std::uniform_real_distribution<float> unit(0.5f, 2.0f);
    std::vector<float> wf(size_t(n * k));
    for (auto& v : wf) v = nd(rng) * std::ldexp(1.0f, int(rng() % 9) - 4);
    packed.resize(size_t(n * ((k + 1) / 2)));
    scales.resize(size_t(n * groups));
    quantize_fp4_groups(wf.data(), n, k, group, packed.data(), scales.data());
    if (odd_scales) {
      scales[rng() % scales.size()] = 0;    // 2^-127
      scales[rng() % scales.size()] = 255;  // NaN
    }
    deq.resize(wf.size());
    dequantize_fp4_groups(packed.data(), scales.data(), n, k, group, deq.data());
    x.resize(size_t(m * k));
    xs.resize(size_t(m * blocks));
    for (auto& v : x) v = e4m3_to_float(uint8_t(rng() % 0x7f) | uint8_t(rng() % 2 ? 0x80 : 0));
    for (auto& v : xs) v = unit(rng);
  }
  // The panels of PackedFp4MatmulArgs (k pairs or [k, 16]) and their group scales.
  void pack(bool pairs, std::vector<uint8_t>& codes, std::vector<float>& group_scales) const {
    const int64_t panels = (n + kPanelCols - 1) / kPanelCols;
    codes.assign(size_t(panels * fp4_panel_bytes(k, pairs)), 0);
    group_scales.assign(size_t(panels * groups * kPanelCols), 0.0f);
    pack_rows_fp4(packed.data(), scales.data(), group, k, 0, n, pairs, codes.data(), group_scales.data());
  }
  // y [m, ldy] (column 0 = output n0) against the f64 loop; nothing written past n.
  void check(const std::vector<float>& y, int64_t n0, int64_t ldy, const char* isa) const {
    check_outputs(y, m, n, n0, ldy, isa, [&](int64_t i, int64_t j, float got) {
      const auto [ref, mag] = fp4_reference(x, deq, xs, i, j, k);
      if (std::isnan(ref)) {
        ASSERT_TRUE(std::isnan(got)) << isa << " row " << j << " has a NaN scale";
        return;
      }
      ASSERT_NEAR(got, ref, 1e-5 * (1e-30 + mag)) << isa << " group " << group << " m" << m << " n" << n << " k" << k << " [" << i << ", "
                                                  << j << "]";
    });
  }
};

}  // namespace

// The packed FP4 kernel on weights packed by pack_rows_fp4 against an f64 loop over the dequantized
// weights: groups of 2, 16, 32 and 128 channels, odd K (rows ending on half a byte), partial last
// panels and 128-k blocks, a column range starting on a later panel, UE8M0 scale bytes of 0 (2^-127)
// and of 255 (NaN: the row's outputs NaN) in some rows.
TEST(CpuKernels, PackedFp4MatmulMatchesLoopForEveryGroupSize) {
  std::mt19937 rng(71);
  bool ran = false;
  for (const KernelTable* kt : tables()) {
    if (!kt->packed_matmul_fp4) continue;
    ran = true;
    for (int iter = 0; iter < 16; ++iter) {
      const int group = std::array{2, 16, 32, 128}[size_t(iter % 4)];
      const Fp4Problem pr(rng, 1 + rng() % 14, 1 + rng() % 100, 2 * (rng() % 200) + 1 + (iter % 3 == 0 ? 0 : 1), group, iter % 4 == 1);
      std::vector<uint8_t> codes;
      std::vector<float> group_scales;
      pr.pack(kt->packed_fp4_pairs, codes, group_scales);
      const int64_t n0 = (rng() % uint32_t(pr.n)) / kPanelCols * kPanelCols, ldy = pr.n - n0 + 3;
      const auto y = packed_fp4_call(*kt, pr.x.data(), pr.xs.data(), pr.m, pr.k, codes.data(), group_scales.data(), group, n0, pr.n, ldy);
      pr.check(y, n0, ldy, kt->isa);
    }
  }
  // k = 0: no products, zeros (not the kernels' unset totals)
  for (const KernelTable* kt : tables()) {
    if (!kt->packed_matmul_fp4) continue;
    std::vector<float> y(6, -777.0f);
    PackedFp4MatmulArgs a4;
    a4.m = 2;
    a4.ldy = 3;
    a4.n1 = 3;
    a4.y = y.data();
    kt->packed_matmul_fp4(a4);
    for (float v : y) ASSERT_EQ(v, 0.0f) << kt->isa << " FP4, k = 0";
    if (!kt->packed_matmul_fp8) continue;
    std::fill(y.begin(), y.end(), -777.0f);
    PackedFp8MatmulArgs a8;
    a8.m = 2;
    a8.ldy = 3;
    a8.n1 = 3;
    a8.y = y.data();
    kt->packed_matmul_fp8(a8);
    for (float v : y) ASSERT_EQ(v, 0.0f) << kt->isa << " FP8, k = 0";
  }
  if (!ran) GTEST_SKIP() << "no kernel table with the packed FP4 kernel on this CPU";
}

// Every packed FP8 / FP4 kernel gives each row the same bits whatever the batch: one row alone and two
// rows alone (one row block, with its own prefetch pattern; FP4 on vdpbf16ps: the decode form over
// groups of 4 / 2 panels, then the panels left over) and the same rows among 21 (several row blocks),
// over 2 and 5 panels, from the first column and from a later panel. The AMX tables run calls of
// >= kAmxMinRows rows on the tiles and fewer on vdpbf16ps (amx_quant_rows), two kernels whose bits
// differ (a row's bits there depend on its call's row count, as for bf16 on AMX): the 21 rows must be
// the tile kernel's and the 1 or 2 rows the avx512_bf16 table's, bit for bit.
TEST(CpuKernels, PackedFp8AndFp4RowsDoNotDependOnTheBatch) {
  std::mt19937 rng(1207);
  bool ran = false;
  for (const int64_t n : {45, 150}) {
    const int64_t m = 21, k = 390;
    const Fp8Problem pr(rng, m, n, k, 128, false, 2);  // every kind of block
    const QuantSpec q = QuantSpec::fp8_block(128, 128, ScaleFormat::f32);
    const int64_t panels = (n + kPanelCols - 1) / kPanelCols, blocks = (k + 127) / 128;
    const int group = 32, groups = int((k + group - 1) / group);
    std::vector<float> wf(size_t(n * k));
    std::normal_distribution<float> nd;
    for (auto& v : wf) v = nd(rng);
    std::vector<uint8_t> fp4(size_t(n * ((k + 1) / 2))), fp4_scales(size_t(n * groups));
    quantize_fp4_groups(wf.data(), n, k, group, fp4.data(), fp4_scales.data());
    // rows [i, i + rows) alone against the same rows of the whole batch, columns [n0, n)
    auto same_rows = [&](const auto& run, const char* isa, const char* what) {
      for (const int64_t n0 : {int64_t(0), kPanelCols}) {
        const int64_t w = n - n0;
        const auto all = run(0, m, n0);
        for (const auto [i, rows] : {std::pair<int64_t, int64_t>{0, 1}, {7, 1}, {20, 1}, {3, 2}, {19, 2}}) {
          const auto part = run(i, rows, n0);
          EXPECT_EQ(std::memcmp(part.data(), all.data() + i * w, size_t(rows * w) * sizeof(float)), 0)
              << isa << " " << what << " rows " << i << ".." << i + rows - 1 << ", n " << n << ", n0 " << n0;
        }
      }
    };
    // an AMX table (amx_split): the whole batch gives the tile kernel's bits, 1 or 2 rows the vdpbf16ps
    // kernel's (each batch-independent: same_rows on the avx512_bf16 table, the AMX kernels' tests)
    auto dispatched = [&](const auto& table, const auto& tiles, const auto& vdp, const char* isa, const char* what) {
      for (const int64_t n0 : {int64_t(0), kPanelCols}) {
        const auto a = table(0, m, n0), b = tiles(0, m, n0);
        EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << isa << " " << what << " " << m << " rows: the tiles'";
        for (const auto [i, rows] : {std::pair<int64_t, int64_t>{0, 1}, {3, 2}}) {
          const auto c = table(i, rows, n0), d = vdp(i, rows, n0);
          EXPECT_EQ(std::memcmp(c.data(), d.data(), c.size() * sizeof(float)), 0)
              << isa << " " << what << " " << rows << " rows: vdpbf16ps's";
        }
      }
    };
    for (const KernelTable* kt : tables()) {
      if (kt->packed_matmul_fp8) {
        ran = true;
        std::vector<uint8_t> codes(size_t(panels * fp8_panel_bytes(k, kt->packed_fp8_pairs))), kinds(size_t(panels * blocks));
        std::vector<float> bscales(size_t(panels * blocks * kPanelCols));
        pack_rows_fp8(pr.w.data(), pr.scales(), q, k, 0, n, kt->packed_fp8_pairs, codes.data(), bscales.data(), kinds.data());
        const auto fp8_with = [&](const auto& kernel) {
          return [&, kernel](int64_t i0, int64_t rows, int64_t n0) {
            return packed_fp8_call(kernel, pr.x.data() + i0 * k, pr.xs.data() + i0 * blocks, rows, k, codes.data(), bscales.data(),
                                   kinds.data(), n0, n, n - n0);
          };
        };
#if defined(MOEX_X86)
        if (amx_split(*kt)) {
          const bool model = std::string(kt->isa) == "avx512_amx_model";
          dispatched(fp8_with([kt](const PackedFp8MatmulArgs& a) { kt->packed_matmul_fp8(a); }),
                     fp8_with([model](const PackedFp8MatmulArgs& a) { packed_matmul_fp8_amx(a, model); }),
                     fp8_with([t = &avx512_bf16_kernels()](const PackedFp8MatmulArgs& a) { t->packed_matmul_fp8(a); }), kt->isa, "FP8");
          ASSERT_TRUE(amx_quant_rows(m) && !amx_quant_rows(2));
        } else
#endif
          same_rows(fp8_with([kt](const PackedFp8MatmulArgs& a) { kt->packed_matmul_fp8(a); }), kt->isa, "FP8");
      }
      if (kt->packed_matmul_fp4) {
        std::vector<uint8_t> codes(size_t(panels * fp4_panel_bytes(k, kt->packed_fp4_pairs)));
        std::vector<float> gscales(size_t(panels * groups * kPanelCols));
        pack_rows_fp4(fp4.data(), fp4_scales.data(), group, k, 0, n, kt->packed_fp4_pairs, codes.data(), gscales.data());
        const auto fp4_with = [&](const auto& kernel) {
          return [&, kernel](int64_t i0, int64_t rows, int64_t n0) {
            return packed_fp4_call(kernel, pr.x.data() + i0 * k, pr.xs.data() + i0 * blocks, rows, k, codes.data(), gscales.data(), group,
                                   n0, n, n - n0);
          };
        };
#if defined(MOEX_X86)
        if (amx_split(*kt)) {
          const bool model = std::string(kt->isa) == "avx512_amx_model";
          dispatched(fp4_with([kt](const PackedFp4MatmulArgs& a) { kt->packed_matmul_fp4(a); }),
                     fp4_with([model](const PackedFp4MatmulArgs& a) { packed_matmul_fp4_amx(a, model); }),
                     fp4_with([t = &avx512_bf16_kernels()](const PackedFp4MatmulArgs& a) { t->packed_matmul_fp4(a); }), kt->isa, "FP4");
        } else
#endif
          same_rows(fp4_with([kt](const PackedFp4MatmulArgs& a) { kt->packed_matmul_fp4(a); }), kt->isa, "FP4");
      }
    }
  }
  if (!ran) GTEST_SKIP() << "no kernel table with the packed FP8 kernel on this CPU";
}

// The f32 FP8 kernels ([k, 32] panels: AVX-512 without BF16, AVX2) do the same operations in the same
// order per column, whatever their vector width: the same outputs bit for bit, every kind of block.
TEST(CpuKernels, PackedFp8F32KernelsAgreeBitForBit) {
  std::vector<const KernelTable*> f32_tables;
  for (const KernelTable* kt : tables())
    if (kt->packed_matmul_fp8 && !kt->packed_fp8_pairs) f32_tables.push_back(kt);
  if (f32_tables.size() < 2) GTEST_SKIP() << "fewer than two f32 FP8 kernels on this CPU";
  std::mt19937 rng(1206);
  for (int iter = 0; iter < 6; ++iter) {
    const Fp8Problem pr(rng, 1 + rng() % 7, 1 + rng() % 100, 1 + rng() % 400, iter % 2 ? 1 : 128, iter % 4 >= 2, iter < 2 ? 4 : 3);
    const QuantSpec q = QuantSpec::fp8_block(int(pr.block_n), 128, pr.ue8m0 ? ScaleFormat::ue8m0 : ScaleFormat::f32);
    const int64_t panels = (pr.n + kPanelCols - 1) / kPanelCols;
    std::vector<uint8_t> codes(size_t(panels * fp8_panel_bytes(pr.k, false))), flags(size_t(panels * pr.blocks));
    std::vector<float> block_scales(size_t(panels * pr.blocks * kPanelCols));
    pack_rows_fp8(pr.w.data(), pr.scales(), q, pr.k, 0, pr.n, false, codes.data(), block_scales.data(), flags.data());
    std::vector<std::vector<float>> ys;
    for (const KernelTable* kt : f32_tables)
      ys.push_back(packed_fp8_call(*kt, pr.x.data(), pr.xs.data(), pr.m, pr.k, codes.data(), block_scales.data(), flags.data(), 0, pr.n,
                                   pr.n));
    for (size_t t = 1; t < ys.size(); ++t)
      EXPECT_EQ(std::memcmp(ys[0].data(), ys[t].data(), ys[0].size() * sizeof(float)), 0)
          << f32_tables[0]->isa << " and " << f32_tables[t]->isa << " differ, iteration " << iter;
  }
}

#if defined(MOEX_X86)
// The AMX bf16 nt kernel (weights loaded in place as A tiles, activations in VNNI B tiles) against the
// f64 loop of the widened values, on its scalar tile model wherever the CPU has AVX512_BF16 and on the
// tile unit where it has AMX: m in one, two and odd numbers of 16-row blocks, n with partial 32-row
// weight blocks and a later first column, k off every multiple of 32 (the zero-padded weight tiles),
// rows given prepacked (x_vnni) or packed by the kernel, with the same bits either way.
TEST(CpuKernels, AmxBf16KernelMatchesLoop) {
  if (!cpu_has_avx512_bf16()) GTEST_SKIP() << "the AMX kernel's row gather needs AVX-512";
  const bool hw = cpu_has_amx();
  std::mt19937 rng(1211);
  std::normal_distribution<float> nd;
  for (int iter = 0; iter < 14; ++iter) {
    const int64_t m = iter < 3 ? 8 + iter * 16 : 8 + rng() % 50, n = 1 + rng() % 90, k = 1 + rng() % 300;
    std::vector<uint16_t> xb(size_t(m * k)), wb(size_t(n * k));
    for (auto& v : xb) v = float_to_bf16(nd(rng));
    for (auto& v : wb) v = float_to_bf16(nd(rng));
    std::vector<uint16_t> xv(size_t(vnni_elems(m, k)));
    pack_x_vnni(xb.data(), k, m, k, xv.data());
    const int64_t n0 = int64_t(rng() % uint32_t(n)), ldy = n + 1;
    for (const bool model : {true, false}) {
      if (!model && !hw) continue;
      std::vector<float> y(size_t(m * ldy), -777.0f), y_pre = y;
      MatmulArgs a = bf16_nt_args(xb.data(), k, m, k, wb.data(), y.data(), ldy, n0, n);
      matmul_bf16_amx(a, model);
      a.y = y_pre.data();
      a.x_vnni = xv.data();
      matmul_bf16_amx(a, model);
      const char* what = model ? "amx tile model" : "amx tiles";
      ASSERT_EQ(std::memcmp(y.data(), y_pre.data(), y.size() * sizeof(float)), 0) << what << ": prepacked rows differ";
      check_outputs(y, m, n, 0, ldy, what, [&](int64_t i, int64_t c, float got) {
        if (c < n0) {
          ASSERT_EQ(got, -777.0f) << what << ": column before n0 was written";
          return;
        }
        double ref = 0, mag = 0;
        for (int64_t kk = 0; kk < k; ++kk) {
          const double p = double(bf16_to_float(xb[size_t(i * k + kk)])) * bf16_to_float(wb[size_t(c * k + kk)]);
          ref += p;
          mag += std::fabs(p);
        }
        ASSERT_NEAR(got, ref, 1e-5 * (1 + mag)) << what << " m" << m << " n" << n << " k" << k << " [" << i << ", " << c << "]";
      });
    }
  }
}

// The AMX FP8 kernel (k-pair panels on the tile unit) against the f64 loop, on its scalar tile model
// wherever the CPU has AVX512_BF16 and on the tile unit where it has AMX: every kind of block, rows in
// one, two and odd numbers of 16-row blocks, partial panels and k blocks, a column range starting on a
// later panel; rows that do not depend on the batch; the model and the hardware within the loop's bound
// of each other (bit for bit where the hardware sums a pair's products in the ISA's described order).
TEST(CpuKernels, AmxFp8KernelMatchesLoop) {
  if (!cpu_has_avx512_bf16()) GTEST_SKIP() << "the AMX FP8 kernel's conversions need AVX512_BF16";
  const bool hw = cpu_has_amx();
  auto model = [](const PackedFp8MatmulArgs& a) { packed_matmul_fp8_amx(a, true); };
  auto tiles = [](const PackedFp8MatmulArgs& a) { packed_matmul_fp8_amx(a, false); };
  std::mt19937 rng(1205);
  int64_t identical = 0, compared = 0;
  for (int iter = 0; iter < 14; ++iter) {
    const int64_t m = iter < 3 ? 1 + iter * 15 : 1 + rng() % 50;  // 1, 16, 31 rows, then any up to 50
    const Fp8Problem pr(rng, m, 1 + rng() % 100, 1 + rng() % 400, iter % 2 ? 1 : 128, iter % 4 >= 2, iter < 4 ? 4 : 3);
    const QuantSpec q = QuantSpec::fp8_block(int(pr.block_n), 128, pr.ue8m0 ? ScaleFormat::ue8m0 : ScaleFormat::f32);
    const int64_t panels = (pr.n + kPanelCols - 1) / kPanelCols;
    std::vector<uint8_t> codes(size_t(panels * fp8_panel_bytes(pr.k, true))), flags(size_t(panels * pr.blocks));
    std::vector<float> block_scales(size_t(panels * pr.blocks * kPanelCols));
    pack_rows_fp8(pr.w.data(), pr.scales(), q, pr.k, 0, pr.n, true, codes.data(), block_scales.data(), flags.data());
    const int64_t n0 = (rng() % uint32_t(pr.n)) / kPanelCols * kPanelCols, ldy = pr.n - n0 + 3;
    auto call = [&](const auto& kernel, int64_t i0, int64_t rows, int64_t c0, int64_t ld) {
      return packed_fp8_call(kernel, pr.x.data() + i0 * pr.k, pr.xs.data() + i0 * pr.blocks, rows, pr.k, codes.data(), block_scales.data(),
                             flags.data(), c0, pr.n, ld);
    };
    const auto ym = call(model, 0, m, n0, ldy);
    pr.check(ym, n0, ldy, "amx tile model");
    // the last row alone gives the same bits as within the batch
    const auto all = call(model, 0, m, 0, pr.n), one = call(model, m - 1, 1, 0, pr.n);
    EXPECT_EQ(std::memcmp(one.data(), all.data() + (m - 1) * pr.n, size_t(pr.n) * sizeof(float)), 0) << "tile model, row " << m - 1;
    if (!hw) continue;
    const auto yt = call(tiles, 0, m, n0, ldy);
    pr.check(yt, n0, ldy, "amx tiles");
    const auto all_t = call(tiles, 0, m, 0, pr.n), one_t = call(tiles, m - 1, 1, 0, pr.n);
    EXPECT_EQ(std::memcmp(one_t.data(), all_t.data() + (m - 1) * pr.n, size_t(pr.n) * sizeof(float)), 0) << "tiles, row " << m - 1;
    for (size_t i = 0; i < ym.size(); ++i) {
      ++compared;
      identical += std::memcmp(&ym[i], &yt[i], sizeof(float)) == 0;
    }
  }
  if (hw) std::printf("AMX FP8: tile unit and tile model identical in %lld of %lld outputs\n", (long long)identical, (long long)compared);
}

// The AMX FP4 kernel likewise: groups of 2, 16, 32 and 128 channels, odd and even k, rows in one, two
// and odd numbers of 16-row blocks; panels holding a scale of 2^-127 or NaN (beyond the tile path's
// exponent range) go to the vdpbf16ps kernel, the rest of the call stays on the tiles; rows that do not
// depend on the batch.
TEST(CpuKernels, AmxFp4KernelMatchesLoop) {
  if (!cpu_has_avx512_bf16()) GTEST_SKIP() << "the AMX FP4 kernel's conversions need AVX512_BF16";
  const bool hw = cpu_has_amx();
  auto model = [](const PackedFp4MatmulArgs& a) { packed_matmul_fp4_amx(a, true); };
  auto tiles = [](const PackedFp4MatmulArgs& a) { packed_matmul_fp4_amx(a, false); };
  std::mt19937 rng(1209);
  for (int iter = 0; iter < 16; ++iter) {
    const int group = std::array{2, 16, 32, 128}[size_t(iter % 4)];
    const int64_t m = iter < 3 ? 1 + iter * 15 : 1 + rng() % 50;  // 1, 16, 31 rows, then any up to 50
    const Fp4Problem pr(rng, m, 1 + rng() % 100, 2 * (rng() % 200) + 1 + (iter % 3 == 0 ? 0 : 1), group, iter % 5 == 4);
    std::vector<uint8_t> codes;
    std::vector<float> group_scales;
    pr.pack(true, codes, group_scales);
    const int64_t n0 = (rng() % uint32_t(pr.n)) / kPanelCols * kPanelCols, ldy = pr.n - n0 + 3;
    auto call = [&](const auto& kernel, int64_t i0, int64_t rows, int64_t c0, int64_t ld) {
      return packed_fp4_call(kernel, pr.x.data() + i0 * pr.k, pr.xs.data() + i0 * pr.blocks, rows, pr.k, codes.data(), group_scales.data(),
                             group, c0, pr.n, ld);
    };
    pr.check(call(model, 0, m, n0, ldy), n0, ldy, "amx tile model");
    const auto all = call(model, 0, m, 0, pr.n), one = call(model, m - 1, 1, 0, pr.n);
    EXPECT_EQ(std::memcmp(one.data(), all.data() + (m - 1) * pr.n, size_t(pr.n) * sizeof(float)), 0) << "tile model, row " << m - 1;
    if (!hw) continue;
    pr.check(call(tiles, 0, m, n0, ldy), n0, ldy, "amx tiles");
    const auto all_t = call(tiles, 0, m, 0, pr.n), one_t = call(tiles, m - 1, 1, 0, pr.n);
    EXPECT_EQ(std::memcmp(one_t.data(), all_t.data() + (m - 1) * pr.n, size_t(pr.n) * sizeof(float)), 0) << "tiles, row " << m - 1;
  }
}
#endif

// The f32 FP4 kernels ([k, 16] panels: AVX-512 without BF16, AVX2) do the same operations in the same
// order per column, whatever their vector width: the same outputs bit for bit.
TEST(CpuKernels, PackedFp4F32KernelsAgreeBitForBit) {
  std::vector<const KernelTable*> f32_tables;
  for (const KernelTable* kt : tables())
    if (kt->packed_matmul_fp4 && !kt->packed_fp4_pairs) f32_tables.push_back(kt);
  if (f32_tables.size() < 2) GTEST_SKIP() << "fewer than two f32 FP4 kernels on this CPU";
  std::mt19937 rng(1205);
  std::normal_distribution<float> nd;
  for (const int group : {16, 32, 128}) {
    const int64_t m = 5, n = 70, k = 300, row_bytes = (k + 1) / 2, groups = (k + group - 1) / group, blocks = (k + 127) / 128;
    std::vector<float> wf(size_t(n * k));
    for (auto& v : wf) v = nd(rng);
    std::vector<uint8_t> packed(size_t(n * row_bytes)), scales(size_t(n * groups));
    quantize_fp4_groups(wf.data(), n, k, group, packed.data(), scales.data());
    const int64_t panels = (n + kPanelCols - 1) / kPanelCols;
    std::vector<uint8_t> codes(size_t(panels * fp4_panel_bytes(k, false)));
    std::vector<float> group_scales(size_t(panels * groups * kPanelCols));
    pack_rows_fp4(packed.data(), scales.data(), group, k, 0, n, false, codes.data(), group_scales.data());
    std::vector<float> x(size_t(m * k)), xs(size_t(m * blocks));
    for (auto& v : x) v = e4m3_to_float(uint8_t(rng() % 0x7f) | uint8_t(rng() % 2 ? 0x80 : 0));
    for (auto& v : xs) v = 0.5f + float(rng() % 100) / 64.0f;
    std::vector<std::vector<float>> ys;
    for (const KernelTable* kt : f32_tables)
      ys.push_back(packed_fp4_call(*kt, x.data(), xs.data(), m, k, codes.data(), group_scales.data(), group, 0, n, n));
    for (size_t t = 1; t < ys.size(); ++t)
      EXPECT_EQ(std::memcmp(ys[0].data(), ys[t].data(), ys[0].size() * sizeof(float)), 0)
          << f32_tables[0]->isa << " and " << f32_tables[t]->isa << " differ, group " << group;
  }
}

TEST(CpuKernels, ConversionsMatchScalar) {
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0, 100);
  for (const KernelTable* kt : tables()) {
    for (DType dt : {DType::bf16, DType::f16}) {
      const int64_t n = 1000 + rng() % 37;
      std::vector<float> src(static_cast<size_t>(n));
      for (auto& v : src) v = nd(rng);
      src[3] = NAN;
      std::vector<uint16_t> h(static_cast<size_t>(n));
      kt->from_f32(src.data(), dt, h.data(), n);
      std::vector<float> back(static_cast<size_t>(n));
      kt->to_f32(h.data(), dt, back.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        if (i == 3) {
          EXPECT_TRUE(std::isnan(back[size_t(i)]));
          continue;
        }
        ASSERT_EQ(back[size_t(i)], round_to(dt, src[size_t(i)])) << kt->isa << " " << dtype_name(dt) << " at " << i;
      }
    }
  }
}

// The gated SiLU of every table against the f64 formula (≤ 4 ulp where the result is normal), the
// special values, and element i's result independent of the call's length (vector body vs tail).
TEST(CpuKernels, SiluMulMatchesTheF64Formula) {
  std::mt19937 rng(21);
  std::normal_distribution<float> nd(0, 6);
  const int64_t n = 1000 + 13;
  std::vector<float> g(static_cast<size_t>(n)), u(static_cast<size_t>(n));
  for (auto& v : g) v = nd(rng);
  for (auto& v : u) v = nd(rng);
  const float specials[] = {0.0f, -0.0f, 1e-30f, -1e-30f, 30.0f, -30.0f, 88.0f, -88.0f, 100.0f, -100.0f, 1e30f, -1e30f,
                            INFINITY, -INFINITY, NAN, 1e-40f};
  for (size_t i = 0; i < std::size(specials); ++i) g[i] = specials[i];
  for (const KernelTable* kt : tables()) {
    std::vector<float> out(static_cast<size_t>(n)), part(static_cast<size_t>(n));
    kt->silu_mul(g.data(), u.data(), out.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const double gd = g[size_t(i)], want = gd / (1.0 + std::exp(-gd)) * double(u[size_t(i)]);
      const float got = out[size_t(i)];
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got)) << kt->isa << " at " << i << " g " << g[size_t(i)];
      } else if (std::isinf(want)) {
        EXPECT_EQ(double(got), want) << kt->isa << " at " << i << " g " << g[size_t(i)];
      } else if (std::fabs(want) < 1e-37) {
        EXPECT_LE(std::fabs(double(got)), 1e-37) << kt->isa << " at " << i << " g " << g[size_t(i)];
      } else {
        EXPECT_LE(std::fabs(double(got) - want), 4 * std::fabs(want) * 0x1p-24) << kt->isa << " at " << i << " g " << g[size_t(i)];
      }
    }
    // the same elements in calls of 7 (a tail every time) and in place (out aliasing g)
    for (int64_t i = 0; i < n; i += 7) kt->silu_mul(g.data() + i, u.data() + i, part.data() + i, std::min<int64_t>(7, n - i));
    std::vector<float> inplace = g;
    kt->silu_mul(inplace.data(), u.data(), inplace.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      if (std::isnan(out[size_t(i)])) continue;
      ASSERT_EQ(part[size_t(i)], out[size_t(i)]) << kt->isa << " at " << i;
      ASSERT_EQ(inplace[size_t(i)], out[size_t(i)]) << kt->isa << " at " << i;
    }
  }
}

namespace {

// The packed form of a logical [n, k] weight matrix (row r = output column r): panels [k, 32].
std::vector<float> pack_panels(const std::vector<float>& w, int64_t n, int64_t k) {
  const int64_t panels = (n + kPanelCols - 1) / kPanelCols;
  std::vector<float> p(static_cast<size_t>(panels * k * kPanelCols), 0.0f);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t kk = 0; kk < k; ++kk) p[size_t(((r / kPanelCols) * k + kk) * kPanelCols + r % kPanelCols)] = w[size_t(r * k + kk)];
  return p;
}

// The packed bf16 form of a logical [n, k] bf16 weight matrix: panels [ceil(k / 2), 32, 2].
std::vector<uint16_t> pack_panels_bf16(const std::vector<uint16_t>& w, int64_t n, int64_t k) {
  const int64_t panels = (n + kPanelCols - 1) / kPanelCols, elems = packed_bf16_panel_elems(k);
  std::vector<uint16_t> p(static_cast<size_t>(panels * elems), 0);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t kk = 0; kk < k; ++kk)
      p[size_t((r / kPanelCols) * elems + ((kk / 2) * kPanelCols + r % kPanelCols) * 2 + kk % 2)] = w[size_t(r * k + kk)];
  return p;
}

// One packed micro-kernel under test: f32 (PackedMatmulArgs, every table) or bf16
// (PackedBf16MatmulArgs, the tables that have it), with its element type, packing and kernel.
// XElem: the activations' element type, Elem: the weights'.
struct PackedF32 {
  using Elem = float;
  using XElem = float;
  using Args = PackedMatmulArgs;
  static Elem from_float(float v) { return v; }
  static float to_float(Elem v) { return v; }
  static XElem x_from_float(float v) { return v; }
  static float x_to_float(XElem v) { return v; }
  static std::vector<Elem> pack(const std::vector<Elem>& w, int64_t n, int64_t k) { return pack_panels(w, n, k); }
  static auto kernel(const KernelTable& kt) { return kt.packed_matmul; }
};
struct PackedBf16 {
  using Elem = uint16_t;
  using XElem = uint16_t;
  using Args = PackedBf16MatmulArgs;
  static Elem from_float(float v) { return float_to_bf16(v); }
  static float to_float(Elem v) { return bf16_to_float(v); }
  static XElem x_from_float(float v) { return float_to_bf16(v); }
  static float x_to_float(XElem v) { return bf16_to_float(v); }
  static std::vector<Elem> pack(const std::vector<Elem>& w, int64_t n, int64_t k) { return pack_panels_bf16(w, n, k); }
  static auto kernel(const KernelTable& kt) { return kt.packed_matmul_bf16; }
};
// The same bf16 panels with f32 activations on FMAs (the AVX2 table).
struct PackedBf16Wide : PackedBf16 {
  using XElem = float;
  using Args = PackedBf16WideArgs;
  static XElem x_from_float(float v) { return v; }
  static float x_to_float(XElem v) { return v; }
  static auto kernel(const KernelTable& kt) { return kt.packed_matmul_bf16_wide; }
};

template <class P>
std::vector<const KernelTable*> tables_with() {
  std::vector<const KernelTable*> out;
  for (const KernelTable* kt : tables())
    if (P::kernel(*kt)) out.push_back(kt);
  return out;
}

template <class P>
void run_packed(const KernelTable& kt, const std::vector<typename P::XElem>& x, int64_t ldx, int64_t m, int64_t k,
                const std::vector<typename P::Elem>& panels, float* y, int64_t ldy, int64_t n0, int64_t n1) {
  typename P::Args a;
  a.x = x.data();
  a.ldx = ldx;
  a.m = m;
  a.k = k;
  a.panels = panels.data();
  a.y = y;
  a.ldy = ldy;
  a.n0 = n0;
  a.n1 = n1;
  P::kernel(kt)(a);
}

// m across every row-block split (1..30), n with partial last panels, k from 0 across the 256-k
// chunks of one row block and (the third draw) across the 2048-k chunks of several (odd k included:
// bf16's last pair has a zero partner); a column range starting on a panel;
// nothing outside it written; against an f64 loop over the same (rounded) inputs.
template <class P>
void packed_matches_loop(uint32_t seed, int iters) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  for (const KernelTable* kt : tables_with<P>()) {
    for (int iter = 0; iter < iters; ++iter) {
      const int64_t m = 1 + rng() % 30, n = 1 + rng() % 100, k = iter == 0 ? 0 : iter == 1 ? 1 : iter == 2 ? 2049 + rng() % 400 : 1 + rng() % 700;
      std::vector<typename P::XElem> x(static_cast<size_t>(m * k));
      std::vector<typename P::Elem> w(static_cast<size_t>(n * k));
      for (auto& v : x) v = P::x_from_float(nd(rng));
      for (auto& v : w) v = P::from_float(nd(rng));
      const auto panels = P::pack(w, n, k);
      const int64_t n0 = (rng() % n) / kPanelCols * kPanelCols, n1 = n0 + 1 + rng() % (n - n0);
      const int64_t ldy = n1 - n0 + 3;
      std::vector<float> y(static_cast<size_t>(m * ldy), -777.0f);
      run_packed<P>(*kt, x, k, m, k, panels, y.data(), ldy, n0, n1);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t c = 0; c < ldy; ++c) {
          const float got = y[size_t(i * ldy + c)];
          if (c >= n1 - n0) {
            ASSERT_EQ(got, -777.0f) << kt->isa << ": column past n1 - n0 was written";
            continue;
          }
          double ref = 0, mag = 0;
          for (int64_t kk = 0; kk < k; ++kk) {
            const double p = double(P::x_to_float(x[size_t(i * k + kk)])) * P::to_float(w[size_t((n0 + c) * k + kk)]);
            ref += p;
            mag += std::fabs(p);
          }
          ASSERT_NEAR(got, ref, 1e-5 * (1 + mag)) << kt->isa << " m" << m << " n" << n << " k" << k << " [" << n0 << ", " << n1 << ")";
        }
    }
  }
}

// Every output is one chain in k order, so a row computed alone, in a block of 13 rows or over a
// narrower column range is bit-identical (results independent of how the backends split work).
template <class P>
void packed_rows_do_not_depend_on_the_batch(uint32_t seed, int64_t k) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  const int64_t m = 13, n = 96;
  std::vector<typename P::XElem> x(static_cast<size_t>(m * k));
  std::vector<typename P::Elem> w(static_cast<size_t>(n * k));
  for (auto& v : x) v = P::x_from_float(nd(rng));
  for (auto& v : w) v = P::from_float(nd(rng));
  const auto panels = P::pack(w, n, k);
  for (const KernelTable* kt : tables_with<P>()) {
    std::vector<float> all(static_cast<size_t>(m * n));
    run_packed<P>(*kt, x, k, m, k, panels, all.data(), n, 0, n);
    for (int64_t i = 0; i < m; ++i) {
      const std::vector<typename P::XElem> row(x.begin() + i * k, x.begin() + (i + 1) * k);
      std::vector<float> one(static_cast<size_t>(n - 32));
      run_packed<P>(*kt, row, k, 1, k, panels, one.data(), n - 32, 32, n);
      for (int64_t c = 32; c < n; ++c) ASSERT_EQ(one[size_t(c - 32)], all[size_t(i * n + c)]) << kt->isa << " row " << i << " column " << c;
    }
    // two rows at a time (the AVX2 kernels' whole-panel blocks of one and two rows)
    for (int64_t i = 0; i + 1 < m; i += 2) {
      const std::vector<typename P::XElem> rows(x.begin() + i * k, x.begin() + (i + 2) * k);
      std::vector<float> two(static_cast<size_t>(2 * n));
      run_packed<P>(*kt, rows, k, 2, k, panels, two.data(), n, 0, n);
      for (int64_t r = 0; r < 2; ++r)
        for (int64_t c = 0; c < n; ++c)
          ASSERT_EQ(two[size_t(r * n + c)], all[size_t((i + r) * n + c)]) << kt->isa << " rows " << i << "+" << r << " column " << c;
    }
  }
}

}  // namespace

TEST(CpuKernels, PackedMatmulMatchesLoopOnEveryIsa) { packed_matches_loop<PackedF32>(23, 40); }

TEST(CpuKernels, PackedMatmulRowsDoNotDependOnTheBatch) {
  packed_rows_do_not_depend_on_the_batch<PackedF32>(29, 600);
  packed_rows_do_not_depend_on_the_batch<PackedF32>(29, 2300);
}

// The vdpbf16ps kernel on VNNI-pair panels (skipped where no table has it: AVX512_BF16 without AMX).
TEST(CpuKernels, PackedBf16MatmulMatchesLoop) {
  if (tables_with<PackedBf16>().empty()) GTEST_SKIP() << "no kernel table with the packed bf16 kernel on this CPU";
  packed_matches_loop<PackedBf16>(31, 60);
}

// The gated up projection in one pass against the path it replaces: the gate and up projections on the
// packed bf16 kernel (k in 2048-pair chunks there, whole here), silu_mul and from_f32 — bit for bit.
// m across the 1..6-row blocks and several panels' worth, odd k, partial last panels, a column range
// starting on a later panel, h columns outside it untouched; gates large enough to reach exp's clamps,
// and a NaN.
TEST(CpuKernels, PackedGatedBf16MatchesTwoProjectionsAndSiluBitForBit) {
  std::vector<const KernelTable*> with;
  for (const KernelTable* kt : tables())
    if (kt->packed_gated_bf16) with.push_back(kt);
  if (with.empty()) GTEST_SKIP() << "no kernel table with the gated bf16 kernel on this CPU";
  std::mt19937 rng(41);
  std::normal_distribution<float> nd;
  for (const KernelTable* kt : with)
    for (int iter = 0; iter < 30; ++iter) {
      const int64_t m = 1 + rng() % 20, I = 1 + rng() % 130, k = iter == 0 ? 1 : iter == 1 ? 4097 + rng() % 200 : 1 + rng() % 600;
      const float gscale = iter % 5 == 4 ? 60.0f : 1.0f;  // |g| up to ~100s: exp's clamps
      std::vector<uint16_t> x(size_t(m * k)), w(size_t(2 * I * k));
      for (auto& v : x) v = float_to_bf16(nd(rng));
      for (auto& v : w) v = float_to_bf16(nd(rng) * gscale / std::sqrt(float(k)));
      if (iter == 7) x[size_t(k / 2)] = 0x7fc0;  // a NaN in row 0
      std::vector<uint16_t> gate(w.begin(), w.begin() + I * k), up(w.begin() + I * k, w.end());
      const auto gp = pack_panels_bf16(gate, I, k), upp = pack_panels_bf16(up, I, k);
      const int64_t n0 = (rng() % I) / kPanelCols * kPanelCols, n1 = n0 + 1 + rng() % (I - n0), wd = n1 - n0;
      // the path it replaces
      std::vector<float> g(size_t(m * wd)), u(size_t(m * wd)), hf(size_t(m * wd));
      run_packed<PackedBf16>(*kt, x, k, m, k, gp, g.data(), wd, n0, n1);
      run_packed<PackedBf16>(*kt, x, k, m, k, upp, u.data(), wd, n0, n1);
      std::vector<uint16_t> want(size_t(m * wd));
      for (int64_t i = 0; i < m; ++i) {
        kt->silu_mul(g.data() + i * wd, u.data() + i * wd, hf.data() + i * wd, wd);
        kt->from_f32(hf.data() + i * wd, DType::bf16, want.data() + i * wd, wd);
      }
      // the gated kernel into h rows wider than the range (ldh = I + 5), poisoned
      const int64_t ldh = I + 5;
      std::vector<uint16_t> h(size_t(m * ldh), 0xdead);
      PackedBf16GatedArgs a;
      a.x = x.data();
      a.ldx = k;
      a.m = m;
      a.k = k;
      a.gate_panels = gp.data();
      a.up_panels = upp.data();
      a.h = h.data() + n0;
      a.ldh = ldh;
      a.n0 = n0;
      a.n1 = n1;
      kt->packed_gated_bf16(a);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t c = 0; c < ldh; ++c) {
          const uint16_t got = h[size_t(i * ldh + c)];
          if (c < n0 || c >= n1) {
            ASSERT_EQ(got, 0xdead) << kt->isa << ": h column " << c << " outside [" << n0 << ", " << n1 << ") was written";
            continue;
          }
          ASSERT_EQ(got, want[size_t(i * wd + c - n0)]) << kt->isa << " m" << m << " I" << I << " k" << k << " row " << i << " column " << c;
        }
    }
}

TEST(CpuKernels, PackedBf16MatmulRowsDoNotDependOnTheBatch) {
  if (tables_with<PackedBf16>().empty()) GTEST_SKIP() << "no kernel table with the packed bf16 kernel on this CPU";
  packed_rows_do_not_depend_on_the_batch<PackedBf16>(37, 601);
  packed_rows_do_not_depend_on_the_batch<PackedBf16>(37, 2301);
}

// bf16 panels with f32 activations on FMAs (AVX2): against the f64 loop, rows independent of the batch,
// and bit for bit the f32 packed kernel of the same table on the weights widened to f32 (the same FMA
// chain in k order) — m across every row block (1..30), odd k, chunks of one and of several row blocks.
TEST(CpuKernels, PackedBf16WideMatchesLoopAndTheF32KernelBitForBit) {
  if (tables_with<PackedBf16Wide>().empty()) GTEST_SKIP() << "no kernel table with the bf16-panel f32 kernel on this CPU";
  packed_matches_loop<PackedBf16Wide>(43, 60);
  packed_rows_do_not_depend_on_the_batch<PackedBf16Wide>(47, 601);
  packed_rows_do_not_depend_on_the_batch<PackedBf16Wide>(47, 2301);
  std::mt19937 rng(53);
  std::normal_distribution<float> nd;
  for (const KernelTable* kt : tables_with<PackedBf16Wide>())
    for (int iter = 0; iter < 40; ++iter) {
      const int64_t m = 1 + rng() % 30, n = 1 + rng() % 100;
      const int64_t k = iter == 0 ? 1 : iter == 1 ? 2049 + rng() % 400 : iter == 2 ? 4097 : 1 + rng() % 700;
      std::vector<float> x(size_t(m * k)), wf(size_t(n * k));
      std::vector<uint16_t> w(size_t(n * k));
      for (auto& v : x) v = nd(rng);
      if (iter == 5) x[0] = std::numeric_limits<float>::infinity();  // an inf in row 0: no 0 · inf from padding
      for (size_t i = 0; i < w.size(); ++i) {
        w[i] = float_to_bf16(nd(rng));
        wf[i] = bf16_to_float(w[i]);
      }
      const int64_t n0 = (rng() % n) / kPanelCols * kPanelCols, n1 = n0 + 1 + rng() % (n - n0), wd = n1 - n0;
      std::vector<float> want(size_t(m * wd)), got(size_t(m * wd), -777.0f);
      run_packed<PackedF32>(*kt, x, k, m, k, pack_panels(wf, n, k), want.data(), wd, n0, n1);
      run_packed<PackedBf16Wide>(*kt, x, k, m, k, pack_panels_bf16(w, n, k), got.data(), wd, n0, n1);
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_EQ(std::memcmp(&got[i], &want[i], 4), 0) << kt->isa << " m" << m << " n" << n << " k" << k << " at " << i << ": "
                                                        << got[i] << " vs " << want[i];
    }
}

namespace {

// A small f32 MoE (E 4, H 96, I 80, K 2) with random weights, tokens and routing, run through
// grouped_mm on 2 threads with any weight buffers of its shape (the packed-weights tests).
struct SmallF32Moe {
  static constexpr int64_t E = 4, H = 96, I = 80, K = 2;
  int64_t T;
  ExpertsSpec spec;
  std::mt19937 rng;
  std::normal_distribution<float> nd{0.0f, 0.05f};
  std::vector<float> gate_up, down, hidden;
  std::vector<int32_t> index;
  std::vector<float> weights;

  SmallF32Moe(uint32_t seed, int64_t tokens) : T(tokens), rng(seed) {
    spec.num_experts = E;
    spec.hidden = H;
    spec.intermediate = I;
    spec.dtype = DType::f32;
    gate_up = random(E * 2 * I * H);
    down = random(E * H * I);
    hidden = random(T * H);
    index.resize(static_cast<size_t>(T * K));
    weights.assign(static_cast<size_t>(T * K), 0.5f);
    for (auto& i : index) i = int32_t(rng() % E);
  }
  std::vector<float> random(int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& f : v) f = nd(rng);
    return v;
  }
  Experts experts(std::vector<float>& gu, std::vector<float>& dn) const {
    return Experts{spec, TensorView(gu.data(), DType::f32, {E, 2 * I, H}), TensorView(dn.data(), DType::f32, {E, H, I}), {}, {}, {}, {}};
  }
  std::vector<float> forward(std::vector<float>& gu, std::vector<float>& dn) {
    std::vector<float> out(static_cast<size_t>(T * H));
    ExpertsCall call{TensorView(hidden.data(), DType::f32, {T, H}), TensorView(index.data(), DType::i32, {T, K}),
                     TensorView(weights.data(), DType::f32, {T, K}), TensorView(out.data(), DType::f32, {T, H})};
    RunOptions opts;
    opts.num_threads = 2;
    experts_forward("grouped_mm", experts(gu, dn), call, opts);
    return out;
  }
};

}  // namespace

TEST(CpuKernels, PackedWeightsFollowNewWeightsAtTheSameAddress) {
  // f32 experts are packed on first use and cached by address; new weights written into the same
  // buffers must be repacked, giving the same output as those weights in a fresh buffer.
  SmallF32Moe moe(31, 9);
  constexpr int64_t E = SmallF32Moe::E, H = SmallF32Moe::H, I = SmallF32Moe::I;
  release_packed_weights();  // the count below starts from this test's objects (other tests' packs dropped)
  const std::vector<float> first = moe.forward(moe.gate_up, moe.down);
  std::vector<float> gate_up2 = moe.random(E * 2 * I * H), down2 = moe.random(E * H * I);
  std::vector<float> gate_up_fresh = gate_up2, down_fresh = down2;
  std::copy(gate_up2.begin(), gate_up2.end(), moe.gate_up.begin());  // same address, new weights
  std::copy(down2.begin(), down2.end(), moe.down.begin());
  const std::vector<float> second = moe.forward(moe.gate_up, moe.down);
  const std::vector<float> fresh = moe.forward(gate_up_fresh, down_fresh);
  EXPECT_NE(first, second);
  EXPECT_EQ(second, fresh);
  // the f32 experts really ran packed (unless MOEX_CPU_PACK=0): two experts objects, 4 experts each
  // per expert: gate and up padded to 96 rows (I = 80) of H, down to 96 rows (H = 96) of I
  const size_t per_object = size_t(E) * size_t(2 * 96 * H + 96 * I) * sizeof(float);
  if (PackedWeights::of(moe.experts(moe.gate_up, moe.down))) EXPECT_EQ(PackedWeights::total_bytes(), 2 * per_object);
  release_packed_weights();
  EXPECT_EQ(PackedWeights::total_bytes(), 0u);
  EXPECT_EQ(moe.forward(moe.gate_up, moe.down), fresh);
}

namespace {

// grouped_mm over quantized experts E = 4, H = 256, I = 128 whose weights and scales are the views given
// (built per call by `views`, so that fresh buffers can be passed), on fixed random tokens: the two
// "new scales at the same address" tests below.
struct QuantExpertsRun {
  static constexpr int64_t E = 4, H = 256, I = 128, T = 9, K = 2;
  ExpertsSpec spec;
  std::vector<float> hidden, weights;
  std::vector<int32_t> index;
  QuantExpertsRun(QuantSpec q, std::mt19937& rng) : hidden(size_t(T * H)), weights(size_t(T * K), 0.5f), index(size_t(T * K)) {
    spec.num_experts = E;
    spec.hidden = H;
    spec.intermediate = I;
    spec.dtype = DType::f32;
    spec.quant = q;
    std::normal_distribution<float> nd(0.0f, 0.05f);
    for (auto& f : hidden) f = nd(rng);
    for (auto& i : index) i = int32_t(rng() % E);
  }
  std::vector<float> operator()(TensorView gu, TensorView dn, TensorView gu_scale, TensorView dn_scale) {
    const Experts ex{spec, gu, dn, {}, {}, gu_scale, dn_scale};
    std::vector<float> out(size_t(T * H));
    ExpertsCall call{TensorView(hidden.data(), DType::f32, {T, H}), TensorView(index.data(), DType::i32, {T, K}),
                     TensorView(weights.data(), DType::f32, {T, K}), TensorView(out.data(), DType::f32, {T, H})};
    RunOptions opts;
    opts.num_threads = 2;
    experts_forward("grouped_mm", ex, call, opts);
    return out;
  }
};

std::vector<float> normal_values(std::mt19937& rng, int64_t n) {
  std::normal_distribution<float> nd(0.0f, 0.05f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& f : v) f = nd(rng);
  return v;
}

}  // namespace

TEST(CpuKernels, PackedFp8ExpertsFollowNewScalesAtTheSameAddress) {
  // FP8 experts are packed with their block scales folded in; new scales written into the same scale
  // buffers (the codes unchanged) must be repacked, giving the output of those scales in fresh buffers.
  std::mt19937 rng(67);
  QuantExpertsRun run(QuantSpec::fp8_block(), rng);
  constexpr int64_t E = QuantExpertsRun::E, H = QuantExpertsRun::H, I = QuantExpertsRun::I;
  const std::vector<float> gu_f = normal_values(rng, E * 2 * I * H), dn_f = normal_values(rng, E * H * I);
  std::vector<uint8_t> gu(gu_f.size()), dn(dn_f.size());
  std::vector<float> gu_s(size_t(E * (2 * I / 128) * (H / 128))), dn_s(size_t(E * (H / 128) * (I / 128)));
  for (int64_t e = 0; e < E; ++e) {
    quantize_fp8_blocks(gu_f.data() + e * 2 * I * H, 2 * I, H, 128, 128, ScaleFormat::f32, gu.data() + e * 2 * I * H,
                        gu_s.data() + e * (2 * I / 128) * (H / 128));
    quantize_fp8_blocks(dn_f.data() + e * H * I, H, I, 128, 128, ScaleFormat::f32, dn.data() + e * H * I,
                        dn_s.data() + e * (H / 128) * (I / 128));
  }
  auto forward = [&](std::vector<uint8_t>& g, std::vector<float>& gs, std::vector<uint8_t>& d, std::vector<float>& ds) {
    return run(TensorView(g.data(), DType::fp8_e4m3, {E, 2 * I, H}), TensorView(d.data(), DType::fp8_e4m3, {E, H, I}),
               TensorView(gs.data(), DType::f32, {E, 2 * I / 128, H / 128}), TensorView(ds.data(), DType::f32, {E, H / 128, I / 128}));
  };
  release_packed_weights();
  const std::vector<float> first = forward(gu, gu_s, dn, dn_s);
  for (auto& v : gu_s) v *= 1.5f;  // same address, new scales
  for (auto& v : dn_s) v *= 0.75f;
  const std::vector<float> second = forward(gu, gu_s, dn, dn_s);
  std::vector<uint8_t> gu2 = gu, dn2 = dn;
  std::vector<float> gu_s2 = gu_s, dn_s2 = dn_s;
  const std::vector<float> fresh = forward(gu2, gu_s2, dn2, dn_s2);
  EXPECT_NE(first, second);
  EXPECT_EQ(second, fresh);
  release_packed_weights();
}

TEST(CpuKernels, PackedFp4ExpertsFollowNewScalesAtTheSameAddress) {
  // The same for FP4 experts (their group scales packed as f32 beside the codes): scale bytes raised
  // by one (× 2) in place must be repacked.
  constexpr int64_t G = 32;
  std::mt19937 rng(73);
  QuantExpertsRun run(QuantSpec::fp4_group(G), rng);
  constexpr int64_t E = QuantExpertsRun::E, H = QuantExpertsRun::H, I = QuantExpertsRun::I;
  const std::vector<float> gu_f = normal_values(rng, E * 2 * I * H), dn_f = normal_values(rng, E * H * I);
  std::vector<uint8_t> gu(size_t(E * 2 * I * H / 2)), dn(size_t(E * H * I / 2)), gu_s(size_t(E * 2 * I * H / G)), dn_s(size_t(E * H * I / G));
  quantize_fp4_groups(gu_f.data(), E * 2 * I, H, G, gu.data(), gu_s.data());
  quantize_fp4_groups(dn_f.data(), E * H, I, G, dn.data(), dn_s.data());
  auto forward = [&](std::vector<uint8_t>& g, std::vector<uint8_t>& gs, std::vector<uint8_t>& d, std::vector<uint8_t>& ds) {
    return run(TensorView(g.data(), DType::u8, {E, 2 * I, H / 2}), TensorView(d.data(), DType::u8, {E, H, I / 2}),
               TensorView(gs.data(), DType::u8, {E, 2 * I, H / G}), TensorView(ds.data(), DType::u8, {E, H, I / G}));
  };
  release_packed_weights();
  const std::vector<float> first = forward(gu, gu_s, dn, dn_s);
  for (auto& v : gu_s) v = uint8_t(v + 1);  // same address, scales × 2
  for (auto& v : dn_s) v = uint8_t(v + 1);
  const std::vector<float> second = forward(gu, gu_s, dn, dn_s);
  std::vector<uint8_t> gu2 = gu, dn2 = dn, gu_s2 = gu_s, dn_s2 = dn_s;
  const std::vector<float> fresh = forward(gu2, gu_s2, dn2, dn_s2);
  EXPECT_NE(first, second);
  EXPECT_EQ(second, fresh);
  EXPECT_GT(PackedWeights::total_bytes(), 0u) << "the FP4 experts were packed";
  release_packed_weights();
}

TEST(CpuKernels, PackedWeightsNoticeNewWeightsThatAgreeAtTheSampledElements) {
  // New weights in the same buffers that equal the old ones at every element the fingerprint
  // starts from (here: zero there, as sparse weights often are) must still be repacked: the
  // fingerprint reads 64 bytes from each of its places, not one element.
  SmallF32Moe moe(43, 9);
  constexpr int64_t E = SmallF32Moe::E, H = SmallF32Moe::H, I = SmallF32Moe::I;
  std::fill(moe.gate_up.begin(), moe.gate_up.end(), 0.0f);
  std::fill(moe.down.begin(), moe.down.end(), 0.0f);
  release_packed_weights();
  const std::vector<float> first = moe.forward(moe.gate_up, moe.down);
  // dense new weights, zero at the 16 sampled elements of every expert matrix (fingerprint())
  auto refill = [&](std::vector<float>& w, int64_t n_per_expert) {
    w = moe.random(E * n_per_expert);
    for (int64_t e = 0; e < E; ++e)
      for (int64_t s = 0; s < 16; ++s) w[size_t(e * n_per_expert + (n_per_expert - 1) * s / 15)] = 0.0f;
  };
  std::vector<float> gate_up2, down2;
  refill(gate_up2, 2 * I * H);
  refill(down2, H * I);
  std::vector<float> gate_up_fresh = gate_up2, down_fresh = down2;
  std::copy(gate_up2.begin(), gate_up2.end(), moe.gate_up.begin());  // same address, new weights
  std::copy(down2.begin(), down2.end(), moe.down.begin());
  const std::vector<float> second = moe.forward(moe.gate_up, moe.down);
  const std::vector<float> fresh = moe.forward(gate_up_fresh, down_fresh);
  EXPECT_NE(first, fresh);  // (the new weights do change the output)
  EXPECT_EQ(second, fresh);
  release_packed_weights();
}

TEST(CpuKernels, PackedWeightsStayWithinTheirBudget) {
  // MOEX_CPU_PACK_MAX_MB bounds all packed copies together: an experts object whose copy would not
  // fit is read in place (PackedWeights::of gives nullptr) and still gives the same result within
  // the kernels' rounding; one that fits is packed.
  SmallF32Moe moe(41, 5);
  const Experts ex = moe.experts(moe.gate_up, moe.down);
  const char* prev = std::getenv("MOEX_CPU_PACK_MAX_MB");
  const std::string saved = prev ? prev : "";
  release_packed_weights();
  setenv("MOEX_CPU_PACK_MAX_MB", "0", 1);
  EXPECT_EQ(PackedWeights::of(ex), nullptr) << "a copy over the budget was made";
  const std::vector<float> in_place = moe.forward(moe.gate_up, moe.down);
  EXPECT_EQ(PackedWeights::total_bytes(), 0u);
  setenv("MOEX_CPU_PACK_MAX_MB", "64", 1);
  const bool packs = PackedWeights::of(ex) != nullptr;  // (false under MOEX_CPU_PACK=0)
  const std::vector<float> packed = moe.forward(moe.gate_up, moe.down);
  if (packs) EXPECT_GT(PackedWeights::total_bytes(), 0u);
  if (prev) setenv("MOEX_CPU_PACK_MAX_MB", saved.c_str(), 1);
  else unsetenv("MOEX_CPU_PACK_MAX_MB");
  release_packed_weights();
  double err = 0, ref = 0;
  for (size_t i = 0; i < packed.size(); ++i) {
    err += (packed[i] - in_place[i]) * double(packed[i] - in_place[i]);
    ref += double(in_place[i]) * in_place[i];
  }
  EXPECT_LE(std::sqrt(err / ref), 1e-5);
}

// The benchmark's peak probes: present where the table's kernels use the instruction, and counting
// the flops of what they ran (FMA: 2 per lane; vdpbf16ps: 2 products and sums per bf16 pair = 64 per
// 512-bit instruction, 12 chains).
// Host buffers: 64-byte aligned at every size; those of whole 2 MiB pages (within 1/8) 2 MiB aligned
// for transparent huge pages (Linux, unless MOEX_CPU_HUGE_PAGES=0); every byte writable, freed with free.
TEST(HostMemory, AlignmentAndHugePageRule) {
  const char* off = std::getenv("MOEX_CPU_HUGE_PAGES");
  const bool huge = !(off && std::string(off) == "0");
  constexpr size_t kMiB = size_t(1) << 20;
  for (size_t bytes : {size_t(0), size_t(1), size_t(4096), 2 * kMiB - 1, 2 * kMiB, 3 * kMiB, 6 * kMiB + 64, 17 * kMiB + 5}) {
    void* p = moex::detail::host_alloc(bytes);
    ASSERT_NE(p, nullptr) << bytes;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u) << bytes;
    const size_t whole = (bytes + 2 * kMiB - 1) / (2 * kMiB) * (2 * kMiB);
    const bool expect_huge = huge && bytes >= 2 * kMiB && (whole - bytes) * 8 <= bytes;
#if defined(__linux__)
    if (expect_huge) EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % (2 * kMiB), 0u) << bytes;
#else
    (void)expect_huge;
#endif
    if (bytes) {
      std::memset(p, 0x5a, bytes);
      EXPECT_EQ(static_cast<unsigned char*>(p)[bytes - 1], 0x5a);
    }
    std::free(p);
  }
  EXPECT_EQ(moex::detail::host_alloc(SIZE_MAX), nullptr) << "a size whose rounding wraps is out of memory, not a small block";
  EXPECT_EQ(moex::detail::host_alloc(SIZE_MAX - 100), nullptr);
}

TEST(CpuKernels, PeakProbesCountTheirFlops) {
  for (const KernelTable* kt : tables()) {
    SCOPED_TRACE(kt->isa);
    ASSERT_NE(kt->fma_probe, nullptr);
    EXPECT_GT(kt->fma_probe(1000), 0.0);
    EXPECT_EQ(kt->bf16_dot_probe != nullptr, kt->bf16_dot) << "a vdpbf16ps probe exactly where the bf16 dot kernels are";
    if (kt->bf16_dot_probe) EXPECT_DOUBLE_EQ(kt->bf16_dot_probe(1000), 64.0 * 1000 * 12);
  }
}
