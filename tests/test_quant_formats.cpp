// FP8 e4m3, UE8M0 and FP4 e2m1: exhaustive over all codes, and round-to-nearest-even from f32
// against a brute-force nearest-value search.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "moex/error.hpp"
#include "moex/quant.hpp"

using namespace moex;

namespace {

// Nearest finite value among `codes` (ties to the even code), or NaN when beyond max + half ulp.
template <class Decode>
int brute_nearest(float f, int ncodes, Decode decode) {
  int best = -1;
  double best_d = INFINITY;
  for (int c = 0; c < ncodes; ++c) {
    const float v = decode(uint8_t(c));
    if (std::isnan(v)) continue;
    const double d = std::fabs(double(v) - double(f));
    if (d < best_d || (d == best_d && (c % 2 == 0) && (best % 2 == 1))) {
      best = c;
      best_d = d;
    }
  }
  return best;
}

}  // namespace

TEST(QuantFormats, E4m3AllCodes) {
  int nan_codes = 0;
  for (int c = 0; c < 256; ++c) {
    const float v = e4m3_to_float(uint8_t(c));
    if (std::isnan(v)) {
      ++nan_codes;
      EXPECT_TRUE((c & 0x7f) == 0x7f) << c;
      continue;
    }
    if (c == 0x80) {
      EXPECT_EQ(v, 0.0f);
      continue;
    }  // -0
    EXPECT_EQ(float_to_e4m3(v), uint8_t(c)) << "code " << c << " value " << v;
  }
  EXPECT_EQ(nan_codes, 2);
  EXPECT_EQ(e4m3_to_float(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_float(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(e4m3_to_float(0x08), std::ldexp(1.0f, -6));
  EXPECT_EQ(e4m3_to_float(0xfe), -448.0f);
}

TEST(QuantFormats, E4m3RoundToNearestEven) {
  std::mt19937 rng(3);
  std::vector<float> probes;
  for (int c = 0; c < 126; ++c) {  // every midpoint between neighbours (ties) and points around them
    const float a = e4m3_to_float(uint8_t(c)), b = e4m3_to_float(uint8_t(c + 1));
    const float mid = 0.5f * (a + b);
    probes.insert(probes.end(), {a, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f), -mid});
  }
  for (int i = 0; i < 200000; ++i) probes.push_back(std::ldexp(std::uniform_real_distribution<float>(-1, 1)(rng), int(rng() % 24) - 14));
  for (float f : probes) {
    const float a = std::fabs(f);
    const uint8_t got = float_to_e4m3(f);
    if (a >= 464.0f) {  // past the midpoint of 448 and the (absent) 480: NaN
      if (a > 464.0f) {
        EXPECT_TRUE(std::isnan(e4m3_to_float(got))) << f;
      } else {
        EXPECT_EQ(e4m3_to_float(got), std::copysign(448.0f, f));  // the tie rounds to even 448
      }
      continue;
    }
    const int want = brute_nearest(a, 127, e4m3_to_float);
    ASSERT_EQ(e4m3_to_float(got), std::copysign(e4m3_to_float(uint8_t(want)), f)) << "f=" << f;
  }
  EXPECT_TRUE(std::isnan(e4m3_to_float(float_to_e4m3(NAN))));
  EXPECT_TRUE(std::isnan(e4m3_to_float(float_to_e4m3(1000.0f))));
  EXPECT_EQ(e4m3_to_float(float_to_e4m3_sat(1000.0f)), 448.0f);
  EXPECT_EQ(e4m3_to_float(float_to_e4m3_sat(-1e30f)), -448.0f);
  EXPECT_EQ(float_to_e4m3(-0.0f), 0x80);
}

TEST(QuantFormats, Ue8m0AllCodes) {
  for (int b = 0; b < 255; ++b) {
    const float v = ue8m0_to_float(uint8_t(b));
    EXPECT_EQ(v, std::ldexp(1.0f, b - 127)) << b;
    if (b >= 1) EXPECT_EQ(float_to_ue8m0_ceil(v), uint8_t(b));
  }
  EXPECT_TRUE(std::isnan(ue8m0_to_float(255)));
  EXPECT_EQ(float_to_ue8m0_ceil(3.0f), 129);   // 4
  EXPECT_EQ(float_to_ue8m0_ceil(0.3f), 126);   // 0.5
  EXPECT_THROW(float_to_ue8m0_ceil(0.0f), Error);
}

TEST(QuantFormats, E2m1AllCodesAndRounding) {
  const float values[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (int c = 0; c < 16; ++c) {
    const float v = e2m1_to_float(uint8_t(c));
    EXPECT_EQ(std::fabs(v), values[c & 7]);
    if (c != 8) EXPECT_EQ(float_to_e2m1(v), uint8_t(c)) << c;
  }
  // ties to even code: 0.25→0, 0.75→1.0, 1.25→1.0, 1.75→2, 2.5→2, 3.5→4, 5→4; saturation past 6
  const std::pair<float, float> cases[] = {{0.25f, 0}, {0.75f, 1}, {1.25f, 1}, {1.75f, 2}, {2.5f, 2}, {3.5f, 4},
                                           {5.0f, 4},  {5.1f, 6},  {7.0f, 6},  {100.f, 6}, {-2.6f, -3}};
  for (auto [in, want] : cases) EXPECT_EQ(e2m1_to_float(float_to_e2m1(in)), want) << in;
  std::mt19937 rng(4);
  for (int i = 0; i < 100000; ++i) {
    const float f = std::uniform_real_distribution<float>(-6, 6)(rng);
    const int want = brute_nearest(std::fabs(f), 8, e2m1_to_float);
    ASSERT_EQ(std::fabs(e2m1_to_float(float_to_e2m1(f))), values[want]) << f;
  }
}

TEST(QuantFormats, BlockQuantizersRoundTrip) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0, 0.02f);
  const int64_t rows = 300, cols = 200;  // partial blocks on both axes
  std::vector<float> w(static_cast<size_t>(rows * cols)), back(static_cast<size_t>(rows * cols));
  for (auto& v : w) v = nd(rng);
  for (ScaleFormat fmt : {ScaleFormat::f32, ScaleFormat::ue8m0}) {
    std::vector<uint8_t> q(w.size());
    std::vector<float> sf(3 * 2);
    std::vector<uint8_t> su(3 * 2);
    quantize_fp8_blocks(w.data(), rows, cols, 128, 128, fmt, q.data(), fmt == ScaleFormat::f32 ? (void*)sf.data() : (void*)su.data());
    dequantize_fp8_blocks(q.data(), fmt == ScaleFormat::f32 ? (void*)sf.data() : (void*)su.data(), fmt, rows, cols, 128, 128,
                          back.data());
    double e2 = 0, n2 = 0;
    for (size_t i = 0; i < w.size(); ++i) {
      e2 += double(w[i] - back[i]) * (w[i] - back[i]);
      n2 += double(w[i]) * w[i];
    }
    EXPECT_LT(std::sqrt(e2 / n2), 0.05) << (fmt == ScaleFormat::f32 ? "f32 scales" : "ue8m0 scales");  // 3 mantissa bits
  }
  std::vector<uint8_t> packed(static_cast<size_t>(rows * ((cols + 1) / 2))), scales(static_cast<size_t>(rows * ((cols + 31) / 32)));
  quantize_fp4_groups(w.data(), rows, cols, 32, packed.data(), scales.data());
  dequantize_fp4_groups(packed.data(), scales.data(), rows, cols, 32, back.data());
  double e2 = 0, n2 = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    e2 += double(w[i] - back[i]) * (w[i] - back[i]);
    n2 += double(w[i]) * w[i];
  }
  EXPECT_LT(std::sqrt(e2 / n2), 0.2);
  // low nibble first
  uint8_t two[1] = {0};
  two[0] = uint8_t(float_to_e2m1(1.0f) | (float_to_e2m1(-6.0f) << 4));
  EXPECT_EQ(e2m1_to_float(fp4_nibble(two, 0)), 1.0f);
  EXPECT_EQ(e2m1_to_float(fp4_nibble(two, 1)), -6.0f);
}

TEST(QuantFormats, ActivationRowScales) {
  std::vector<float> x(300);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(i % 17) - 8.0f;
  x[5] = 0;
  std::vector<uint8_t> q(300);
  std::vector<float> s(3);
  quantize_activation_row(x.data(), 300, 128, q.data(), s.data());
  EXPECT_FLOAT_EQ(s[0], 8.0f / 448.0f);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(e4m3_to_float(q[i]) * s[i / 128], x[i], std::fabs(x[i]) * 0.0625 + 1e-6);
  std::vector<float> zeros(10, 0.0f);
  quantize_activation_row(zeros.data(), 10, 128, q.data(), s.data());
  EXPECT_EQ(s[0], 1.0f);
}
