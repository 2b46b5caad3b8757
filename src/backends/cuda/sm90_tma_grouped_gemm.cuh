// backends/cuda/sm90_tma_grouped_gemm.cuh — the warp-specialised TMA + wgmma grouped GEMM for
// Hopper (sm90_tma_grouped_gemm.cu). Same contract as launch_grouped_gemm_wgmma (cuda_common.cuh):
// per-expert row blocks from the device tile table, fused gated-activation / bias epilogues.
#pragma once
#include "backends/cuda/cuda_common.cuh"

namespace moex::cuda {

// True when the TMA kernel can run this GEMM: compute capability 9.0, K-major weights, 16-byte
// aligned rows (vec16), sizes multiples of 8 elements, tiles of 128 rows, the driver's tensor-map
// encoder available, and MOEX_CUDA_NO_TMA unset (or 0).
bool tma_usable(const GroupedGemmArgs& a, bool vec16);
// MOEX_CUDA_NO_TMA set (and not 0): the TMA kernels are off (read once).
bool tma_disabled();

// What the FP8 variant and the deepgemm layouts add to GroupedGemmArgs.
//   out_rows   nullptr: the output row of A row r is r; else out_rows[r] (< 0: not written). The
//              deepgemm layouts compute on padded / masked A rows and write compact pair rows.
// FP8 (e4m3 A and B; a.A holds codes, a.W the e4m3 weights [E, N, Kdim]):
//   a_scales   [ceil(Kdim/128), a_scales_ld] f32, "MN-major" (transposed) so that the 128 scales
//              of one tile and K block are one 512-byte TMA box; the scale of A row r (for the
//              gathered up projection: of source row a_gather[r] / a_div) and K block kb is
//              a_scales[kb * a_scales_ld + r]. a_scales_ld: a multiple of 4.
//   w_scales   [E, ceil(N/128), ceil(Kdim/128)] f32 or UE8M0 bytes (w_ue8m0): 128x128 blocks.
// The two-level accumulation: per 128-K block the wgmma (QGMMA) partial sums of the codes are
// multiplied by activation scale x weight block scale and added to f32 registers. Up epilogues
// write h in the activation dtype (rounded, then quantized again before the down projection).
struct TmaFp8Extra {
  const int* out_rows = nullptr;
  const float* a_scales = nullptr;
  int a_scales_ld = 0;
  const void* w_scales = nullptr;
  bool w_ue8m0 = false;
  int n_tile = 0;  // bf16/f16: 128 or 256 columns per N tile (0: 256); MOEX_CUDA_TMA_N overrides
  bool cluster = false;  // bf16/f16: 2-CTA clusters sharing the weight tile; MOEX_CUDA_TMA_CLUSTER overrides
  // The up epilogue's SiLU chosen once per tile instead of per element (set by the launcher; on
  // unless MOEX_CUDA_COMPACT_EPILOGUE=0; see gated_act_k in cuda_common.cuh)
  bool compact_epilogue = true;
  // The dynamic schedule of the cooperative kernels outside clusters: [2] ints (claims, finished
  // CTAs), zero at launch and reset by the kernel's last CTA (set by the launcher from the routing
  // plan's `sched` unless MOEX_CUDA_TMA_DYNAMIC=0; nullptr: the static stride). See the kernel.
  int* work_counter = nullptr;
  // A consumer warpgroup with no row of its own in a tile (an expert's last tile of <= 64 rows; rank 1
  // of an odd last pair) skips its MMAs (set by the launcher unless MOEX_CUDA_TMA_IDLE_SKIP=0)
  bool skip_idle_rows = false;
  // m tiles (m-tile pairs in clusters) per group of the work order (set by the launcher: 8, or
  // MOEX_CUDA_TMA_GROUP_M in [1, 64])
  int group_m = 8;
  // FP8 only. exact: the exact variant (grouped_mm's FP8 path on Hopper; see sm90_tma_grouped_gemm.cu).
  // a.A then holds f16 codes [rows, a_ld] (a_ld = Kdim rounded up to 128, zero past Kdim) whose k
  // order inside every 64 is permuted as deepgemm.cu's quantizer writes it (x_code_col); the
  // weights stay e4m3 and are converted in registers. false: QGMMA on e4m3 codes (deepgemm).
  bool exact = false;
  int a_ld = 0;
  // With exact: the untransposed exact kernel (opt-in, MOEX_CUDA_FP8_X_NT=1, see deepgemm.cu): the
  // consumers convert each stage's e4m3 weight tile into f16 in shared memory and run HGMMA with both
  // operands by descriptor; a.A's f16 codes are then in natural k order (no x_code_col permutation).
  bool exact_nt = false;
  // With exact (transposed, A rows by TMA): the few-row kernel (X = 3 in sm90_tma_kernel.cuh): A
  // stages of 64 rows and six stages in the ring instead of four (more weight bytes in flight where
  // the GEMM streams its weights: few rows per expert); a tile of more rows takes two passes, each
  // streaming the weight tile. Set by the caller from its pair count (deepgemm.cu); the launcher
  // takes it only where the A rows come by TMA (a.a_gather null), the transposed kernel otherwise.
  bool exact_few_rows = false;
  // With exact (transposed, not few_rows): the wide kernel (X = 4 in sm90_tma_kernel.cuh; opt-in,
  // MOEX_CUDA_FP8_X_WIDE=1, see deepgemm.cu): 256 weight rows per tile (two m64 blocks per consumer
  // warpgroup) and one accumulator set rescaled per 128-k block instead of promoted partial sums.
  // The launcher takes it for down / plain GEMMs and the concatenated gated layout with I % 128 == 0.
  // 1: the two m64 blocks' MMAs in one commit group (X = 4); 2: pipelined, block 1's weights converted
  // under block 0's MMAs and block 0 rescaled under block 1's (X = 5, MOEX_CUDA_FP8_X_WIDE=2); 0: off.
  int exact_wide = 0;
  // With exact (the gated up GEMM in the concatenated layout, I % 128 == 0, A rows by TMA in natural k
  // order): the converting kernel (X = 6 in sm90_tma_kernel.cuh; by default from 256 pairs per expert, MOEX_CUDA_FP8_X_CONV=1 / 0,
  // see deepgemm.cu): untransposed, 256 weight rows per tile converted to f16 in shared memory by the
  // producer warpgroup, SS HGMMA, one accumulator set rescaled per 128-k block, h quantized in its
  // epilogue where h_codes is set (tma_fp8_quantizes_h).
  bool exact_conv = false;
  // FP8 gated up GEMM (QGMMA with 256-wide tiles, or the converting exact kernel: tma_fp8_quantizes_h):
  // h quantized in the epilogue for the down GEMM instead of written in the activation dtype: e4m3
  // codes [rows, I] at the A (layout) rows and their per-row scales [ceil(I/128), h_scales_ld]
  // (nullptr: h written to a.out).
  void* h_codes = nullptr;
  float* h_scales = nullptr;
  int h_scales_ld = 0;
};
// True when the FP8 up GEMM `a` with activation dtype act_dtype runs the kernel that can quantize h in
// its epilogue (TmaFp8Extra::h_codes): the concatenated gated layout with I % 128 == 0 on QGMMA with
// 256-wide tiles (bf16 activations) or on the converting exact kernel (exact_conv, any activation dtype).
bool tma_fp8_quantizes_h(const GroupedGemmArgs& a, DType act_dtype, bool exact, bool exact_conv = false);
// True when the FP8 variant can run this GEMM: compute capability 9.0, K-major weights, Kdim a
// multiple of 16, N a multiple of 8, the gated concatenated layout with I a multiple of 64 (a
// 64-row half of a tile never straddles two 128-row scale blocks), 16-byte aligned bases.
bool tma_fp8_usable(const GroupedGemmArgs& a);
// act_dtype: the activation dtype of the bias (bf16 / f16 / f32 allowed for FP8). FP8 runs 256-wide
// N tiles on QGMMA for bf16 activations, 128-wide otherwise (see fp8_wide_tiles in the .cu). x.out_rows
// may be set for bf16/f16 (fp8 = false) too.
void launch_grouped_gemm_tma_ex(const GroupedGemmArgs& a, DType act_dtype, bool fp8, const TmaFp8Extra& x, int64_t a_rows,
                                int64_t E, cudaStream_t stream);
// a_rows: rows of the A buffer when it is read without a gather (the down projection's h [S, I]);
// E: experts in the weights [E, N, K].
// The N tile (128 / 256) and whether 2-CTA clusters share the weight tile, chosen per GEMM from the
// pairs per expert and the weights' size (measured rules in the .cu; MOEX_CUDA_TMA_POLICY,
// MOEX_CUDA_TMA_N and MOEX_CUDA_TMA_CLUSTER override). Sets x.n_tile and x.cluster.
void choose_tma_tile(const GroupedGemmArgs& a, int64_t pairs, int64_t E, TmaFp8Extra& x);
// grouped_mm: launch_grouped_gemm_tma_ex with choose_tma_tile's choice (a_rows = the pairs S).
void launch_grouped_gemm_tma(const GroupedGemmArgs& a, DType dtype, int64_t a_rows, int64_t E, cudaStream_t stream);

}  // namespace moex::cuda
