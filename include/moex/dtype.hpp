// moex/dtype.hpp — element types of tensors and the conversions between them.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace moex {

// Element types. f32/f16/bf16 are activation and weight types; i32/i64 are routing indices;
// the 8-bit types are there for quantized experts (fp8 e4m3 weights, UE8M0 scales, fp4 e2m1
// packed two per byte in a u8).
enum class DType : uint8_t { f32, f16, bf16, f64, i32, i64, u8, i8, fp8_e4m3, ue8m0, fp4_e2m1x2 };

// Bytes per element (fp4_e2m1x2 is one byte holding two values).
size_t dtype_size(DType dt);
// Short name: "f32", "bf16", ...
std::string_view dtype_name(DType dt);
// Parses "f32" / "float32" / "bf16" / "bfloat16" / "f16" / "float16" / "half" ...; throws moex::Error.
DType parse_dtype(std::string_view s);
inline bool is_float_activation(DType dt) { return dt == DType::f32 || dt == DType::f16 || dt == DType::bf16; }
inline bool is_index(DType dt) { return dt == DType::i32 || dt == DType::i64; }

// ---- scalar conversions (round to nearest even; NaN stays NaN) -------------------------------
inline float bf16_to_float(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
float f16_to_float(uint16_t h);
uint16_t float_to_f16(float f);

// Rounds an f32 value to the given activation dtype and back (identity for f32).
inline float round_to(DType dt, float v) {
  if (dt == DType::bf16) return bf16_to_float(float_to_bf16(v));
  if (dt == DType::f16) return f16_to_float(float_to_f16(v));
  return v;
}

}  // namespace moex
