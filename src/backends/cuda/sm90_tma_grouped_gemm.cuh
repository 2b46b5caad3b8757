// backends/cuda/sm90_tma_grouped_gemm.cuh — the warp-specialised TMA + wgmma grouped GEMM for
// Hopper (sm90_tma_grouped_gemm.cu). Same contract as launch_grouped_gemm_wgmma (cuda_common.cuh):
// per-expert row blocks from the device tile table, fused gated-activation / bias epilogues.
#pragma once
#include "backends/cuda/cuda_common.cuh"

namespace moex::cuda {

// True when the TMA kernel can run this GEMM: compute capability 9.0, K-major weights, 16-byte
// aligned rows (vec16), sizes multiples of 8 elements, tiles of 128 rows, the driver's tensor-map
// encoder available, and MOEX_CUDA_NO_TMA unset (or 0).
bool tma_usable(const GroupedGemmArgs& a, bool vec16);
// a_rows: rows of the A buffer when it is read without a gather (the down projection's h [S, I]);
// E: experts in the weights [E, N, K].
// MOEX_CUDA_TMA_N=128 selects 128-wide N tiles (default 256). MOEX_CUDA_TMA_CLUSTER=1 selects the
// 2-CTA cluster variant that multicasts the weight tile (opt-in, NOT yet run on a GPU: check it with
// `MOEX_CUDA_TMA_CLUSTER=1 moex_tests --gtest_filter='*Cuda*:-CudaPerf*'` before timing it).
void launch_grouped_gemm_tma(const GroupedGemmArgs& a, DType dtype, int64_t a_rows, int64_t E, cudaStream_t stream);

}  // namespace moex::cuda
