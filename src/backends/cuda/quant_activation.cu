// backends/cuda/quant_activation.cu — dynamic activation quantization (per token, per 128
// channels, as moex::quantize_activation_row) and the per-expert weight dequantization of eager.
#include <algorithm>

#include "backends/cuda/quant_common.cuh"

namespace moex::cuda {

namespace {

constexpr int THREADS = 256;
constexpr int PER_LANE = kQuantGroup / 32;  // channels of a group per lane

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// One warp per (row, 128-channel group). fmaxf ignores NaN like the CPU's std::max chain;
// an infinite amax gives scale 1 (codes saturate to ±448), as on the CPU.
template <class T>
__global__ void __launch_bounds__(THREADS) quantize_activations(const T* x, int64_t rows, int64_t K, int64_t groups,
                                                                const int* valid_rows, uint8_t* codes, float* scales,
                                                                float* values) {
  const int64_t item = int64_t(blockIdx.x) * (THREADS / 32) + (threadIdx.x >> 5);
  if (item >= rows * groups) return;
  const int64_t r = item / groups, g = item % groups;
  if (valid_rows && r >= *valid_rows) return;
  const int lane = threadIdx.x & 31;
  const int64_t c0 = g * kQuantGroup;
  float v[PER_LANE];
  float amax = 0.0f;
#pragma unroll
  for (int q = 0; q < PER_LANE; ++q) {
    const int64_t c = c0 + q * 32 + lane;
    v[q] = c < K ? to_f32(x[r * K + c]) : 0.0f;
    amax = fmaxf(amax, fabsf(v[q]));
  }
  amax = warp_max(amax);
  const float scale = amax > 0.0f && isfinite(amax) ? __fdiv_rn(amax, 448.0f) : 1.0f;
  if (lane == 0) scales[r * groups + g] = scale;
#pragma unroll
  for (int q = 0; q < PER_LANE; ++q) {
    const int64_t c = c0 + q * 32 + lane;
    if (c >= K) continue;
    const uint8_t code = e4m3_code_sat(__fdiv_rn(v[q], scale));
    codes[r * K + c] = code;
    if (values) values[r * K + c] = e4m3_value(code) * scale;
  }
}

__global__ void __launch_bounds__(THREADS) dequantize_expert(QuantWeights w, int64_t e, float* out) {
  const int64_t total = w.N * w.K;
  for (int64_t i = int64_t(blockIdx.x) * THREADS + threadIdx.x; i < total; i += int64_t(gridDim.x) * THREADS) {
    const int64_t n = i / w.K, k = i % w.K;
    out[i] = weight_value(w, e, n, k) * weight_block_factor(w, e, n, k / kQuantGroup);
  }
}

}  // namespace

void launch_quantize_activations(const void* x, DType dtype, int64_t rows, int64_t K, const int* valid_rows, uint8_t* codes,
                                 float* scales, float* values, cudaStream_t stream) {
  const int64_t groups = ceil_div(K, kQuantGroup);
  const int64_t items = rows * groups;
  if (items == 0) return;
  const int64_t blocks = ceil_div(items, THREADS / 32);
  MOEX_CHECK(blocks < (int64_t(1) << 31), "activation quantization on CUDA: {} rows x {} channels is too many", rows, K);
  switch (dtype) {
    case DType::f32:
      quantize_activations<float><<<unsigned(blocks), THREADS, 0, stream>>>(static_cast<const float*>(x), rows, K, groups,
                                                                            valid_rows, codes, scales, values);
      break;
    case DType::f16:
      quantize_activations<__half><<<unsigned(blocks), THREADS, 0, stream>>>(static_cast<const __half*>(x), rows, K, groups,
                                                                             valid_rows, codes, scales, values);
      break;
    case DType::bf16:
      quantize_activations<__nv_bfloat16><<<unsigned(blocks), THREADS, 0, stream>>>(
          static_cast<const __nv_bfloat16*>(x), rows, K, groups, valid_rows, codes, scales, values);
      break;
    default: detail::fail(ErrorCode::internal, "activation quantization on CUDA: unexpected dtype {}", dtype_name(dtype));
  }
  check_launch("quantize_activations");
}

void launch_dequantize_expert(const QuantWeights& w, int64_t e, float* out, cudaStream_t stream) {
  const int64_t total = w.N * w.K;
  if (total == 0) return;
  const int64_t blocks = std::min<int64_t>(ceil_div(total, THREADS), 65535);
  dequantize_expert<<<unsigned(blocks), THREADS, 0, stream>>>(w, e, out);
  check_launch("dequantize_expert");
}

}  // namespace moex::cuda
