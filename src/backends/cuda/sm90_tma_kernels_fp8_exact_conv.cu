// backends/cuda/sm90_tma_kernels_fp8_exact_conv.cu — the converting exact FP8 kernel (X = 6: the
// e4m3 weight tile converted to f16 in shared memory by the producer warpgroup's warps 1-3, f16
// activation codes by TMA, SS HGMMA m64n256k16, one accumulator set rescaled per 128-k block, h
// quantized in the epilogue for the down GEMM), per activation dtype. grouped_mm's FP8 up GEMM from 256
// pairs per expert (deepgemm.cu's kConvMinRowsPerExpert; MOEX_CUDA_FP8_X_CONV=1 / 0 forces it). (kernels
// of the TMA grouped GEMM, split over several files to compile in parallel: sm90_tma_launch.cuh)
#include "backends/cuda/sm90_tma_kernel.cuh"

MOEX_TMA_INSTANTIATE_X(__nv_bfloat16, 256, true, false, false, 6);
MOEX_TMA_INSTANTIATE_X(__half, 256, true, false, false, 6);
MOEX_TMA_INSTANTIATE_X(float, 256, true, false, false, 6);
