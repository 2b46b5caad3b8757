// backends/cpu/quant_math.hpp — FP8 block-scaled and FP4 experts on the CPU (SPEC §6): activations
// quantized dynamically (e4m3, one scale per token and 128 channels), products of the e4m3 codes
// summed in f32 per 128-wide k block, then scaled by activation scale × weight block scale. Weights
// are dequantized one 64×128 block at a time into a per-thread buffer: never a full copy.
#pragma once
#include <cstdint>

#include "backends/cpu/kernels.hpp"
#include "moex/experts.hpp"

namespace moex::cpu {

constexpr int64_t kActGroup = 128;        // channels per activation scale
constexpr int64_t kQuantScratch = 64 * 128 + 64 * 64;  // floats of per-thread scratch for quant_projection

// One quantized weight matrix of one expert, logically [N, K] (out × in).
struct QuantMatrix {
  QuantSpec quant;
  const uint8_t* data;   // fp8: [N, K] (or [K, N] when transposed) e4m3; fp4: [N, ceil(K/2)] packed
  const void* scales;    // fp8: [ceil(N/bn), ceil(K/bk)] f32 or UE8M0; fp4: [N, ceil(K/group)] UE8M0
  int64_t N, K;
  bool transposed;
};

// The scale of the FP8 weight block holding row n and k block kb of w (f32, or UE8M0 decoded).
float weight_block_scale(const QuantMatrix& w, int64_t n, int64_t kb);

// Replaces each row of x [m, k] (row stride k) by its e4m3 codes (as exact f32 values) and writes
// the row's scales [m, ceil(k/128)]: x ≈ codes · scale.
void quantize_rows(float* x, int64_t m, int64_t k, float* scales);

// y[0:m, n0:n1] = Σ_kb xs[:, kb] · ws[·, kb] · Σ_{k in kb} codes[:, k] · wq[n, k]   (f32)
// codes [m, K] and xs [m, ceil(K/128)] from quantize_rows; scratch: kQuantScratch floats.
void quant_matmul(const KernelTable& kt, const QuantMatrix& w, const float* codes, const float* xs, int64_t m, float* y,
                  int64_t ldy, int64_t n0, int64_t n1, float* scratch);

}  // namespace moex::cpu
