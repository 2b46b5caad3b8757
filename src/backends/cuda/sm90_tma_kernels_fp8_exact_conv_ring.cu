// backends/cuda/sm90_tma_kernels_fp8_exact_conv_ring.cu — the converting exact FP8 kernel with its e4m3
// tiles staged in a ring of their own (X = 8, TmaFp8Extra::exact_conv == 2, opt-in
// MOEX_CUDA_FP8_X_CONV=2; see TmaCfg in sm90_tma_kernel.cuh), per activation dtype. (kernels of the TMA
// grouped GEMM, split over several files to compile in parallel: sm90_tma_launch.cuh)
#include "backends/cuda/sm90_tma_kernel.cuh"

MOEX_TMA_INSTANTIATE_X(__nv_bfloat16, 256, true, false, false, 8);
MOEX_TMA_INSTANTIATE_X(__half, 256, true, false, false, 8);
MOEX_TMA_INSTANTIATE_X(float, 256, true, false, false, 8);
