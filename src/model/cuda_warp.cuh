// model/cuda_warp.cuh — warp reductions and the L2 prefetch helper shared by the model runtime's kernels (cuda_kernels.cu,
// cuda_attention.cu); device code, included by .cu files only. Every lane gets the result.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "model/cuda_kernels.cuh"

namespace moex::model::cuda {

// Thread 0 of block `part` of `parts` asks L2 for its share of pf's bytes with bulk prefetches
// (cp.async.bulk.prefetch.L2: no registers held, nothing to wait for). Used by latency-bound decode
// kernels (attention, the router) to stream the weights of the GEMV that follows them while DRAM is
// otherwise idle; the GEMV then reads them from L2.
__device__ __forceinline__ void l2_prefetch_share(const L2Prefetch& pf, int64_t part, int64_t parts) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (pf.base == nullptr || pf.bytes <= 0 || parts <= 0 || threadIdx.x != 0) return;
  constexpr int64_t kChunk = 32768;  // bytes per prefetch instruction
  const int64_t share = ((pf.bytes + parts - 1) / parts + 15) & ~int64_t(15);
  const int64_t lo = part * share, hi = (lo + share < pf.bytes ? lo + share : pf.bytes) & ~int64_t(15);
  const char* base = static_cast<const char*>(pf.base);
  for (int64_t o = lo; o < hi; o += kChunk) {
    const uint32_t n = uint32_t(hi - o < kChunk ? hi - o : kChunk);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(base + o), "r"(n) : "memory");
  }
#else
  (void)pf;
  (void)part;
  (void)parts;
#endif
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

}  // namespace moex::model::cuda
