// backends/cuda/sm90_tma_kernels_fp8_n256.cu — the QGMMA FP8 kernels with 256-wide tiles (bf16
// activations), without and with 2-CTA clusters: the default for bf16 activations
// (MOEX_CUDA_FP8_N=128: the 128-wide ones; see fp8_wide_tiles in sm90_tma_grouped_gemm.cu).
// (kernels of the TMA grouped GEMM, split over several files to compile in parallel: sm90_tma_launch.cuh)
#include "backends/cuda/sm90_tma_kernel.cuh"

MOEX_TMA_INSTANTIATE(__nv_bfloat16, 256, true, false, false);
MOEX_TMA_INSTANTIATE(__nv_bfloat16, 256, true, true, false);
