// backends/cuda/sm90_tma_kernels_n128_bf16.cu — the bf16 kernels with 128-wide tiles, without and with 2-CTA clusters.
// (kernels of the TMA grouped GEMM, split over several files to compile in parallel: sm90_tma_launch.cuh)
#include "backends/cuda/sm90_tma_kernel.cuh"

MOEX_TMA_INSTANTIATE(__nv_bfloat16, 128, false, false, false);
MOEX_TMA_INSTANTIATE(__nv_bfloat16, 128, false, true, false);
