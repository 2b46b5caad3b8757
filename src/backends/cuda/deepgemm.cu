// backends/cuda/deepgemm.cu — the `deepgemm` experts backend (SPEC §2) on Hopper: bf16 or FP8
// block-quantized experts through the warp-specialised TMA + wgmma grouped GEMM of
// sm90_tma_grouped_gemm.cu / sm90_tma_kernel.cuh (HGMMA for bf16, QGMMA with the two-level
// accumulation for FP8).
//
// Layouts of the A rows (one row per token-expert pair; both built on the device, no host sync):
//   contiguous (prefill)  pairs sorted by expert, every expert's block padded to a multiple of
//                         128 rows: expert e owns layout rows [128·tile_off[e], +cnt[e]), the
//                         rest of its last 128-row tile is padding (row_pair = −1, never read,
//                         never written). Bound: S + min(S, E)·127 rows.
//   masked (decode)       [E, max_rows] with max_rows = T4 = T rounded up to a multiple of 4 (a
//                         token reaches an expert at most once): expert e owns rows
//                         [e·T4, e·T4 + cnt[e]); the per-expert counts stay on the device and
//                         only ceil(cnt/128) tiles per expert are listed. T4, not T: the FP8 down
//                         GEMM loads a tile's 128 activation scales (f32, consecutive in the
//                         MN-major scale array) as one TMA box starting at the tile's first row,
//                         and a box whose innermost start is not 16-byte aligned faults
//                         ("illegal instruction", H200, 2026-11-30, T = 5 etc.).
// Default: masked for T <= 64, contiguous above; MOEX_DEEPGEMM_LAYOUT=contiguous|masked forces one.
//
// Small batches (small_batch_route: FP8 while experts hold <= 6 pairs on average, bf16 up to T = 8
// while pairs rarely share an expert): the call goes to the GEMV kernels batched_mm runs at that size instead
// (cuda_backends.cu: FP8 through quant_decode.cu, each routed expert's weights read once for all
// its rows; bf16 through batched_gemv.cu). There a 128-row MMA tile carries a handful of valid rows
// and the chain plan -> layout -> quantize -> up -> down -> combine costs a fixed ~40-60 us over the
// weights' read time (H200, deepseek_v3 T = 1: 1.36x / 1.84x of the memory floor on the masked layout,
// 1.16x / 1.29x on this route, bf16 / FP8, docs/PERF.md twenty-first session).
//
// One forward (S = T·K pairs, M = layout rows):
//   plan       routing_plan.cu's counting sort, then the layout: tile table (expert, row begin,
//              row end) over 128-row tiles in the plan's paired tile order, row_pair [M] (layout
//              row -> pair), pair_lrow [S] (pair -> layout row or -1), pair_rows [S] (p or -1: the
//              combine's y row)
//   FP8        x -> e4m3 codes xq [T, H] + scales [ceil(H/128), T4] (per token per 128 channels);
//              grouped_mm's exact variant: the codes as f16 values [T, x_code_ld(H)] (x_code_col order)
//   up         grouped GEMM, A rows gathered from x (bf16) or xq (FP8) through row_pair; gated
//              activation in the epilogue -> h in the activation dtype: at the layout row (bf16)
//              or at the pair row (FP8)
//   FP8        h ([S, I], rounded to the activation dtype as SPEC §6 / the reference do) -> hq [M, I]
//              codes at the layout rows + scales [ceil(I/128), M4]; in the up GEMM's epilogue where
//              its tiles are 256 wide (tma_fp8_quantizes_h), else a separate pass
//   down       grouped GEMM, A = h / hq rows by TMA, y[pair] = f32 (+ bias)
//   combine    out[t] = Σ_j w[t, j] · y[t·K + j] in slot order (combine.cu)
// Workspace (all static bounds from T, K, E): plan + layout arrays (~16·M + 16·S bytes) + y [S, H]
// f32 + bf16: h [M, I]; FP8: xq [T, H] + h [S, I] (act dtype) + hq [M, I] + scales (exact variant: xq and
// hq as f16 rows of x_code_ld columns, 2 bytes per element).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <type_traits>

#include <cuda_fp8.h>

#include "backends/backend_impls.hpp"
#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/quant_common.cuh"
#include "backends/cuda/sm90_tma_grouped_gemm.cuh"

namespace moex::detail {

using namespace moex::cuda;

namespace {


constexpr int kTile = 128;  // rows per M tile = the padding granule of the contiguous layout
constexpr int kKBlock = 128;

enum class Layout { contiguous, masked };

enum class LayoutChoice { by_size, contiguous };

constexpr int64_t kMaskedMaxTokens = 64;  // masked layout up to here, contiguous above

// MOEX_DEEPGEMM_LAYOUT: a forced route, or none. Read at every call (the tests switch it; a getenv
// costs nothing next to a forward), so that the workspace size and the forward agree.
enum class ForcedRoute { none, small, masked, contiguous };
ForcedRoute forced_route() {
  const char* s = std::getenv("MOEX_DEEPGEMM_LAYOUT");
  if (!s) return ForcedRoute::none;
  if (std::strcmp(s, "small") == 0) return ForcedRoute::small;
  if (std::strcmp(s, "masked") == 0) return ForcedRoute::masked;
  if (std::strcmp(s, "contiguous") == 0) return ForcedRoute::contiguous;
  return ForcedRoute::none;
}

Layout layout_for(int64_t T, LayoutChoice choice = LayoutChoice::by_size) {
  if (choice == LayoutChoice::contiguous) return Layout::contiguous;
  switch (forced_route()) {
    case ForcedRoute::masked: return Layout::masked;
    case ForcedRoute::contiguous: return Layout::contiguous;
    default: return T <= kMaskedMaxTokens ? Layout::masked : Layout::contiguous;
  }
}

// Whether a call of T tokens, top-k K, takes batched_mm's GEMV kernels (see the file comment). By the
// pairs per expert S / E = T·K / E, from a sweep of T = 1..64 on four shapes, both routes forced (H200,
// twenty-first session, docs/PERF.md):
//   FP8   quant_decode.cu reads each routed expert's weights once for all its rows, with CUDA-core
//         dot products: ahead of the masked TMA layout up to S = 4.3·E (qwen15_moe_a2_7b T = 64:
//         0.168 vs 0.223 ms), behind it from 8·E (mixtral_8x7b T = 32: 0.485 vs 0.437). Bound: S <= 6·E.
//   bf16  batched_gemv.cu reads an expert's weights once per pair (the L2 catches few repeats of
//         experts of 10-350 MB): ahead while T <= 8 and S <= E (mixtral_8x7b T = 4, S = E: 0.569 vs
//         0.596 ms), behind at T = 16 even at S = E / 2 (deepseek_v3: 2.27 vs 2.17) and at S = 2·E
//         (mixtral_8x7b T = 8: 0.890 vs 0.623).
// MOEX_DEEPGEMM_SMALL_T=n replaces the rule by T <= n (0: never); MOEX_DEEPGEMM_LAYOUT=small forces
// the route (FP8 where quant_decode.cu takes the shape), =masked / =contiguous the TMA kernels.
bool small_batch_route(const ExpertsSpec& s, int64_t T, int64_t K) {
  const bool fp8 = s.quant.kind == QuantKind::fp8_block;
  if (fp8 && !quant_decode_shape_ok(s, T, K)) return false;  // FP8 elsewhere: quant_gemv.cu, an expert read per pair
  if (const ForcedRoute f = forced_route(); f != ForcedRoute::none) return f == ForcedRoute::small;
  if (const char* e = std::getenv("MOEX_DEEPGEMM_SMALL_T"); e && *e) return T <= std::strtoll(e, nullptr, 10);
  const int64_t S = T * K, E = s.num_experts;
  return fp8 ? T <= kMaskedMaxTokens && S <= 6 * E : T <= 8 && S <= E;
}

int64_t round4(int64_t v) { return (v + 3) / 4 * 4; }
int64_t layout_rows(Layout l, int64_t T, int64_t S, int64_t E) {
  return l == Layout::masked ? E * round4(T) : S + std::min(S, E) * (kTile - 1);
}

// ---- layout kernels -----------------------------------------------------------------------------

// tile_off[e] = Σ_{e' < e} ceil(cnt[e'] / 128); row_base[e] = the layout row of expert e's first row
// (masked: e · masked_rows). One block: E is at most a few thousand; a block-wide scan in chunks of blockDim.
__global__ void layout_scan_kernel(const int* counts, int E, int masked_rows, bool masked, int* tile_off, int* row_base) {
  __shared__ int carry;
  __shared__ int warp_sums[32];
  if (threadIdx.x == 0) carry = 0;
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  for (int c0 = 0; c0 < E; c0 += blockDim.x) {
    const int e = c0 + threadIdx.x;
    const int v = e < E ? (counts[e] + kTile - 1) / kTile : 0;
    int incl = v;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int o = __shfl_up_sync(0xffffffffu, incl, d);
      if (lane >= d) incl += o;
    }
    if (lane == 31) warp_sums[warp] = incl;
    __syncthreads();
    if (warp == 0) {
      int w = lane < nwarps ? warp_sums[lane] : 0;
#pragma unroll
      for (int d = 1; d < 32; d <<= 1) {
        const int o = __shfl_up_sync(0xffffffffu, w, d);
        if (lane >= d) w += o;
      }
      if (lane < nwarps) warp_sums[lane] = w;  // inclusive prefix of the warp totals
    }
    __syncthreads();
    const int excl = carry + (warp > 0 ? warp_sums[warp - 1] : 0) + incl - v;
    if (e < E) {
      tile_off[e] = excl;
      row_base[e] = masked ? e * masked_rows : excl * kTile;
    }
    __syncthreads();
    if (threadIdx.x == 0) carry += warp_sums[nwarps - 1];
    __syncthreads();
  }
  if (threadIdx.x == 0) tile_off[E] = carry;
}

// The e in [0, n) with starts[e] <= v < starts[e + 1] (starts ascending, starts[0] <= v).
__device__ __forceinline__ int segment_of(const int* starts, int n, int v) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (starts[mid] <= v) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// The tile table (valid tiles first, then expert -1 up to max_tiles) and the row maps. The tiles
// come in the routing plan's tile order (plan_tiles: 128-row tiles over the sorted rows; paired or
// expert by expert, see routing_plan.cu), translated to the layout rows: tile j of expert e covers
// layout rows [row_base[e] + 128·j, row_base[e] + cnt[e]) (the end is the expert's, as the kernels'
// idle-row test expects).
__global__ void layout_fill_kernel(const int* counts, const int* offsets, const int* sorted_pairs, const int* pair_to_row,
                                   const int4* plan_tiles, const int* tile_off, const int* row_base, int E, int S,
                                   int max_tiles, int4* tiles, int* row_pair, int* pair_lrow, int* pair_rows) {
  const int total_tiles = tile_off[E];
  const int n_rows = offsets[E];
  const int stride = gridDim.x * blockDim.x;
  for (int t = blockIdx.x * blockDim.x + threadIdx.x; t < max_tiles; t += stride) {
    if (t >= total_tiles) {
      tiles[t] = make_int4(-1, 0, 0, 0);
      continue;
    }
    const int4 pt = plan_tiles[t];
    const int e = pt.x, j = (pt.y - offsets[e]) / kTile;
    tiles[t] = make_int4(e, row_base[e] + j * kTile, row_base[e] + counts[e], 0);
  }
  for (int r = blockIdx.x * blockDim.x + threadIdx.x; r < S; r += stride) {
    // sorted row r -> layout row
    if (r < n_rows) {
      const int e = segment_of(offsets, E, r);  // the expert of sorted row r
      const int p = sorted_pairs[r];
      const int lrow = row_base[e] + (r - offsets[e]);
      row_pair[lrow] = p;
      pair_lrow[p] = lrow;
    }
    // pair r: its y row is r itself when it is not dropped
    const bool valid = pair_to_row[r] >= 0;
    pair_rows[r] = valid ? r : -1;
    if (!valid) pair_lrow[r] = -1;
  }
}

// ---- dynamic FP8 activation quantization (SPEC §6; the CPU's quantize_activation_row) ------------
// The exact FP8 kernel's A operand (TmaFp8Extra::exact) holds the codes as f16 values (exact), rows of
// x_code_ld(K) = ceil(K/128)·128 columns, zero past K, the k order inside every 64 columns permuted so
// that the kernel's register fragments of the weights (4 consecutive code bytes per k16 step: k pairs
// 2c and 2c+8 of the wgmma A layout) meet the matching A-row columns: column p = 16c + 4s + 2b1 + b0 of
// a 64-group (thread c of the quad, k16 step s, byte b) is stored at 16s + 8b1 + 2c + b0.
__host__ __device__ constexpr int x_code_col(int p) { return ((p >> 2) & 3) * 16 + ((p >> 1) & 1) * 8 + (p >> 4) * 2 + (p & 1); }
int64_t x_code_ld(int64_t K) { return ceil_div(K, kKBlock) * kKBlock; }

// Four channels of `x` from column c (zero past K): one 8- / 16-byte load where `vec` (K % 4 == 0 and
// the rows 4-element aligned) and the four are in range, else element by element.
template <class T>
__device__ __forceinline__ void load4(const T* x, int c, int K, bool vec, float (&v)[4]) {
  if (vec && c + 3 < K) {
    if constexpr (std::is_same_v<T, float>) {
      const float4 f = *reinterpret_cast<const float4*>(x + c);
      v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
    } else {
      const uint2 raw = *reinterpret_cast<const uint2*>(x + c);
      const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int i = 0; i < 4; ++i) v[i] = to_f32(e[i]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = c + i < K ? to_f32(x[c + i]) : 0.0f;
  }
}

// One warp per row and group of kQuantBlocksPerWarp 128-channel blocks; lane l holds channels
// 4l..4l+3 of each block. Per block: scale = amax / 448 (1 when amax is 0 or not finite),
// code = e4m3(x / scale) saturated. Row s (of `rows`) reads row s / in_div of `in` [rows / in_div, K]
// (in_div = top_k: pair s's token) and goes to dst row (row_map ? row_map[s] : s) of the codes and of
// scales [ceil(K/128), ld] (MN-major); row_map[s] < 0 skips the row.
// Code = uint8_t: e4m3 bytes [*, K] in order (QGMMA); uint16_t: f16 values [*, x_code_ld(K)] in the
// x_code_col order (the transposed exact kernel) or, with `natural`, in k order (the untransposed one).
// Every block's loads are issued before the first reduction, and stored 4 codes at a time: with one
// block per warp and byte stores the pass ran at 1.5 TB/s (ncu on the H200, 2026-12-02: deepseek_v3
// T = 16384, x 233 us, h 550 us).
constexpr int kQuantBlocksPerWarp = 4;
template <class T, class Code>
__global__ void quantize_rows_kernel(const T* in, int64_t rows, int K, const int* row_map, Code* codes, float* scales, int ld,
                                     int in_div, bool vec, bool natural) {
  constexpr int G = kQuantBlocksPerWarp;
  const int kb_count = (K + kKBlock - 1) / kKBlock, groups = (kb_count + G - 1) / G;
  const int64_t warp_id = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (warp_id >= rows * groups) return;
  const int64_t s = warp_id / groups;
  const int g = int(warp_id - s * groups);
  const int dst = row_map ? row_map[s] : int(s);
  if (dst < 0) return;
  const T* x = in + (s / in_div) * int64_t(K);
  float v[G][4];
#pragma unroll
  for (int u = 0; u < G; ++u) load4(x, (g * G + u) * kKBlock + lane * 4, K, vec, v[u]);
#pragma unroll
  for (int u = 0; u < G; ++u) {
    const int kb = g * G + u;
    if (kb >= kb_count) break;  // warp-uniform
    const int c = kb * kKBlock + lane * 4;
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) amax = fmaxf(amax, fabsf(v[u][i]));  // fmaxf ignores NaN, as std::max on the CPU does
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, d));
    const float scale = amax > 0.0f && isfinite(amax) ? amax / 448.0f : 1.0f;
    uint32_t code[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      code[i] = c + i < K ? uint32_t(__nv_cvt_float_to_fp8(v[u][i] / scale, __NV_SATFINITE, __NV_E4M3)) : 0u;
    if constexpr (std::is_same_v<Code, uint8_t>) {
      uint8_t* q = codes + int64_t(dst) * K;
      if (vec && c + 3 < K) {
        *reinterpret_cast<uint32_t*>(q + c) = code[0] | (code[1] << 8) | (code[2] << 16) | (code[3] << 24);
      } else {
#pragma unroll
        for (int i = 0; i < 4; ++i)
          if (c + i < K) q[c + i] = uint8_t(code[i]);
      }
    } else {
      // columns 4l + {0, 1} and 4l + {2, 3} of the block land in two pairs of adjacent halves
      // (x_code_col), every column written (zero past K)
      uint16_t* q = codes + int64_t(dst) * (int64_t(kb_count) * kKBlock) + kb * kKBlock;
      uint16_t hv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) hv[i] = __nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t(code[i]), __NV_E4M3).x;
      const int p = lane * 4;
      const uint32_t lo = uint32_t(hv[0]) | (uint32_t(hv[1]) << 16), hi = uint32_t(hv[2]) | (uint32_t(hv[3]) << 16);
      if (natural) {
        *reinterpret_cast<uint2*>(q + p) = make_uint2(lo, hi);
      } else {
        *reinterpret_cast<uint32_t*>(q + (p & ~63) + x_code_col(p & 63)) = lo;
        *reinterpret_cast<uint32_t*>(q + (p & ~63) + x_code_col((p + 2) & 63)) = hi;
      }
    }
    if (lane == 0) scales[int64_t(kb) * ld + dst] = scale;
  }
}

template <class T, class Code>
void launch_quantize_rows(const void* in, int64_t rows, int K, const int* row_map, Code* codes, float* scales, int ld,
                          int in_div, bool natural, cudaStream_t stream) {
  const int64_t groups = ceil_div(ceil_div(int64_t(K), int64_t(kKBlock)), int64_t(kQuantBlocksPerWarp));
  const int64_t warps = rows * groups;
  if (warps == 0) return;
  // vector loads / stores: rows of a multiple of 4 elements on 4-element aligned bases
  const bool vec = K % 4 == 0 && reinterpret_cast<uintptr_t>(in) % (4 * sizeof(T)) == 0 &&
                   reinterpret_cast<uintptr_t>(codes) % 4 == 0;
  const int threads = 256;
  const int64_t blocks = (warps * 32 + threads - 1) / threads;
  quantize_rows_kernel<T, Code>
      <<<unsigned(blocks), threads, 0, stream>>>(static_cast<const T*>(in), rows, K, row_map, codes, scales, ld, in_div, vec,
                                                 natural);
  check_launch("deepgemm quantize_rows");
}

// codes: uint8_t* (e4m3, QGMMA) or uint16_t* (f16 values in the exact kernels' order: natural for the
// untransposed one, TmaFp8Extra::exact_nt).
template <class Code>
void quantize_rows(DType dt, const void* in, int64_t rows, int K, const int* row_map, Code* codes, float* scales, int ld,
                   cudaStream_t stream, int in_div = 1, bool natural = false) {
  if (dt == DType::bf16) launch_quantize_rows<__nv_bfloat16>(in, rows, K, row_map, codes, scales, ld, in_div, natural, stream);
  else if (dt == DType::f16) launch_quantize_rows<__half>(in, rows, K, row_map, codes, scales, ld, in_div, natural, stream);
  else launch_quantize_rows<float>(in, rows, K, row_map, codes, scales, ld, in_div, natural, stream);
}

// ---- workspace ---------------------------------------------------------------------------------

struct Sizes {
  int64_t T, K, S, E, H, I, R, M, M4, T4, max_tiles;
  Layout layout;
  bool fp8;
  // FP8 GEMMs through the exact kernel (f16 codes, rows of x_code_ld columns), else QGMMA (e4m3 codes)
  bool up_exact, down_exact;
  // the quantizer writes the token codes at the layout rows ([M, x_ld], one copy per pair) and the up
  // GEMM reads them by TMA instead of gathering them with cp.async. Exact up GEMM: where S = T·K <= 8192
  // (kPregatherMaxPairs); QGMMA: opt-in only (measured slower at K = 8). MOEX_CUDA_FP8_X_PREGATHER=1 / 0
  // forces it on / off.
  bool x_pregather;
  // the exact up GEMM on the converting kernel (TmaFp8Extra::exact_conv): gated, concatenated,
  // I % 128 == 0; by default from kConvMinRowsPerExpert rows per expert; MOEX_CUDA_FP8_X_CONV=1 / 0
  // forces it on / off (read per call). Its A rows come by TMA (x_pregather forced) as f16 codes in
  // natural k order.
  bool x_conv;
  // FP8 code buffers (derived from the flags above): x codes [x_rows, x_ld] and their scales
  // [ceil(H/128), x_scale_ld]; h codes [M, h_ld]. Code bytes: 2 (exact, f16 values) or 1 (e4m3).
  int64_t x_rows, x_ld, x_scale_ld, h_ld;
  int x_code_bytes, h_code_bytes;
};

// The pre-gathered token codes of the exact up GEMM (Sizes::x_pregather) up to this many pairs. H200,
// 2026-12-01 (docs/PERF.md, fifteenth session, one round): 3-10 % faster at T = 512 on the four SPEC §9
// shapes (S = 1024..4096) and on mixtral_8x7b T = 4096 (S = 8192: 6.84 -> 6.29 ms); at S = 16384 /
// 32768 within 2 % (qwen15_moe_a2_7b, deepseek_v3 T = 4096) or 9 % slower (qwen3_30b_a3b: 1.047 ->
// 1.141 ms), where the K copies of every token's codes cost more than the gather they replace.
constexpr int64_t kPregatherMaxPairs = 8192;
// The exact GEMMs take the few-row kernel (TmaFp8Extra::exact_few_rows) up to this many pairs per
// expert on average (S <= 32 E: mixtral_8x7b at T <= 128, qwen3_30b_a3b and deepseek_v3 at T <= 512).
constexpr int64_t kFewRowsPerExpert = 32;
// The converting exact kernel (X = 6) for the gated up GEMM by default where it fits and the experts
// hold at least kConvMinRowsPerExpert pairs on average (S >= 256 E). Measured on the H100 (2026-12-06,
// docs/PERF.md, forty-sixth session, calls 1 and 2, FP8 forward against X = 1): mixtral_8x7b T = 4096
// (1 024 rows per expert) 6.86 -> 5.28 and 6.14 -> 6.07 ms, qwen15_moe_a2_7b T = 4096 (273) 0.94 -> 0.89
// both times, qwen3_30b_a3b T = 4096 (256) 1.069 -> 1.062 and 1.082 -> 1.066; slower below: deepseek_v3
// T = 4096 (128 rows: 8.27 -> 8.68 ms) and every shape at T = 512 (16-128 rows: 8-30 %), where its
// pre-gathered codes (x_conv forces x_pregather) and the 256-wide tiles' padding cost more than the
// GEMM saves.
constexpr int64_t kConvMinRowsPerExpert = 256;

Sizes sizes_of(const ExpertsSpec& s, int64_t T, int64_t K, LayoutChoice choice = LayoutChoice::by_size,
               Fp8TmaKernels kernels = {false, false}) {
  Sizes z{};
  z.T = T;
  z.K = K;
  z.S = T * K;
  z.E = s.num_experts;
  z.H = s.hidden;
  z.I = s.intermediate;
  z.R = s.gate_up_rows();
  z.layout = layout_for(T, choice);
  z.M = layout_rows(z.layout, T, z.S, z.E);
  z.M4 = round4(z.M);
  z.T4 = round4(T);
  z.fp8 = s.quant.kind == QuantKind::fp8_block;
  z.up_exact = z.fp8 && kernels.up_exact;
  z.down_exact = z.fp8 && kernels.down_exact;
  if (z.fp8) {
    const char* conv = std::getenv("MOEX_CUDA_FP8_X_CONV");  // read per call, as the route
    const bool conv_wanted = conv && *conv ? *conv == '1' : z.S >= kConvMinRowsPerExpert * z.E;
    z.x_conv = z.up_exact && conv_wanted && s.has_gate && !s.interleaved && z.I % 128 == 0;
    const char* pre = std::getenv("MOEX_CUDA_FP8_X_PREGATHER");
    z.x_pregather = z.x_conv || (pre && *pre ? *pre == '1' : z.up_exact && z.S <= kPregatherMaxPairs);
  }
  z.x_rows = z.x_pregather ? z.M : z.T;
  z.x_scale_ld = z.x_pregather ? z.M4 : z.T4;
  z.x_ld = z.up_exact ? x_code_ld(z.H) : z.H;
  z.h_ld = z.down_exact ? x_code_ld(z.I) : z.I;
  z.x_code_bytes = z.up_exact ? 2 : 1;
  z.h_code_bytes = z.down_exact ? 2 : 1;
  // tiles: contiguous Σ ceil(cnt/128) <= ceil(S/128) + min(S, E); masked the same sum
  z.max_tiles = max_m_tiles(z.S, z.E, kTile);
  return z;
}

size_t workspace_of(const Sizes& z, DType act) {
  size_t b = plan_workspace_bytes(z.S, z.E, kTile);
  b += bytes_of(z.E + 1, 4) + bytes_of(z.E, 4) + bytes_of(z.max_tiles, 16) + bytes_of(z.M, 4) + 2 * bytes_of(z.S, 4);
  b += bytes_of(z.S * z.H, 4);  // y
  if (z.fp8) {
    // x codes, their scales, h at the pair rows, h codes, their scales (run_deepgemm's order)
    b += bytes_of(z.x_rows * z.x_ld, z.x_code_bytes) + bytes_of(ceil_div(z.H, kKBlock) * z.x_scale_ld, 4);
    b += bytes_of(z.S * z.I, dtype_size(act)) + bytes_of(z.M * z.h_ld, z.h_code_bytes) + bytes_of(ceil_div(z.I, kKBlock) * z.M4, 4);
  } else {
    b += bytes_of(z.M * z.I, dtype_size(act));
  }
  return b;
}

Epi up_epi_of(const ExpertsSpec& s) {
  if (!s.has_gate) return Epi::up_plain;
  return s.interleaved ? Epi::up_interleaved : Epi::up_concat;
}

}  // namespace

// ---- requirements beyond the SPEC §2 ones (builtin_backends.cpp checks those first) -------------

Support cuda_deepgemm_supports(const Problem& p) {
  const ExpertsSpec& s = p.spec;
  const bool fp8 = s.quant.kind == QuantKind::fp8_block;
  const int cc = p.effective_compute_capability();
  if (cc != 90)
    return Support::no(format("the deepgemm kernels of this build are compiled for sm_90a (Hopper, compute capability 9.0); "
                              "{} has {}.{}; use grouped_mm",
                              to_string(p.device), cc / 10, cc % 10));
  if (s.transposed)
    return Support::no("deepgemm reads K-major weights ([E, out, in]); FP8 wgmma has no transposed operand and this build "
                       "does not transpose [E, in, out] weights; use grouped_mm");
  if (fp8 && s.quant.block_n != 128)
    return Support::no(format("deepgemm on Hopper runs 128x128 FP8 weight blocks (got {}x{}); use grouped_mm", s.quant.block_n,
                              s.quant.block_k));
  const int64_t align = fp8 ? 16 : 8;
  if (s.hidden % align != 0 || s.intermediate % align != 0)
    return Support::no(format("deepgemm needs H and I multiples of {} (TMA rows of 16 bytes); got H={} I={}; use grouped_mm",
                              align, s.hidden, s.intermediate));
  if (fp8 && s.has_gate && !s.interleaved && s.intermediate % 64 != 0)
    return Support::no(format("deepgemm FP8 with concatenated gate/up needs I a multiple of 64 (got {}): a 64-row half tile "
                              "must not straddle two 128-row scale blocks; use grouped_mm",
                              s.intermediate));
  const int64_t S = p.tokens * p.top_k;
  const Sizes z = sizes_of(s, p.tokens, p.top_k);
  if (z.M >= (int64_t(1) << 31) - 256 || S >= (int64_t(1) << 31) - 1024 || z.max_tiles > (int64_t(1) << 30))
    return Support::no(format("deepgemm: {} layout rows exceed 2^31; split the call into fewer tokens", z.M));
  return Support::yes();
}

size_t cuda_deepgemm_workspace(const Problem& p) {
  if (small_batch_route(p.spec, p.tokens, p.top_k)) return cuda_batched_workspace(p);
  return workspace_of(sizes_of(p.spec, p.tokens, p.top_k), p.spec.dtype);
}

namespace {

// kernels: per FP8 GEMM, the exact kernel (grouped_mm) or QGMMA (deepgemm: both).
void run_deepgemm(const Experts& ex, const ExpertsCall& call, const RunContext& ctx, LayoutChoice choice, Fp8TmaKernels kernels) {
  const ExpertsSpec& s = ex.spec;
  DeviceGuard guard(call.hidden.device.index);
  cudaStream_t stream = static_cast<cudaStream_t>(ctx.options.stream);
  const int64_t T = call.hidden.shape[0], K = call.top_k_index.shape[1];
  const Sizes z = sizes_of(s, T, K, choice, kernels);
  const bool idx64 = call.top_k_index.dtype == DType::i64;

  WorkspaceCarver ws(ctx.workspace.data(), ctx.workspace.capacity());
  DevicePlan plan = carve_plan(ws, z.S, z.E, kTile);
  // The paired tile order (routing_plan.cu): the clustered GEMMs (FP8 up projections, bf16 on
  // grouped_mm's cluster rule) share the weight tile of m tiles 2p and 2p + 1 only when both belong
  // to one expert, and in expert order every expert after one with an odd tile count starts at an
  // odd tile. MOEX_DEEPGEMM_PAIRED=0: expert by expert (A/B runs).
  static const bool paired_order = [] {
    const char* e = std::getenv("MOEX_DEEPGEMM_PAIRED");
    return !(e && *e == '0');
  }();
  plan.pair_aligned = paired_order;
  int* tile_off = ws.take<int>(size_t(z.E + 1));
  int* row_base = ws.take<int>(size_t(z.E));
  int4* tiles = ws.take<int4>(size_t(z.max_tiles));
  int* row_pair = ws.take<int>(size_t(z.M));
  int* pair_lrow = ws.take<int>(size_t(z.S));
  int* pair_rows = ws.take<int>(size_t(z.S));
  float* y = ws.take<float>(size_t(z.S * z.H));

  build_plan(plan, call.top_k_index.data, idx64, z.S, z.E, stream);
  if (z.S > 0) {
    layout_scan_kernel<<<1, 1024, 0, stream>>>(plan.counts, int(z.E), int(z.T4), z.layout == Layout::masked, tile_off, row_base);
    check_launch("deepgemm layout_scan");
    const int64_t work = std::max<int64_t>(z.max_tiles, z.S);
    const unsigned blocks = unsigned(std::min<int64_t>(1024, ceil_div(work, 256)));
    layout_fill_kernel<<<blocks, 256, 0, stream>>>(plan.counts, plan.offsets, plan.sorted_pairs, plan.pair_to_row,
                                                   plan.tiles, tile_off, row_base, int(z.E), int(z.S), int(z.max_tiles),
                                                   tiles, row_pair, pair_lrow, pair_rows);
    check_launch("deepgemm layout_fill");
  }
  DevicePlan lplan = plan;
  lplan.tiles = tiles;
  lplan.max_tiles = int(z.max_tiles);
  lplan.tile_m = kTile;

  GroupedGemmArgs up{};
  up.a_gather = row_pair;  // layout row -> pair; / K -> token
  up.a_div = int(K);
  up.W = ex.gate_up.data;
  up.w_transposed = false;
  up.w_expert_stride = z.R * z.H;
  up.bias = s.has_bias ? ex.gate_up_bias.data : nullptr;
  up.Kdim = int(z.H);
  up.N = int(z.R);
  up.I = int(z.I);
  up.epi = up_epi_of(s);
  up.act = act_params(s.activation);
  up.ldo = int(z.I);
  up.plan = lplan;

  GroupedGemmArgs down = up;
  down.a_gather = nullptr;
  down.a_div = 1;
  down.W = ex.down.data;
  down.w_expert_stride = z.H * z.I;
  down.bias = s.has_bias ? ex.down_bias.data : nullptr;
  down.Kdim = int(z.I);
  down.N = int(z.H);
  down.epi = Epi::down;
  down.out = y;
  down.ldo = int(z.H);

  TmaFp8Extra xu{}, xd{};
  xd.out_rows = row_pair;  // y rows are pair ids
  if (z.fp8) {
    // codes: e4m3 bytes [rows, K] (QGMMA) or f16 values [rows, x_code_ld(K)] (exact)
    void* xq = ws.take_bytes(size_t(z.x_rows * z.x_ld) * size_t(z.x_code_bytes));
    float* xs = ws.take<float>(size_t(ceil_div(z.H, kKBlock) * z.x_scale_ld));
    void* hp = ws.take_bytes(size_t(z.S * z.I) * dtype_size(s.dtype));  // h at the pair rows
    void* hq = ws.take_bytes(size_t(z.M * z.h_ld) * size_t(z.h_code_bytes));
    float* hs = ws.take<float>(size_t(ceil_div(z.I, kKBlock) * z.M4));
    const bool ue8m0 = s.quant.scale_format == ScaleFormat::ue8m0;
    // The exact GEMMs on the untransposed kernel (TmaFp8Extra::exact_nt; their f16 codes in natural k
    // order): opt-in, MOEX_CUDA_FP8_X_NT=1 (read per call, as MOEX_CUDA_FP8_TMA: the prefill test
    // runs both): measured on the H200, 2 % faster to 11 % slower than the transposed kernel at T = 4096.
    const char* x_nt_env = std::getenv("MOEX_CUDA_FP8_X_NT");
    const bool x_nt = x_nt_env && *x_nt_env == '1';
    // pre-gathered: pair p's token row p / K at its layout row (padding rows stay unwritten: discarded);
    // else one row of codes per token
    const int64_t x_in_rows = z.x_pregather ? z.S : T;
    const int* x_row_map = z.x_pregather ? pair_lrow : nullptr;
    const int x_in_div = z.x_pregather ? int(K) : 1;
    if (z.up_exact)
      quantize_rows(s.dtype, call.hidden.data, x_in_rows, int(z.H), x_row_map, static_cast<uint16_t*>(xq), xs,
                    int(z.x_scale_ld), stream, x_in_div, x_nt || z.x_conv);
    else
      quantize_rows(s.dtype, call.hidden.data, x_in_rows, int(z.H), x_row_map, static_cast<uint8_t*>(xq), xs,
                    int(z.x_scale_ld), stream, x_in_div);
    xu.exact = z.up_exact;
    xd.exact = z.down_exact;
    xu.exact_nt = xd.exact_nt = x_nt;
    xu.exact_conv = z.x_conv;
    // The few-row exact kernel (six stages of 64-row A tiles instead of four of 128) where an expert
    // holds about 32 rows or fewer on average (S <= 32 E): there the exact GEMM streams its weights
    // and the ring's weight bytes in flight set its pace. MOEX_CUDA_FP8_X_FEW=1 / 0 forces it on / off
    // (read per call, for A/B runs and the tests).
    const char* few_env = std::getenv("MOEX_CUDA_FP8_X_FEW");
    const bool few = few_env && *few_env ? *few_env == '1' : z.S <= kFewRowsPerExpert * z.E;
    xu.exact_few_rows = xd.exact_few_rows = few;  // (the launcher: only where the A rows come by TMA)
    // The wide exact kernel (256 weight rows per tile, one rescaled accumulator set; TmaFp8Extra::
    // exact_wide) for the exact GEMMs that do not take the few-row one: opt-in, MOEX_CUDA_FP8_X_WIDE=1
    // (2: its pipelined form; read per call: the prefill test runs both).
    const char* wide_env = std::getenv("MOEX_CUDA_FP8_X_WIDE");
    xu.exact_wide = xd.exact_wide = wide_env && (*wide_env == '1' || *wide_env == '2') ? *wide_env - '0' : 0;
    xu.a_ld = z.up_exact ? int(z.x_ld) : 0;
    xd.a_ld = z.down_exact ? int(z.h_ld) : 0;
    up.A = xq;
    up.out = hp;
    xu.out_rows = row_pair;  // h at the pair row
    xu.a_scales = xs;
    xu.a_scales_ld = int(z.x_scale_ld);
    if (z.x_pregather) up.a_gather = nullptr;  // A rows by TMA, at the layout rows
    xu.w_scales = ex.gate_up_scale.data;
    xu.w_ue8m0 = ue8m0;
    down.A = hq;
    xd.a_scales = hs;
    xd.a_scales_ld = int(z.M4);
    xd.w_scales = ex.down_scale.data;
    xd.w_ue8m0 = ue8m0;
    if (!tma_fp8_usable(up) || !tma_fp8_usable(down))
      fail(ErrorCode::unsupported, "deepgemm: the FP8 TMA kernel cannot run this call (device {} / alignment of the buffers); "
                                   "use grouped_mm",
           to_string(call.hidden.device));
    // h quantized in the up GEMM's epilogue where its kernel can (256-wide QGMMA tiles, concatenated
    // gate / up: tma_fp8_quantizes_h), bit-identical to the separate pass over h at the pair rows,
    // which it saves (read S x I in the activation dtype, write the codes again; 0.55 ms of
    // deepseek_v3 T = 16384's 16.2, ncu on the H200, 2026-12-02). MOEX_DEEPGEMM_FUSED_HQ=0: the pass.
    static const bool fuse_hq = [] {
      const char* e = std::getenv("MOEX_DEEPGEMM_FUSED_HQ");
      return !(e && *e == '0');
    }();
    const bool hq_in_epilogue = fuse_hq && !z.down_exact && tma_fp8_quantizes_h(up, s.dtype, z.up_exact, z.x_conv);
    if (hq_in_epilogue) {
      xu.h_codes = hq;
      xu.h_scales = hs;
      xu.h_scales_ld = int(z.M4);
    }
    launch_grouped_gemm_tma_ex(up, s.dtype, true, xu, z.x_rows, z.E, stream);
    if (!hq_in_epilogue) {
      if (z.down_exact)
        quantize_rows(s.dtype, hp, z.S, int(z.I), pair_lrow, static_cast<uint16_t*>(hq), hs, int(z.M4), stream, 1, x_nt);
      else
        quantize_rows(s.dtype, hp, z.S, int(z.I), pair_lrow, static_cast<uint8_t*>(hq), hs, int(z.M4), stream);
    }
    launch_grouped_gemm_tma_ex(down, s.dtype, true, xd, z.M, z.E, stream);
  } else {
    void* h = ws.take_bytes(size_t(z.M * z.I) * dtype_size(s.dtype));
    up.A = call.hidden.data;
    up.out = h;  // at the layout row (the down GEMM reads it by TMA)
    down.A = h;
    const bool vec = aligned16(call.hidden.data) && aligned16(ex.gate_up.data) && aligned16(ex.down.data);
    if (!tma_usable(up, vec) || !tma_usable(down, vec))
      fail(ErrorCode::unsupported, "deepgemm: the TMA kernel cannot run this call (device {}, MOEX_CUDA_NO_TMA, or 16-byte "
                                   "alignment of the buffers); use grouped_mm",
           to_string(call.hidden.device));
    // grouped_mm's tile / cluster rule (choose_tma_tile): faster than the 256-wide tiles without
    // clusters that this path had until 2026-12-01 (H200, 2026-11-30, two calls, docs/PERF.md:
    // mixtral_8x7b T = 16384 26.8 -> 23.6 ms, T = 4096 6.88 -> 5.53, qwen3_30b_a3b T = 16384 4.23 -> 3.51).
    // Its GPU tests passed in 2-CTA clusters on 256-wide tiles (forced, tenth session), unforced
    // (twelfth) and with 128-wide tiles forced (fifteenth). MOEX_CUDA_DEEPGEMM_GROUPED_TILES=0: the
    // 256-wide tiles without clusters.
    static const bool grouped_tiles = [] {
      const char* e = std::getenv("MOEX_CUDA_DEEPGEMM_GROUPED_TILES");
      return !(e && *e == '0');
    }();
    if (grouped_tiles) {
      choose_tma_tile(up, z.S, z.E, xu);
      choose_tma_tile(down, z.S, z.E, xd);
    }
    launch_grouped_gemm_tma_ex(up, s.dtype, false, xu, T, z.E, stream);
    launch_grouped_gemm_tma_ex(down, s.dtype, false, xd, z.M, z.E, stream);
  }

  launch_combine_call(call, y, pair_rows, z.H, nullptr, s.dtype, stream);  // bias added in the down GEMM
}

}  // namespace

void cuda_deepgemm(const Experts& ex, const ExpertsCall& call, const RunContext& ctx) {
  if (small_batch_route(ex.spec, call.hidden.shape[0], call.top_k_index.shape[1])) {
    cuda_batched(ex, call, ctx);  // a handful of tokens: the GEMV kernels (file comment)
    return;
  }
  run_deepgemm(ex, call, ctx, LayoutChoice::by_size, Fp8TmaKernels{false, false});
}

// grouped_mm's FP8 path on Hopper: the same kernels in the contiguous layout, exact (f16 codes and
// HGMMA; the default) or QGMMA.
bool cuda_fp8_tma_route(const Problem& p) {
  const QuantSpec& q = p.spec.quant;
  if (q.kind != QuantKind::fp8_block || q.block_n != 128 || q.block_k != 128 || q.activation_scheme != ActivationScheme::dynamic)
    return false;
  if (tma_disabled()) return false;
  if (!p.device.is_cuda() || p.compute_capability < 0) return false;  // the caller fills in the device's
  return cuda_deepgemm_supports(p).ok;
}
size_t cuda_fp8_tma_workspace(const Problem& p, Fp8TmaKernels kernels) {
  return workspace_of(sizes_of(p.spec, p.tokens, p.top_k, LayoutChoice::contiguous, kernels), p.spec.dtype);
}
void cuda_fp8_tma_grouped(const Experts& ex, const ExpertsCall& call, const RunContext& ctx, Fp8TmaKernels kernels) {
  run_deepgemm(ex, call, ctx, LayoutChoice::contiguous, kernels);
}

}  // namespace moex::detail
