// core/dtype.cpp — dtype names, sizes and the f16 conversions.
#include "moex/dtype.hpp"

#include <cmath>
#include <string>

#include "core/check.hpp"

namespace moex {

size_t dtype_size(DType dt) {
  switch (dt) {
    case DType::f64: case DType::i64: return 8;
    case DType::f32: case DType::i32: return 4;
    case DType::f16: case DType::bf16: return 2;
    case DType::u8: case DType::i8: case DType::fp8_e4m3: case DType::ue8m0: case DType::fp4_e2m1x2: return 1;
  }
  return 1;
}

std::string_view dtype_name(DType dt) {
  switch (dt) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::f64: return "f64";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::u8: return "u8";
    case DType::i8: return "i8";
    case DType::fp8_e4m3: return "fp8_e4m3";
    case DType::ue8m0: return "ue8m0";
    case DType::fp4_e2m1x2: return "fp4_e2m1x2";
  }
  return "?";
}

DType parse_dtype(std::string_view s) {
  if (s == "f32" || s == "float32" || s == "float" || s == "fp32") return DType::f32;
  if (s == "f16" || s == "float16" || s == "half" || s == "fp16") return DType::f16;
  if (s == "bf16" || s == "bfloat16") return DType::bf16;
  if (s == "f64" || s == "float64" || s == "double") return DType::f64;
  if (s == "i32" || s == "int32") return DType::i32;
  if (s == "i64" || s == "int64") return DType::i64;
  if (s == "u8" || s == "uint8") return DType::u8;
  if (s == "i8" || s == "int8") return DType::i8;
  if (s == "fp8_e4m3" || s == "float8_e4m3fn" || s == "e4m3") return DType::fp8_e4m3;
  detail::fail(ErrorCode::invalid_argument, "unknown dtype '{}' (valid: f32, f16, bf16, f64, i32, i64, u8, i8, fp8_e4m3)", s);
}

// IEEE half: 1 sign, 5 exponent (bias 15), 10 mantissa bits.
float f16_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ff;
  uint32_t u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do { man <<= 1; ++e; } while ((man & 0x400) == 0);
      u = sign | (uint32_t(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (man << 13) | (man ? 0x400000u : 0);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t float_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint16_t sign = uint16_t((u >> 16) & 0x8000);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint16_t(sign | 0x7e00);  // NaN
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00);  // rounds to >= 65520: inf
  if (a < 0x38800000u) {                                 // below the smallest normal: subnormal or 0
    // value * 2^24 rounded to nearest even gives the subnormal mantissa
    float af;
    std::memcpy(&af, &a, 4);
    float scaled = af * 16777216.0f;  // exact (power of two)
    auto m = uint32_t(std::nearbyint(scaled));  // default rounding mode: nearest even
    return uint16_t(sign | m);
  }
  // normal: round the 23-bit mantissa to 10 bits, nearest even; carries propagate into the exponent
  uint32_t rounded = a + 0xfffu + ((a >> 13) & 1u);
  uint32_t exp = (rounded >> 23) - 127 + 15;
  uint32_t man = (rounded >> 13) & 0x3ff;
  return uint16_t(sign | (exp << 10) | man);
}

}  // namespace moex
