// backends/cuda/sm90_tma_kernels_fp8_exact_few.cu — the exact FP8 kernels for few-row tiles (X = 3:
// 64-row A stages, six stages in the ring; TmaFp8Extra::exact_few_rows), per activation dtype.
// (kernels of the TMA grouped GEMM, split over several files to compile in parallel: sm90_tma_launch.cuh)
#include "backends/cuda/sm90_tma_kernel.cuh"

MOEX_TMA_INSTANTIATE_X(__nv_bfloat16, 128, true, false, false, 3);
MOEX_TMA_INSTANTIATE_X(__half, 128, true, false, false, 3);
MOEX_TMA_INSTANTIATE_X(float, 128, true, false, false, 3);
