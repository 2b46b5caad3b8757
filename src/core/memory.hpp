// core/memory.hpp — raw allocation and copies on the CPU and on CUDA devices.
#pragma once
#include <cstddef>

#include "moex/device.hpp"

namespace moex::detail {

// 64-byte aligned host memory (host_alloc) / cudaMalloc on the device. Throws Error(out_of_memory).
void* device_alloc(Device dev, size_t bytes);
// 64-byte aligned host memory, freed with std::free. Buffers of 2 MiB or more whose size rounds up to
// whole 2 MiB pages with at most 1/8 of it unused are 2 MiB aligned and asked to sit on transparent
// huge pages (madvise; Linux, where the kernel allows it): the CPU kernels stream expert weights
// through them, and 4 KiB pages cost a TLB miss every 4 KiB of the stream (docs/PERF.md, thirty-sixth
// session). MOEX_CPU_HUGE_PAGES=0 turns it off. nullptr when out of memory.
void* host_alloc(size_t bytes) noexcept;
void device_free(Device dev, void* p) noexcept;
// Synchronous copy (cudaMemcpy when either side is CUDA).
void device_copy(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes);

// CUDA side (core/cuda_runtime.cu, or core/cuda_absent.cpp without CUDA).
void* cuda_alloc(int device, size_t bytes);
void cuda_free(int device, void* p) noexcept;
void cuda_copy(void* dst, const void* src, size_t bytes);  // cudaMemcpyDefault

}  // namespace moex::detail
