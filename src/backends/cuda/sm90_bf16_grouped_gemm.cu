// backends/cuda/sm90_bf16_grouped_gemm.cu — the grouped GEMM of sm80_grouped_gemm.cu on Hopper's
// warpgroup MMA (wgmma.mma_async m64n128k16, bf16/f16 in, f32 accumulate), sm_90a only.
//
// Same contract: 128×128 tiles of one expert's sorted rows, (expert, row range) from the device
// tile table, A rows gathered through the sorted pair list, fused gated activation / bias
// epilogues. Used for weights stored [E, N, K] (K-major, the default layout) with rows that are
// 16-byte aligned; the transposed layout and odd sizes stay on the mma.sync kernel.
//
// Tiles are loaded by cp.async straight into the 128B-swizzled K-major layout wgmma reads (rows
// of 64 elements = 128 bytes, 16-byte chunk index XOR row % 8, 1024-byte aligned stages), 3
// stages deep. Two warpgroups each own 64 rows × 128 columns (64 f32 accumulators per thread);
// one wgmma group stays in flight while the next stage is requested. 2 blocks per SM.
// NOTE (H200, bf16, T=16384, CUDA-graph timings of CudaPerf.Shapes, 2026-11-29): replacing the
// mma.sync kernel by this one took grouped_mm from 41.5 to 29.0 ms on mixtral_8x7b (278 -> 398
// TFLOP/s), 48.5 -> 31.6 ms on deepseek_v3 (238 -> 366) and 6.76 -> 3.57 ms on qwen3_30b_a3b.
// The m64n256 variant (1 block/SM, 4 stages) was slower in the same run: 36.8 / 44.1 / 7.1 ms,
// so 128 stays the default. cuBLAS dense reaches ~860 TFLOP/s there: the gap is the barrier-
// synchronised cp.async pipeline. The next step is TMA loads with an mbarrier pipeline and a
// producer warp (setmaxnreg), plus a persistent tile scheduler.
#include "backends/cuda/grouped_gemm_common.cuh"
#include "backends/cuda/mma_ptx.cuh"
#include "backends/cuda/wgmma_ptx.cuh"

namespace moex::cuda {

namespace {

constexpr int BM = kTcTileM, BK = 64, THREADS = 256;
constexpr int A_BYTES = BM * BK * 2;
// BN = 128: 3 stages (97 KB), 2 blocks per SM. BN = 256: 4 stages (193 KB), 1 block per SM,
// twice the MMA work per barrier (MOEX_CUDA_WGMMA_N=256).
template <int BN>
struct Cfg {
  static constexpr int STAGES = BN == 128 ? 3 : 4;
  static constexpr int B_BYTES = BN * BK * 2;
  static constexpr int SMEM_BYTES = STAGES * (A_BYTES + B_BYTES) + 1024;  // + alignment slack
  static constexpr int MIN_BLOCKS = BN == 128 ? 2 : 1;
};

__device__ __forceinline__ int sw64(int row, int chunk) { return row * 64 + ((chunk ^ (row & 7)) << 3); }

template <class T, int BN>
__global__ void __launch_bounds__(THREADS, Cfg<BN>::MIN_BLOCKS) grouped_gemm_wgmma(GroupedGemmArgs a) {
  constexpr int STAGES = Cfg<BN>::STAGES, B_BYTES = Cfg<BN>::B_BYTES, NF = BN / 8, BJ = BN / 32;
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = ptx::smem_u32(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  T* smem = reinterpret_cast<T*>(smem_raw + (base - raw));
  T* sA = smem;                                  // [STAGES][BM*BK]
  T* sB = smem + STAGES * (A_BYTES / 2);         // [STAGES][BN*BK]
  const uint32_t sA_u32 = base, sB_u32 = base + STAGES * A_BYTES;

  const int4 tile = a.plan.tiles[blockIdx.y];
  const int e = tile.x;
  if (e < 0) return;
  const int row_begin = tile.y, row_end = tile.z;
  const ColMap cm{a.epi, int(blockIdx.x), BN, a.N, a.I};
  const T* A = static_cast<const T*>(a.A);
  const T* W = static_cast<const T*>(a.W) + int64_t(e) * a.w_expert_stride;
  const int Kdim = a.Kdim;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;

  const T* a_rows[4];
  const T* b_rows[BJ];
  bool b_ok[BJ];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int r = (tid >> 3) + 32 * j;
    const int sr = row_begin + r;
    a_rows[j] = nullptr;
    if (sr < row_end) {
      const int64_t src = a.a_gather ? int64_t(a.a_gather[sr] / a.a_div) : int64_t(sr);
      a_rows[j] = A + src * Kdim;
    }
  }
#pragma unroll
  for (int j = 0; j < BJ; ++j) {
    const int w = cm.w_of((tid >> 3) + 32 * j);
    b_ok[j] = w >= 0;
    b_rows[j] = W + int64_t(w < 0 ? 0 : w) * Kdim;
  }
  auto load_stage = [&](int stage, int kt) {
    T* dA = sA + stage * (A_BYTES / 2);
    T* dB = sB + stage * (B_BYTES / 2);
    const int c = tid & 7, k = kt * BK + c * 8;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = (tid >> 3) + 32 * j;
      const bool oka = a_rows[j] != nullptr && k < Kdim;
      ptx::cp_async16(ptx::smem_u32(dA + sw64(r, c)), oka ? a_rows[j] + k : A, oka);
    }
#pragma unroll
    for (int j = 0; j < BJ; ++j) {
      const int r = (tid >> 3) + 32 * j;
      const bool okb = b_ok[j] && k < Kdim;
      ptx::cp_async16(ptx::smem_u32(dB + sw64(r, c)), okb ? b_rows[j] + k : W, okb);
    }
  };

  float acc[NF][4];
#pragma unroll
  for (int j = 0; j < NF; ++j)
#pragma unroll
    for (int q = 0; q < 4; ++q) acc[j][q] = 0.0f;

  const int ktiles = (Kdim + BK - 1) / BK;
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < ktiles) load_stage(s, s);
    ptx::cp_async_commit();
  }
  for (int kt = 0; kt < ktiles; ++kt) {
    ptx::cp_async_wait<STAGES - 2>();
    wgmma::fence_proxy_async();  // cp.async wrote through the generic proxy; wgmma reads through the async one
    __syncthreads();
    const int st = kt % STAGES;
    const uint32_t a_tile = sA_u32 + st * A_BYTES + wg * (64 * BK * 2);
    const uint32_t b_tile = sB_u32 + st * B_BYTES;
    wgmma::fence_acc(acc);
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk)
      wgmma::mma_m64k16<T, BN>(acc, wgmma::desc_sw128(a_tile + kk * 32), wgmma::desc_sw128(b_tile + kk * 32));
    wgmma::commit();
    wgmma::wait<1>();  // the previous k tile's MMAs are done ...
    wgmma::fence_acc(acc);
    __syncthreads();   // ... in both warpgroups: its stage can be refilled
    const int nk = kt + STAGES - 1;
    if (nk < ktiles) load_stage(nk % STAGES, nk);
    ptx::cp_async_commit();
  }
  wgmma::wait<0>();
  wgmma::fence_acc(acc);
  ptx::cp_async_wait<0>();

  // ---- epilogue: the m64n128 accumulator layout is mma.sync's m16n8 layout per warp and n8 block
  const T* bias = a.bias ? static_cast<const T*>(a.bias) + int64_t(e) * a.N : nullptr;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int row = row_begin + wg * 64 + (warp & 3) * 16 + (lane >> 2) + hh * 8;
    if (row >= row_end) continue;
    if (a.epi == Epi::down || a.epi == Epi::up_plain) {
#pragma unroll
      for (int nf = 0; nf < NF; ++nf) {
        const int c = nf * 8 + 2 * (lane & 3);
        epi_single<T>(a, cm, bias, row, c, acc[nf][2 * hh]);
        epi_single<T>(a, cm, bias, row, c + 1, acc[nf][2 * hh + 1]);
      }
    } else if (a.epi == Epi::up_interleaved) {
#pragma unroll
      for (int nf = 0; nf < NF; ++nf) {
        const int c = nf * 8 + 2 * (lane & 3);
        epi_pair<T>(a, cm, bias, row, c, acc[nf][2 * hh], acc[nf][2 * hh + 1]);
      }
    } else {
#pragma unroll
      for (int nf = 0; nf < NF; nf += 2) {
        const int c = nf * 8 + 2 * (lane & 3);
        epi_pair<T>(a, cm, bias, row, c, acc[nf][2 * hh], acc[nf + 1][2 * hh]);
        epi_pair<T>(a, cm, bias, row, c + 1, acc[nf][2 * hh + 1], acc[nf + 1][2 * hh + 1]);
      }
    }
  }
#else
  __trap();  // built without sm_90a: the launcher never selects this kernel then
#endif
}

template <class T, int BN>
void launch_typed(const GroupedGemmArgs& a, cudaStream_t stream) {
  auto kernel = grouped_gemm_wgmma<T, BN>;
  constexpr int SMEM_BYTES = Cfg<BN>::SMEM_BYTES;
  static thread_local int configured_device = -1;
  int dev = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  if (configured_device != dev) {
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_BYTES), "cudaFuncSetAttribute");
    configured_device = dev;
  }
  dim3 grid(unsigned(n_tiles_of(a.epi, a.N, a.I, BN)), unsigned(a.plan.max_tiles));
  kernel<<<grid, THREADS, SMEM_BYTES, stream>>>(a);
  check_launch("grouped_gemm_wgmma");
}

}  // namespace

bool wgmma_usable(const GroupedGemmArgs& a, bool vec16) {
  static const bool disabled = [] {
    const char* s = std::getenv("MOEX_CUDA_NO_WGMMA");
    return s && *s && *s != '0';
  }();
  return !disabled && vec16 && !a.w_transposed && current_device_cc() == 90;
}

void launch_grouped_gemm_wgmma(const GroupedGemmArgs& a, DType dtype, cudaStream_t stream) {
  MOEX_ASSERT(a.plan.tile_m == BM);
  MOEX_CHECK(a.plan.max_tiles <= 65535, "grouped_mm on CUDA: {} row tiles exceed the grid limit; split the call into "
             "fewer tokens", a.plan.max_tiles);
  static const int bn = [] {
    const char* s = std::getenv("MOEX_CUDA_WGMMA_N");
    return s && std::atoi(s) == 256 ? 256 : 128;
  }();
  if (bn == 256) {
    if (dtype == DType::bf16) launch_typed<__nv_bfloat16, 256>(a, stream);
    else launch_typed<__half, 256>(a, stream);
  } else {
    if (dtype == DType::bf16) launch_typed<__nv_bfloat16, 128>(a, stream);
    else launch_typed<__half, 128>(a, stream);
  }
}

}  // namespace moex::cuda
