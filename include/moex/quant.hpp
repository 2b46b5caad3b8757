// moex/quant.hpp — the number formats of quantized experts (SPEC §6), exact to the bit:
//   e4m3 (FP8, "e4m3fn"): 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities; finite max 448;
//        S.1111.111 is NaN. Rounding from f32 is to nearest even; a value that rounds past 448 is NaN
//        (as the reference library's cast does); `float_to_e4m3_sat` clamps to ±448 instead.
//   ue8m0: an unsigned power-of-two scale 2^(b − 127), b = 0..254; 255 is NaN.
//   e2m1 (FP4): 1 sign, 2 exponent (bias 1), 1 mantissa bit: ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}; no NaN or
//        infinity, values past 6 saturate; packed two per byte, the lower nibble first.
// and the block quantizers built on them.
#pragma once
#include <cstdint>

#include "moex/experts.hpp"

namespace moex {

float e4m3_to_float(uint8_t v);
uint8_t float_to_e4m3(float f);
uint8_t float_to_e4m3_sat(float f);
constexpr float kE4m3Max = 448.0f;

float ue8m0_to_float(uint8_t b);
// The smallest power of two >= f (f > 0 and finite), as UE8M0 (so that x / scale never overflows).
uint8_t float_to_ue8m0_ceil(float f);

float e2m1_to_float(uint8_t nibble);  // the low 4 bits
uint8_t float_to_e2m1(float f);       // a nibble
constexpr float kE2m1Max = 6.0f;
// Element i of a packed FP4 row.
inline uint8_t fp4_nibble(const uint8_t* packed, int64_t i) { return (packed[i >> 1] >> ((i & 1) * 4)) & 0xf; }

// FP8 block quantization of one [rows, cols] f32 matrix (row-major): one scale per block_n × block_k
// block, scale = amax / 448 (f32 format) or the next power of two of it (UE8M0), q = e4m3(w / scale).
//   q:      [rows, cols] e4m3 codes
//   scales: [ceil(rows / block_n), ceil(cols / block_k)] f32 or u8 (UE8M0)
// An all-zero block gets scale 1 (f32) / 2^0 (UE8M0).
void quantize_fp8_blocks(const float* w, int64_t rows, int64_t cols, int block_n, int block_k, ScaleFormat fmt, uint8_t* q,
                         void* scales);
// w[r, c] = e4m3(q[r, c]) · scale[r / block_n, c / block_k]
void dequantize_fp8_blocks(const uint8_t* q, const void* scales, ScaleFormat fmt, int64_t rows, int64_t cols, int block_n,
                           int block_k, float* w);

// FP4 group quantization (1 × group along a row): scale = UE8M0 ceil(amax / 6), q = e2m1(w / scale).
//   packed: [rows, ceil(cols / 2)] bytes; scales: [rows, ceil(cols / group)] UE8M0
void quantize_fp4_groups(const float* w, int64_t rows, int64_t cols, int group, uint8_t* packed, uint8_t* scales);
void dequantize_fp4_groups(const uint8_t* packed, const uint8_t* scales, int64_t rows, int64_t cols, int group, float* w);

// Dynamic activation quantization of one token row (per 128 channels; SPEC §6): for each group of
// `group` channels scale = amax / 448 (1 when amax is 0), q = e4m3(x / scale). scales: [ceil(n / group)].
void quantize_activation_row(const float* x, int64_t n, int group, uint8_t* q, float* scales);

}  // namespace moex
