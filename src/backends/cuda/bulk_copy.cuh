// backends/cuda/bulk_copy.cuh — mbarriers and one-dimensional bulk copies (sm_90).
//
// A bulk copy (`cp.async.bulk`) moves a contiguous range of global memory into shared memory by the
// tensor memory accelerator: one instruction, any multiple of 16 bytes, no registers held while the
// bytes are in flight. Its completion is counted on an mbarrier (bytes announced with
// mbar_arrive_expect_tx, waited for with mbar_wait on the phase's parity). The TMA grouped GEMM's
// barriers use the same helpers (sm90_tma_kernel.cuh).
//
// Why the decode kernels use it (model/cuda_kernels.cu, batched_gemv.cu): a block can request its
// whole weight slice (~130–190 KB) before `pdl_wait`, while the previous kernel of the chain still
// runs, where register pre-loads held only eight 16-byte loads per lane.
#pragma once
#include <cstdint>

namespace moex::cuda {

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// The barriers' initialisation made visible to the async proxy (the TMA unit) before copies use them.
__device__ __forceinline__ void mbar_fence_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}
// bytes (a multiple of 16; src and dst 16-byte aligned) from global src to shared dst, completed on
// the mbarrier at bar (whose expected transaction bytes must include them).
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(reinterpret_cast<uint64_t>(src)), "r"(bytes), "r"(bar)
               : "memory");
}

}  // namespace moex::cuda
