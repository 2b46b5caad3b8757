// backends/cuda/batched_probe.hpp — which batched_mm kernels a one-token call takes, for the tests
// (plain C++: no CUDA headers, so test files compiled by the host compiler include it).
#pragma once
#include <cstdint>

namespace moex::cuda {

// Whether batched_mm on the current CUDA device runs a T = 1 call of these sizes (bf16 / f16
// experts, [E, out, in] weights, 16-byte aligned buffers) as the one cooperative kernel
// (batched_gemv.cu, batched_fused_t1) rather than the up and down kernels. Reads
// MOEX_CUDA_FUSED_T1 as the forward does.
bool batched_fused_t1_would_run(int64_t K, int64_t H, int64_t I, int dtype_bytes);

}  // namespace moex::cuda
