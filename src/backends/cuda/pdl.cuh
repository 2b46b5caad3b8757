// backends/cuda/pdl.cuh — programmatic dependent launch (PDL, compute capability >= 9.0) for the
// short kernels of a decode step.
//
// Why: at batch 1 a decode step is ~450 short kernels in a CUDA graph, and each one paid ≈ 3 µs
// before doing anything (launch, the first loads' round trip, the previous kernel's tail). With PDL
// a kernel is launched while its predecessor still runs: its blocks become resident, issue the loads
// that do not depend on the predecessor (weights), and wait in `pdl_wait` for the predecessor's
// completion and memory flush.
//
// The contract of a kernel launched with `launch_pdl` (the PDL attribute set):
//   * it calls `pdl_wait()` before its first access to memory that any earlier kernel of the stream
//     writes or reads; only reads of data that no kernel still in flight on the stream writes —
//     model weights, uploaded and synchronised at load — may come before it, writes never do;
//   * it may call `pdl_launch_dependents()` anywhere (early: the next kernel becomes resident
//     sooner). A kernel that never calls it lets its dependents start when its blocks exit.
// Because every such kernel waits for its predecessor's completion, completion stays ordered down
// the stream: kernel n+1 waits for n, which waited for n−1 before finishing. Kernels launched
// without the attribute (cuBLAS, memcpy, any other launch) keep the ordinary stream order, and the
// device functions are no-ops there, so a PDL kernel is also correct when launched plainly.
// Stream capture turns the attribute into programmatic graph edges (CUDA >= 12.3).
//
// MOEX_CUDA_PDL=0 launches every kernel plainly (A/B measurement, debugging).
#pragma once
#include <cuda_runtime.h>

#include <utility>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/trace.cuh"

namespace moex::cuda {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Whether kernels on the current device are launched with the PDL attribute: compute capability
// >= 9.0 and MOEX_CUDA_PDL not "0" (read once per process).
inline bool pdl_enabled() {
  static const bool env_on = [] {
    const char* s = std::getenv("MOEX_CUDA_PDL");
    return !(s && std::string_view(s) == "0");
  }();
  return env_on && current_device_cc() >= 90;
}

// kernel<<<grid, block, smem, stream>>>(args...) with the PDL attribute when pdl_enabled() and, where
// `cluster` has more than one block, in thread-block clusters of that shape (compute capability
// >= 9.0); launch errors become moex::Error naming `what`.
template <class... Params, class... Args>
void launch_pdl_cluster(const char* what, void (*kernel)(Params...), dim3 grid, dim3 cluster, dim3 block, size_t smem,
                        cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (cluster.x * cluster.y * cluster.z > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = cluster.x;
    attr[n].val.clusterDim.y = cluster.y;
    attr[n].val.clusterDim.z = cluster.z;
    ++n;
  }
  if (pdl_enabled()) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = n;
  check(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...), what);
}
// The same without clusters.
template <class... Params, class... Args>
void launch_pdl(const char* what, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                Args&&... args) {
  launch_pdl_cluster(what, kernel, grid, dim3(1, 1, 1), block, smem, stream, std::forward<Args>(args)...);
}

}  // namespace moex::cuda
