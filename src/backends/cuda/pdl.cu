// backends/cuda/pdl.cu — see pdl.cuh.
#include "backends/cuda/pdl.cuh"

#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>

namespace moex::cuda {

namespace {
int env_mode() {  // MOEX_CUDA_PDL: 0 off, 1 on (default), 2 on with the latency kernels releasing first
  static const int mode = [] {
    const char* s = std::getenv("MOEX_CUDA_PDL");
    if (!s || !*s) return 1;
    return std::strcmp(s, "0") == 0 ? 0 : std::strcmp(s, "2") == 0 ? 2 : 1;
  }();
  return mode;
}
}  // namespace

bool pdl_release_first() { return env_mode() == 2 && pdl_enabled(); }

bool pdl_enabled() {
  if (env_mode() == 0) return false;
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
