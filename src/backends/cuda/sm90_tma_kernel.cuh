// backends/cuda/sm90_tma_kernel.cuh — the TMA + wgmma grouped GEMM kernel for Hopper and its
// typed launcher (tma::launch_bn). Design, measurements and the dispatch rules: the comment at the top
// of sm90_tma_grouped_gemm.cu. Included only by the sm90_tma_kernels_*.cu files, each of which
// instantiates a few launch_bn combinations (MOEX_TMA_INSTANTIATE) so that the kernels compile in
// parallel.
#pragma once
#include <type_traits>

#include <cuda_fp8.h>

#include "backends/cuda/mma_ptx.cuh"
#include "backends/cuda/sm90_tma_launch.cuh"
#include "backends/cuda/tma_ptx.cuh"
#include "backends/cuda/wgmma_ptx.cuh"

namespace moex::cuda::tma {

constexpr int BK = 64, THREADS = 384;
// Work items in flight between the producer and the consumers under the dynamic schedule.
constexpr int ITEM_SLOTS = 4;
// Rows per TMA box of a non-gathered A: a tile loads only the boxes that hold its rows. 32 measured
// as fast as one 128-row box everywhere and 3-7 % faster where experts hold few rows (H200,
// 2026-11-29, fifth session, docs/PERF.md).
constexpr int ABOX = 32;
constexpr int A_BYTES = BM * BK * 2;

// One pipeline stage holds 128 bytes of every row: 64 bf16/f16 or 128 e4m3 elements of K. FP8 adds
// the stage's 128 activation scales (f32, one per A row; one 128-wide K block = one stage).
// X (exact FP8): the A rows are f16 codes, 128 of K = 256 bytes per row, stored as two 128-byte
// swizzled sub-tiles [128 rows][64 k] (A_STAGE = 32 KB); four stages fit. X = 2 (untransposed) adds
// two f16 copies of a stage's weight tile (F_BYTES each, the same two-sub-tile layout as A) outside
// the ring, and keeps three stages.
constexpr int SA_BYTES = BM * 4;
constexpr int X_SUB_BYTES = BM * 128;  // one [128 rows][64 f16] sub-tile of an X stage
// X = 4 (the transposed exact kernel with 256 weight rows per tile, TmaFp8Extra::exact_wide): the
// X = 1 A stage (128 rows of f16 codes, 32 KB) beside 32 KB of weights: three stages.
// X = 3 (the transposed exact kernel for few-row tiles, TmaFp8Extra::exact_few_rows): A stages of
// XR_ROWS rows ([64 rows][64 f16] sub-tiles, 16 KB a stage), which leaves room for six stages instead
// of four: 96 KB of weights in flight per SM instead of 64. A tile of more rows is computed in
// passes of XR_ROWS rows, each streaming the weight tile again.
constexpr int XR_ROWS = 64;
// Rows per pass of a tile and the passes of a tile (int4 {expert, first row, end row, -}): X = 3 in
// passes of XR_ROWS, every other kernel in one. The producer and the consumers walk the same passes.
template <int X>
constexpr int pass_rows() {
  return X == 3 ? XR_ROWS : BM;
}
template <int X>
__device__ __forceinline__ int tile_passes(const int4& tile) {
  return X == 3 ? max(1, (tile.z - tile.y + XR_ROWS - 1) / XR_ROWS) : 1;
}
// Tried on the H200 (2026-12-02, twenty-third session): 16-row A boxes for it (half the f16 code bytes
// per stage at <= 16 rows) left its L2 throughput at 81 % and ran no faster (mixtral_8x7b T = 64 up
// GEMM 314.6 us against 308.4; forward 0.4532 against 0.4496 ms with 32-row boxes); removed.
// X = 6 (the untransposed exact kernel with converted weight tiles, TmaFp8Extra::exact_conv): a stage is
// 64 of K: the A rows' f16 codes ([128 rows][64 k], one 16 KB sub-tile), the 256 weight rows' e4m3
// bytes as TMA brings them (W8_BYTES, [256 rows][64 B], unswizzled) and the same rows converted to f16
// by the producer warpgroup's warps 1-3 (B_BYTES, [256 rows][64 k] 128B-swizzled, as the bf16 kernel's
// TMA B tile): three stages.
// Tried on an H100 and removed (2026-12-06, forty-seventh session, docs/PERF.md): X = 8, X = 6 with its
// e4m3 tiles in a staging ring of four slots of their own, each freed by the converting warps once
// converted, the producer keeping the weight TMA up to four stages ahead of the A stream — bit-identical
// to X = 6 and no faster (qwen3_30b_a3b T = 4096 up GEMM 577.5 µs against 579.6, tensor pipe 48.0 %
// against 47.6 %; the FP8 forward within ±4 % on the four shapes): the weight loads' latency is not
// what holds X = 6 at half the tensor pipe. Earlier, X = 7 (the converting warps loading the weights
// into registers): 1.9× slower (forty-sixth session).
// The converting exact variant (X = 6): the weight tile converted to f16 in shared memory by producer
// warps 1-3 from e4m3 bytes staged by TMA.
constexpr bool converts_weights(int X) { return X == 6; }

template <int BN, bool FP8 = false, int X = 0>
struct TmaCfg {
  static constexpr int STAGES = X == 2 || X >= 4 ? 3 : X == 3 ? 6 : X ? 4 : BN == 256 ? 4 : 6;
  static constexpr int X_SUB = X == 3 ? XR_ROWS * 128 : X_SUB_BYTES;  // bytes of an A sub-tile (X)
  static constexpr int A_STAGE = converts_weights(X) ? X_SUB : X ? 2 * X_SUB : A_BYTES;
  static constexpr int B_BYTES = BN * BK * 2;
  static constexpr int F_BYTES = X == 2 ? BN * 256 : 0;  // [BN rows][128 k] f16
  static constexpr int W8_BYTES = converts_weights(X) ? BN * 64 : 0;  // [BN rows][64 k] e4m3 (X = 6)
  static constexpr int W8_SLOTS = STAGES;  // e4m3 staging slots: one per stage
  static constexpr int STAGE_BYTES = A_STAGE + B_BYTES + (FP8 ? SA_BYTES : 0);
  static constexpr int SMEM_BYTES = STAGES * STAGE_BYTES + W8_SLOTS * W8_BYTES + 2 * F_BYTES + 1024 + 256;  // align slack + barriers
};

// ---- PTX helpers --------------------------------------------------------------------------
// 4-byte cp.async (one activation scale); valid = false writes zero.
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_mbar_arrive_noinc(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
// ---- 2-CTA clusters (MC kernels): the weight tile multicast into both CTAs -----------------
// cluster_ctarank / cluster_sync: cuda_common.cuh
// Arrive on the barrier at the same shared-memory offset in CTA `cta` of the cluster. CTA-scoped
// release (the default): the arrive only has to follow this warp's finished wgmma reads of the
// stage; with a cluster-scoped release on every stage the kernel ran 1.3-1.9x slower (H200, 2026-11-30).
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t local_bar, uint32_t cta) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local_bar), "r"(cta));
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(remote) : "memory");
}
// TMA load written at offset dst of every CTA in cta_mask; each destination CTA's barrier at
// offset bar receives the complete_tx of the bytes written there.
__device__ __forceinline__ void tma_load_3d_multicast(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1, int c2,
                                                      uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%3, "
      "%4, %5}], [%2], %6;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "h"(cta_mask)
      : "memory");
}

template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

// The next position of a STAGES-deep ring: stage + 1, the barrier parity flipping at each wrap.
template <int STAGES>
__device__ __forceinline__ void next_stage(int& stage, uint32_t& phase) {
  if (++stage == STAGES) {
    stage = 0;
    phase ^= 1u;
  }
}

// Work item w -> (m tile, n tile): groups of group_m m tiles (m-tile pairs in clusters), n-major
// inside a group, so that the CTAs running at one time share a group's A rows and each n tile's
// weights in L2 (TmaFp8Extra::group_m).
__device__ __forceinline__ void decode_work(int w, int num_m, int n_tiles, int group_m, int& m, int& n) {
  const int per_group = group_m * n_tiles;
  const int g = w / per_group, r = w - g * per_group;
  const int gs = min(group_m, num_m - g * group_m);
  n = r / gs;
  m = g * group_m + (r - n * gs);
}

template <class T>
__device__ __forceinline__ void store2(T* p, float a, float b) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(a, b);
  else if constexpr (std::is_same_v<T, __half>) *reinterpret_cast<__half2*>(p) = __floats2half2_rn(a, b);
  else *reinterpret_cast<float2*>(p) = make_float2(a, b);
}

__device__ __forceinline__ float weight_scale(const TmaFp8Extra& x, int64_t idx) {
  return x.w_ue8m0 ? __uint_as_float(uint32_t(static_cast<const uint8_t*>(x.w_scales)[idx]) << 23)
                   : static_cast<const float*>(x.w_scales)[idx];
}

// Index of the first weight block scale (k block 0) of the 128 x BN tile n of expert e, for the tile's two
// column halves: ws_lo for columns [0, BN/2), ws_hi for [BN/2, BN) (gate / up in the concatenated gated
// layout; otherwise weight rows n·BN and n·BN + BN/2: one block at BN = 128, two at BN = 256, the second
// clamped to the last block where a partial tile has no second half). w_scales is
// [E, ceil(N/128), ceil(Kdim/128)]; k block kt adds kt. (BN = 256 with the concatenated layout needs
// I % 128 == 0: the launcher checks it.)
template <int BN>
__device__ __forceinline__ void weight_scale_rows(const GroupedGemmArgs& a, int e, int n, int64_t& ws_lo, int64_t& ws_hi) {
  const int64_t kb_count = (a.Kdim + 127) / 128, nb_count = (a.N + 127) / 128;
  const bool concat = a.epi == Epi::up_concat;
  constexpr int BLOCKS = BN / 128;  // 128-row scale blocks per plain tile
  const int64_t blk_lo = concat ? (int64_t(n) * (BN / 2)) / 128 : int64_t(n) * BLOCKS;
  const int64_t blk_hi = concat ? (int64_t(a.I) + int64_t(n) * (BN / 2)) / 128
                         : BLOCKS == 1 ? int64_t(n) : min(nb_count - 1, int64_t(n) * BLOCKS + 1);
  ws_lo = (int64_t(e) * nb_count + blk_lo) * kb_count;
  ws_hi = (int64_t(e) * nb_count + blk_hi) * kb_count;
}

// ---- epilogue --------------------------------------------------------------------------------
// The activation with its kind fixed at compile time (ACT), or the run-time switch (kActRuntime).
constexpr int kActRuntime = -1;
template <int ACT>
__device__ __forceinline__ float gact(const ActParams& p, float g, float u) {
  if constexpr (ACT == kActRuntime) return gated_act(p, g, u);
  else return gated_act_k<ACT>(p, g, u);
}
template <int ACT>
__device__ __forceinline__ float pact(const ActParams& p, float v) {
  if constexpr (ACT == kActRuntime) return plain_act(p, v);
  else return plain_act_k<ACT>(v);
}

// The gated h of columns i, i + 1 (of I) of a tile of the concatenated layout, accumulator rows hh:
// gate from acc[nf], up from acc[nf + NFA / 2], bias added (nullptr: none); results in h0, h1.
template <int ACT, class T, int NFA>
__device__ __forceinline__ void concat_h2(const ActParams& p, const float (&acc)[NFA][4], const T* bias, int I, int nf, int hh,
                                          int i, float& h0, float& h1) {
  float g0 = acc[nf][2 * hh], g1 = acc[nf][2 * hh + 1];
  float u0 = acc[nf + NFA / 2][2 * hh], u1 = acc[nf + NFA / 2][2 * hh + 1];
  if (bias) {
    g0 += to_f32(bias[i]);
    g1 += to_f32(bias[i + 1]);
    u0 += to_f32(bias[I + i]);
    u1 += to_f32(bias[I + i + 1]);
  }
  h0 = gact<ACT>(p, g0, u0);
  h1 = gact<ACT>(p, g1, u1);
}

// Writes the 128 × BN tile (m, n) from the consumers' accumulators (mma.sync's m16n8 layout per
// warp and n8 block; warpgroup cw holds rows [cw*64, +64)): f32 rows for the down projection (bias
// added), the activation for the up projections, writing h in the activation dtype T.
template <class T, int BN, int ACT>
__device__ __forceinline__ void store_tile(const GroupedGemmArgs& a, const TmaFp8Extra& x, float (&acc)[BN / 8][4], int m, int n,
                                           int cw, int warp_in_wg, int lane) {
  constexpr int NF = BN / 8;
  const int4 tile = a.plan.tiles[m];
  const int e = tile.x, rb = tile.y, re = tile.z;
  const T* bias = a.bias ? static_cast<const T*>(a.bias) + int64_t(e) * a.N : nullptr;
  // h in the activation dtype, also for FP8: SPEC §6 quantizes the rounded h (as the CPU and the
  // reference do), so the deepgemm quantizer reads it back from T (the 256-wide FP8 gated tiles
  // quantize it themselves: store_tile_hq).
  using HOut = T;
  const int I = a.I, N = a.N;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int arow = rb + cw * 64 + warp_in_wg * 16 + (lane >> 2) + hh * 8;
    if (arow >= re) continue;
    const int row = x.out_rows ? x.out_rows[arow] : arow;  // the output row of this A row
    if (row < 0) continue;
    if (a.epi == Epi::down) {
      float* out = static_cast<float*>(a.out) + int64_t(row) * a.ldo;
#pragma unroll
      for (int nf = 0; nf < NF; ++nf) {
        const int wcol = n * BN + nf * 8 + 2 * (lane & 3);
        if (wcol < N) {
          float2 v = make_float2(acc[nf][2 * hh], acc[nf][2 * hh + 1]);
          if (bias) {
            v.x += to_f32(bias[wcol]);
            v.y += to_f32(bias[wcol + 1]);
          }
          *reinterpret_cast<float2*>(out + wcol) = v;
        }
      }
    } else if (a.epi == Epi::up_plain) {
      HOut* out = static_cast<HOut*>(a.out) + int64_t(row) * a.ldo;
#pragma unroll
      for (int nf = 0; nf < NF; ++nf) {
        const int wcol = n * BN + nf * 8 + 2 * (lane & 3);
        if (wcol < N) {
          float x0 = acc[nf][2 * hh], x1 = acc[nf][2 * hh + 1];
          if (bias) {
            x0 += to_f32(bias[wcol]);
            x1 += to_f32(bias[wcol + 1]);
          }
          store2<HOut>(out + wcol, pact<ACT>(a.act, x0), pact<ACT>(a.act, x1));
        }
      }
    } else if (a.epi == Epi::up_interleaved) {
      HOut* out = static_cast<HOut*>(a.out) + int64_t(row) * a.ldo;
#pragma unroll
      for (int nf = 0; nf < NF; ++nf) {
        const int i = (n * BN + nf * 8 + 2 * (lane & 3)) >> 1;
        if (i < I) {
          float g = acc[nf][2 * hh], u = acc[nf][2 * hh + 1];
          if (bias) {
            g += to_f32(bias[2 * i]);
            u += to_f32(bias[2 * i + 1]);
          }
          out[i] = from_f32<HOut>(gact<ACT>(a.act, g, u));
        }
      }
    } else {  // up_concat
      HOut* out = static_cast<HOut*>(a.out) + int64_t(row) * a.ldo;
#pragma unroll
      for (int nf = 0; nf < NF / 2; ++nf) {
        const int i = n * (BN / 2) + nf * 8 + 2 * (lane & 3);
        if (i < I) {
          float h0, h1;
          concat_h2<ACT>(a.act, acc, bias, I, nf, hh, i, h0, h1);
          store2<HOut>(out + i, h0, h1);
        }
      }
    }
  }
}

// The gated up projection of a 256-wide FP8 tile with h quantized here for the down GEMM
// (x.h_codes set; the concatenated layout, I % 128 == 0): the tile's 128 h columns are exactly one
// 128-channel block (k block n of the down GEMM), so each row's scale needs only the max over the
// quad of lanes that holds the row. The same arithmetic as the separate pass it replaces (deepgemm.cu,
// quantize_rows over h at the pair rows): h rounded to T first (SPEC §6 quantizes the rounded h),
// scale = amax / 448 (1 when amax is 0 or not finite), code = e4m3(h / scale) saturated, so the codes
// are bit-identical. Codes go to [rows, I] e4m3 at the layout (A) row of the down GEMM, scales to
// [ceil(I/128), h_scales_ld]; padding rows (out_rows < 0) stay unwritten, as before.
template <class T, int ACT>
__device__ __forceinline__ void store_tile_hq(const GroupedGemmArgs& a, const TmaFp8Extra& x, float (&acc)[32][4], int m, int n,
                                              int cw, int warp_in_wg, int lane) {
  constexpr int NH = 16;  // n8 fragments of h: 128 columns
  const int4 tile = a.plan.tiles[m];
  const int e = tile.x, rb = tile.y, re = tile.z;
  const T* bias = a.bias ? static_cast<const T*>(a.bias) + int64_t(e) * a.N : nullptr;
  const int I = a.I;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int arow = rb + cw * 64 + warp_in_wg * 16 + (lane >> 2) + hh * 8;
    float h[NH][2];
    float amax = 0.0f;
#pragma unroll
    for (int nf = 0; nf < NH; ++nf) {
      float h0, h1;
      concat_h2<ACT>(a.act, acc, bias, I, nf, hh, n * 128 + nf * 8 + 2 * (lane & 3), h0, h1);
      h[nf][0] = to_f32(from_f32<T>(h0));  // rounded to T: SPEC §6 quantizes the rounded h
      h[nf][1] = to_f32(from_f32<T>(h1));
      amax = fmaxf(amax, fmaxf(fabsf(h[nf][0]), fabsf(h[nf][1])));  // fmaxf ignores NaN, as the pass did
    }
    // the row's 128 columns sit in the 4 lanes of a quad (all lanes shuffle, valid rows or not)
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
    if (arow >= re || (x.out_rows && x.out_rows[arow] < 0)) continue;
    const float scale = amax > 0.0f && isfinite(amax) ? amax / 448.0f : 1.0f;
    uint8_t* q = static_cast<uint8_t*>(x.h_codes) + int64_t(arow) * I + n * 128 + 2 * (lane & 3);
#pragma unroll
    for (int nf = 0; nf < NH; ++nf) {
      const uint32_t c0 = __nv_cvt_float_to_fp8(h[nf][0] / scale, __NV_SATFINITE, __NV_E4M3);
      const uint32_t c1 = __nv_cvt_float_to_fp8(h[nf][1] / scale, __NV_SATFINITE, __NV_E4M3);
      *reinterpret_cast<uint16_t*>(q + nf * 8) = uint16_t(c0 | (c1 << 8));
    }
    if ((lane & 3) == 0) x.h_scales[int64_t(n) * x.h_scales_ld + arow] = scale;
  }
}

// The epilogue of one 64-row half (cw) of a tile: SiLU (the activation of every SPEC §9 shape) with
// its kind fixed at compile time, dispatched once per tile, in its fast form (__expf, __fdividef:
// ≤ 1e-5 relative, far below the bf16 / f16 rounding of h that follows); any other activation
// through the per-element switch. Compiling more kinds adds a whole epilogue to each kernel (with
// all six this file took 12 min to compile on the 2-core development machine).
// HQ: the FP8 kernels, whose 256-wide gated up projections may quantize h here (store_tile_hq).
template <class T, int BN, bool HQ = false>
__device__ __forceinline__ void epilogue(const GroupedGemmArgs& a, const TmaFp8Extra& x, float (&acc)[BN / 8][4], int m, int n, int cw,
                                         int warp_in_wg, int lane) {
  const bool silu = x.compact_epilogue && a.epi != Epi::down && a.act.kind == int(Activation::silu);
  if constexpr (HQ && BN == 256) {
    if (x.h_codes) {
      if (silu) store_tile_hq<T, kSiluFast>(a, x, acc, m, n, cw, warp_in_wg, lane);
      else store_tile_hq<T, kActRuntime>(a, x, acc, m, n, cw, warp_in_wg, lane);
      return;
    }
  }
  if (silu)
    store_tile<T, BN, kSiluFast>(a, x, acc, m, n, cw, warp_in_wg, lane);
  else
    store_tile<T, BN, kActRuntime>(a, x, acc, m, n, cw, warp_in_wg, lane);
}

// ---- the exact FP8 variant (X) ------------------------------------------------------------------
// The two weight rows (of the stage's 128-row weight tile) whose products this thread holds: the
// A fragment rows g and g + 8 of its warp. Gated layouts pair the gate and up rows of one
// intermediate channel i (concatenated: tile rows i and 64 + i; interleaved: 2i and 2i + 1) so
// that both results land in one thread; i = 32·cw + 8·warp + g. Down / plain: rows in order.
__device__ __forceinline__ void x_weight_rows(Epi epi, int cw, int warp_in_wg, int g, int& row_lo, int& row_hi) {
  const int i = 32 * cw + 8 * warp_in_wg + g;
  if (epi == Epi::up_concat) {
    row_lo = i;
    row_hi = 64 + i;
  } else if (epi == Epi::up_interleaved) {
    row_lo = 2 * i;
    row_hi = 2 * i + 1;
  } else {
    row_lo = 64 * cw + 16 * warp_in_wg + g;
    row_hi = row_lo + 8;
  }
}

// The one rescaled accumulator set of the wide (X = 4 / 5) and converting (X = 6) exact kernels: the next
// k block's weight scale -> the ratio w_cur / w_next by which the accumulators are multiplied (1 where
// the next is zero: that block adds nothing and the scale before it is carried on, w_zero; NaN where
// it is not finite, so that it reaches the output as X = 1's promotion would); w_cur becomes the
// scale in effect.
__device__ __forceinline__ float x_step_scale(float w_next, float& w_cur, bool& w_zero) {
  w_zero = w_next == 0.0f;
  const float eff = w_zero ? w_cur : w_next;
  const float ratio = isfinite(w_next) ? w_cur / eff : __int_as_float(0x7fffffff);
  w_cur = eff;
  return ratio;
}

// The 16-byte weight chunk of `row` (of a stage's weight tile, 128 bytes per row, 128B-swizzled) that
// holds 64-k half `half`'s bytes of lane quad position c4.
__device__ __forceinline__ uint32_t x_w_chunk(uint32_t w_tile, int row, int half, int c4) {
  return w_tile + uint32_t(row * 128 + (((4 * half + c4) ^ (row & 7)) << 4));
}
// The 16 code bytes of each 64-k half of weight rows row_lo / row_hi (g = lane / 4, c4 = lane % 4),
// lo[h] / hi[h] for half h. Which half each row loads first: the two rows of one 8-thread phase of
// the 16-byte loads then fall into different halves of the swizzled 128-byte row (no bank conflict).
__device__ __forceinline__ void x_load_w(uint32_t w_tile, int row_lo, int row_hi, int g, int c4, uint4 (&lo)[2], uint4 (&hi)[2]) {
  const int first_lo = (g & 1) ^ ((row_lo >> 2) & 1), first_hi = (g & 1) ^ ((row_hi >> 2) & 1);
  const uint4 la = ptx::lds128(x_w_chunk(w_tile, row_lo, first_lo, c4));
  const uint4 lb = ptx::lds128(x_w_chunk(w_tile, row_lo, first_lo ^ 1, c4));
  const uint4 ha = ptx::lds128(x_w_chunk(w_tile, row_hi, first_hi, c4));
  const uint4 hb = ptx::lds128(x_w_chunk(w_tile, row_hi, first_hi ^ 1, c4));
  lo[0] = first_lo ? lb : la;
  lo[1] = first_lo ? la : lb;
  hi[0] = first_hi ? hb : ha;
  hi[1] = first_hi ? ha : hb;
}
// A stage's weight bytes (x_load_w) converted in registers (e4m3 -> f16, exact) into the wgmma A
// fragments of its 8 k16 steps.
__device__ __forceinline__ void x_convert_w(const uint4 (&lo)[2], const uint4 (&hi)[2], uint32_t (&f)[8][4]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint32_t wl[4] = {lo[h].x, lo[h].y, lo[h].z, lo[h].w};
    const uint32_t wh[4] = {hi[h].x, hi[h].y, hi[h].z, hi[h].w};
#pragma unroll
    for (int st = 0; st < 4; ++st) {
      wgmma::e4m3x4_to_f16x2x2(wl[st], f[4 * h + st][0], f[4 * h + st][2]);
      wgmma::e4m3x4_to_f16x2x2(wh[st], f[4 * h + st][1], f[4 * h + st][3]);
    }
  }
}

// The output rows of this thread's 32 A rows of a transposed tile (rb + 8j + 2c4 + q; -1 from re on),
// loaded before any store, all in flight together: read between the stores (which the compiler cannot
// prove do not alias out_rows) they were 32 dependent round trips per tile, about the time of the
// tile's MMAs at K = 2048.
__device__ __forceinline__ void x_output_rows(const TmaFp8Extra& x, int rb, int re, int c4, int (&orow)[16][2]) {
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const int arow = rb + 8 * j + 2 * c4 + q;
      orow[j][q] = arow >= re ? -1 : x.out_rows ? __ldg(x.out_rows + arow) : arow;
    }
}

// Writes a warpgroup's part of the (transposed) tile: acc[j][q] (q = 0, 1) is weight row row_lo
// and A row rb + 8j + 2c + q (c = lane % 4), acc[j][q + 2] the same A row and row_hi; A rows from re
// on are not written (rb, re: the tile's rows, or one pass of them). Down: f32 y (+ bias); up: the
// activation, h in T. Each store writes one element (consecutive lanes g write consecutive columns
// of one output row).
template <class T, int ACT>
__device__ __forceinline__ void store_tile_x(const GroupedGemmArgs& a, const TmaFp8Extra& x, float (&acc)[16][4], int m, int n,
                                             int rb, int re, int cw, int warp_in_wg, int lane, int row_lo, int row_hi) {
  const int e = a.plan.tiles[m].x;
  const T* bias = a.bias ? static_cast<const T*>(a.bias) + int64_t(e) * a.N : nullptr;
  const int c4 = lane & 3;
  const int i = n * 64 + 32 * cw + 8 * warp_in_wg + (lane >> 2);  // gated: the intermediate channel
  const int col_lo = n * 128 + row_lo, col_hi = n * 128 + row_hi;  // down / plain: the output columns
  float b_lo = 0.0f, b_hi = 0.0f;
  if (bias) {
    if (a.epi == Epi::up_concat) {
      if (i < a.I) {
        b_lo = to_f32(bias[i]);
        b_hi = to_f32(bias[a.I + i]);
      }
    } else if (a.epi == Epi::up_interleaved) {
      if (i < a.I) {
        b_lo = to_f32(bias[2 * i]);
        b_hi = to_f32(bias[2 * i + 1]);
      }
    } else {
      if (col_lo < a.N) b_lo = to_f32(bias[col_lo]);
      if (col_hi < a.N) b_hi = to_f32(bias[col_hi]);
    }
  }
  int orow[16][2];
  x_output_rows(x, rb, re, c4, orow);
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const int row = orow[j][q];
      if (row < 0) continue;
      const float lo = acc[j][q] + b_lo, hi = acc[j][q + 2] + b_hi;
      if (a.epi == Epi::down) {
        float* out = static_cast<float*>(a.out) + int64_t(row) * a.ldo;
        if (col_lo < a.N) out[col_lo] = lo;
        if (col_hi < a.N) out[col_hi] = hi;
      } else if (a.epi == Epi::up_plain) {
        T* out = static_cast<T*>(a.out) + int64_t(row) * a.ldo;
        if (col_lo < a.N) out[col_lo] = from_f32<T>(pact<ACT>(a.act, lo));
        if (col_hi < a.N) out[col_hi] = from_f32<T>(pact<ACT>(a.act, hi));
      } else if (i < a.I) {
        T* out = static_cast<T*>(a.out) + int64_t(row) * a.ldo;
        out[i] = from_f32<T>(gact<ACT>(a.act, lo, hi));
      }
    }
}

// SiLU compiled in, in its accurate form (expf): h is quantized to e4m3 again before the down GEMM,
// and the fast form's ~1e-5 moved enough elements across a code boundary to measure 3.4e-4 against
// the reference on f32 activations (H200, 2026-12-01), where the portable path measured 1.2e-5.
template <class T>
__device__ __forceinline__ void epilogue_x(const GroupedGemmArgs& a, const TmaFp8Extra& x, float (&acc)[16][4], int m, int n, int rb,
                                           int re, int cw, int warp_in_wg, int lane, int row_lo, int row_hi) {
  if (x.compact_epilogue && a.epi != Epi::down && a.act.kind == int(Activation::silu))
    store_tile_x<T, int(Activation::silu)>(a, x, acc, m, n, rb, re, cw, warp_in_wg, lane, row_lo, row_hi);
  else
    store_tile_x<T, kActRuntime>(a, x, acc, m, n, rb, re, cw, warp_in_wg, lane, row_lo, row_hi);
}

// ---- the wide exact FP8 variant (X = 4) ------------------------------------------------------------
// This thread's weight rows of the stage's 256-row weight tile, r[b][0] / r[b][1] for its m64 block b
// (wgmma rows 16·warp + g and + 8 of the warpgroup's block b). Concatenated gated layout (tile rows
// [0, 128) gate, [128, 256) up): block 0 the gate rows of channels i, i + 8 (i = 64·cw + 16·warp + g of
// the tile's 128), block 1 their up rows, so a channel's gate and up sums land in one thread.
// Down / plain: warpgroup cw the tile rows [128·cw, +128), block b the 64 from 128·cw + 64·b.
__device__ __forceinline__ void xw_weight_rows(Epi epi, int cw, int warp_in_wg, int g, int (&r)[2][2]) {
  if (epi == Epi::up_concat) {
    const int i = 64 * cw + 16 * warp_in_wg + g;
    r[0][0] = i;
    r[0][1] = i + 8;
    r[1][0] = 128 + i;
    r[1][1] = 136 + i;
  } else {
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      r[b][0] = 128 * cw + 64 * b + 16 * warp_in_wg + g;
      r[b][1] = r[b][0] + 8;
    }
  }
}

// Writes a warpgroup's part of the wide transposed tile: acc[16·b + j][q + 2·h] is weight row r[b][h]
// (xw_weight_rows) and A row rb + 8j + 2c + q (c = lane % 4, q = 0, 1); A rows from re on are not
// written. Down: f32 y (+ bias); plain: the activation, h in T; concatenated gated: h of channels
// n·128 + i, i + 8 from the gate (block 0) and up (block 1) sums.
template <class T, int ACT>
__device__ __forceinline__ void store_tile_xw(const GroupedGemmArgs& a, const TmaFp8Extra& x, float (&acc)[32][4], int m, int n,
                                              int rb, int re, int cw, int warp_in_wg, int lane, const int (&r)[2][2]) {
  const int e = a.plan.tiles[m].x;
  const T* bias = a.bias ? static_cast<const T*>(a.bias) + int64_t(e) * a.N : nullptr;
  const int c4 = lane & 3;
  const bool gated = a.epi == Epi::up_concat;
  // gated: the channels of rows h = 0, 1; otherwise the output columns of [b][h]
  const int ch[2] = {n * 128 + r[0][0], n * 128 + r[0][1]};
  int col[2][2];
  float bs[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};  // the bias of [b][h] (gated: b 0 gate, 1 up)
#pragma unroll
  for (int b = 0; b < 2; ++b)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      col[b][h] = n * 256 + r[b][h];
      if (bias) {
        if (gated) {
          if (ch[h] < a.I) bs[b][h] = to_f32(bias[b * a.I + ch[h]]);
        } else if (col[b][h] < a.N) {
          bs[b][h] = to_f32(bias[col[b][h]]);
        }
      }
    }
  int orow[16][2];
  x_output_rows(x, rb, re, c4, orow);
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const int row = orow[j][q];
      if (row < 0) continue;
      if (gated) {
        T* out = static_cast<T*>(a.out) + int64_t(row) * a.ldo;
#pragma unroll
        for (int h = 0; h < 2; ++h)
          if (ch[h] < a.I)
            out[ch[h]] = from_f32<T>(gact<ACT>(a.act, acc[j][q + 2 * h] + bs[0][h], acc[16 + j][q + 2 * h] + bs[1][h]));
      } else if (a.epi == Epi::down) {
        float* out = static_cast<float*>(a.out) + int64_t(row) * a.ldo;
#pragma unroll
        for (int b = 0; b < 2; ++b)
#pragma unroll
          for (int h = 0; h < 2; ++h)
            if (col[b][h] < a.N) out[col[b][h]] = acc[16 * b + j][q + 2 * h] + bs[b][h];
      } else {  // up_plain
        T* out = static_cast<T*>(a.out) + int64_t(row) * a.ldo;
#pragma unroll
        for (int b = 0; b < 2; ++b)
#pragma unroll
          for (int h = 0; h < 2; ++h)
            if (col[b][h] < a.N) out[col[b][h]] = from_f32<T>(pact<ACT>(a.act, acc[16 * b + j][q + 2 * h] + bs[b][h]));
      }
    }
}

// The wide tile's epilogue: SiLU compiled in (accurate form, as epilogue_x) or the run-time switch.
template <class T>
__device__ __forceinline__ void epilogue_xw(const GroupedGemmArgs& a, const TmaFp8Extra& x, float (&acc)[32][4], int m, int n, int rb,
                                            int re, int cw, int warp_in_wg, int lane, const int (&r)[2][2]) {
  if (x.compact_epilogue && a.epi != Epi::down && a.act.kind == int(Activation::silu))
    store_tile_xw<T, int(Activation::silu)>(a, x, acc, m, n, rb, re, cw, warp_in_wg, lane, r);
  else
    store_tile_xw<T, kActRuntime>(a, x, acc, m, n, rb, re, cw, warp_in_wg, lane, r);
}

// Ping-pong consumer (PP kernels): consumer warpgroup cw computes whole 128 × BN tiles (both 64-row
// halves, two accumulator sets), the CTA's work items j = cw, cw + 2, …, so that one warpgroup's
// epilogue runs while the other's MMAs use the tensor cores. The producer fills the ring in item
// order; item j's stages are ring positions [j·ktiles, (j+1)·ktiles). A warpgroup starts waiting for
// item j's stages only after the other one has seen every stage of item j − 1 (turn barriers), so the
// full barrier of each position is at most one phase away from it and its parity is unambiguous.
// full_bar / empty_bar / turn_bar: the kernel's barrier addresses. MC: in 2-CTA clusters as the
// cooperative kernel (every stage released to both CTAs; the rank-1 CTA of an odd last pair computes
// and writes nothing).
template <class T, int BN, bool GATHER, bool MC, class WorkItem, class FullBar, class EmptyBar, class TurnBar>
__device__ __forceinline__ void pingpong_consumer(const GroupedGemmArgs& a, const TmaFp8Extra& x, int cw, int tid, int first_item,
                                                  int item_step, int total, int ktiles, uint32_t sA, uint32_t sB, uint32_t rank,
                                                  WorkItem work_item, FullBar full_bar, EmptyBar empty_bar, TurnBar turn_bar) {
  using Cfg = TmaCfg<BN, false>;
  constexpr int STAGES = Cfg::STAGES, B_BYTES = Cfg::B_BYTES, NF = BN / 8;
  const int warp_in_wg = (tid >> 5) & 3, lane = tid & 31;
  float acc[2][NF][4];
  auto release = [&](int st) {
    __syncwarp();
    if (lane == 0) mbar_arrive(empty_bar(st));
    if constexpr (MC) {
      if (lane == 1) mbar_arrive_cluster(empty_bar(st), rank ^ 1u);  // in parallel with lane 0's
    }
  };
  int mine = 0;  // items of this warpgroup so far
  for (int j = cw; first_item + j * item_step < total; j += 2, ++mine) {
    int m, n;
    bool shared, own;
    work_item(first_item + j * item_step, m, n, shared, own);
    // warpgroup 1's item k follows warpgroup 0's item k, warpgroup 0's item k its item k − 1 of 1
    if (cw == 1 || mine > 0) mbar_wait(turn_bar(cw), uint32_t(cw == 1 ? mine : mine - 1) & 1u);
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int f = 0; f < NF; ++f)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[h][f][q] = 0.0f;
    const int64_t pos = int64_t(j) * ktiles;
    int stage = int(pos % STAGES);
    uint32_t phase = uint32_t((pos / STAGES) & 1);
    int prev = -1;
    for (int kt = 0; kt < ktiles; ++kt) {
      mbar_wait(full_bar(stage), phase);
      if constexpr (GATHER) wgmma::fence_proxy_async();  // cp.async (generic proxy) -> wgmma (async proxy)
      const uint32_t a_tile = sA + uint32_t(stage) * A_BYTES;
      const uint32_t b_tile = sB + uint32_t(stage) * B_BYTES;
      wgmma::fence_acc(acc[0]);
      wgmma::fence_acc(acc[1]);
      wgmma::fence();
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk) {
        const uint64_t db = wgmma::desc_sw128(b_tile + kk * 32);
        wgmma::mma_m64k16<T, BN>(acc[0], wgmma::desc_sw128(a_tile + kk * 32), db);
        wgmma::mma_m64k16<T, BN>(acc[1], wgmma::desc_sw128(a_tile + 64 * 128 + kk * 32), db);
      }
      wgmma::commit();
      wgmma::wait<1>();
      wgmma::fence_acc(acc[0]);
      wgmma::fence_acc(acc[1]);
      if (prev >= 0) release(prev);
      prev = stage;
      next_stage<STAGES>(stage, phase);
    }
    if ((tid & 127) == 0) mbar_arrive(turn_bar(cw ^ 1));  // every stage of item j has arrived
    wgmma::wait<0>();
    wgmma::fence_acc(acc[0]);
    wgmma::fence_acc(acc[1]);
    if (prev >= 0) release(prev);
    if (!own) continue;
    epilogue<T, BN>(a, x, acc[0], m, n, 0, warp_in_wg, lane);
    epilogue<T, BN>(a, x, acc[1], m, n, 1, warp_in_wg, lane);
  }
}

// T: the activation dtype (bias, the h output of bf16/f16 GEMMs). FP8: A and B are e4m3 codes with
// the two-level accumulation (see the comment at the top of sm90_tma_grouped_gemm.cu).
// MC: launched in clusters of 2 CTAs (see "2-CTA clusters" at the top of sm90_tma_grouped_gemm.cu).
// PP: ping-pong consumers (see "Ping-pong" there).
template <class T, int BN, bool GATHER, bool FP8, bool MC, bool PP, int X>
__global__ void __launch_bounds__(THREADS, 1)
    grouped_gemm_tma(const __grid_constant__ CUtensorMap tm_b, const __grid_constant__ CUtensorMap tm_a,
                     const __grid_constant__ CUtensorMap tm_sa, const __grid_constant__ GroupedGemmArgs a,
                     const __grid_constant__ TmaFp8Extra x, int n_tiles) {
  using Cfg = TmaCfg<BN, FP8, X>;
  // A elements: bf16 / f16 (T), e4m3 codes (FP8), f16 codes (X)
  using Elem = std::conditional_t<X, uint16_t, std::conditional_t<FP8, uint8_t, T>>;
  constexpr int STAGES = Cfg::STAGES, B_BYTES = Cfg::B_BYTES, A_STAGE = Cfg::A_STAGE, NF = BN / 8;
  // K elements per stage (128 bytes per row either way; X = 6: 64, the f16 operands' 128 bytes)
  // X = 6 (XC): the converting kernel (the weight tile converted to f16 by producer warps 1-3)
  constexpr bool XC = converts_weights(X);
  constexpr int W8_SLOTS = Cfg::W8_SLOTS;
  constexpr int BKE = XC ? 64 : FP8 ? 128 : BK;
  constexpr int CHUNK = 16 / int(sizeof(Elem));  // K elements per 16-byte cp.async chunk
  // FP8 keeps two accumulator sets; at BN = 256 its partial set covers one 128-column half at a time
  static_assert(!FP8 || BN == 128 || (BN == 256 && (!X || X >= 4)), "FP8: 128-wide N tiles (256-wide: QGMMA and X = 4 / 5 / 6 only)");
  static_assert(X < 4 || BN == 256, "the wide exact variants: 256 weight rows per tile");
  static_assert(!PP || (!FP8 && BN == 128), "ping-pong: bf16 / f16, 128-wide tiles");
  static_assert(!X || (FP8 && !MC && !PP), "the exact FP8 variant: FP8, cooperative, no clusters");
  static_assert(X != 2 || BN == 128, "the untransposed exact variant: 128-wide tiles");
  static_assert(X != 3 || !GATHER, "the few-row exact variant: A rows by TMA (the gather writes 128 rows)");
  static_assert(!XC || !GATHER, "the converting exact variant: A rows by TMA (warps 1-3 convert the weights)");
  // the transposed exact kernels (D[weight row][A row]): all rows of a tile at once (1), or in
  // passes of XR_ROWS rows (3)
  constexpr bool XT = X == 1 || (X >= 3 && X <= 5);
  constexpr int X_SUB = Cfg::X_SUB;
  constexpr uint32_t HALF_B = (BN / 2) * 128;  // bytes of half a B stage (BN/2 weight rows)
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = ptx::smem_u32(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  const uint32_t sA = base, sB = base + STAGES * A_STAGE;
  const uint32_t sF = sB + STAGES * B_BYTES;                    // X = 2: [2][F_BYTES] f16 weights
  const uint32_t sW8 = sF + 2 * Cfg::F_BYTES;                   // X = 6: [W8_SLOTS][W8_BYTES] e4m3 weights
  const uint32_t sSA = sW8 + W8_SLOTS * Cfg::W8_BYTES;          // FP8: [STAGES][128] f32
  // barriers and small shared values, in this order: full[STAGES], empty[STAGES], num_m (8 bytes),
  // turn[2] (PP), item_full[ITEM_SLOTS], item_empty[ITEM_SLOTS], items[ITEM_SLOTS] (dynamic schedule)
  const uint32_t bars = sSA + (FP8 ? STAGES * SA_BYTES : 0);
  int* s_num_m = reinterpret_cast<int*>(smem_raw + (bars - raw) + 16 * STAGES);
  // PP: turn[w] completes each time the other consumer warpgroup has seen every stage of an item
  auto turn_bar = [&](int w) { return bars + 16u * uint32_t(STAGES) + 8u + 8u * uint32_t(w); };
  auto full_bar = [&](int s) { return bars + 8u * uint32_t(s); };
  auto empty_bar = [&](int s) { return bars + 8u * uint32_t(STAGES + s); };
  auto item_full = [&](int s) { return bars + 16u * uint32_t(STAGES) + 24u + 8u * uint32_t(s); };
  auto item_empty = [&](int s) { return bars + 16u * uint32_t(STAGES) + 24u + 8u * uint32_t(ITEM_SLOTS + s); };
  int* s_items = reinterpret_cast<int*>(smem_raw + (bars - raw) + 16 * STAGES + 24 + 16 * ITEM_SLOTS);
  // X = 6: conv[STAGES] after the items, completed when warps 1-3 have converted the stage's weights
  auto conv_bar = [&](int s) { return bars + 16u * uint32_t(STAGES) + 24u + 20u * ITEM_SLOTS + 8u * uint32_t(s); };
  static_assert((16 * STAGES + 24 + 20 * ITEM_SLOTS) % 8 == 0, "conv barriers: 8-byte aligned");
  static_assert(16 * (STAGES + ITEM_SLOTS) + 24 + 4 * ITEM_SLOTS + (XC ? 8 * STAGES : 0) <= 256,
                "the barriers outgrow SMEM_BYTES' 256-byte reserve");

  // The dynamic schedule (x.work_counter set; cooperative kernels outside clusters): after its first
  // item (blockIdx.x) a CTA claims the next from a global counter as soon as its producer has issued
  // the current item's stages, so items are begun in order however the CTAs drift apart. Items with
  // neighbouring indices share their weight tile (the m tiles of one expert, same n tile) or their A
  // rows (the n tiles of one group): begun within microseconds of each other, the second reader finds
  // the data in L2. Under
  // the static stride (w += gridDim.x) the CTAs drift apart over the waves; ncu on deepseek_v3
  // T = 4096 (H200, 2026-12-01) measured 24.1 GB of DRAM reads in the up GEMM whose weights are 15.0
  // GB, i.e. the second m tile of an expert re-read its weights from DRAM. The producer's thread 0
  // claims and publishes each item into a ring of ITEM_SLOTS shared slots (item_full / item_empty
  // barriers) where the consumers (and the gather producer's other warps) read it. The counter pair
  // (claims, finished CTAs) is zero at launch: the routing plan zeroes it, and the last CTA to finish
  // resets it for the next launch on the same plan.
  const bool dyn = !MC && !PP && x.work_counter != nullptr;

  const int tid = threadIdx.x, wg = tid >> 7;
  // MC: the cluster (2 CTAs) is the unit of the persistent schedule; rank = this CTA's half.
  const uint32_t rank = MC ? cluster_ctarank() : 0u;
  const int first_item = MC ? int(blockIdx.x >> 1) : int(blockIdx.x);
  const int item_step = MC ? int(gridDim.x >> 1) : int(gridDim.x);
  if (tid == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full_bar(s), GATHER ? 129u : 1u);  // thread 0's expect_tx (+ 128 cp.async arrivals)
      // one arrival per consumer warp that reads the stage: of both CTAs (MC), of one warpgroup (PP)
      mbar_init(empty_bar(s), (MC ? 2u : 1u) * (PP ? 4u : 8u));
      if (XC) mbar_init(conv_bar(s), 3u);  // one arrival per converting warp
    }
    if (PP) {
      mbar_init(turn_bar(0), 1u);
      mbar_init(turn_bar(1), 1u);
    }
    if (dyn) {
      for (int s = 0; s < ITEM_SLOTS; ++s) {
        mbar_init(item_full(s), 1u);
        // read by the 8 consumer warps and, in the gather and converting (X = 6) variants, producer
        // warps 1-3 (the gather's warp 0 gets the item from thread 0 by a shuffle)
        mbar_init(item_empty(s), GATHER || XC ? 11u : 8u);
      }
    }
    mbar_fence_init();
    // valid m tiles come first in the table, then expert -1: find the first invalid one
    int lo = 0, hi = a.plan.max_tiles;
    while (lo < hi) {
      const int mid = (lo + hi) >> 1;
      if (a.plan.tiles[mid].x >= 0) lo = mid + 1;
      else hi = mid;
    }
    *s_num_m = lo;
  }
  __syncthreads();
  if constexpr (MC) cluster_sync();  // the peer's barriers exist before any multicast / remote arrive
  // The valid m tiles, their pairs (MC) and the work items: read from shared memory where used
  // rather than held from here, across the roles' register reallocation (held, the gather producer
  // spilled them to local memory).
  const volatile int* v_num_m = s_num_m;
  auto num_m_now = [&] { return *v_num_m; };
  auto total_items = [&] { return (MC ? (num_m_now() + 1) >> 1 : num_m_now()) * n_tiles; };
  const int Kdim = a.Kdim;
  const int ktiles = (Kdim + BKE - 1) / BKE;
  const int a_ld = X ? x.a_ld : Kdim;  // elements per A row in memory (X: padded to a multiple of 128)
  const bool concat = a.epi == Epi::up_concat;
  // Work item w -> this CTA's m tile and the n tile. MC: the pair (2p, 2p+1) of m tiles; `shared`
  // when both belong to one expert (same B tile: each CTA loads one half and multicasts it);
  // `own` false for rank 1 of an odd last pair, which recomputes tile 2p and writes nothing.
  auto work_item = [&](int w, int& m, int& n, bool& shared, bool& own) {
    const int num_m = num_m_now();
    if constexpr (MC) {
      int p;
      decode_work(w, (num_m + 1) >> 1, n_tiles, x.group_m, p, n);
      const int m0 = 2 * p, m1 = min(2 * p + 1, num_m - 1);
      own = 2 * p + int(rank) < num_m;
      m = rank ? m1 : m0;
      shared = a.plan.tiles[m0].x == a.plan.tiles[m1].x;
    } else {
      decode_work(w, num_m, n_tiles, x.group_m, m, n);
      shared = false;
      own = true;
    }
  };

  // A reader warp of the dynamic schedule's item ring (the consumers, X = 6's converting warps): the
  // next item; `items` counts the items read so far (slot items % ITEM_SLOTS)
  auto read_item = [&](int& items, int lane) {
    const int islot = items % ITEM_SLOTS;
    mbar_wait(item_full(islot), uint32_t(items / ITEM_SLOTS) & 1u);
    ++items;
    const int w = s_items[islot];
    __syncwarp();
    if (lane == 0) mbar_arrive(item_empty(islot));
    return w;
  };

  // X = 6: producer warps 1-3 (ct = 0..95) convert each stage's e4m3 weight tile (sW8, [BN rows][64 B])
  // into f16 (sB, [BN rows][64 k], 128B-swizzled: the consumers' wgmma B operand) once TMA has
  // brought it, then complete the stage's conv barrier. They walk the items and stages in the order of
  // the producer and the consumers. The rows of a weight block whose scale is 0 are written as zeros
  // (such a block adds nothing; the consumers' rescale carries the scale before it, see X = 6 there).
  // The e4m3 -> f16 conversion is exact. 16-byte chunk c of a row (k 16c..16c+15) becomes the f16
  // chunks 2c and 2c + 1; consecutive threads take consecutive chunks (4 per row), so each 8-thread
  // phase of the 16-byte accesses covers two rows and, with the swizzle, 8 distinct bank groups.
  // Thread ct converts chunks ct + 96 i (i = 0..10; 10 only for ct < 64): rows ct / 4 + 24 i, so its
  // chunk position (ct % 4) and swizzle (row % 8) are the same for every i and the addresses are
  // immediates. Four chunks' loads are issued before their conversions: the first form (one chunk
  // at a time, a zero-block select after each load) waited on every load and converted a stage in ~2x
  // the consumers' MMA time (ncu, H100, 2026-12-06: the consumers' conv wait the top stall).
  // (a generic lambda: compiled only where X = 6 calls it)
  auto x6_converter = [&](auto ct) {
    constexpr int CT = 96, PER = (BN * 4 + CT - 1) / CT;  // converting threads; chunks per thread (11)
    constexpr uint32_t SRC_STEP = CT * 16, DST_STEP = (CT / 4) * 128;  // bytes between a thread's chunks
    const int lane = ct & 31;
    const bool has_last = ct + (PER - 1) * CT < BN * 4;
    auto has_chunk = [&](int i) { return i < PER - 1 || (i == PER - 1 && has_last); };  // chunk ct + CT i exists
    const int row0 = ct >> 2, ch = ct & 3;
    static_assert((CT / 4) % 8 == 0, "a thread's chunks keep their swizzle: CT / 4 rows apart, a multiple of 8");
    const uint32_t off0 = uint32_t(((2 * ch) ^ (row0 & 7)) << 4), off1 = uint32_t(((2 * ch + 1) ^ (row0 & 7)) << 4);
    auto convert_store = [&](uint4 v, uint32_t d) {
      uint32_t f[8];
      wgmma::e4m3x4_to_f16x2x2(v.x, f[0], f[1]);
      wgmma::e4m3x4_to_f16x2x2(v.y, f[2], f[3]);
      wgmma::e4m3x4_to_f16x2x2(v.z, f[4], f[5]);
      wgmma::e4m3x4_to_f16x2x2(v.w, f[6], f[7]);
      ptx::sts128(d + off0, f[0], f[1], f[2], f[3]);
      ptx::sts128(d + off1, f[4], f[5], f[6], f[7]);
    };
    int stage = 0;
    uint32_t phase = 0;
    int items = 0;
    for (int w = int(blockIdx.x);; w += int(gridDim.x)) {
      if (dyn) w = read_item(items, lane);
      if (w >= total_items()) break;
      int m, n;
      bool shared, own;
      work_item(w, m, n, shared, own);
      int64_t ws_lo, ws_hi;
      weight_scale_rows<BN>(a, a.plan.tiles[m].x, n, ws_lo, ws_hi);
      for (int kt = 0; kt < ktiles; ++kt) {
        const bool zero_lo = weight_scale(x, ws_lo + (kt >> 1)) == 0.0f;
        const bool zero_hi = weight_scale(x, ws_hi + (kt >> 1)) == 0.0f;
        mbar_wait(full_bar(stage), phase);  // weights and A by TMA (after the stage's release)
        const uint32_t src = sW8 + uint32_t(stage) * Cfg::W8_BYTES + uint32_t(ct) * 16u;
        const uint32_t dst = sB + uint32_t(stage) * B_BYTES + uint32_t(row0) * 128u;
        if (!zero_lo && !zero_hi) {
#pragma unroll
          for (int i0 = 0; i0 < PER; i0 += 4) {
            uint4 v[4];
#pragma unroll
            for (int j = 0; j < 4; ++j)
              if (has_chunk(i0 + j)) v[j] = ptx::lds128(src + uint32_t(i0 + j) * SRC_STEP);
#pragma unroll
            for (int j = 0; j < 4; ++j)
              if (has_chunk(i0 + j)) convert_store(v[j], dst + uint32_t(i0 + j) * DST_STEP);
          }
        } else {  // a zero weight block in the stage (rare): its rows as zeros
          for (int i = 0; i < PER && has_chunk(i); ++i) {
            const bool zero = row0 + (CT / 4) * i < BN / 2 ? zero_lo : zero_hi;
            const uint4 v = zero ? make_uint4(0u, 0u, 0u, 0u) : ptx::lds128(src + uint32_t(i) * SRC_STEP);
            convert_store(v, dst + uint32_t(i) * DST_STEP);
          }
        }
        wgmma::fence_proxy_async();  // the generic-proxy stores, before the consumers' wgmma reads them
        __syncwarp();
        if (lane == 0) mbar_arrive(conv_bar(stage));
        next_stage<STAGES>(stage, phase);
      }
    }
  };

  if (wg == 0) {
    // ================================ producer ================================
    setmaxnreg_dec<56>();
    if constexpr (XC) {
      if (tid >= 32) {  // warps 1-3: the weight converter
        x6_converter(tid - 32);
        return;
      }
    }
    if (!GATHER && tid != 0) return;
    if (tid == 0) {
      prefetch_tmap(&tm_b);
      if (!GATHER) prefetch_tmap(&tm_a);
      if (!GATHER && FP8) prefetch_tmap(&tm_sa);
    }
    const Elem* A = static_cast<const Elem*>(a.A);
    int stage = 0;
    uint32_t phase = 0;
    int items = 0;  // items through the ring so far (dynamic schedule): slot items % ITEM_SLOTS
    for (int w = MC ? first_item : int(blockIdx.x);;) {
      if (dyn) {
        const int islot = items % ITEM_SLOTS;
        const uint32_t iphase = uint32_t(items / ITEM_SLOTS) & 1u;
        ++items;
        // publish item w (thread 0 holds it: blockIdx.x first, then its claims)
        if (tid == 0) {
          mbar_wait(item_empty(islot), iphase ^ 1u);
          s_items[islot] = w;
          mbar_arrive(item_full(islot));  // release: the consumers' wait acquires the slot's value
        }
        if constexpr (GATHER) {
          if (tid < 32) {
            w = __shfl_sync(0xffffffffu, w, 0);
          } else {
            mbar_wait(item_full(islot), iphase);
            w = s_items[islot];
            __syncwarp();
            if ((tid & 31) == 0) mbar_arrive(item_empty(islot));
          }
        }
      }
      if (w >= total_items()) break;  // re-read: the gather producer has no register to spare
      int m, n;
      bool shared, own;
      work_item(w, m, n, shared, own);
      const int4 tile = a.plan.tiles[m];
      const int e = tile.x, re = tile.z;
      int src[GATHER ? 8 : 1];
      int scale_src = -1;  // FP8 gather: source row of this thread's row (tid) of the tile
      if constexpr (GATHER) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const int sr = tile.y + (tid >> 3) + 16 * j;
          src[j] = sr < re ? a.a_gather[sr] / a.a_div : -1;
        }
        if constexpr (FP8) scale_src = tile.y + tid < re ? a.a_gather[tile.y + tid] / a.a_div : -1;
      }
      // X = 3: the tile's rows in passes of XR_ROWS (each streams the weight tile); otherwise one pass
      const int passes = tile_passes<X>(tile);
      for (int pass = 0; pass < passes; ++pass) {
        const int rb = tile.y + pass * pass_rows<X>();  // first A row of this pass
        // TMA A: only the boxes of ABOX rows that hold the tile's rows are loaded; the smem rows past
        // them keep stale data, computed and discarded like the rows past re (an MMA row depends on
        // its own A row only). Few-row experts (decode, deepseek_v3 at T = 512: 16 rows) then stop
        // pulling 128 rows of h through L2 per stage for every n tile.
        const int a_boxes = GATHER ? 0 : (min(re - rb, pass_rows<X>()) + ABOX - 1) / ABOX;
        // X = 6: one stage's e4m3 weight tile into staging bytes dW (gate / up halves of BN/2 rows in
        // the concatenated layout, else BN rows; 64 bytes of k per row), completing on barrier bar
        [[maybe_unused]] auto load_w8 = [&](uint32_t dW, uint32_t bar, int k0) {
          if (concat) {
            tma_load_3d(dW, &tm_b, bar, k0, n * (BN / 2), e);
            tma_load_3d(dW + (BN / 2) * 64, &tm_b, bar, k0, a.I + n * (BN / 2), e);
          } else {
            tma_load_3d(dW, &tm_b, bar, k0, n * BN, e);
          }
        };
        // X = 6: the stage's e4m3 weights (B is their f16 conversion, written by warps 1-3) and one
        // 64-k sub-tile of A codes
        const uint32_t tx_bytes = (XC ? Cfg::W8_BYTES : B_BYTES) +
                                  (GATHER ? 0 : a_boxes * ABOX * 128 * (X && !XC ? 2 : 1) + (FP8 ? SA_BYTES : 0));
        for (int kt = 0; kt < ktiles; ++kt) {
          mbar_wait(empty_bar(stage), phase ^ 1u);
          const int k0 = kt * BKE;
          if (tid == 0) {
            const uint32_t fb = full_bar(stage);
            mbar_arrive_expect_tx(fb, tx_bytes);
            const uint32_t dB = sB + uint32_t(stage) * B_BYTES;
            if constexpr (XC) {
              load_w8(sW8 + uint32_t(stage) * Cfg::W8_BYTES, fb, k0);
            } else if (MC) {
              // halves: gate / up rows (concat) or rows [n*BN, +BN/2), [n*BN + BN/2, +BN/2)
              const int r0 = concat ? n * (BN / 2) : n * BN, r1 = concat ? a.I + n * (BN / 2) : n * BN + BN / 2;
              if (shared) {
                tma_load_3d_multicast(dB + rank * HALF_B, &tm_b, fb, k0, rank ? r1 : r0, e, uint16_t(3));
              } else {
                tma_load_3d(dB, &tm_b, fb, k0, r0, e);
                tma_load_3d(dB + HALF_B, &tm_b, fb, k0, r1, e);
              }
            } else if (concat) {
              tma_load_3d(dB, &tm_b, fb, k0, n * (BN / 2), e);
              tma_load_3d(dB + HALF_B, &tm_b, fb, k0, a.I + n * (BN / 2), e);
            } else {
              tma_load_3d(dB, &tm_b, fb, k0, n * BN, e);
            }
            if constexpr (!GATHER) {
              for (int b = 0; b < a_boxes; ++b) {
                const uint32_t dA = sA + uint32_t(stage) * A_STAGE + uint32_t(b * ABOX * 128);
                tma_load_2d(dA, &tm_a, fb, k0, rb + b * ABOX);
                if constexpr (X && !XC) tma_load_2d(dA + X_SUB, &tm_a, fb, k0 + 64, rb + b * ABOX);  // k 64-127
              }
              // the activation scales of the stage's 128-k block (X = 6: two stages per block)
              if constexpr (FP8) tma_load_2d(sSA + uint32_t(stage) * SA_BYTES, &tm_sa, fb, rb, XC ? kt >> 1 : kt);
            }
          }
          if constexpr (GATHER) {
            const int c = tid & 7, k = k0 + c * CHUNK;
            const uint32_t dA = sA + uint32_t(stage) * A_STAGE;
#pragma unroll
            for (int j = 0; j < 8; ++j) {
              const int r = (tid >> 3) + 16 * j;
              const uint32_t d = dA + uint32_t(r * 128 + ((c ^ (r & 7)) << 4));
              const bool ok = src[j] >= 0 && k < a_ld;
              const Elem* p = ok ? A + int64_t(src[j]) * a_ld + k : A;
              ptx::cp_async16(d, p, ok);
              // X: the same row's k + 64 in the second sub-tile (a_ld is a multiple of 128: in range)
              if constexpr (X) ptx::cp_async16(d + X_SUB, ok ? p + 64 : A, ok);
            }
            if constexpr (FP8)
              cp_async4(sSA + uint32_t(stage) * SA_BYTES + 4u * uint32_t(tid),
                        scale_src >= 0 ? x.a_scales + int64_t(kt) * x.a_scales_ld + scale_src : x.a_scales, scale_src >= 0);
            cp_async_mbar_arrive_noinc(full_bar(stage));
          }
          next_stage<STAGES>(stage, phase);
        }
      }
      // the next item: claimed once this one's stages are issued (the ring's STAGES filled stages
      // keep the consumers busy over the atomic's round trip; claimed earlier, the result held a
      // register across the loop and the gather producer spilled)
      if (!dyn) w += item_step;
      else if (tid == 0) w = int(gridDim.x) + atomicAdd(x.work_counter, 1);
    }
    if (dyn && tid == 0) {
      // every claim of this CTA has returned (its last one ended the loop); the last CTA to get
      // here resets the counters for the next launch
      __threadfence();
      if (atomicAdd(x.work_counter + 1, 1) == int(gridDim.x) - 1) {
        atomicExch(x.work_counter, 0);
        atomicExch(x.work_counter + 1, 0);
      }
    }
    if constexpr (GATHER) ptx::cp_async_wait<0>();
  } else {
    // ================================ consumers ================================
    setmaxnreg_inc<224>();
    const int total = total_items();
    if constexpr (PP) {
      pingpong_consumer<T, BN, GATHER, MC>(a, x, wg - 1, tid, first_item, item_step, total, ktiles, sA, sB, rank, work_item,
                                           full_bar, empty_bar, turn_bar);
      if constexpr (MC) cluster_sync();  // as at the end of the kernel
      return;
    }
    const int cw = wg - 1;                       // rows [cw*64, cw*64+64) of the tile
    const int warp_in_wg = (tid >> 5) & 3, lane = tid & 31;
    int stage = 0;
    uint32_t phase = 0;
    float acc[NF][4];
    // FP8: the partial sums of one 128-K block, for 128 columns (BN = 256: one half at a time)
    constexpr int NFP = FP8 && !XT && !XC ? (NF < 16 ? NF : 16) : 1;
    float part[NFP][4];
    // a stage is refilled when the consumers of every CTA that reads it released it (MC: the
    // peer's multicast writes into this CTA's stage too)
    auto release = [&](int s) {
      __syncwarp();
      if (lane == 0) mbar_arrive(empty_bar(s));
      if constexpr (MC) {
        if (lane == 1) mbar_arrive_cluster(empty_bar(s), rank ^ 1u);  // in parallel with lane 0's
      }
    };
    int items = 0;  // items through the ring so far (dynamic schedule): slot items % ITEM_SLOTS
    for (int w = MC ? first_item : int(blockIdx.x);; w += item_step) {
      if (dyn) w = read_item(items, lane);
      if (w >= total) break;
      int m, n;
      bool shared, own;
      work_item(w, m, n, shared, own);
      // A warpgroup with no row of its own in this tile (an expert's last tile holding <= 64 rows, or
      // rank 1 of an odd last pair, which writes nothing) only follows the ring: it waits for each
      // stage and releases it without MMAs, leaving the tensor cores to the other warpgroup. Its
      // accumulators stay zero and its epilogue writes nothing (every row is past re).
      // The flag is broadcast from lane 0 so that the compiler sees a warp-uniform branch (no extra
      // convergence barriers around the MMAs; the SASS keeps its 168 registers).
      bool idle = false;
      if (x.skip_idle_rows && !X) {  // X = 1: both warpgroups read every A row; 2: both convert the weights
        const int4 tile_rows = a.plan.tiles[m];
        idle = __shfl_sync(0xffffffffu, int(!own || tile_rows.z - tile_rows.y <= cw * 64), 0) != 0;
      }
#pragma unroll
      for (int j = 0; j < NF; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[j][q] = 0.0f;
      if (idle) {
        for (int kt = 0; kt < ktiles; ++kt) {
          mbar_wait(full_bar(stage), phase);
          release(stage);
          next_stage<STAGES>(stage, phase);
        }
      } else if constexpr (X == 2) {
        // ---- exact FP8, untransposed (opt-in, TmaFp8Extra::exact_nt): per 128-K block, part = A·Bᵀ
        // by HGMMA on f16 operands in shared memory (exact: e4m3 ⊂ f16, products exact, f32 sums),
        // then acc += part × activation scale (per A row) × weight block scale (per 64-column half),
        // as the QGMMA branch below promotes. A: the stage's f16 codes (natural k order). B: the
        // stage's e4m3 weight tile converted into f16 buffer kt % 2 by both consumer warpgroups
        // (thread ct: row ct / 2, k half ct % 2), the next stage's converted under this stage's MMAs.
        // Named barrier 1 (both warpgroups) after each stage: buffer kt % 2 read by every MMA before it
        // is written again, buffer (kt + 1) % 2 written by both halves before it is read.
        // Why: the transposed kernel spends ~323 instructions per stage and warp on conversion into
        // register fragments and 64 distinct scale products; here the promotion needs 4 products
        // and the conversion runs beside the tensor cores. Measured on the H200 (2026-12-02): correct, but
        // not faster (not profiled; likely the conversion's shared-memory traffic, ~192 KB per stage).
        const int e = a.plan.tiles[m].x;
        int64_t ws_lo, ws_hi;
        weight_scale_rows<BN>(a, e, n, ws_lo, ws_hi);
        const int srow = cw * 64 + warp_in_wg * 16 + (lane >> 2);
        const int ct = tid - 128, cr = ct >> 1, ch = ct & 1;
        // e4m3 [128 rows][128 B] (128B-swizzled TMA tile) -> f16 sub-tile ch of buffer fb, row cr:
        // e4m3 chunk c (k 16c..16c+15) becomes f16 chunks 2(c % 4) and 2(c % 4) + 1. The order j ^ 2ch
        // keeps each 8-thread phase of the 16-byte loads and stores on 8 distinct bank groups.
        auto convert = [&](int st, int fb) {
          const uint32_t src = sB + uint32_t(st) * B_BYTES + uint32_t(cr * 128);
          const uint32_t dst = sF + uint32_t(fb * Cfg::F_BYTES + ch * X_SUB_BYTES + cr * 128);
          const int sw = cr & 7;
#pragma unroll
          for (int j0 = 0; j0 < 4; ++j0) {
            const int j = j0 ^ (2 * ch), c = 4 * ch + j;
            const uint4 w = ptx::lds128(src + uint32_t((c ^ sw) << 4));
            uint32_t f[8];
            wgmma::e4m3x4_to_f16x2x2(w.x, f[0], f[1]);
            wgmma::e4m3x4_to_f16x2x2(w.y, f[2], f[3]);
            wgmma::e4m3x4_to_f16x2x2(w.z, f[4], f[5]);
            wgmma::e4m3x4_to_f16x2x2(w.w, f[6], f[7]);
            ptx::sts128(dst + uint32_t(((2 * j) ^ sw) << 4), f[0], f[1], f[2], f[3]);
            ptx::sts128(dst + uint32_t(((2 * j + 1) ^ sw) << 4), f[4], f[5], f[6], f[7]);
          }
        };
        mbar_wait(full_bar(stage), phase);
        if constexpr (GATHER) wgmma::fence_proxy_async();
        convert(stage, 0);
        wgmma::fence_proxy_async();  // the generic-proxy stores, before wgmma reads them
        ptx::named_barrier_sync(1, 256);
        for (int kt = 0; kt < ktiles; ++kt) {
          const int fb = kt & 1;
          const uint32_t a_tile = sA + uint32_t(stage) * A_STAGE + uint32_t(cw) * (64 * 128);
          const uint32_t b_tile = sF + uint32_t(fb * Cfg::F_BYTES);
          wgmma::fence_acc_first<16>(part);
          wgmma::fence();
#pragma unroll
          for (int kk = 0; kk < 8; ++kk) {
            const uint32_t sub = uint32_t((kk >> 2) * X_SUB_BYTES + (kk & 3) * 32);
            wgmma::wgmma_m64n128k16_f16(part, wgmma::desc_sw128(a_tile + sub), wgmma::desc_sw128(b_tile + sub), kk);
          }
          wgmma::commit();
          int next = stage;
          uint32_t next_phase = phase;
          next_stage<STAGES>(next, next_phase);
          if (kt + 1 < ktiles) {  // the next stage's weights, converted under this stage's MMAs
            mbar_wait(full_bar(next), next_phase);
            if constexpr (GATHER) wgmma::fence_proxy_async();
            convert(next, fb ^ 1);
            wgmma::fence_proxy_async();
          }
          const float w_lo = weight_scale(x, ws_lo + kt), w_hi = weight_scale(x, ws_hi + kt);
          wgmma::wait<0>();
          wgmma::fence_acc(part);
          const float* sa = reinterpret_cast<const float*>(smem_raw + (sSA - raw) + stage * SA_BYTES);
          const float sa0 = sa[srow], sa1 = sa[srow + 8];
          release(stage);
#pragma unroll
          for (int nf = 0; nf < NF; ++nf) {
            const float ws = nf < NF / 2 ? w_lo : w_hi;
            const float s0 = sa0 * ws, s1 = sa1 * ws;
            acc[nf][0] += part[nf][0] * s0;
            acc[nf][1] += part[nf][1] * s0;
            acc[nf][2] += part[nf][2] * s1;
            acc[nf][3] += part[nf][3] * s1;
          }
          ptx::named_barrier_sync(1, 256);
          stage = next;
          phase = next_phase;
        }
      } else if constexpr (XC) {
        // ---- exact FP8, untransposed, converted weight tiles (TmaFp8Extra::exact_conv): this
        // warpgroup computes rows [cw·64, +64) of the tile's A rows x its 256 weight rows with SS
        // HGMMA m64n256k16 on f16 operands (exact: e4m3 ⊂ f16, products exact, f32 sums), as the
        // bf16 kernel does: A = the stage's f16 token codes (TMA, natural k order), B = the stage's
        // weights converted to f16 by producer warps 1-3 (conv barrier). Why: the transposed
        // kernel (X = 1) converts the weights into register fragments and promotes partial sums in
        // each consumer's chain between its MMAs; here the consumers only issue MMAs, as in the bf16
        // kernel, and the tile is 256 wide (half the A bytes per MAC of X = 1).
        // The two-level accumulation on one accumulator set, as X = 4: after 128-k block kb the
        // accumulators hold R = acc / s(kb), s = activation scale (per A row) x weight block scale
        // (per 128-column half); block kb + 1's MMAs add its exact code products into R after R is
        // multiplied by s(kb) / s(kb + 1); the last block's R by s(last). A zero weight block adds
        // nothing (its f16 rows were written as zeros; x_step_scale carries the scale before it).
        // A block's first stage is released once its MMAs retire, the second once all retire; the
        // next block's activation scales come with its first stage (the one after the block's last:
        // the previous block's last, already released, so waiting for it cannot deadlock the ring).
        const int4 tile_rows = a.plan.tiles[m];
        int64_t ws_lo, ws_hi;
        weight_scale_rows<BN>(a, tile_rows.x, n, ws_lo, ws_hi);
        const int srow = cw * 64 + warp_in_wg * 16 + (lane >> 2);  // this thread's A rows: srow, srow + 8
        float w_lo = 1.0f, w_hi = 1.0f;  // the weight scales in effect (x_step_scale)
        bool z_lo, z_hi;
        x_step_scale(weight_scale(x, ws_lo), w_lo, z_lo);
        x_step_scale(weight_scale(x, ws_hi), w_hi, z_hi);
        // one stage's 4 MMAs (k 64) into the accumulators, one commit group
        auto issue_stage = [&](int st, uint32_t ph) {
          mbar_wait(full_bar(st), ph);  // A and the activation scales (TMA)
          mbar_wait(conv_bar(st), ph);  // B (warps 1-3)
          const uint32_t a_tile = sA + uint32_t(st) * A_STAGE + uint32_t(cw) * (64 * 128);
          const uint32_t b_tile = sB + uint32_t(st) * B_BYTES;
          wgmma::fence_acc(acc);
          wgmma::fence();
#pragma unroll
          for (int kk = 0; kk < 4; ++kk)
            wgmma::wgmma_m64n256k16_f16(acc, wgmma::desc_sw128(a_tile + kk * 32), wgmma::desc_sw128(b_tile + kk * 32));
          wgmma::commit();
        };
        // per 128-k block: its one or two stages' MMAs, then (retired) the rescale. The loop's back
        // edge follows the wait, so ptxas keeps the MMAs of a block's two stages in flight together
        // (with a per-stage condition on the wait it waited after every stage, C7517).
        const int kblocks = (ktiles + 1) >> 1;
        for (int kb = 0; kb < kblocks; ++kb) {
          const bool more = kb + 1 < kblocks;
          float wn_lo = 0.0f, wn_hi = 0.0f;  // the next block's weight scales, in flight under the MMAs
          if (more) {
            wn_lo = weight_scale(x, ws_lo + kb + 1);
            wn_hi = weight_scale(x, ws_hi + kb + 1);
          }
          const int first = stage;
          int last = stage;
          issue_stage(stage, phase);
          next_stage<STAGES>(stage, phase);
          if (2 * kb + 1 < ktiles) {
            last = stage;
            issue_stage(stage, phase);
            next_stage<STAGES>(stage, phase);
          }
          // stage / phase now name the next block's first stage: its activation scales
          const float* sa = reinterpret_cast<const float*>(smem_raw + (sSA - raw) + last * SA_BYTES);
          float r0 = sa[srow], r1 = sa[srow + 8], q_lo = w_lo, q_hi = w_hi;
          if (more) {
            mbar_wait(full_bar(stage), phase);
            const float* sn = reinterpret_cast<const float*>(smem_raw + (sSA - raw) + stage * SA_BYTES);
            r0 = r0 / sn[srow];
            r1 = r1 / sn[srow + 8];
            q_lo = x_step_scale(wn_lo, w_lo, z_lo);
            q_hi = x_step_scale(wn_hi, w_hi, z_hi);
          }
          const float f00 = r0 * q_lo, f01 = r0 * q_hi, f10 = r1 * q_lo, f11 = r1 * q_hi;
          if (first != last) {  // the first stage's MMAs retired: its stage can be refilled meanwhile
            wgmma::wait<1>();
            release(first);
          }
          wgmma::wait<0>();
          release(last);  // the rescale reads registers only (its factors were computed above)
          wgmma::fence_acc(acc);
#pragma unroll
          for (int nf = 0; nf < NF; ++nf) {
            const float g0 = nf < NF / 2 ? f00 : f01, g1 = nf < NF / 2 ? f10 : f11;
            acc[nf][0] *= g0;
            acc[nf][1] *= g0;
            acc[nf][2] *= g1;
            acc[nf][3] *= g1;
          }
        }
        if (own) epilogue<T, BN, true>(a, x, acc, m, n, cw, warp_in_wg, lane);
        continue;
      } else if constexpr (X >= 4) {
        // ---- exact FP8, transposed, 256 weight rows per tile (opt-in, TmaFp8Extra::exact_wide): this
        // warpgroup computes D[w row][tile row] for 128 of the tile's 256 weight rows as two m64
        // blocks (xw_weight_rows) and every A row of the tile (wgmma N as in X = 1), the weights
        // converted in registers as X = 1 does. Why: a stage then brings 64 KB (32 KB of A codes,
        // 32 KB of weights) per 4.2 M MACs where X = 1 brings 48 KB per 2.1 M, the bf16 kernel's
        // clustered 256-wide ratio. Measured slower than X = 1 on the H100 (see the comment at the
        // top of sm90_tma_grouped_gemm.cu): opt-in.
        // Its 128 accumulators leave no registers for a second set of per-block partial sums, so
        // the two-level accumulation keeps one set, scaled: after k block kb the accumulators hold
        // R = acc / s(kb), s(kb) = activation scale (per A row) x weight block scale (per m64
        // block) of block kb. Block kb's MMAs add its exact code products (f16 HGMMA, f32 sums) into
        // R; before block kb + 1's, R is multiplied by s(kb) / s(kb + 1) (the two stages' activation
        // scales are both in shared memory then), and after the last block by s(last). Same
        // multiply count as X = 1's promotion, f32 rounding of the same order (one rounding of the
        // ratio and one of the product per block). A zero weight block scale adds nothing: its
        // fragments are zeroed and the scale before it carried on. Limit: R overflows where a
        // block's s is more than ~2^100 below an earlier block's (|code products| <= 2^25 per
        // block); the activation scales of deepgemm.cu's quantizer are never 0.
        const int4 tile_rows = a.plan.tiles[m];
        const int e = tile_rows.x, rb = tile_rows.y, re = tile_rows.z;
        const int g = lane >> 2, c4 = lane & 3;
        int wr[2][2];
        xw_weight_rows(a.epi, cw, warp_in_wg, g, wr);
        int64_t ws_lo, ws_hi;
        weight_scale_rows<BN>(a, e, n, ws_lo, ws_hi);
        // each m64 block's scale row (k block 0): gate / up, or the warpgroup's 128 rows
        const int64_t wsb0 = concat || !cw ? ws_lo : ws_hi, wsb1 = concat ? ws_hi : wsb0;
        auto& acc0 = *reinterpret_cast<float(*)[16][4]>(&acc[0][0]);   // block 0: acc[0..15]
        auto& acc1 = *reinterpret_cast<float(*)[16][4]>(&acc[16][0]);  // block 1: acc[16..31]
        auto kloop = [&](auto nb_tag) {
          constexpr int NB = decltype(nb_tag)::value, NFB = NB / 8;
          // each block's weight scale of the current k block (w_cur: a zero scale replaced by the
          // one before, 1 at the start) and whether the block is zero
          float w_cur0 = 1.0f, w_cur1 = 1.0f;
          bool w_zero0, w_zero1;
          const float w0 = weight_scale(x, wsb0);
          x_step_scale(w0, w_cur0, w_zero0);
          x_step_scale(concat ? weight_scale(x, wsb1) : w0, w_cur1, w_zero1);
          float w_next0 = 0.0f, w_next1 = 0.0f;
          auto load_w_next = [&](int kt) {
            if (kt + 1 < ktiles) {
              w_next0 = weight_scale(x, wsb0 + kt + 1);
              w_next1 = concat ? weight_scale(x, wsb1 + kt + 1) : w_next0;
            }
          };
          // one m64 block's A fragments from a stage (zeroed for a zero block scale: it adds nothing)
          auto convert_block = [&](int st, int b, uint32_t (&f)[8][4], bool zero) {
            uint4 lo[2], hi[2];
            x_load_w(sB + uint32_t(st) * B_BYTES, wr[b][0], wr[b][1], g, c4, lo, hi);
            x_convert_w(lo, hi, f);
            if (zero) {
#pragma unroll
              for (int kk = 0; kk < 8; ++kk) f[kk][0] = f[kk][1] = f[kk][2] = f[kk][3] = 0u;
            }
          };
          // a block's 8 MMAs into its accumulators (f: live until they retire)
          auto issue = [&](float (&d)[16][4], uint32_t (&f)[8][4], uint32_t x_tile, int kt) {
#pragma unroll
            for (int kk = 0; kk < 8; ++kk)
              wgmma::mma_rega_f16<NB>(d, f[kk], wgmma::desc_sw128(x_tile + uint32_t((kk >> 2) * X_SUB + (kk & 3) * 32)), kt | kk);
          };
          // R *= s(kb) / s(kb + 1) for one block (sn: the next stage's activation scales; rw: the
          // weight scales' ratio), or acc = R x s(last) (sn null; rw: the last weight scale)
          auto rescale = [&](float (&d)[16][4], const float* sa, const float* sn, float rw) {
#pragma unroll
            for (int j = 0; j < NFB; ++j) {
              const float2 s_now = *reinterpret_cast<const float2*>(sa + 8 * j + 2 * c4);
              float r0 = s_now.x, r1 = s_now.y;
              if (sn) {
                const float2 s_nxt = *reinterpret_cast<const float2*>(sn + 8 * j + 2 * c4);
                r0 = __fdividef(r0, s_nxt.x);
                r1 = __fdividef(r1, s_nxt.y);
              }
              r0 *= rw;
              r1 *= rw;
              d[j][0] *= r0;
              d[j][1] *= r1;
              d[j][2] *= r0;
              d[j][3] *= r1;
            }
          };
          // X = 5: per stage, the two blocks pipelined inside the warpgroup: block 1's weights are
          // converted under block 0's MMAs, block 0's rescale runs under block 1's (the next stage's
          // block-0 fragments converted under block 1's MMAs too spilled ~150 registers per stage).
          // X = 4: both blocks converted, their 16 MMAs in one commit group, then both rescaled.
          mbar_wait(full_bar(stage), phase);
          if constexpr (GATHER) wgmma::fence_proxy_async();
          for (int kt = 0; kt < ktiles; ++kt) {
            uint32_t f0[8][4], f1[8][4];
            convert_block(stage, 0, f0, w_zero0);
            // where A comes by TMA, the next block's weight scales are in flight under this block's
            // MMAs; the gather variant requests them after its next proxy fence (a MEMBAR there, see X = 1)
            if constexpr (!GATHER) load_w_next(kt);
            const uint32_t x_tile = sA + uint32_t(stage) * A_STAGE;
            if constexpr (X == 5) {
              wgmma::fence_acc_first<NFB>(acc0);
              wgmma::fence();
              issue(acc0, f0, x_tile, kt);
              wgmma::commit();
              convert_block(stage, 1, f1, w_zero1);
              wgmma::fence_acc_first<NFB>(acc1);
              wgmma::fence();
              issue(acc1, f1, x_tile, kt);
              wgmma::commit();
            } else {
              convert_block(stage, 1, f1, w_zero1);
              wgmma::fence_acc_first<NFB>(acc0);
              wgmma::fence_acc_first<NFB>(acc1);
              wgmma::fence();
              issue(acc0, f0, x_tile, kt);
              issue(acc1, f1, x_tile, kt);
              wgmma::commit();
            }
            int next = stage;
            uint32_t next_phase = phase;
            next_stage<STAGES>(next, next_phase);
            const bool more = kt + 1 < ktiles;
            if (more) {  // the next stage's activation scales are read below
              mbar_wait(full_bar(next), next_phase);
              if constexpr (GATHER) wgmma::fence_proxy_async();
            }
            if constexpr (GATHER) load_w_next(kt);
            const float* sa = reinterpret_cast<const float*>(smem_raw + (sSA - raw) + stage * SA_BYTES);
            const float* sn = more ? reinterpret_cast<const float*>(smem_raw + (sSA - raw) + next * SA_BYTES) : nullptr;
            if constexpr (X == 5) wgmma::wait<1>();  // block 0's MMAs retired
            else wgmma::wait<0>();
            wgmma::fence_acc_first<NFB>(acc0);
            rescale(acc0, sa, sn, more ? x_step_scale(w_next0, w_cur0, w_zero0) : w_cur0);
            if constexpr (X == 5) wgmma::wait<0>();  // block 1's
            wgmma::fence_acc_first<NFB>(acc1);
            rescale(acc1, sa, sn, more ? x_step_scale(w_next1, w_cur1, w_zero1) : w_cur1);
            release(stage);
            stage = next;
            phase = next_phase;
          }
        };
        // the wgmma N: the tile's A rows rounded up to 16 / 32 / 64 / 128 (as X = 1)
        const int rows = re - rb;
        if (rows <= 16) kloop(std::integral_constant<int, 16>{});
        else if (rows <= 32) kloop(std::integral_constant<int, 32>{});
        else if (rows <= 64) kloop(std::integral_constant<int, 64>{});
        else kloop(std::integral_constant<int, 128>{});
        if (own) epilogue_xw<T>(a, x, acc, m, n, rb, re, cw, warp_in_wg, lane, wr);
        continue;
      } else if constexpr (X) {
        // ---- exact FP8, transposed: this warpgroup computes D[w row][tile row] for 64 weight rows
        // of the 128-row weight tile and every A row of the tile (up to 128, the wgmma N), per 128-K
        // block: part = W·Aᵀ on the codes in f16 (exact: e4m3 ⊂ f16, products exact, f32 sums),
        // then acc += part × activation scale (per A row) × weight block scale (per weight row).
        // W: e4m3 from the stage, converted in registers into the A fragments; A rows: f16 codes
        // in the stage (wgmma B by descriptor), their k order within each 64 permuted by the
        // quantizer (deepgemm.cu, x_code_col) so that each thread's fragment bytes are 16
        // contiguous bytes per row and 64 k.
        const int4 tile_rows = a.plan.tiles[m];
        const int e = tile_rows.x;
        const int g = lane >> 2, c4 = lane & 3;
        int row_lo, row_hi;
        x_weight_rows(a.epi, cw, warp_in_wg, g, row_lo, row_hi);
        int64_t ws_lo, ws_hi;
        weight_scale_rows<BN>(a, e, n, ws_lo, ws_hi);
        // the 16 code bytes of each 64-k half of row_lo / row_hi in a stage
        auto load_w = [&](int st, uint4 (&lo)[2], uint4 (&hi)[2]) {
          x_load_w(sB + uint32_t(st) * B_BYTES, row_lo, row_hi, g, c4, lo, hi);
        };
        // a stage's 8 MMAs (wgmma N = NB A rows) into fresh partial sums p, one commit group
        auto issue_x = [&](auto nb_tag, int st, uint32_t (&f)[8][4], auto& p) {
          constexpr int NB = decltype(nb_tag)::value;
          const uint32_t x_tile = sA + uint32_t(st) * A_STAGE;
          wgmma::fence_acc_first<NB / 8>(p);
          wgmma::fence();
#pragma unroll
          for (int kk = 0; kk < 8; ++kk)
            wgmma::mma_rega_f16<NB>(p, f[kk], wgmma::desc_sw128(x_tile + uint32_t((kk >> 2) * X_SUB + (kk & 3) * 32)), kk);
          wgmma::commit();
        };
        // acc += a stage's partial sums (their MMAs retired) x activation scale (per A row, from the
        // stage) x weight block scale (per weight row)
        auto promote_x = [&](int st, auto& p, float w_lo, float w_hi) {
          constexpr int NFP = int(sizeof(p) / sizeof(p[0]));
          wgmma::fence_acc_first<NFP>(p);
          const float* sa = reinterpret_cast<const float*>(smem_raw + (sSA - raw) + st * SA_BYTES);
#pragma unroll
          for (int j = 0; j < NFP; ++j) {
            const float2 s2 = *reinterpret_cast<const float2*>(sa + 8 * j + 2 * c4);
            acc[j][0] += p[j][0] * (s2.x * w_lo);
            acc[j][1] += p[j][1] * (s2.y * w_lo);
            acc[j][2] += p[j][2] * (s2.x * w_hi);
            acc[j][3] += p[j][3] * (s2.y * w_hi);
          }
        };
        // NB: the A rows computed (wgmma N). One commit group per stage: the 8 MMAs in flight, the
        // next stage's weight bytes loaded from shared memory under them. Registers: partial sums
        // (NB/2), A fragments (32), the next stage's bytes (16), accumulators (64): 176 at NB = 128,
        // within the consumers' 224. Measured on the H200 (2026-12-01): two passes of 64 rows, each
        // waited for, without that load ahead: 7-25 % slower; two commit groups of 64 rows with the
        // first promoted under the second: no faster (within 2 %). With the partial sums declared
        // outside the item loop ptxas serialized the wgmmas (C7511). Independent partial-sum sets
        // (2 / 4 / 8 at 64 / 32 / 16 rows, each over consecutive k16 steps, added at the promotion)
        // were slower (2026-12-02: mixtral_8x7b T = 64 up GEMM 308 -> 324 us, deepseek_v3 T = 512
        // forward 3.32 -> 3.47 ms): the one-set chain is not what bounds it. A k loop pipelined
        // across stages (the next stage's MMAs issued before this stage's promotion, two A-fragment
        // and partial-sum sets in turn) made ptxas serialize every wgmma of the few-row kernel
        // (C7511, insufficient registers), its default loop included: mixtral_8x7b T = 64 forward
        // 0.4496 -> 0.5061 ms, 0.5169 with the pipelined loop, and 9 minutes of build (2026-12-02,
        // twenty-fourth session); removed.
        auto kloop = [&](auto nb_tag) {
          constexpr int NB = decltype(nb_tag)::value, NFP = NB / 8;
          uint4 lo[2], hi[2];
          mbar_wait(full_bar(stage), phase);
          if constexpr (GATHER) wgmma::fence_proxy_async();
          load_w(stage, lo, hi);
          for (int kt = 0; kt < ktiles; ++kt) {
            uint32_t af[8][4];  // [k16 step] the A fragment
            x_convert_w(lo, hi, af);  // the stage's weight bytes into the 8 k16 steps' A fragments
            float xpart[NFP][4];
            issue_x(nb_tag, stage, af, xpart);
            int next = stage;
            uint32_t next_phase = phase;
            next_stage<STAGES>(next, next_phase);
            if (kt + 1 < ktiles) {  // the next stage's weight bytes, under this stage's MMAs
              mbar_wait(full_bar(next), next_phase);
              if constexpr (GATHER) wgmma::fence_proxy_async();
              load_w(next, lo, hi);
            }
            // this block's weight scales, requested after the proxy fence rather than at the top of
            // the iteration: the fence is a MEMBAR.ALL.CTA in the SASS of the gather variant, which
            // can hold the warp until its outstanding loads return (a global round trip per stage);
            // here they arrive under the MMAs. (Not yet timed against the old order; see PERF.md,
            // sixteenth session.)
            const float w_lo = weight_scale(x, ws_lo + kt), w_hi = concat ? weight_scale(x, ws_hi + kt) : w_lo;
            wgmma::wait<0>();
            promote_x(stage, xpart, w_lo, w_hi);
            release(stage);
            stage = next;
            phase = next_phase;
          }
        };
        // X = 3: the tile's rows in passes of XR_ROWS, as the producer loads them (each pass's
        // scales in the stage start at its first row); X = 1: one pass of every row
        const int passes = tile_passes<X>(tile_rows);
        for (int pass = 0; pass < passes; ++pass) {
          const int rb = tile_rows.y + pass * pass_rows<X>(), re = min(tile_rows.z, rb + pass_rows<X>());
          if (pass > 0) {
#pragma unroll
            for (int j = 0; j < NF; ++j)
#pragma unroll
              for (int q = 0; q < 4; ++q) acc[j][q] = 0.0f;
          }
          // the wgmma N: the pass's A rows rounded up to 16 / 32 / 64 / 128 (few-row experts then do
          // not pay for 128 columns; the CTA-uniform choice keeps the wgmma aligned)
          const int rows = re - rb;
          if (rows <= 16) kloop(std::integral_constant<int, 16>{});
          else if (rows <= 32) kloop(std::integral_constant<int, 32>{});
          else if (X == 3 || rows <= 64) kloop(std::integral_constant<int, 64>{});
          else kloop(std::integral_constant<int, X == 3 ? 64 : 128>{});
          if (own) epilogue_x<T>(a, x, acc, m, n, rb, re, cw, warp_in_wg, lane, row_lo, row_hi);
        }
        continue;
      } else if constexpr (FP8) {
        // ---- two-level accumulation: per 128-K block, part = A·B on the e4m3 codes (QGMMA), then
        // acc += part × activation scale (per row) × weight block scale (per 128 outputs)
        const int e = a.plan.tiles[m].x;
        int64_t ws_lo, ws_hi;
        weight_scale_rows<BN>(a, e, n, ws_lo, ws_hi);
        const int srow = cw * 64 + warp_in_wg * 16 + (lane >> 2);
        // weight block scales one k block ahead where A comes by TMA (grouped_mm's down GEMM at
        // mixtral_8x7b T = 64: 129.5 -> 122.8 us, H200, 2026-12-02); the gather variant loads them
        // per block after its proxy fence, as before: loaded a block ahead they can still be in
        // flight at the next block's fence (a MEMBAR.ALL.CTA there), and deepgemm FP8 at deepseek_v3
        // T = 16384, which gathers, ran 708 TFLOP/s that way against 744-757 before. The exact
        // variant gained nothing from it (mixtral T = 64's up GEMM 312.9 us either way): its
        // few-row tiles are not waiting on the scales.
        float w_lo_next = 0.0f, w_hi_next = 0.0f;
        if constexpr (!GATHER) {
          w_lo_next = weight_scale(x, ws_lo);
          w_hi_next = weight_scale(x, ws_hi);
        }
        for (int kt = 0; kt < ktiles; ++kt) {
          mbar_wait(full_bar(stage), phase);
          if constexpr (GATHER) wgmma::fence_proxy_async();
          // after the proxy fence (a MEMBAR in the gather variant, see the exact variant): they
          // arrive under the MMAs
          float w_lo = w_lo_next, w_hi = w_hi_next;
          if constexpr (GATHER) {
            w_lo = weight_scale(x, ws_lo + kt);
            w_hi = weight_scale(x, ws_hi + kt);
          } else if (kt + 1 < ktiles) {
            w_lo_next = weight_scale(x, ws_lo + kt + 1);
            w_hi_next = weight_scale(x, ws_hi + kt + 1);
          }
          const uint32_t a_tile = sA + uint32_t(stage) * A_BYTES + uint32_t(cw) * (64 * 128);
          const uint32_t b_tile = sB + uint32_t(stage) * B_BYTES;
          // the tile's 128-column parts (one at BN = 128; at 256 the weight rows [0, 128) and
          // [128, 256) of the stage, 16 KB apart) one after the other into the one partial set, each
          // promoted with its block scale before the next part's MMAs (the other consumer warpgroup's
          // MMAs keep the tensor cores busy meanwhile); the stage is released after the last part's
          constexpr int PARTS = BN / 128;
          float sa0 = 0.0f, sa1 = 0.0f;
#pragma unroll
          for (int h = 0; h < PARTS; ++h) {
            wgmma::fence_acc(part);
            wgmma::fence();
#pragma unroll
            for (int kk = 0; kk < 4; ++kk)
              wgmma::wgmma_m64n128k32_e4m3(part, wgmma::desc_sw128(a_tile + kk * 32),
                                           wgmma::desc_sw128(b_tile + uint32_t(h) * (128 * 128) + kk * 32), kk);
            wgmma::commit();
            wgmma::wait<0>();
            wgmma::fence_acc(part);
            if (h == 0) {
              const float* sa = reinterpret_cast<const float*>(smem_raw + (sSA - raw) + stage * SA_BYTES);
              sa0 = sa[srow];
              sa1 = sa[srow + 8];
            }
            if (h == PARTS - 1) {
              release(stage);
              next_stage<STAGES>(stage, phase);
            }
#pragma unroll
            for (int nf = 0; nf < NFP; ++nf) {
              // BN = 128: columns [0, 64) take w_lo, [64, 128) w_hi; BN = 256: part 0 w_lo, part 1 w_hi
              const float ws = PARTS == 1 ? (nf < NF / 2 ? w_lo : w_hi) : (h ? w_hi : w_lo);
              const float s0 = sa0 * ws, s1 = sa1 * ws;
              acc[NFP * h + nf][0] += part[nf][0] * s0;
              acc[NFP * h + nf][1] += part[nf][1] * s0;
              acc[NFP * h + nf][2] += part[nf][2] * s1;
              acc[NFP * h + nf][3] += part[nf][3] * s1;
            }
          }
        }
      } else {
      int prev = -1;
      for (int kt = 0; kt < ktiles; ++kt) {
        mbar_wait(full_bar(stage), phase);
        if constexpr (GATHER) wgmma::fence_proxy_async();  // cp.async (generic proxy) -> wgmma (async proxy)
        const uint32_t a_tile = sA + uint32_t(stage) * A_BYTES + uint32_t(cw) * (64 * 128);
        const uint32_t b_tile = sB + uint32_t(stage) * B_BYTES;
        wgmma::fence_acc(acc);
        wgmma::fence();
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk)
          wgmma::mma_m64k16<T, BN>(acc, wgmma::desc_sw128(a_tile + kk * 32), wgmma::desc_sw128(b_tile + kk * 32));
        wgmma::commit();
        wgmma::wait<1>();
        wgmma::fence_acc(acc);
        if (prev >= 0) release(prev);
        prev = stage;
        next_stage<STAGES>(stage, phase);
      }
      wgmma::wait<0>();
      wgmma::fence_acc(acc);
      if (prev >= 0) release(prev);
      }
      if (!own) continue;

      epilogue<T, BN, FP8 && !X>(a, x, acc, m, n, cw, warp_in_wg, lane);
    }
  }
  if constexpr (MC) cluster_sync();  // no CTA leaves while its peer may still write or arrive into it
#else
  __trap();  // built without sm_90a: the launcher never selects this kernel then
#endif
}

// ---- typed launcher ---------------------------------------------------------------------------

template <class T, int BN, bool GATHER, bool FP8, bool MC, bool PP, int X>
void launch_typed(const GroupedGemmArgs& a, DType dtype, const TmaFp8Extra& x, int64_t a_rows, int64_t E, cudaStream_t stream) {
  auto kernel = grouped_gemm_tma<T, BN, GATHER, FP8, MC, PP, X>;
  constexpr int SMEM = TmaCfg<BN, FP8, X>::SMEM_BYTES;
  constexpr int BKE = FP8 ? 128 : BK;
  constexpr int ESZ = FP8 ? 1 : 2;
  static thread_local int configured_device = -1, max_clusters = 0;
  int dev = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  cudaLaunchAttribute cluster_attr[1];
  cluster_attr[0].id = cudaLaunchAttributeClusterDimension;
  cluster_attr[0].val.clusterDim.x = 2;
  cluster_attr[0].val.clusterDim.y = 1;
  cluster_attr[0].val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg{};
  cfg.blockDim = dim3(THREADS);
  cfg.dynamicSmemBytes = SMEM;
  cfg.stream = stream;
  cfg.attrs = cluster_attr;
  cfg.numAttrs = 1;
  if (configured_device != dev) {
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM), "cudaFuncSetAttribute");
    if (MC) {
      // how many 2-CTA clusters fit at once (the SMs of a GPC pair up; an odd one stays idle)
      cfg.gridDim = dim3(unsigned(sm_count() & ~1));
      if (cudaOccupancyMaxActiveClusters(&max_clusters, kernel, &cfg) != cudaSuccess || max_clusters <= 0) {
        cudaGetLastError();
        max_clusters = sm_count() / 2;
      }
    }
    configured_device = dev;
  }
  const CUtensorMapDataType etype = FP8 ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                        : dtype == DType::bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  const int n_tiles = a.epi == Epi::up_concat ? int(ceil_div(a.I, BN / 2)) : int(ceil_div(a.N, BN));
  // B: [E, N, K] as a 3-D map (K, N, E); box 128 bytes of K × rows × 1
  const cuuint64_t bdims[3] = {cuuint64_t(a.Kdim), cuuint64_t(a.N), cuuint64_t(E)};
  const cuuint64_t bstrides[2] = {cuuint64_t(a.Kdim) * ESZ, cuuint64_t(a.w_expert_stride) * ESZ};
  // MC and the concatenated gated layout load B in two halves of BN/2 rows
  // (X = 6: boxes of 64 bytes of K, unswizzled: the converting warps read them in row order)
  const cuuint32_t bbox[3] = {cuuint32_t(converts_weights(X) ? 64 : BKE), cuuint32_t(MC || a.epi == Epi::up_concat ? BN / 2 : BN), 1};
  const CUtensorMap tm_b =
      make_map(etype, a.W, 3, bdims, bstrides, bbox, converts_weights(X) ? CU_TENSOR_MAP_SWIZZLE_NONE : CU_TENSOR_MAP_SWIZZLE_128B);
  CUtensorMap tm_a = tm_b, tm_sa = tm_b;
  if (!GATHER && X) {
    // f16 codes [a_rows, a_ld]: boxes of 64 k (128 bytes) x ABOX rows
    const cuuint64_t adims[2] = {cuuint64_t(x.a_ld), cuuint64_t(a_rows)};
    const cuuint64_t astrides[1] = {cuuint64_t(x.a_ld) * 2};
    const cuuint32_t abox[2] = {64, cuuint32_t(ABOX)};
    tm_a = make_map(CU_TENSOR_MAP_DATA_TYPE_FLOAT16, a.A, 2, adims, astrides, abox, CU_TENSOR_MAP_SWIZZLE_128B);
  } else if (!GATHER) {
    const cuuint64_t adims[2] = {cuuint64_t(a.Kdim), cuuint64_t(a_rows)};
    const cuuint64_t astrides[1] = {cuuint64_t(a.Kdim) * ESZ};
    const cuuint32_t abox[2] = {cuuint32_t(BKE), cuuint32_t(ABOX)};
    tm_a = make_map(etype, a.A, 2, adims, astrides, abox, CU_TENSOR_MAP_SWIZZLE_128B);
  }
  if (!GATHER) {
    if (FP8) {
      // activation scales [kb, ld] f32: box of 128 rows of one K block
      const cuuint64_t sdims[2] = {cuuint64_t(x.a_scales_ld), cuuint64_t(ceil_div(a.Kdim, 128))};
      const cuuint64_t sstrides[1] = {cuuint64_t(x.a_scales_ld) * 4};
      const cuuint32_t sbox[2] = {cuuint32_t(BM), 1};
      tm_sa = make_map(CU_TENSOR_MAP_DATA_TYPE_FLOAT32, x.a_scales, 2, sdims, sstrides, sbox, CU_TENSOR_MAP_SWIZZLE_NONE);
    }
  }
  if constexpr (MC) {
    const int64_t pair_bound = ceil_div(int64_t(a.plan.max_tiles), 2) * n_tiles;
    cfg.gridDim = dim3(unsigned(2 * std::max<int64_t>(1, std::min<int64_t>(max_clusters, pair_bound))));
    check(cudaLaunchKernelEx(&cfg, kernel, tm_b, tm_a, tm_sa, a, x, n_tiles), "cudaLaunchKernelEx (grouped_gemm_tma, clusters)");
  } else {
    const int64_t work_bound = int64_t(a.plan.max_tiles) * n_tiles;
    const unsigned grid = unsigned(std::max<int64_t>(1, std::min<int64_t>(sm_count(), work_bound)));
    kernel<<<grid, THREADS, SMEM, stream>>>(tm_b, tm_a, tm_sa, a, x, n_tiles);
  }
  check_launch("grouped_gemm_tma");
}

template <class T, int BN, bool FP8, bool MC, bool PP, int X>
void launch_bn(const GroupedGemmArgs& a, DType dtype, const TmaFp8Extra& x, int64_t a_rows, int64_t E, cudaStream_t stream) {
  if constexpr (X == 3 || converts_weights(X)) {  // A rows by TMA only (the caller's choice: exact_few_rows / exact_conv)
    MOEX_ASSERT(!a.a_gather);
    launch_typed<T, BN, false, FP8, MC, PP, X>(a, dtype, x, a_rows, E, stream);
  } else if (a.a_gather) {
    launch_typed<T, BN, true, FP8, MC, PP, X>(a, dtype, x, a_rows, E, stream);
  } else {
    launch_typed<T, BN, false, FP8, MC, PP, X>(a, dtype, x, a_rows, E, stream);
  }
}

}  // namespace moex::cuda::tma

// Explicit instantiation of one launch_bn combination (and with it its two kernels, gathered and
// not). Use at global scope in a sm90_tma_kernels_*.cu file.
#define MOEX_TMA_INSTANTIATE(T, BN, FP8, MC, PP) MOEX_TMA_INSTANTIATE_X(T, BN, FP8, MC, PP, 0)
// ... with the exact FP8 variant chosen (X)
#define MOEX_TMA_INSTANTIATE_X(T, BN, FP8, MC, PP, X)                                                         \
  template void moex::cuda::tma::launch_bn<T, BN, FP8, MC, PP, X>(const moex::cuda::GroupedGemmArgs&, moex::DType, \
                                                               const moex::cuda::TmaFp8Extra&, int64_t, int64_t, \
                                                               cudaStream_t)
