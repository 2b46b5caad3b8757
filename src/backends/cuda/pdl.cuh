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

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string_view>
#include <utility>
#include <vector>

#include "backends/cuda/cuda_common.cuh"

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

// The shared-memory carveout asked for every kernel launched by launch_pdl (MOEX_CUDA_CARVEOUT: unset
// or "auto" = the driver's choice per kernel, "max" = the largest shared-memory share, or a
// percentage 0..100), or -1 for none. Why it matters: an SM runs blocks of one L1 / shared-memory
// split at a time, and a kernel that needs more shared memory than the current split gives must wait
// for the SM to empty before the split changes, which undoes the overlap PDL buys. Read once.
inline int pdl_carveout() {
  static const int v = [] {
    const char* s = std::getenv("MOEX_CUDA_CARVEOUT");
    if (!s || !*s || std::string_view(s) == "auto") return -1;
    if (std::string_view(s) == "max") return 100;
    return std::clamp(std::atoi(s), 0, 100);
  }();
  return v;
}
// Sets pdl_carveout() on `kernel` the first time it is launched (a short list of the kernels seen).
inline void apply_pdl_carveout(const void* kernel) {
  const int carveout = pdl_carveout();
  if (carveout < 0) return;
  static std::mutex mu;
  static std::vector<const void*> done;
  std::lock_guard<std::mutex> lock(mu);
  if (std::find(done.begin(), done.end(), kernel) != done.end()) return;
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, carveout),
        "cudaFuncSetAttribute (shared-memory carveout)");
  done.push_back(kernel);
}

// kernel<<<grid, block, smem, stream>>>(args...) with the PDL attribute when pdl_enabled();
// launch errors become moex::Error naming `what`.
template <class... Params, class... Args>
void launch_pdl(const char* what, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                Args&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled() ? 1 : 0;
  apply_pdl_carveout(reinterpret_cast<const void*>(kernel));
  check(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...), what);
}

}  // namespace moex::cuda
