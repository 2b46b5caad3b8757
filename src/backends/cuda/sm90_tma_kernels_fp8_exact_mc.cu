// backends/cuda/sm90_tma_kernels_fp8_exact_mc.cu — the exact FP8 kernels in 2-CTA clusters (two n
// tiles of one m tile per cluster, the f16 A codes loaded half by each CTA and multicast to both),
// TMA A rows only, per activation dtype.
// (kernels of the TMA grouped GEMM, split over several files to compile in parallel: sm90_tma_launch.cuh)
#include "backends/cuda/sm90_tma_kernel.cuh"

MOEX_TMA_INSTANTIATE_X(__nv_bfloat16, 128, true, true, false, true);
MOEX_TMA_INSTANTIATE_X(__half, 128, true, true, false, true);
MOEX_TMA_INSTANTIATE_X(float, 128, true, true, false, true);
