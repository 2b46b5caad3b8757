// backends/cuda/l2_prefetch.cuh — asking L2 for weights that a later kernel will read, while the
// memory system would otherwise idle or the later kernel cannot start yet.
//
// Why: in a decode step at batch 1 the kernels that read weights are chained (PDL, pdl.cuh), and
// some of them cannot request their weights early: batched_mm's down kernel becomes resident only as
// the up kernel's blocks leave, and the o projection's blocks sit behind the attention's latency.
// A kernel that runs before them and knows the addresses (the up kernel knows its slot's expert; the
// attention knows the layer) asks L2 for their bytes with cp.async.bulk.prefetch (sm_90): one
// instruction per piece, no registers held, nothing to wait for — DRAM streams those bytes during
// the earlier kernel, and the later kernel's loads hit L2. A hint only: results never depend on it.
//
// Only worth it where the bytes fit L2 beside what is streaming through it (l2_prefetch_budget).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "backends/cuda/cuda_common.cuh"

namespace moex::cuda {

// Bytes a kernel asks for per cp.async.bulk.prefetch instruction.
constexpr int64_t kL2PrefetchPiece = 16 * 1024;

// Part `part` of `parts` (e.g. blockIdx.x of gridDim.x) of [ptr, ptr + bytes) asked of L2, split
// among the block's threads in pieces of kL2PrefetchPiece. Whole 16-byte units from the first
// 16-byte boundary at or after ptr (the instruction's alignment): a partial unit at either end is
// left out. Before compute capability 9.0: nothing.
__device__ __forceinline__ void l2_prefetch_part(const void* ptr, int64_t bytes, int64_t part, int64_t parts) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (ptr == nullptr || bytes <= 0 || parts <= 0) return;
  const uintptr_t p0 = reinterpret_cast<uintptr_t>(ptr), a0 = (p0 + 15) & ~uintptr_t(15);
  const int64_t units = (bytes - int64_t(a0 - p0)) / 16;
  if (units <= 0) return;
  const int64_t per = (units + parts - 1) / parts, u0 = part * per, u1 = min(units, u0 + per);
  constexpr int64_t piece_units = kL2PrefetchPiece / 16;
  const int threads = blockDim.x * blockDim.y * blockDim.z;
  const int tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  for (int64_t u = u0 + int64_t(tid) * piece_units; u < u1; u += int64_t(threads) * piece_units) {
    const uint32_t size = uint32_t(min(piece_units, u1 - u) * 16);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a0 + uintptr_t(u) * 16), "r"(size) : "memory");
  }
#endif
}

// The most bytes worth asking for ahead of a kernel: 60 % of the current device's L2 (the rest
// holds what streams past meanwhile and the activations), or MOEX_CUDA_L2_PREFETCH_MB when set
// (0 turns every prefetch off; A/B measurement). Before compute capability 9.0: 0.
inline int64_t l2_prefetch_budget() {
  static int64_t cache[64] = {};
  static bool known[64] = {};
  int dev = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  if (dev < 0 || dev >= 64) dev = 63;
  if (!known[dev]) {
    int l2 = 0;
    check(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev), "cudaDeviceGetAttribute");
    int64_t budget = int64_t(l2) * 6 / 10;
    if (const char* e = std::getenv("MOEX_CUDA_L2_PREFETCH_MB"); e && *e) budget = int64_t(std::atof(e) * 1048576.0);
    cache[dev] = current_device_cc() >= 90 ? budget : 0;
    known[dev] = true;
  }
  return cache[dev];
}

}  // namespace moex::cuda
