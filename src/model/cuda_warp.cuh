// model/cuda_warp.cuh — warp reductions shared by the model runtime's kernels (cuda_kernels.cu,
// cuda_attention.cu); device code, included by .cu files only. Every lane gets the result.
#pragma once
#include <cuda_runtime.h>

namespace moex::model::cuda {

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

}  // namespace moex::model::cuda
