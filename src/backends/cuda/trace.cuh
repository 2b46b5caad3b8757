// backends/cuda/trace.cuh — the device side of trace.hpp: MOEX_CUDA_TRACE_BLOCK(kernel) at the top
// of a traced kernel records one trace::Record per block (thread 0 writes it at exit), and
// MOEX_CUDA_TRACE_WAITED() right after the kernel's pdl_wait notes when the wait returned. Without
// MOEX_CUDA_TRACE both are empty, so ordinary builds carry no trace code.
//
// Each translation unit has its own copy of the device-side target (the library is compiled
// without relocatable device code); every copy registers a host setter, and trace::start sets them
// all to one buffer and one counter.
#pragma once
#include "backends/cuda/trace.hpp"

namespace moex::cuda::trace {
// The device's global timer (ns) and this block's SM (the hooks below and trace.cu's anchors).
__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ uint32_t sm_id() {
  uint32_t s;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
  return s;
}
}  // namespace moex::cuda::trace

#if defined(MOEX_CUDA_TRACE) && MOEX_CUDA_TRACE
#include <cuda_runtime.h>

#include <vector>

namespace moex::cuda::trace {

struct Target {
  Record* buf = nullptr;
  unsigned* count = nullptr;
  unsigned cap = 0;
};
using Setter = cudaError_t (*)(const Target&);
inline std::vector<Setter>& setters() {
  static std::vector<Setter> s;
  return s;
}

namespace {
__device__ Target g_target;
cudaError_t set_target_here(const Target& t) { return cudaMemcpyToSymbol(g_target, &t, sizeof t); }
[[maybe_unused]] const bool registered_here = (setters().push_back(&set_target_here), true);
}  // namespace

__device__ __forceinline__ bool block_leader() { return threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0; }
// Lives for the kernel body: entry clocks at construction, the record at destruction (thread 0).
struct BlockScope {
  uint32_t kernel;
  uint64_t c_start = 0, g_start = 0, c_wait = 0, c_mark[kMarks] = {};
  __device__ explicit BlockScope(uint32_t k) : kernel(k) {
    if (block_leader()) {
      c_start = clock64();
      g_start = global_ns();
    }
  }
  // right after the kernel's pdl_wait (MOEX_CUDA_TRACE_WAITED)
  __device__ void waited() {
    if (block_leader()) c_wait = clock64();
  }
  __device__ void mark(int i) {
    if (block_leader()) c_mark[i] = clock64();
  }
  __device__ ~BlockScope() {
    if (!block_leader() || !g_target.buf) return;
    const uint64_t c_end = clock64(), g_end = global_ns();
    const unsigned slot = atomicAdd(g_target.count, 1u);
    if (slot >= g_target.cap) return;
    Record r;
    r.kernel = kernel;
    r.block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    r.grid = gridDim.x * gridDim.y * gridDim.z;
    r.smid = sm_id();
    r.c_start = c_start;
    r.c_wait = c_wait;
    r.c_end = c_end;
    r.g_start = g_start;
    r.g_end = g_end;
    for (int i = 0; i < kMarks; ++i) r.c_mark[i] = c_mark[i];
    g_target.buf[slot] = r;
  }
};

}  // namespace moex::cuda::trace

#define MOEX_CUDA_TRACE_BLOCK(k) ::moex::cuda::trace::BlockScope moex_trace_block_(::moex::cuda::trace::k)
#define MOEX_CUDA_TRACE_WAITED() moex_trace_block_.waited()
#define MOEX_CUDA_TRACE_MARK(i) moex_trace_block_.mark(i)
#else
#define MOEX_CUDA_TRACE_BLOCK(k) ((void)0)
#define MOEX_CUDA_TRACE_WAITED() ((void)0)
#define MOEX_CUDA_TRACE_MARK(i) ((void)0)
#endif
