// backends/cuda/quant_grouped_gemm.cu — grouped GEMM over per-expert row blocks on FP8
// block-scaled and FP4 experts, on tensor cores (mma.sync m16n8k16 bf16, f32 accumulate), for
// compute capability >= 8.0: the portable path of grouped_mm on quantized experts.
//
//   C[r, c] = Σ_kb xs[arow(r), kb] · wscale(w(c), kb) · Σ_{k in kb} code[arow(r), k] · wv[w(c), k]
//
// Activation codes (e4m3) and weight values (e4m3 codes, or e2m1 × 2^k group scale for FP4) are
// exact in bf16, so they are converted to bf16 on their way into shared memory and the MMA sums
// them exactly as products, in f32. Each 128-wide k block is accumulated in its own registers and
// then promoted: acc += block · (activation scale × weight block scale), as on the CPU.
//
// Tiles: 64 sorted rows (the routing plan is built with tile_m = kQuantTileM) × 128 tile
// columns, k tiles of 64; 8 warps as 2 (M) × 4 (N), each 32×32. The tile-column mapping and the
// epilogues (gated activation fused in the up projection, h written in the activation dtype;
// down: f32 y + bias) are those of the bf16 kernel (grouped_gemm_common.cuh). Rows whose bytes
// are 16-byte aligned are loaded 16 bytes at a time; other shapes and transposed FP8 weights
// element by element (correct, slower). Loads are synchronous (one shared stage): two blocks per
// SM overlap one another's loads. Grids are sized by static bounds: capturable.
#include "backends/cuda/grouped_gemm_common.cuh"
#include "backends/cuda/mma_ptx.cuh"
#include "backends/cuda/quant_common.cuh"

namespace moex::cuda {

namespace {

constexpr int BM = kQuantTileM, BN = 128, BK = 64, THREADS = 256;
constexpr int A_ELEMS = BM * BK, B_ELEMS = BN * BK;  // bf16 elements of the two shared tiles

// Element offset of (row, chunk of 8) in a [rows][64] K-major tile with the XOR swizzle.
__device__ __forceinline__ int sw64(int row, int chunk) { return row * 64 + ((chunk ^ (row & 7)) << 3); }

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
// Eight f32 values (exact in bf16) as one 16-byte chunk of bf16.
__device__ __forceinline__ uint4 chunk_bf16(const float* f) {
  return make_uint4(pack_bf16(f[0], f[1]), pack_bf16(f[2], f[3]), pack_bf16(f[4], f[5]), pack_bf16(f[6], f[7]));
}

// VEC_A: activation rows 16-byte loadable (Kdim % 16 == 0, aligned base).
// VEC_B: weight rows 16-byte loadable (default layout; FP8 Kdim % 16 == 0, FP4 Kdim % 32 == 0).
template <class T, bool VEC_A, bool VEC_B>
__global__ void __launch_bounds__(THREADS) quant_grouped_gemm(QuantGemmArgs qa) {
  __shared__ __align__(128) __nv_bfloat16 sA[A_ELEMS];
  __shared__ __align__(128) __nv_bfloat16 sB[B_ELEMS];
  const GroupedGemmArgs& a = qa.g;
  const QuantWeights& qw = qa.w;

  const int4 tile = a.plan.tiles[blockIdx.y];
  const int e = tile.x;
  if (e < 0) return;
  const int row_begin = tile.y, row_end = tile.z;
  const ColMap cm{a.epi, int(blockIdx.x), BN, a.N, a.I};
  const int Kdim = a.Kdim, kblocks = int(quant_groups(Kdim));
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp >> 2, wn = warp & 3;
  auto a_row_of = [&](int sr) -> int64_t { return a.a_gather ? int64_t(a.a_gather[sr] / a.a_div) : int64_t(sr); };

  // ---- the promotion factors' operands of this thread's fragments ----
  int64_t frag_arow[2][2];  // [mf][hh] activation row, -1 outside the row block
#pragma unroll
  for (int mf = 0; mf < 2; ++mf)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int sr = row_begin + wm * 32 + mf * 16 + (lane >> 2) + hh * 8;
      frag_arow[mf][hh] = sr < row_end ? a_row_of(sr) : -1;
    }
  int frag_w[4][2];  // [nf][q] weight output row, -1 outside the matrix
#pragma unroll
  for (int nf = 0; nf < 4; ++nf)
#pragma unroll
    for (int q = 0; q < 2; ++q) frag_w[nf][q] = cm.w_of(wn * 32 + nf * 8 + 2 * (lane & 3) + q);

  auto load_tile = [&](int k0) {
    // A: [64 rows][64 k] codes → bf16
    if constexpr (VEC_A) {
      const int r = tid >> 2, ch = tid & 3, sr = row_begin + r, k = k0 + ch * 16;
      float f[16];
      if (sr < row_end && k < Kdim) {
        decode16(__ldg(reinterpret_cast<const uint4*>(qa.aq + a_row_of(sr) * Kdim + k)), f);
      } else {
#pragma unroll
        for (int q = 0; q < 16; ++q) f[q] = 0.0f;
      }
      *reinterpret_cast<uint4*>(sA + sw64(r, 2 * ch)) = chunk_bf16(f);
      *reinterpret_cast<uint4*>(sA + sw64(r, 2 * ch + 1)) = chunk_bf16(f + 8);
    } else {
      for (int id = tid; id < A_ELEMS; id += THREADS) {
        const int r = id / BK, kk = id % BK, k = k0 + kk, sr = row_begin + r;
        const float v = sr < row_end && k < Kdim ? e4m3_value(qa.aq[a_row_of(sr) * Kdim + k]) : 0.0f;
        sA[sw64(r, kk >> 3) + (kk & 7)] = __float2bfloat16_rn(v);
      }
    }
    // B: [128 tile columns][64 k] weight values → bf16
    if constexpr (VEC_B) {
      if (!qw.fp4) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int n = (tid >> 2) + 64 * j, ch = tid & 3, k = k0 + ch * 16, w = cm.w_of(n);
          float f[16];
          if (w >= 0 && k < Kdim) {
            decode16(__ldg(reinterpret_cast<const uint4*>(qw.data + e * qw.data_stride + int64_t(w) * Kdim + k)), f);
          } else {
#pragma unroll
            for (int q = 0; q < 16; ++q) f[q] = 0.0f;
          }
          *reinterpret_cast<uint4*>(sB + sw64(n, 2 * ch)) = chunk_bf16(f);
          *reinterpret_cast<uint4*>(sB + sw64(n, 2 * ch + 1)) = chunk_bf16(f + 8);
        }
      } else {
        // 16 packed bytes = 32 values k .. k+31 of one weight row
        const int n = tid >> 1, half = tid & 1, k = k0 + half * 32, w = cm.w_of(n);
        float f[32];
        if (w >= 0 && k < Kdim) {
          const int64_t groups = (Kdim + qw.group - 1) / qw.group;
          const uint4 v = __ldg(reinterpret_cast<const uint4*>(qw.data + e * qw.data_stride + int64_t(w) * (Kdim / 2) + k / 2));
          const uint32_t b[4] = {v.x, v.y, v.z, v.w};
          const uint8_t* rs = static_cast<const uint8_t*>(qw.scales) + e * qw.scale_stride + int64_t(w) * groups;
#pragma unroll
          for (int q = 0; q < 32; ++q) f[q] = e2m1_value(b[q >> 3] >> ((q & 7) * 4)) * ue8m0_value(rs[(k + q) / qw.group]);
        } else {
#pragma unroll
          for (int q = 0; q < 32; ++q) f[q] = 0.0f;
        }
#pragma unroll
        for (int c = 0; c < 4; ++c) *reinterpret_cast<uint4*>(sB + sw64(n, 4 * half + c)) = chunk_bf16(f + 8 * c);
      }
    } else {
      // element-wise: consecutive threads take consecutive tile columns (coalesced for [K, N])
      for (int id = tid; id < B_ELEMS; id += THREADS) {
        const int kk = id / BN, n = id % BN, k = k0 + kk, w = cm.w_of(n);
        const float v = w >= 0 && k < Kdim ? weight_value(qw, e, w, k) : 0.0f;
        sB[sw64(n, kk >> 3) + (kk & 7)] = __float2bfloat16_rn(v);
      }
    }
  };

  float acc[2][4][4], blk[2][4][4];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[i][j][q] = blk[i][j][q] = 0.0f;

  const int ktiles = (Kdim + BK - 1) / BK;
  const int tiles_per_block = kQuantGroup / BK;
  for (int kt = 0; kt < ktiles; ++kt) {
    __syncthreads();  // the previous tile's fragments are read
    load_tile(kt * BK);
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      uint32_t af[2][4], bf[4][2];
#pragma unroll
      for (int mf = 0; mf < 2; ++mf) {
        const int row = wm * 32 + mf * 16 + (lane & 15);
        const int chunk = kk * 2 + (lane >> 4);
        ptx::ldmatrix_x4(ptx::smem_u32(sA + sw64(row, chunk)), af[mf][0], af[mf][1], af[mf][2], af[mf][3]);
      }
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        const int n = wn * 32 + np * 16 + (lane & 7) + ((lane >> 4) << 3);
        const int chunk = kk * 2 + ((lane >> 3) & 1);
        ptx::ldmatrix_x4(ptx::smem_u32(sB + sw64(n, chunk)), bf[2 * np][0], bf[2 * np][1], bf[2 * np + 1][0], bf[2 * np + 1][1]);
      }
#pragma unroll
      for (int mf = 0; mf < 2; ++mf)
#pragma unroll
        for (int nf = 0; nf < 4; ++nf) ptx::mma16816<__nv_bfloat16>(blk[mf][nf], af[mf], bf[nf]);
    }
    // end of a 128-wide k block (or of K): promote with activation scale × weight block scale
    if (kt % tiles_per_block == tiles_per_block - 1 || kt == ktiles - 1) {
      const int kb = kt / tiles_per_block;
      float ws[4][2];
#pragma unroll
      for (int nf = 0; nf < 4; ++nf)
#pragma unroll
        for (int q = 0; q < 2; ++q) ws[nf][q] = frag_w[nf][q] >= 0 ? weight_block_factor(qw, e, frag_w[nf][q], kb) : 0.0f;
#pragma unroll
      for (int mf = 0; mf < 2; ++mf)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const float xs = frag_arow[mf][hh] >= 0 ? qa.as[frag_arow[mf][hh] * kblocks + kb] : 0.0f;
#pragma unroll
          for (int nf = 0; nf < 4; ++nf)
#pragma unroll
            for (int q = 0; q < 2; ++q) {
              float& b = blk[mf][nf][2 * hh + q];
              acc[mf][nf][2 * hh + q] = fmaf(b, xs * ws[nf][q], acc[mf][nf][2 * hh + q]);
              b = 0.0f;
            }
        }
    }
  }

  // ---- epilogue (as grouped_gemm_tc) ----
  const T* bias = a.bias ? static_cast<const T*>(a.bias) + int64_t(e) * a.N : nullptr;
  store_fragments<T, 2>(a, cm, bias, row_begin + wm * 32, row_end, wn * 32, lane, acc);
}

template <class T, bool VEC_A, bool VEC_B>
void launch_one(const QuantGemmArgs& a, cudaStream_t stream) {
  const int nt = n_tiles_of(a.g.epi, a.g.N, a.g.I, BN);
  MOEX_CHECK(a.g.plan.max_tiles <= 65535, "grouped_mm on CUDA: {} row tiles exceed the grid limit; split the call into "
             "fewer tokens", a.g.plan.max_tiles);
  dim3 grid(unsigned(nt), unsigned(a.g.plan.max_tiles));
  quant_grouped_gemm<T, VEC_A, VEC_B><<<grid, THREADS, 0, stream>>>(a);
  check_launch("quant_grouped_gemm");
}

template <class T>
void launch_typed(const QuantGemmArgs& a, bool vec_a, bool vec_b, cudaStream_t stream) {
  if (vec_a) vec_b ? launch_one<T, true, true>(a, stream) : launch_one<T, true, false>(a, stream);
  else vec_b ? launch_one<T, false, true>(a, stream) : launch_one<T, false, false>(a, stream);
}

}  // namespace

void launch_quant_grouped_gemm(const QuantGemmArgs& a, DType dtype, cudaStream_t stream) {
  MOEX_ASSERT(a.g.plan.tile_m == BM);
  MOEX_ASSERT(kQuantGroup % BK == 0);
  if (a.g.plan.max_tiles == 0) return;
  const QuantWeights& w = a.w;
  const bool vec_a = a.g.Kdim % 16 == 0 && aligned16(a.aq);
  const bool vec_b = !w.transposed && aligned16(w.data) && w.data_stride % 16 == 0 &&
                     (w.fp4 ? a.g.Kdim % 32 == 0 : a.g.Kdim % 16 == 0);
  switch (dtype) {
    case DType::f32: launch_typed<float>(a, vec_a, vec_b, stream); break;
    case DType::f16: launch_typed<__half>(a, vec_a, vec_b, stream); break;
    case DType::bf16: launch_typed<__nv_bfloat16>(a, vec_a, vec_b, stream); break;
    default: detail::fail(ErrorCode::internal, "grouped_mm on CUDA: unexpected dtype {}", dtype_name(dtype));
  }
}

}  // namespace moex::cuda
