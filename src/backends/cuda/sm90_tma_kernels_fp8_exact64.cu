// backends/cuda/sm90_tma_kernels_fp8_exact64.cu — the exact FP8 kernels on 64-row weight tiles with
// double-buffered partial sums (X64), per activation dtype.
// (kernels of the TMA grouped GEMM, split over several files to compile in parallel: sm90_tma_launch.cuh)
#include "backends/cuda/sm90_tma_kernel.cuh"

MOEX_TMA_INSTANTIATE_X(__nv_bfloat16, 64, true, false, false, true);
MOEX_TMA_INSTANTIATE_X(__half, 64, true, false, false, true);
MOEX_TMA_INSTANTIATE_X(float, 64, true, false, false, true);
