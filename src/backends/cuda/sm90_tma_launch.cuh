// backends/cuda/sm90_tma_launch.cuh — internal to the TMA grouped GEMM: what its dispatcher
// (sm90_tma_grouped_gemm.cu) and the files that compile its kernels (sm90_tma_kernels_*.cu) share.
// The kernels are explicit instantiations of tma::launch_bn spread over several translation units so
// that a parallel build compiles them side by side (one file held all 54 kernels and was the build's
// critical path: ~170 s on the 2-core development machine, the rest of the library ≤ 40 s per file).
#pragma once
#include <cudaTypedefs.h>

#include "backends/cuda/sm90_tma_grouped_gemm.cuh"

namespace moex::cuda::tma {

constexpr int BM = 128;  // rows per tile (the routing plan's tile_m)

// Launches grouped_gemm_tma<T, BN, GATHER, FP8, MC, PP> (GATHER from a.a_gather). T: the activation
// dtype (__nv_bfloat16, __half; float too for FP8). BN: 128 / 256 columns per tile. FP8: e4m3 A and
// B with the two-level accumulation. MC: 2-CTA clusters multicasting the weight tile. PP: ping-pong
// consumers. X (with FP8): the exact variant, f16 codes in A and HGMMA (TmaFp8Extra::exact): 1 the
// product transposed (weights converted in registers), 2 untransposed (weights converted into shared
// memory; TmaFp8Extra::exact_nt), 3 transposed for few-row tiles (64-row A stages, six stages;
// TmaFp8Extra::exact_few_rows; A by TMA only), 4 / 5 transposed with 256 weight rows per tile (BN = 256;
// TmaFp8Extra::exact_wide; 5 pipelined), 6 untransposed with the weight tile converted to f16 in
// shared memory by the producer warpgroup (BN = 256, TmaFp8Extra::exact_conv). Defined in sm90_tma_kernel.cuh; the combinations the dispatcher
// uses are instantiated by the sm90_tma_kernels_*.cu files (MOEX_TMA_INSTANTIATE).
template <class T, int BN, bool FP8, bool MC, bool PP, int X = 0>
void launch_bn(const GroupedGemmArgs& a, DType dtype, const TmaFp8Extra& x, int64_t a_rows, int64_t E, cudaStream_t stream);

// The driver's cuTensorMapEncodeTiled (nullptr when the driver lacks it).
using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
EncodeTiledFn encode_fn();
// A tiled tensor map (rank 2 or 3) over base, 256-byte L2 promotion, no OOB NaN fill: try_make_map
// returns the driver's result, make_map fails with ErrorCode::internal when encoding fails.
CUresult try_make_map(CUtensorMap& map, CUtensorMapDataType type, const void* base, int rank, const cuuint64_t* dims,
                      const cuuint64_t* strides_bytes, const cuuint32_t* box, CUtensorMapSwizzle swizzle);
CUtensorMap make_map(CUtensorMapDataType type, const void* base, int rank, const cuuint64_t* dims,
                     const cuuint64_t* strides_bytes, const cuuint32_t* box, CUtensorMapSwizzle swizzle);
// SMs of the current device (cached per device).
int sm_count();

}  // namespace moex::cuda::tma
