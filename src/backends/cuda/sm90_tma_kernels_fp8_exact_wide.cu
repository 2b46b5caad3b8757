// backends/cuda/sm90_tma_kernels_fp8_exact_wide.cu — the wide exact FP8 kernels (X = 4: e4m3 weights
// converted to f16 in registers, f16 activation codes, HGMMA, 256 weight rows per tile with one
// accumulator set rescaled per 128-k block), per activation dtype. Opt-in: MOEX_CUDA_FP8_X_WIDE=1
// (deepgemm.cu). (kernels of the TMA grouped GEMM, split over several files to compile in parallel:
// sm90_tma_launch.cuh)
#include "backends/cuda/sm90_tma_kernel.cuh"

MOEX_TMA_INSTANTIATE_X(__nv_bfloat16, 256, true, false, false, 4);
MOEX_TMA_INSTANTIATE_X(__half, 256, true, false, false, 4);
MOEX_TMA_INSTANTIATE_X(float, 256, true, false, false, 4);
// X = 5: the same with the two m64 blocks pipelined inside each warpgroup (MOEX_CUDA_FP8_X_WIDE=2)
MOEX_TMA_INSTANTIATE_X(__nv_bfloat16, 256, true, false, false, 5);
MOEX_TMA_INSTANTIATE_X(__half, 256, true, false, false, 5);
MOEX_TMA_INSTANTIATE_X(float, 256, true, false, false, 5);
