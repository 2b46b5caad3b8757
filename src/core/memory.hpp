// core/memory.hpp — raw allocation and copies on the CPU and on CUDA devices.
#pragma once
#include <cstddef>

#include "moex/device.hpp"

namespace moex::detail {

// 64-byte aligned host memory / cudaMalloc on the device. Throws Error(out_of_memory).
void* device_alloc(Device dev, size_t bytes);
void device_free(Device dev, void* p) noexcept;
// Synchronous copy (cudaMemcpy when either side is CUDA).
void device_copy(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes);

// CUDA side (core/cuda_runtime.cu, or core/cuda_absent.cpp without CUDA).
void* cuda_alloc(int device, size_t bytes);
void cuda_free(int device, void* p) noexcept;
void cuda_copy(void* dst, const void* src, size_t bytes);  // cudaMemcpyDefault

}  // namespace moex::detail
