// quant/formats.cpp — FP8 e4m3, UE8M0 and FP4 e2m1 conversions and the block quantizers.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/check.hpp"
#include "moex/quant.hpp"

namespace moex {

namespace {

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Rounds |a| (finite, >= 0) to a binary format with `man` mantissa bits and minimum normal
// exponent `emin` (subnormals below it), nearest even. Returns the rounded value as a float
// (exact: every such value is representable in f32).
float round_format(float a, int man, int emin) {
  if (a == 0.0f) return 0.0f;
  int e;
  std::frexp(a, &e);  // a = m · 2^e, m in [0.5, 1)
  e = std::max(e - 1, emin);
  const float quantum = std::ldexp(1.0f, e - man);
  return std::nearbyint(a / quantum) * quantum;  // a / quantum is exact (power of two); nearbyint: ties to even
}

}  // namespace

float e4m3_to_float(uint8_t v) {
  const uint32_t sign = v >> 7, exp = (v >> 3) & 0xf, man = v & 7;
  if (exp == 15 && man == 7) return std::numeric_limits<float>::quiet_NaN();
  float mag = exp == 0 ? std::ldexp(float(man), -9) : std::ldexp(float(8 + man), int(exp) - 10);
  return sign ? -mag : mag;
}

uint8_t float_to_e4m3(float f) {
  const uint32_t u = bits_of(f);
  const uint8_t sign = (u >> 24) & 0x80;
  const uint32_t a = u & 0x7fffffffu;
  // fast path, the normal range [2^-6, 448]: round the 23-bit mantissa to 3 bits (nearest even) in
  // integer arithmetic; a carry moves into the exponent by itself
  if (a >= 0x3c800000u && a <= 0x43e00000u) {
    const uint32_t r = a + 0x7ffffu + ((a >> 20) & 1u);
    const uint32_t e = (r >> 23) - 120, man = (r >> 20) & 7;
    if (e > 15 || (e == 15 && man == 7)) return uint8_t(sign | 0x7f);
    return uint8_t(sign | (e << 3) | man);
  }
  if (std::isnan(f)) return uint8_t(sign | 0x7f);
  const float af = std::fabs(f);
  const float r = std::isinf(af) ? INFINITY : round_format(af, 3, -6);
  if (r > kE4m3Max) return uint8_t(sign | 0x7f);  // no infinity in e4m3: NaN
  if (r == 0.0f) return sign;
  int e;
  std::frexp(r, &e);
  e -= 1;
  if (e < -6) return uint8_t(sign | uint8_t(r * 512.0f));  // subnormal: multiples of 2^-9
  const uint32_t man = uint32_t(std::ldexp(r, 3 - e)) - 8;  // r = (8 + man) · 2^(e-3)
  return uint8_t(sign | uint8_t((e + 7) << 3) | man);
}

uint8_t float_to_e4m3_sat(float f) {
  if (std::isnan(f)) return float_to_e4m3(f);
  return float_to_e4m3(std::clamp(f, -kE4m3Max, kE4m3Max));
}

float ue8m0_to_float(uint8_t b) {
  if (b == 255) return std::numeric_limits<float>::quiet_NaN();
  if (b == 0) return std::ldexp(1.0f, -127);  // 2^-127 (an f32 subnormal)
  uint32_t u = uint32_t(b) << 23;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint8_t float_to_ue8m0_ceil(float f) {
  MOEX_CHECK(f > 0.0f && std::isfinite(f), "UE8M0 scale of {} (must be positive and finite)", f);
  int e;
  const float m = std::frexp(f, &e);  // f = m · 2^e, m in [0.5, 1)
  int p = (m == 0.5f) ? e - 1 : e;    // smallest p with 2^p >= f
  p = std::clamp(p, -127, 127);
  return uint8_t(p + 127);
}

float e2m1_to_float(uint8_t nibble) {
  static const float kValues[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float mag = kValues[nibble & 7];
  return (nibble & 8) ? -mag : mag;
}

uint8_t float_to_e2m1(float f) {
  const uint8_t sign = (bits_of(f) >> 28) & 0x8;
  if (std::isnan(f)) return 0;  // no NaN in e2m1: quantizers never produce one from finite input
  const float a = std::min(std::fabs(f), kE2m1Max);
  const float r = round_format(a, 1, 0);  // normals from 2^0, subnormal 0.5
  static const float kValues[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  uint8_t code = 0;
  for (uint8_t c = 0; c < 8; ++c)
    if (kValues[c] == r) code = c;
  return uint8_t(sign | code);
}

void quantize_fp8_blocks(const float* w, int64_t rows, int64_t cols, int block_n, int block_k, ScaleFormat fmt, uint8_t* q,
                         void* scales) {
  MOEX_CHECK(block_n >= 1 && block_k >= 1, "FP8 block size {}x{} must be positive", block_n, block_k);
  const int64_t br = (rows + block_n - 1) / block_n, bc = (cols + block_k - 1) / block_k;
  for (int64_t bi = 0; bi < br; ++bi)
    for (int64_t bj = 0; bj < bc; ++bj) {
      const int64_t r0 = bi * block_n, r1 = std::min(rows, r0 + block_n), c0 = bj * block_k, c1 = std::min(cols, c0 + block_k);
      float amax = 0.0f;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(w[r * cols + c]));
      float scale;
      if (fmt == ScaleFormat::ue8m0) {
        const uint8_t b = amax > 0 ? float_to_ue8m0_ceil(amax / kE4m3Max) : uint8_t(127);
        static_cast<uint8_t*>(scales)[bi * bc + bj] = b;
        scale = ue8m0_to_float(b);
      } else {
        scale = amax > 0 ? amax / kE4m3Max : 1.0f;
        static_cast<float*>(scales)[bi * bc + bj] = scale;
      }
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) q[r * cols + c] = float_to_e4m3_sat(w[r * cols + c] / scale);
    }
}

void dequantize_fp8_blocks(const uint8_t* q, const void* scales, ScaleFormat fmt, int64_t rows, int64_t cols, int block_n,
                           int block_k, float* w) {
  const int64_t bc = (cols + block_k - 1) / block_k;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t s = (r / block_n) * bc + c / block_k;
      const float scale = fmt == ScaleFormat::ue8m0 ? ue8m0_to_float(static_cast<const uint8_t*>(scales)[s])
                                                    : static_cast<const float*>(scales)[s];
      w[r * cols + c] = e4m3_to_float(q[r * cols + c]) * scale;
    }
}

void quantize_fp4_groups(const float* w, int64_t rows, int64_t cols, int group, uint8_t* packed, uint8_t* scales) {
  MOEX_CHECK(group >= 1, "FP4 group size {} must be positive", group);
  const int64_t groups = (cols + group - 1) / group, row_bytes = (cols + 1) / 2;
  std::memset(packed, 0, size_t(rows * row_bytes));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t c0 = g * group, c1 = std::min(cols, c0 + group);
      float amax = 0.0f;
      for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(w[r * cols + c]));
      const uint8_t b = amax > 0 ? float_to_ue8m0_ceil(amax / kE2m1Max) : uint8_t(127);
      scales[r * groups + g] = b;
      const float scale = ue8m0_to_float(b);
      for (int64_t c = c0; c < c1; ++c) packed[r * row_bytes + c / 2] |= uint8_t(float_to_e2m1(w[r * cols + c] / scale) << ((c & 1) * 4));
    }
}

void dequantize_fp4_groups(const uint8_t* packed, const uint8_t* scales, int64_t rows, int64_t cols, int group, float* w) {
  const int64_t groups = (cols + group - 1) / group, row_bytes = (cols + 1) / 2;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      w[r * cols + c] = e2m1_to_float(fp4_nibble(packed + r * row_bytes, c)) * ue8m0_to_float(scales[r * groups + c / group]);
}

void quantize_activation_row(const float* x, int64_t n, int group, uint8_t* q, float* scales) {
  for (int64_t g = 0; g * group < n; ++g) {
    const int64_t c0 = g * group, c1 = std::min(n, c0 + group);
    float amax = 0.0f;
    for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(x[c]));
    const float scale = amax > 0 && std::isfinite(amax) ? amax / kE4m3Max : 1.0f;
    scales[g] = scale;
    for (int64_t c = c0; c < c1; ++c) q[c] = float_to_e4m3_sat(x[c] / scale);
  }
}

}  // namespace moex
