// backends/cpu/quant_math.cpp — see quant_math.hpp.
#include "backends/cpu/quant_math.hpp"

#include <algorithm>
#include <array>
#include <cmath>

#include "moex/quant.hpp"

namespace moex::cpu {

namespace {

const std::array<float, 256>& e4m3_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c) t[size_t(c)] = e4m3_to_float(uint8_t(c));
    return t;
  }();
  return table;
}

// dst[r, 0:kc] = weight values of rows n..n+nc, columns k0..k0+kc: e4m3 codes (fp8, the block
// scale is applied later) or e2m1 · group scale (fp4).
void dequant_block(const KernelTable& kt, const QuantMatrix& w, int64_t n, int64_t nc, int64_t k0, int64_t kc,
                   float* dst /* [nc, 128] */) {
  const auto& lut = e4m3_table();
  if (w.quant.kind == QuantKind::fp8_block) {
    for (int64_t r = 0; r < nc; ++r) {
      float* d = dst + r * 128;
      if (!w.transposed) {
        kt.e4m3_to_f32(w.data + (n + r) * w.K + k0, d, kc);
      } else {  // stored [K, N]
        for (int64_t c = 0; c < kc; ++c) d[c] = lut[w.data[(k0 + c) * w.N + n + r]];
      }
    }
  } else {
    // per group, the 16 e2m1 values times the group's scale (the same product as per element), then
    // two codes per byte (low nibble first) by table: ~14× faster than converting every nibble
    // (qwen3_30b_a3b FP4 T = 1: 144 → ~10 ms on the AMD EPYC VM, docs/PERF.md, thirty-sixth session)
    static const std::array<float, 16> e2m1 = [] {
      std::array<float, 16> t{};
      for (int v = 0; v < 16; ++v) t[size_t(v)] = e2m1_to_float(uint8_t(v));
      return t;
    }();
    const int64_t gk = w.quant.block_k, row_bytes = (w.K + 1) / 2, groups = (w.K + gk - 1) / gk;
    const uint8_t* sc = static_cast<const uint8_t*>(w.scales);
    for (int64_t r = 0; r < nc; ++r) {
      const uint8_t* src = w.data + (n + r) * row_bytes;
      float* d = dst + r * 128;
      for (int64_t c0 = 0; c0 < kc;) {  // k0 + c0 starts a group (k0 is a multiple of 128, groups divide 128)
        const int64_t c1 = std::min(kc, c0 + gk);
        const float s = ue8m0_to_float(sc[(n + r) * groups + (k0 + c0) / gk]);
        float value[16];
        for (int v = 0; v < 16; ++v) value[v] = e2m1[size_t(v)] * s;
        int64_t c = c0;
        if ((k0 + c) & 1) d[c] = value[fp4_nibble(src, k0 + c)], ++c;
        for (; c + 1 < c1; c += 2) {
          const uint8_t b = src[(k0 + c) >> 1];
          d[c] = value[b & 0xf];
          d[c + 1] = value[b >> 4];
        }
        if (c < c1) d[c] = value[fp4_nibble(src, k0 + c)];
        c0 = c1;
      }
    }
  }
}

}  // namespace

float weight_block_scale(const QuantMatrix& w, int64_t n, int64_t kb) {
  const int64_t bc = (w.K + w.quant.block_k - 1) / w.quant.block_k;
  const int64_t idx = (n / w.quant.block_n) * bc + kb;
  return w.quant.scale_format == ScaleFormat::ue8m0 ? ue8m0_to_float(static_cast<const uint8_t*>(w.scales)[idx])
                                                    : static_cast<const float*>(w.scales)[idx];
}

void quantize_rows(float* x, int64_t m, int64_t k, float* scales) {
  const int64_t groups = (k + kActGroup - 1) / kActGroup;
  const auto& lut = e4m3_table();
  std::array<uint8_t, kActGroup> q{};
  for (int64_t i = 0; i < m; ++i) {
    float* row = x + i * k;
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t c0 = g * kActGroup, n = std::min(kActGroup, k - c0);
      quantize_activation_row(row + c0, n, int(kActGroup), q.data(), scales + i * groups + g);
      for (int64_t c = 0; c < n; ++c) row[c0 + c] = lut[q[size_t(c)]];
    }
  }
}

void quant_matmul(const KernelTable& kt, const QuantMatrix& w, const float* codes, const float* xs, int64_t m, float* y,
                  int64_t ldy, int64_t n0, int64_t n1, float* scratch) {
  const int64_t K = w.K, blocks = (K + kActGroup - 1) / kActGroup;
  if (w.quant.kind == QuantKind::fp8_block && !w.transposed) {
    // the common case: e4m3 rows read as stored, converted in registers by the kernel
    Fp8MatmulArgs a;
    a.x = codes;
    a.ldx = K;
    a.xs = xs;
    a.m = m;
    a.k = K;
    a.w = w.data;
    a.ldw = K;
    a.ws = w.scales;
    a.ws_ue8m0 = w.quant.scale_format == ScaleFormat::ue8m0;
    a.block_n = w.quant.block_n;
    a.y = y;
    a.ldy = ldy;
    a.n0 = n0;
    a.n1 = n1;
    kt.fp8_matmul(a);
    return;
  }
  float* wbuf = scratch;                 // [64, 128]
  float* partial = scratch + 64 * 128;   // [64, 64]
  for (int64_t i = 0; i < m; ++i) std::fill(y + i * ldy + n0, y + i * ldy + n1, 0.0f);
  for (int64_t n = n0; n < n1; n += 64) {
    const int64_t nc = std::min<int64_t>(64, n1 - n);
    for (int64_t kb = 0; kb < blocks; ++kb) {
      const int64_t k0 = kb * kActGroup, kc = std::min(kActGroup, K - k0);
      dequant_block(kt, w, n, nc, k0, kc, wbuf);
      for (int64_t m0 = 0; m0 < m; m0 += 64) {
        const int64_t mc = std::min<int64_t>(64, m - m0);
        MatmulArgs a;
        a.x = codes + m0 * K + k0;
        a.ldx = K;
        a.m = mc;
        a.k = kc;
        a.w = wbuf;
        a.wdtype = DType::f32;
        a.layout = WeightLayout::nt;
        a.ldw = 128;
        a.y = partial;
        a.ldy = 64;
        a.n0 = 0;
        a.n1 = nc;
        kt.matmul(a);
        // the two-level accumulation: block partial sums × activation scale × weight block scale
        for (int64_t j = 0; j < nc; ++j) {
          const float ws = w.quant.kind == QuantKind::fp8_block ? weight_block_scale(w, n + j, kb) : 1.0f;
          for (int64_t i = 0; i < mc; ++i) y[(m0 + i) * ldy + n + j] += partial[i * 64 + j] * (xs[(m0 + i) * blocks + kb] * ws);
        }
      }
    }
  }
}

}  // namespace moex::cpu
