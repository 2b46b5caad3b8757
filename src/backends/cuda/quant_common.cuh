// backends/cuda/quant_common.cuh — FP8 block-scaled and FP4 experts on CUDA (SPEC §6): the weight
// descriptor, the number formats on the device and the launchers of quant_activation.cu,
// quant_gemv.cu and quant_grouped_gemm.cu.
//
// Numerics (the CPU's, backends/cpu/quant_math.cpp): activations x and h are quantized per token
// and 128 channels (scale = amax/448, 1 when amax is 0 or not finite; codes = e4m3(v / scale),
// saturating, nearest even); the products codes × weight values (e4m3 codes for FP8, e2m1 × 2^k
// group scale for FP4) are summed in f32 per 128-wide k block and scaled by activation scale ×
// weight block scale. Every such value is exact in bf16, so bf16 tensor-core products with f32
// accumulation per block compute the same sums.
#pragma once
#include <cuda_fp8.h>

#include "backends/cuda/cuda_common.cuh"

namespace moex::cuda {

constexpr int kQuantGroup = 128;  // activation channels per scale (= FP8 weight block_k)
constexpr int kQuantTileM = 64;   // rows per M tile of the quantized grouped GEMM (its routing plan)

// Activation scale groups of a row of n channels (host and device).
__host__ __device__ __forceinline__ int64_t quant_groups(int64_t n) { return (n + kQuantGroup - 1) / kQuantGroup; }

// One quantized projection of all experts, logically W_e [N, K] (out × in).
struct QuantWeights {
  const uint8_t* data;    // fp8: [E, N, K] e4m3 (transposed: [E, K, N]); fp4: [E, N, ceil(K/2)] packed, low nibble first
  const void* scales;     // fp8: [E, ceil(N/bn), ceil(K/128)] f32 or UE8M0; fp4: [E, N, ceil(K/group)] UE8M0
  int64_t data_stride;    // bytes per expert
  int64_t scale_stride;   // scale elements per expert
  bool fp4;
  bool ue8m0;             // fp8 scale format (fp4 scales are always UE8M0)
  bool transposed;        // fp8 only
  int block_n;            // fp8 rows per scale block
  int group;              // fp4 values per scale (divides 128)
  int64_t N, K;
};

// ---- formats (bit-exact with src/quant/formats.cpp) ----------------------------------------
__device__ __forceinline__ float e4m3_value(uint8_t c) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t(c), __NV_E4M3)));
}
// Two e4m3 codes (low byte first) as f32.
__device__ __forceinline__ float2 e4m3x2_value(uint16_t c2) {
  const __half2_raw r = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(c2), __NV_E4M3);
  return __half22float2(__half2(r));
}
// 16 e4m3 codes of a uint4 (low byte first) as f32.
__device__ __forceinline__ void decode16(const uint4& v, float* f) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const float2 lo = e4m3x2_value(uint16_t(w[q] & 0xffffu)), hi = e4m3x2_value(uint16_t(w[q] >> 16));
    f[4 * q] = lo.x;
    f[4 * q + 1] = lo.y;
    f[4 * q + 2] = hi.x;
    f[4 * q + 3] = hi.y;
  }
}
__device__ __forceinline__ uint8_t e4m3_code_sat(float v) {
  return uint8_t(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
}
// 2^(b−127); b = 0 is 2^-127 (an f32 subnormal), 255 is NaN.
__device__ __forceinline__ float ue8m0_value(uint8_t b) {
  if (b == 0) return __uint_as_float(0x00400000u);
  if (b == 255) return __uint_as_float(0x7fc00000u);
  return __uint_as_float(uint32_t(b) << 23);
}
// ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}: exponent bits e (bias 1), mantissa bit m; e = 0 is 0 or 0.5.
__device__ __forceinline__ float e2m1_value(uint32_t nibble) {
  const uint32_t code = nibble & 7u, e = code >> 1;
  const float mag = e ? __uint_as_float(((e + 126u) << 23) | ((code & 1u) << 22)) : (code ? 0.5f : 0.0f);
  return (nibble & 8u) ? -mag : mag;
}

// Weight block scale of FP8 element (n, k) of expert e.
__device__ __forceinline__ float fp8_block_scale(const QuantWeights& w, int64_t e, int64_t n, int64_t kb) {
  const int64_t bc = (w.K + kQuantGroup - 1) / kQuantGroup;
  const int64_t i = e * w.scale_stride + (n / w.block_n) * bc + kb;
  return w.ue8m0 ? ue8m0_value(static_cast<const uint8_t*>(w.scales)[i]) : static_cast<const float*>(w.scales)[i];
}
// The weight value that multiplies an activation code: the e4m3 code value (FP8; the block scale
// is applied per 128-k block) or e2m1 × its group scale (FP4).
__device__ __forceinline__ float weight_value(const QuantWeights& w, int64_t e, int64_t n, int64_t k) {
  if (!w.fp4) {
    const int64_t off = w.transposed ? k * w.N + n : n * w.K + k;
    return e4m3_value(w.data[e * w.data_stride + off]);
  }
  const int64_t row_bytes = (w.K + 1) / 2, groups = (w.K + w.group - 1) / w.group;
  const uint8_t byte = w.data[e * w.data_stride + n * row_bytes + (k >> 1)];
  const uint8_t sc = static_cast<const uint8_t*>(w.scales)[e * w.scale_stride + n * groups + k / w.group];
  return e2m1_value((byte >> ((k & 1) * 4)) & 0xf) * ue8m0_value(sc);
}
// The per-128-k-block factor of the weights: the FP8 block scale, 1 for FP4.
__device__ __forceinline__ float weight_block_factor(const QuantWeights& w, int64_t e, int64_t n, int64_t kb) {
  return w.fp4 ? 1.0f : fp8_block_scale(w, e, n, kb);
}

// ---- launchers ------------------------------------------------------------------------------
// Dynamic activation quantization of rows [0, rows) of x [rows, K] (activation dtype): codes
// [rows, K] e4m3 and scales [rows, ceil(K/128)] f32; with `values` also the dequantized values
// codes·scale as f32 [rows, K] (eager). valid_rows (device, nullable): only rows < *valid_rows.
void launch_quantize_activations(const void* x, DType dtype, int64_t rows, int64_t K, const int* valid_rows, uint8_t* codes,
                                 float* scales, float* values, cudaStream_t stream);
// Expert e of a quantized projection dequantized to f32 [N, K] row-major (eager).
void launch_dequantize_expert(const QuantWeights& w, int64_t e, float* out, cudaStream_t stream);

// batched_mm on quantized experts (quant_gemv.cu). xq/xs: the tokens quantized; h, hq/hs: workspace.
struct QuantBatchedArgs {
  BatchedArgs b;            // routing, biases, activation, sizes, out (b.gate_up / b.down unused)
  QuantWeights up, down;
  uint8_t* xq;              // [T, H] codes of the tokens (written by launch_quant_batched)
  float* xs;                // [T, ceil(H/128)]
  uint8_t* hq;              // [S, I] codes of h
  float* hs;                // [S, ceil(I/128)]
};
void launch_quant_batched(const QuantBatchedArgs& a, DType dtype, cudaStream_t stream);

// Grouped GEMM over per-expert row blocks on quantized experts (quant_grouped_gemm.cu):
// C[r, c] = Σ_kb xs[arow(r), kb] · wscale(w(c), kb) · Σ_{k in kb} codes[arow(r), k] · wv[w(c), k],
// then the epilogue of g.epi (g.A, g.W and g.w_transposed are not used).
struct QuantGemmArgs {
  GroupedGemmArgs g;        // gather, bias, Kdim, N, I, epilogue, out, plan (tile_m = kQuantTileM)
  QuantWeights w;
  const uint8_t* aq;        // [*, Kdim] activation codes
  const float* as;          // [*, ceil(Kdim/128)] activation scales
};
void launch_quant_grouped_gemm(const QuantGemmArgs& a, DType dtype, cudaStream_t stream);

// FP8 experts at decode / small batch (quant_decode.cu): each routed expert's weights read once
// for all its rows, three kernels per forward (plan + token quantization, up, down + combine).
// grouped_mm and batched_mm route FP8 here when quant_decode_shape_ok and quant_decode_usable.
constexpr int kDecodeMaxExperts = 2048;  // the plan is built in one block's shared memory
constexpr int64_t kDecodeMaxTokens = 64; // default bound on T (MOEX_CUDA_FP8_DECODE=1: any T, =0: never)
struct QuantDecodeArgs {
  const void* hidden;       // [T, H]
  const void* idx;          // [T, K]
  bool idx64;
  const void* topw;         // [T, K]
  int topw_code;
  QuantWeights up, down;    // FP8, [E, out, in]
  const void* up_bias;      // [E, R] or nullptr
  const void* down_bias;    // [E, H] or nullptr
  Epi up_epi;               // up_plain, up_concat or up_interleaved
  ActParams act;
  int64_t T, K, E, H, I;
  DType dtype;              // activation dtype
  void* ws;                 // workspace (quant_decode_workspace bytes)
  size_t ws_bytes;
  void* out;                // [T, H]
};
// Above this many pairs per expert (T·K > 6·E: mixtral_8x7b from T = 32) a caller with a tensor-core
// alternative (grouped_mm's TMA kernels on Hopper) takes it: the path's 32-row passes are bound by
// their instruction stream there (mixtral_8x7b T = 64, FP8 grouped_mm: 0.532 ms on this path, 0.468 on
// the TMA kernels, H200, 2026-12-02, docs/PERF.md), as deepgemm.cu's small_batch_route measured
// against its masked layout (ahead up to 4.3·E, behind from 8·E).
constexpr int64_t kDecodeMaxPairsPerExpert = 6;
inline bool decode_many_pairs(int64_t T, int64_t K, int64_t E) { return T * K > kDecodeMaxPairsPerExpert * E; }
// The layout/size/T conditions (host only, no pointers): FP8 128-k blocks, [E, out, in], H and
// I multiples of 16, E <= kDecodeMaxExperts, T <= kDecodeMaxTokens and, where the caller has a
// tensor-core alternative, T·K <= kDecodeMaxPairsPerExpert·E — unless MOEX_CUDA_FP8_DECODE forces
// the path on (1: any T) or off (0).
bool quant_decode_shape_ok(const ExpertsSpec& s, int64_t T, int64_t K, bool tensor_core_alternative = false);
size_t quant_decode_workspace(int64_t T, int64_t K, int64_t E, int64_t H, int64_t I, size_t esz);
// The run-time conditions: aligned bases, sm_89+, enough workspace.
bool quant_decode_usable(const QuantDecodeArgs& a);
void launch_quant_decode(const QuantDecodeArgs& a, cudaStream_t stream);

}  // namespace moex::cuda
