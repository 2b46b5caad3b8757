// backends/cuda/sm90_tma_kernels_pingpong_f16.cu — the f16 kernels with ping-pong consumers (128-wide tiles), without and with 2-CTA clusters.
// (kernels of the TMA grouped GEMM, split over several files to compile in parallel: sm90_tma_launch.cuh)
#include "backends/cuda/sm90_tma_kernel.cuh"

MOEX_TMA_INSTANTIATE(__half, 128, false, false, true);
MOEX_TMA_INSTANTIATE(__half, 128, false, true, true);
