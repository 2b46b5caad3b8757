// backends/cuda/sm80_grouped_gemm.cu — grouped GEMM over per-expert contiguous row blocks on
// tensor cores (mma.sync m16n8k16, bf16/f16 in, f32 accumulate), for compute capability >= 8.0.
//
//   C[r, c] = Σ_k A[arow(r), k] · W_e[w(c), k]     r in one expert e's sorted rows
//
// A block computes a 128×128 tile; its (expert, row range) comes from the device tile table of
// the routing plan (blockIdx.y indexes it; entries past the real tile count have expert -1 and
// the block exits), so the grid is sized by a static bound and needs no host knowledge of the
// per-expert counts. The up projection gathers its A rows straight from hidden through the
// sorted pair list (no [S, H] copy); the gated activation runs in the epilogue and h is written
// rounded to the activation dtype; the down projection writes f32 y rows (+ bias).
//
// Pipeline: 3 shared-memory stages of (A 128×64, B 128×64) filled by cp.async; ldmatrix with an
// XOR swizzle (conflict-free); 8 warps as 2 (M) × 4 (N), each 64×32.
// Weights stored [E, N, K] ("nt", K-major) are read with ldmatrix; [E, K, N] (transposed) with
// ldmatrix.trans. When rows are not 16-byte aligned (H or I not a multiple of 8) the tiles are
// filled element by element instead (correct, slower).
#include "backends/cuda/grouped_gemm_common.cuh"
#include "backends/cuda/mma_ptx.cuh"

namespace moex::cuda {

namespace {

constexpr int BM = kTcTileM, BN = 128, BK = 64, STAGES = 3, THREADS = 256;
constexpr int A_ELEMS = BM * BK, B_ELEMS = BN * BK;
constexpr int SMEM_BYTES = STAGES * (A_ELEMS + B_ELEMS) * 2;

// Element offset of (row, chunk of 8) in a [rows][64] K-major tile with the XOR swizzle.
__device__ __forceinline__ int sw64(int row, int chunk) { return row * 64 + ((chunk ^ (row & 7)) << 3); }
// Element offset of (k, chunk of 8 columns) in a [64][128] N-major tile.
__device__ __forceinline__ int sw128(int k, int chunk) { return k * 128 + ((chunk ^ (k & 7)) << 3); }

template <class T, bool BT, bool VEC>
__global__ void __launch_bounds__(THREADS) grouped_gemm_tc(GroupedGemmArgs a) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sA = reinterpret_cast<T*>(smem_raw);
  T* sB = sA + STAGES * A_ELEMS;

  const int4 tile = a.plan.tiles[blockIdx.y];
  const int e = tile.x;
  if (e < 0) return;
  const int row_begin = tile.y, row_end = tile.z;
  const ColMap cm{a.epi, int(blockIdx.x), BN, a.N, a.I};
  const T* A = static_cast<const T*>(a.A);
  const T* W = static_cast<const T*>(a.W) + int64_t(e) * a.w_expert_stride;
  const int Kdim = a.Kdim;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp >> 2, wn = warp & 3;

  // ---- per-thread load descriptors (VEC path) ----
  // A: chunks id = tid + j*256 → row (tid>>3) + 32j, chunk tid&7
  const T* a_rows[4];
  const T* b_rows[4];  // K-major B: weight row pointers; N-major B: column-chunk base pointers
  bool b_ok[4];
  if constexpr (VEC) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = (tid >> 3) + 32 * j;
      const int sr = row_begin + r;
      a_rows[j] = nullptr;
      if (sr < row_end) {
        const int64_t src = a.a_gather ? int64_t(a.a_gather[sr] / a.a_div) : int64_t(sr);
        a_rows[j] = A + src * Kdim;
      }
      if constexpr (!BT) {
        const int w = cm.w_of((tid >> 3) + 32 * j);
        b_ok[j] = w >= 0;
        b_rows[j] = W + int64_t(w < 0 ? 0 : w) * Kdim;
      } else {
        const int w = cm.w_of((tid & 15) * 8);  // same chunk for every j; k rows differ
        b_ok[j] = w >= 0;
        b_rows[j] = W + (w < 0 ? 0 : w);
      }
    }
  }

  auto load_stage = [&](int stage, int kt) {
    T* dA = sA + stage * A_ELEMS;
    T* dB = sB + stage * B_ELEMS;
    const int k0 = kt * BK;
    if constexpr (VEC) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int r = (tid >> 3) + 32 * j, c = tid & 7;
        const int k = k0 + c * 8;
        const bool ok = a_rows[j] != nullptr && k < Kdim;
        ptx::cp_async16(ptx::smem_u32(dA + sw64(r, c)), ok ? a_rows[j] + k : A, ok);
      }
      if constexpr (!BT) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int n = (tid >> 3) + 32 * j, c = tid & 7;
          const int k = k0 + c * 8;
          const bool ok = b_ok[j] && k < Kdim;
          ptx::cp_async16(ptx::smem_u32(dB + sw64(n, c)), ok ? b_rows[j] + k : W, ok);
        }
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int kr = (tid >> 4) + 16 * j, cc = tid & 15;
          const int k = k0 + kr;
          const bool ok = b_ok[j] && k < Kdim;
          ptx::cp_async16(ptx::smem_u32(dB + sw128(kr, cc)), ok ? b_rows[j] + int64_t(k) * a.N : W, ok);
        }
      }
    } else {
      // element-wise fallback for rows that are not 16-byte aligned
      for (int id = tid; id < BM * BK; id += THREADS) {
        const int r = id / BK, kk = id % BK, k = k0 + kk, sr = row_begin + r;
        T v = from_f32<T>(0.0f);
        if (sr < row_end && k < Kdim) {
          const int64_t src = a.a_gather ? int64_t(a.a_gather[sr] / a.a_div) : int64_t(sr);
          v = A[src * Kdim + k];
        }
        dA[sw64(r, kk >> 3) + (kk & 7)] = v;
      }
      if constexpr (!BT) {
        for (int id = tid; id < BN * BK; id += THREADS) {
          const int n = id / BK, kk = id % BK, k = k0 + kk;
          const int w = cm.w_of(n);
          T v = from_f32<T>(0.0f);
          if (w >= 0 && k < Kdim) v = W[int64_t(w) * Kdim + k];
          dB[sw64(n, kk >> 3) + (kk & 7)] = v;
        }
      } else {
        for (int id = tid; id < BN * BK; id += THREADS) {
          const int kr = id / BN, n = id % BN, k = k0 + kr;
          const int w = cm.w_of(n);
          T v = from_f32<T>(0.0f);
          if (w >= 0 && k < Kdim) v = W[int64_t(k) * a.N + w];
          dB[sw128(kr, n >> 3) + (n & 7)] = v;
        }
      }
    }
  };

  float acc[4][4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.0f;

  const int ktiles = (Kdim + BK - 1) / BK;
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < ktiles) load_stage(s, s);
    ptx::cp_async_commit();
  }

  for (int kt = 0; kt < ktiles; ++kt) {
    ptx::cp_async_wait<STAGES - 2>();
    __syncthreads();
    {
      const int nk = kt + STAGES - 1;
      if (nk < ktiles) load_stage(nk % STAGES, nk);
      ptx::cp_async_commit();
    }
    const T* tA = sA + (kt % STAGES) * A_ELEMS;
    const T* tB = sB + (kt % STAGES) * B_ELEMS;
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      uint32_t af[4][4], bf[4][2];
#pragma unroll
      for (int mf = 0; mf < 4; ++mf) {
        const int row = wm * 64 + mf * 16 + (lane & 15);
        const int chunk = kk * 2 + (lane >> 4);
        ptx::ldmatrix_x4(ptx::smem_u32(tA + sw64(row, chunk)), af[mf][0], af[mf][1], af[mf][2], af[mf][3]);
      }
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        if constexpr (!BT) {
          const int n = wn * 32 + np * 16 + (lane & 7) + ((lane >> 4) << 3);
          const int chunk = kk * 2 + ((lane >> 3) & 1);
          ptx::ldmatrix_x4(ptx::smem_u32(tB + sw64(n, chunk)), bf[2 * np][0], bf[2 * np][1], bf[2 * np + 1][0],
                           bf[2 * np + 1][1]);
        } else {
          const int k = kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
          const int nchunk = (wn * 32 + np * 16) / 8 + (lane >> 4);
          ptx::ldmatrix_x4_trans(ptx::smem_u32(tB + sw128(k, nchunk)), bf[2 * np][0], bf[2 * np][1], bf[2 * np + 1][0],
                                 bf[2 * np + 1][1]);
        }
      }
#pragma unroll
      for (int mf = 0; mf < 4; ++mf)
#pragma unroll
        for (int nf = 0; nf < 4; ++nf) ptx::mma16816<T>(acc[mf][nf], af[mf], bf[nf]);
    }
  }
  ptx::cp_async_wait<0>();

  // ---- epilogue ----
  const T* bias = a.bias ? static_cast<const T*>(a.bias) + int64_t(e) * a.N : nullptr;
  store_fragments<T, 4>(a, cm, bias, row_begin + wm * 64, row_end, wn * 32, lane, acc);
}

template <class T, bool BT, bool VEC>
void launch_one(const GroupedGemmArgs& a, cudaStream_t stream) {
  auto kernel = grouped_gemm_tc<T, BT, VEC>;
  static thread_local int configured_device = -1;
  int dev = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  if (configured_device != dev) {
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_BYTES), "cudaFuncSetAttribute");
    configured_device = dev;
  }
  const int nt = n_tiles_of(a.epi, a.N, a.I, BN);
  MOEX_CHECK(a.plan.max_tiles <= 65535, "grouped_mm on CUDA: {} row tiles exceed the grid limit; split the call into "
             "fewer tokens", a.plan.max_tiles);
  dim3 grid(unsigned(nt), unsigned(a.plan.max_tiles));
  kernel<<<grid, THREADS, SMEM_BYTES, stream>>>(a);
  check_launch("grouped_gemm_tc");
}

}  // namespace

void launch_grouped_gemm_tc(const GroupedGemmArgs& a, DType dtype, bool vec16, cudaStream_t stream) {
  MOEX_ASSERT(a.plan.tile_m == BM);
  if (dtype == DType::bf16) {
    if (a.w_transposed) vec16 ? launch_one<__nv_bfloat16, true, true>(a, stream) : launch_one<__nv_bfloat16, true, false>(a, stream);
    else vec16 ? launch_one<__nv_bfloat16, false, true>(a, stream) : launch_one<__nv_bfloat16, false, false>(a, stream);
  } else {
    MOEX_ASSERT(dtype == DType::f16);
    if (a.w_transposed) vec16 ? launch_one<__half, true, true>(a, stream) : launch_one<__half, true, false>(a, stream);
    else vec16 ? launch_one<__half, false, true>(a, stream) : launch_one<__half, false, false>(a, stream);
  }
}

}  // namespace moex::cuda
