// backends/cuda/sm90_tma_kernels_fp8_exact_nt.cu — the untransposed exact FP8 kernels (e4m3 weights
// converted into f16 in shared memory by the consumers, f16 activation codes in natural k order, HGMMA
// with both operands by descriptor, two-level accumulation), 128-wide tiles, per activation dtype.
// Opt-in: MOEX_CUDA_FP8_X_NT=1 (deepgemm.cu). (kernels of the TMA grouped GEMM, split over several
// files to compile in parallel: sm90_tma_launch.cuh)
#include "backends/cuda/sm90_tma_kernel.cuh"

MOEX_TMA_INSTANTIATE_X(__nv_bfloat16, 128, true, false, false, 2);
MOEX_TMA_INSTANTIATE_X(__half, 128, true, false, false, 2);
MOEX_TMA_INSTANTIATE_X(float, 128, true, false, false, 2);
