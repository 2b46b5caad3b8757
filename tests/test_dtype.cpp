// Conversions between f32 and f16/bf16: exhaustive over the 16-bit codes, round-to-nearest-even.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "moex/moex.hpp"

using namespace moex;

namespace {
uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// Reference: round an f32 to a format with `man` mantissa bits and exponent range by long double math.
double round_nearest_even(double x, int man_bits, int min_exp, double max_finite) {
  if (std::isnan(x) || x == 0) return x;
  const double a = std::fabs(x);
  int e;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  e -= 1;             // a in [2^e, 2^(e+1))
  if (e < min_exp) e = min_exp;  // subnormal range: fixed quantum
  const double quantum = std::ldexp(1.0, e - man_bits);
  double q = a / quantum;
  double r = std::nearbyint(q);  // ties to even
  double v = r * quantum;
  if (v > max_finite) {
    // beyond the largest finite value: infinity when at or past the halfway point to the next binade step
    const double half_step = std::ldexp(1.0, int(std::log2(max_finite)) - man_bits - 1);
    v = (a >= max_finite + half_step) ? INFINITY : max_finite;
  }
  return std::copysign(v, x);
}
}  // namespace

TEST(DType, F16DecodeAllCodesRoundTrip) {
  for (uint32_t c = 0; c < 65536; ++c) {
    const float f = f16_to_float(uint16_t(c));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(f))));
      continue;
    }
    EXPECT_EQ(float_to_f16(f), uint16_t(c)) << "code " << c;
  }
  EXPECT_EQ(f16_to_float(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_float(0x7bff), 65504.0f);
  EXPECT_EQ(f16_to_float(0x0001), std::ldexp(1.0f, -24));
}

TEST(DType, Bf16DecodeAllCodesRoundTrip) {
  for (uint32_t c = 0; c < 65536; ++c) {
    const float f = bf16_to_float(uint16_t(c));
    if (std::isnan(f)) continue;
    EXPECT_EQ(float_to_bf16(f), uint16_t(c)) << "code " << c;
  }
}

TEST(DType, RoundToNearestEvenAgainstReference) {
  std::mt19937 rng(42);
  for (int i = 0; i < 2000000; ++i) {
    // random bit patterns cover every exponent, including subnormals, overflow and ties
    float f = from_bits(uint32_t(rng()));
    if (i % 4 == 0) f = std::ldexp(float(int(rng() % 20000) - 10000) / 1024.0f, int(rng() % 40) - 30);  // many exact ties
    if (std::isnan(f)) continue;
    const double want16 = round_nearest_even(f, 10, -14, 65504.0);
    const float got16 = f16_to_float(float_to_f16(f));
    ASSERT_EQ(double(got16), want16) << "f16 of " << f << " bits " << std::hex << bits(f);
    const double want_b = round_nearest_even(f, 7, -126, 3.3895313892515355e38);
    const float got_b = bf16_to_float(float_to_bf16(f));
    ASSERT_EQ(double(got_b), want_b) << "bf16 of " << f << " bits " << std::hex << bits(f);
  }
}

TEST(DType, NaNStaysNaN) {
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(NAN))));
  EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(NAN))));
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(from_bits(0x7f800001)))));  // signalling NaN is not rounded to inf
}

TEST(DType, NamesAndParsing) {
  EXPECT_EQ(parse_dtype("bfloat16"), DType::bf16);
  EXPECT_EQ(parse_dtype("float32"), DType::f32);
  EXPECT_EQ(parse_dtype("half"), DType::f16);
  EXPECT_EQ(dtype_name(DType::bf16), "bf16");
  EXPECT_EQ(dtype_size(DType::i64), 8u);
  EXPECT_THROW(parse_dtype("float7"), Error);
}
