// core/cuda_runtime.cu — CUDA device discovery, memory and copies (built only with CUDA).
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "core/check.hpp"
#include "core/memory.hpp"
#include "moex/device.hpp"

namespace moex {

bool built_with_cuda() { return true; }

std::string cuda_unavailable_reason() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error of a failed init
    return std::string("no usable CUDA device: ") + cudaGetErrorString(e);
  }
  if (n == 0) return "no CUDA device found";
  return "";
}

std::vector<CudaDeviceInfo> cuda_devices() {
  std::vector<CudaDeviceInfo> out;
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return out;
  }
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    CudaDeviceInfo info;
    info.index = i;
    info.name = prop.name;
    info.cc_major = prop.major;
    info.cc_minor = prop.minor;
    info.total_memory = prop.totalGlobalMem;
    info.multiprocessors = prop.multiProcessorCount;
    out.push_back(info);
  }
  return out;
}

namespace detail {

void* cuda_alloc(int device, size_t bytes) {
  int prev = 0;
  cudaGetDevice(&prev);
  if (cudaSetDevice(device) != cudaSuccess) {
    cudaGetLastError();
    fail(ErrorCode::invalid_argument, "CUDA device {} is not available: {}", device, cuda_unavailable_reason());
  }
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
  cudaSetDevice(prev);
  if (e != cudaSuccess) {
    cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    fail(ErrorCode::out_of_memory, "out of GPU memory on cuda:{}: asked for {:.1f} MiB, {:.1f} MiB free ({})", device,
         bytes / 1048576.0, free_b / 1048576.0, cudaGetErrorString(e));
  }
  return p;
}

void cuda_free(int device, void* p) noexcept {
  if (p) cudaFree(p);
}

void cuda_copy(void* dst, const void* src, size_t bytes) {
  cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyDefault);
  if (e != cudaSuccess) fail(ErrorCode::internal, "cudaMemcpy of {} bytes failed: {}", bytes, cudaGetErrorString(e));
}

}  // namespace detail
}  // namespace moex
