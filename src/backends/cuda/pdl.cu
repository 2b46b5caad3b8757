// backends/cuda/pdl.cu — see pdl.cuh.
#include "backends/cuda/pdl.cuh"

#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>

namespace moex::cuda {

bool pdl_enabled() {
  static const bool env_on = [] {
    const char* s = std::getenv("MOEX_CUDA_PDL");
    return !(s && std::strcmp(s, "0") == 0);
  }();
  if (!env_on) return false;
  // per device: 0 unknown, 1 off, 2 on (compute capability >= 9.0)
  static std::array<std::atomic<int>, 64> state{};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  if (dev < 0 || dev >= int(state.size())) return false;
  int s = state[size_t(dev)].load(std::memory_order_relaxed);
  if (s == 0) {
    int major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
      cudaGetLastError();
      major = 0;
    }
    s = major >= 9 ? 2 : 1;
    state[size_t(dev)].store(s, std::memory_order_relaxed);
  }
  return s == 2;
}

}  // namespace moex::cuda
