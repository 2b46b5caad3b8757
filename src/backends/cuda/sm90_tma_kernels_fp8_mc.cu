// backends/cuda/sm90_tma_kernels_fp8_mc.cu — the FP8 (e4m3, two-level accumulation, QGMMA) kernels in
// 2-CTA clusters (the weight tile multicast into both CTAs of a pair of m tiles), 128-wide tiles, per
// activation dtype. (kernels of the TMA grouped GEMM, split over several files to compile in parallel:
// sm90_tma_launch.cuh)
#include "backends/cuda/sm90_tma_kernel.cuh"

MOEX_TMA_INSTANTIATE(__nv_bfloat16, 128, true, true, false);
MOEX_TMA_INSTANTIATE(__half, 128, true, true, false);
MOEX_TMA_INSTANTIATE(float, 128, true, true, false);
