// backends/cuda/f32_grouped_gemm.cu — grouped GEMM over per-expert row blocks in f32 on FFMA
// (no TF32: SPEC §8 asks f32 results within 1e-5 of the f64 reference).
//
// Same contract as sm80_grouped_gemm.cu (device tile table, gathered A rows, fused gated
// activation, f32 y for the down projection) with a plain shared-memory tiled SGEMM:
// 64×64 tile, k-step 16, 256 threads each computing 4 rows × 4 columns. Element loads with
// bounds checks, so any H and I work. f32 experts are the accuracy path, not the fast path.
#include "backends/cuda/grouped_gemm_common.cuh"

namespace moex::cuda {

namespace {

constexpr int BM = kF32TileM, BN = 64, BK = 16, THREADS = 256;

template <bool BT>
__global__ void __launch_bounds__(THREADS) grouped_gemm_f32(GroupedGemmArgs a) {
  __shared__ float As[BK][BM + 4];
  __shared__ float Bs[BK][BN + 4];
  const int4 tile = a.plan.tiles[blockIdx.y];
  const int e = tile.x;
  if (e < 0) return;
  const int row_begin = tile.y, row_end = tile.z;
  const ColMap cm{a.epi, int(blockIdx.x), BN, a.N, a.I};
  const float* A = static_cast<const float*>(a.A);
  const float* W = static_cast<const float*>(a.W) + int64_t(e) * a.w_expert_stride;
  const int Kdim = a.Kdim, tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;

  // rows and columns of this thread's loads (fixed across k steps)
  const float* a_row[4];
  int b_w[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int id = tid + j * THREADS;
    const int r = id / BK, sr = row_begin + r;
    a_row[j] = nullptr;
    if (sr < row_end) a_row[j] = A + (a.a_gather ? int64_t(a.a_gather[sr] / a.a_div) : int64_t(sr)) * Kdim;
    b_w[j] = BT ? cm.w_of(id % BN) : cm.w_of(id / BK);
  }
  const int cbase = (tx & 3) * 2 + (tx >> 2) * 16;
  const int cols[4] = {cbase, cbase + 1, cbase + 8, cbase + 9};
  float acc[4][4] = {};

  for (int k0 = 0; k0 < Kdim; k0 += BK) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int id = tid + j * THREADS;
      {
        const int r = id / BK, kk = id % BK, k = k0 + kk;
        As[kk][r] = (a_row[j] && k < Kdim) ? a_row[j][k] : 0.0f;
      }
      if (!BT) {
        const int n = id / BK, kk = id % BK, k = k0 + kk;
        Bs[kk][n] = (b_w[j] >= 0 && k < Kdim) ? W[int64_t(b_w[j]) * Kdim + k] : 0.0f;
      } else {
        const int kk = id / BN, n = id % BN, k = k0 + kk;
        Bs[kk][n] = (b_w[j] >= 0 && k < Kdim) ? W[int64_t(k) * a.N + b_w[j]] : 0.0f;
      }
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < BK; ++kk) {
      float av[4], bv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) av[i] = As[kk][ty * 4 + i];
#pragma unroll
      for (int j = 0; j < 4; ++j) bv[j] = Bs[kk][cols[j]];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
    }
    __syncthreads();
  }

  const float* bias = a.bias ? static_cast<const float*>(a.bias) + int64_t(e) * a.N : nullptr;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int row = row_begin + ty * 4 + i;
    if (row >= row_end) continue;
    if (a.epi == Epi::down || a.epi == Epi::up_plain) {
#pragma unroll
      for (int j = 0; j < 4; ++j) epi_single<float>(a, cm, bias, row, cols[j], acc[i][j]);
    } else if (a.epi == Epi::up_interleaved) {
      epi_pair<float>(a, cm, bias, row, cols[0], acc[i][0], acc[i][1]);
      epi_pair<float>(a, cm, bias, row, cols[2], acc[i][2], acc[i][3]);
    } else {
      epi_pair<float>(a, cm, bias, row, cols[0], acc[i][0], acc[i][2]);
      epi_pair<float>(a, cm, bias, row, cols[1], acc[i][1], acc[i][3]);
    }
  }
}

}  // namespace

void launch_grouped_gemm_f32(const GroupedGemmArgs& a, cudaStream_t stream) {
  MOEX_ASSERT(a.plan.tile_m == BM);
  MOEX_CHECK(a.plan.max_tiles <= 65535, "grouped_mm on CUDA: {} row tiles exceed the grid limit; split the call into "
             "fewer tokens", a.plan.max_tiles);
  dim3 grid(unsigned(n_tiles_of(a.epi, a.N, a.I, BN)), unsigned(a.plan.max_tiles));
  if (a.w_transposed) grouped_gemm_f32<true><<<grid, THREADS, 0, stream>>>(a);
  else grouped_gemm_f32<false><<<grid, THREADS, 0, stream>>>(a);
  check_launch("grouped_gemm_f32");
}

}  // namespace moex::cuda
