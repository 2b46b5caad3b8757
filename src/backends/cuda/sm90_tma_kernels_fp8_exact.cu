// backends/cuda/sm90_tma_kernels_fp8_exact.cu — the exact FP8 kernels (e4m3 weights converted to f16 in
// registers, f16 activation codes, HGMMA, two-level accumulation), 128-wide tiles, per activation dtype.
// (kernels of the TMA grouped GEMM, split over several files to compile in parallel: sm90_tma_launch.cuh)
#include "backends/cuda/sm90_tma_kernel.cuh"

MOEX_TMA_INSTANTIATE_X(__nv_bfloat16, 128, true, false, false, 1);
MOEX_TMA_INSTANTIATE_X(__half, 128, true, false, false, 1);
MOEX_TMA_INSTANTIATE_X(float, 128, true, false, false, 1);
