// backends/cuda/batched_gemv.cu — batched_mm on CUDA: every token–expert pair multiplies its
// token by its own expert's matrices, read in place (no per-pair weight copies; the reference
// library copies them and runs out of memory at a few hundred tokens). Built for decode (small T):
// GEMV-style kernels streaming the weights with 16-byte loads.
//
//   up:   h[p, i] = round(act(x_t · Wgᵉ[i] + b, x_t · Wuᵉ[i] + b))          h: [S, I] workspace
//   down: out[t, n] = round(Σ_j w[t,j] · (h[t*K+j] · Wdᵉʲ[n] + bᵈ[n]))   (slot order, f32)
//
// The down kernel fuses the weighted reduction over the K slots, so the extra memory is h only
// (S·I elements). No routing plan, no host synchronisation: capturable in a CUDA graph.
// Weights stored [E, out, in] (default) use one warp per output row; transposed weights
// [E, in, out] use 64 output columns × 4 k-slices per block (coalesced along the output dim).
#include "backends/cuda/batched_probe.hpp"
#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/mma_ptx.cuh"
#include "backends/cuda/pdl.cuh"

#include <cooperative_groups.h>

#include <cstdlib>
#include <mutex>
#include <string_view>
#include <type_traits>

namespace moex::cuda {

namespace {

constexpr int THREADS = 256;

template <class T>
__device__ __forceinline__ float dot_vec(const uint4& xa, const uint4& wa, float acc);
template <>
__device__ __forceinline__ float dot_vec<__nv_bfloat16>(const uint4& xa, const uint4& wa, float acc) {
  const __nv_bfloat162* x2 = reinterpret_cast<const __nv_bfloat162*>(&xa);
  const __nv_bfloat162* w2 = reinterpret_cast<const __nv_bfloat162*>(&wa);
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const float2 xf = __bfloat1622float2(x2[q]), wf = __bfloat1622float2(w2[q]);
    acc = fmaf(xf.x, wf.x, acc);
    acc = fmaf(xf.y, wf.y, acc);
  }
  return acc;
}
template <>
__device__ __forceinline__ float dot_vec<__half>(const uint4& xa, const uint4& wa, float acc) {
  const __half2* x2 = reinterpret_cast<const __half2*>(&xa);
  const __half2* w2 = reinterpret_cast<const __half2*>(&wa);
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const float2 xf = __half22float2(x2[q]), wf = __half22float2(w2[q]);
    acc = fmaf(xf.x, wf.x, acc);
    acc = fmaf(xf.y, wf.y, acc);
  }
  return acc;
}
template <>
__device__ __forceinline__ float dot_vec<float>(const uint4& xa, const uint4& wa, float acc) {
  const float* x = reinterpret_cast<const float*>(&xa);
  const float* w = reinterpret_cast<const float*>(&wa);
#pragma unroll
  for (int q = 0; q < 4; ++q) acc = fmaf(x[q], w[q], acc);
  return acc;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Σ_k x[k]·w[k] over n elements, by one warp (all lanes get the sum).
template <class T, bool VEC>
__device__ __forceinline__ float warp_dot(const T* x, const T* w, int64_t n, int lane) {
  float acc = 0.0f;
  if constexpr (VEC) {
    constexpr int V = 16 / sizeof(T);
    const uint4* xv = reinterpret_cast<const uint4*>(x);
    const uint4* wv = reinterpret_cast<const uint4*>(w);
    const int64_t nv = n / V;
#pragma unroll 4
    for (int64_t c = lane; c < nv; c += 32) acc = dot_vec<T>(__ldg(xv + c), __ldg(wv + c), acc);
  } else {
    for (int64_t k = lane; k < n; k += 32) acc = fmaf(to_f32(x[k]), to_f32(w[k]), acc);
  }
  return warp_sum(acc);
}

// Two dot products sharing x (gate and up rows), by one warp.
template <class T, bool VEC>
__device__ __forceinline__ float2 warp_dot2(const T* x, const T* wg, const T* wu, int64_t n, int lane) {
  float g = 0.0f, u = 0.0f;
  if constexpr (VEC) {
    constexpr int V = 16 / sizeof(T);
    const uint4* xv = reinterpret_cast<const uint4*>(x);
    const uint4* gv = reinterpret_cast<const uint4*>(wg);
    const uint4* uv = reinterpret_cast<const uint4*>(wu);
    const int64_t nv = n / V;
#pragma unroll 4
    for (int64_t c = lane; c < nv; c += 32) {
      const uint4 xa = __ldg(xv + c);
      g = dot_vec<T>(xa, __ldg(gv + c), g);
      u = dot_vec<T>(xa, __ldg(uv + c), u);
    }
  } else {
    for (int64_t k = lane; k < n; k += 32) {
      const float xf = to_f32(x[k]);
      g = fmaf(xf, to_f32(wg[k]), g);
      u = fmaf(xf, to_f32(wu[k]), u);
    }
  }
  return make_float2(warp_sum(g), warp_sum(u));
}

// ---- up projection, weights [E, R, H]: one warp per (pair, i) ----
template <class T, bool VEC>
__global__ void __launch_bounds__(THREADS) batched_up_nt(BatchedArgs a) {
  pdl_wait();  // launched with PDL (pdl.cuh): the expert index comes from the previous kernels
  pdl_launch_dependents();
  const int64_t p = blockIdx.x;
  const int64_t e = load_index(a.idx, a.idx64, p);
  if (e < 0 || e >= a.E) return;  // dropped slot: h row never read
  const int lane = threadIdx.x & 31;
  const int64_t i = int64_t(blockIdx.y) * (THREADS / 32) + (threadIdx.x >> 5);
  if (i >= a.I) return;
  const int64_t H = a.H, I = a.I, R = a.has_gate ? 2 * I : I;
  const T* x = static_cast<const T*>(a.hidden) + (p / a.K) * H;
  const T* W = static_cast<const T*>(a.gate_up) + e * R * H;
  const T* bias = a.gate_up_bias ? static_cast<const T*>(a.gate_up_bias) + e * R : nullptr;
  float h;
  if (a.has_gate) {
    const int64_t wg = a.interleaved ? 2 * i : i, wu = a.interleaved ? 2 * i + 1 : I + i;
    float2 gu = warp_dot2<T, VEC>(x, W + wg * H, W + wu * H, H, lane);
    if (bias) {
      gu.x += to_f32(bias[wg]);
      gu.y += to_f32(bias[wu]);
    }
    h = gated_act(a.act, gu.x, gu.y);
  } else {
    float v = warp_dot<T, VEC>(x, W + i * H, H, lane);
    if (bias) v += to_f32(bias[i]);
    h = plain_act(a.act, v);
  }
  if (lane == 0) static_cast<T*>(a.h)[p * I + i] = from_f32<T>(h);
}

// ---- down projection + weighted slot sum, weights [E, H, I]: one warp per (token, n) ----
// Slots in groups of SLOTS whose dot products run interleaved, UC chunks of each in flight
// (SLOTS·UC = 8 sixteen-byte weight loads per lane): a row of W is short (I elements: 1.5 KB on
// qwen3), so one slot at a time left too few loads in flight (H200, batch 1: 17 µs for 25 MB), and
// with K = 2 (mixtral) four slots in flight were two. Each slot's per-lane partial sum runs over its
// chunks in order and the warp reduction is warp_dot's, and the slots are added in slot order: the
// same f32 result whatever SLOTS and UC are.
template <class T, bool VEC, int SLOTS>
__global__ void __launch_bounds__(THREADS) batched_down_nt(BatchedArgs a) {
  pdl_wait();
  pdl_launch_dependents();
  constexpr int UC = VEC ? 8 / SLOTS : 1;
  const int64_t t = blockIdx.x;
  const int64_t n = int64_t(blockIdx.y) * (THREADS / 32) + (threadIdx.x >> 5);
  if (n >= a.H) return;
  const int lane = threadIdx.x & 31;
  const int64_t H = a.H, I = a.I;
  float acc = 0.0f;
  for (int64_t j0 = 0; j0 < a.K; j0 += SLOTS) {
    const T* hp[SLOTS];
    const T* W[SLOTS];
    bool ok[SLOTS];
    int64_t e[SLOTS];
#pragma unroll
    for (int q = 0; q < SLOTS; ++q) {
      const int64_t j = j0 + q;
      e[q] = j < a.K ? load_index(a.idx, a.idx64, t * a.K + j) : -1;
      ok[q] = e[q] >= 0 && e[q] < a.E;
      hp[q] = static_cast<const T*>(a.h) + (t * a.K + j) * I;
      W[q] = static_cast<const T*>(a.down) + ((ok[q] ? e[q] : 0) * H + n) * I;
    }
    float part[SLOTS];
#pragma unroll
    for (int q = 0; q < SLOTS; ++q) part[q] = 0.0f;
    if constexpr (VEC) {
      constexpr int V = 16 / sizeof(T);
      const int64_t nv = I / V;
      for (int64_t c0 = lane; c0 < nv; c0 += 32 * UC) {
        uint4 xh[SLOTS][UC], xw[SLOTS][UC];
#pragma unroll
        for (int q = 0; q < SLOTS; ++q)
#pragma unroll
          for (int u = 0; u < UC; ++u)
            if (ok[q] && c0 + 32 * u < nv) {
              xh[q][u] = __ldg(reinterpret_cast<const uint4*>(hp[q]) + c0 + 32 * u);
              xw[q][u] = __ldg(reinterpret_cast<const uint4*>(W[q]) + c0 + 32 * u);
            }
#pragma unroll
        for (int q = 0; q < SLOTS; ++q)
#pragma unroll
          for (int u = 0; u < UC; ++u)
            if (ok[q] && c0 + 32 * u < nv) part[q] = dot_vec<T>(xh[q][u], xw[q][u], part[q]);
      }
    } else {
      for (int64_t k = lane; k < I; k += 32)
#pragma unroll
        for (int q = 0; q < SLOTS; ++q)
          if (ok[q]) part[q] = fmaf(to_f32(hp[q][k]), to_f32(W[q][k]), part[q]);
    }
#pragma unroll
    for (int q = 0; q < SLOTS; ++q) {
      if (!ok[q]) continue;
      float y = warp_sum(part[q]);
      if (a.down_bias) y += to_f32(static_cast<const T*>(a.down_bias)[e[q] * H + n]);
      acc += load_any(a.topw, a.topw_code, t * a.K + j0 + q) * y;
    }
  }
  if (lane == 0) static_cast<T*>(a.out)[t * H + n] = from_f32<T>(acc);
}

// ---- one token (T = 1): up and down in one cooperative kernel ----
// Why: at batch 1 the two kernels above stream a token's experts (qwen3: 50 MB up, 25 MB down) in
// ~31 µs inside a decode graph, against ~18 µs at the copy rate: each pays its own ramp and tail,
// and the down kernel cannot ask for its weights before the up kernel has finished. Here one block
// per SM first requests its slice of the down rows (every slot's rows n0 .. n0 + rows) into shared
// memory with cp.async, then computes its share of the up rows (h into the workspace) while those
// bytes arrive, meets the grid at one barrier (a cooperative launch: every block resident), and
// finishes its down rows from shared memory. The arithmetic is batched_up_nt's and
// batched_down_nt's, in the same order, so the result is bit-identical to the two-kernel path.
constexpr int FUSED_THREADS = 512, FUSED_WARPS = FUSED_THREADS / 32;
constexpr int FUSED_UP_CHUNKS = 8;  // 16-byte chunks of a gate (and up) row in flight per lane
constexpr int FUSED_MAX_K = 64;

// Dynamic shared memory: down rows [K][rows][I] | h [K][I], activation dtype.
size_t fused_t1_smem_bytes(int64_t K, int64_t rows, int64_t I, size_t esz) {
  return size_t(K * rows * I + K * I) * esz;
}

// Measurement switches (MOEX_CUDA_FUSED_T1_MODE, bits): 1 = the grid barrier on a module-scope
// counter instead of a cooperative launch's (one such kernel at a time per device), 2 = the down
// rows read from global memory after the barrier instead of staged.
__device__ unsigned g_fused_t1_barrier[2];  // arrivals (back to 0 after each barrier), generation

__device__ __forceinline__ void fused_own_grid_barrier() {
  __syncthreads();
  if (threadIdx.x == 0) {
    volatile unsigned* gen = &g_fused_t1_barrier[1];
    const unsigned g = *gen;  // read before arriving: the last arrival moves it on
    __threadfence();
    if (atomicAdd(&g_fused_t1_barrier[0], 1u) == gridDim.x - 1) {
      atomicExch(&g_fused_t1_barrier[0], 0u);
      __threadfence();
      atomicAdd(&g_fused_t1_barrier[1], 1u);
    } else {
      while (*gen == g) __nanosleep(20);
    }
    __threadfence();
  }
  __syncthreads();
}

template <class T>
__global__ void __launch_bounds__(FUSED_THREADS, 1) batched_fused_t1(BatchedArgs a, int rows_per_block, int mode) {
  const bool own_barrier = mode & 1, staged = !(mode & 2);
  namespace cg = cooperative_groups;
  constexpr int V = 16 / sizeof(T);
  pdl_wait();  // the routing comes from the previous kernels
  extern __shared__ __align__(16) unsigned char fused_smem[];
  const int K = int(a.K), I = int(a.I), H = int(a.H);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int n0 = int(blockIdx.x) * rows_per_block;
  const int rows = max(0, min(rows_per_block, H - n0));
  const int nvI = I / V, nvH = H / V;  // 16-byte chunks of a down row / of an up row
  T* wd_s = reinterpret_cast<T*>(fused_smem);   // [K][rows_per_block][I]
  T* h_s = wd_s + size_t(K) * rows_per_block * I;  // [K][I]
  __shared__ int64_t e_s[FUSED_MAX_K];  // slot j's expert (T = 1: pair j is slot j)
  if (tid < K) e_s[tid] = load_index(a.idx, a.idx64, tid);
  __syncthreads();
  auto expert = [&](int j) { return e_s[j]; };
  auto valid = [&](int64_t e) { return e >= 0 && e < a.E; };

  // (1) this block's down rows, every routed slot, into shared memory (waited for in (4))
  {
    const int per_slot = staged ? rows * nvI : 0;
    for (int q = tid; q < K * per_slot; q += FUSED_THREADS) {
      const int j = q / per_slot, r = (q / nvI) % rows, c = q % nvI;
      const int64_t e = expert(j);
      if (!valid(e)) continue;
      const T* src = static_cast<const T*>(a.down) + ((e * H + n0 + r) * int64_t(I) + int64_t(c) * V);
      ptx::cp_async16(ptx::smem_u32(wd_s + (size_t(j) * rows_per_block + r) * I + size_t(c) * V), src, true);
    }
    ptx::cp_async_commit();
  }

  // (2) the up rows: item (j, i) = h[j, i] by one warp, items spread over every warp of the grid
  {
    const int64_t R = a.has_gate ? 2 * int64_t(I) : int64_t(I);
    const uint4* xv = static_cast<const uint4*>(a.hidden);
    const int total_warps = int(gridDim.x) * FUSED_WARPS;
    for (int it = int(blockIdx.x) * FUSED_WARPS + warp; it < K * I; it += total_warps) {
      const int j = it / I, i = it % I;
      const int64_t e = expert(j);
      if (!valid(e)) continue;  // dropped slot: its h row is never read
      const T* W = static_cast<const T*>(a.gate_up) + e * R * H;
      const int64_t wg = a.has_gate ? (a.interleaved ? 2 * int64_t(i) : int64_t(i)) : int64_t(i);
      const int64_t wu = a.interleaved ? 2 * int64_t(i) + 1 : int64_t(I) + i;
      const uint4* gv = reinterpret_cast<const uint4*>(W + wg * H);
      const uint4* uv = reinterpret_cast<const uint4*>(W + wu * H);
      float g = 0.0f, u = 0.0f;
      // chunks lane, lane + 32, ... in order (warp_dot2's order), FUSED_UP_CHUNKS of each row at a time
      for (int c0 = lane; c0 < nvH; c0 += 32 * FUSED_UP_CHUNKS) {
        uint4 wgc[FUSED_UP_CHUNKS], wuc[FUSED_UP_CHUNKS];
#pragma unroll
        for (int q = 0; q < FUSED_UP_CHUNKS; ++q) {
          const int c = c0 + 32 * q;
          if (c < nvH) {
            wgc[q] = __ldcs(gv + c);
            if (a.has_gate) wuc[q] = __ldcs(uv + c);
          }
        }
#pragma unroll
        for (int q = 0; q < FUSED_UP_CHUNKS; ++q) {
          const int c = c0 + 32 * q;
          if (c < nvH) {
            const uint4 xa = __ldg(xv + c);
            g = dot_vec<T>(xa, wgc[q], g);
            if (a.has_gate) u = dot_vec<T>(xa, wuc[q], u);
          }
        }
      }
      g = warp_sum(g);
      float hv;
      if (a.has_gate) {
        u = warp_sum(u);
        if (a.gate_up_bias) {
          g += to_f32(static_cast<const T*>(a.gate_up_bias)[e * R + wg]);
          u += to_f32(static_cast<const T*>(a.gate_up_bias)[e * R + wu]);
        }
        hv = gated_act(a.act, g, u);
      } else {
        if (a.gate_up_bias) g += to_f32(static_cast<const T*>(a.gate_up_bias)[e * R + i]);
        hv = plain_act(a.act, g);
      }
      if (lane == 0) static_cast<T*>(a.h)[int64_t(j) * I + i] = from_f32<T>(hv);
    }
  }

  // (3) every h row written, grid-wide (the barrier orders the writes before the reads below)
  if (own_barrier) fused_own_grid_barrier();
  else cg::this_grid().sync();
  pdl_launch_dependents();
  if (rows == 0) return;

  // (4) h from L2 into shared memory, then the block's down rows: warp = row, slots in order
  for (int q = tid; q < K * nvI; q += FUSED_THREADS) {
    const int j = q / nvI, c = q % nvI;
    if (valid(expert(j)))
      *reinterpret_cast<uint4*>(h_s + size_t(j) * I + size_t(c) * V) =
          __ldcg(reinterpret_cast<const uint4*>(static_cast<const T*>(a.h) + int64_t(j) * I) + c);
  }
  ptx::cp_async_wait<0>();
  __syncthreads();
  for (int r = warp; r < rows; r += FUSED_WARPS) {
    const int64_t n = n0 + r;
    float acc = 0.0f;
    for (int j = 0; j < K; ++j) {
      const int64_t e = expert(j);
      if (!valid(e)) continue;
      const uint4* hv = reinterpret_cast<const uint4*>(h_s + size_t(j) * I);
      const uint4* wv = staged ? reinterpret_cast<const uint4*>(wd_s + (size_t(j) * rows_per_block + r) * I)
                               : reinterpret_cast<const uint4*>(static_cast<const T*>(a.down) + (e * H + n) * int64_t(I));
      float part = 0.0f;
      for (int c = lane; c < nvI; c += 32) part = dot_vec<T>(hv[c], wv[c], part);
      float y = warp_sum(part);
      if (a.down_bias) y += to_f32(static_cast<const T*>(a.down_bias)[e * H + n]);
      acc += load_any(a.topw, a.topw_code, j) * y;
    }
    if (lane == 0) static_cast<T*>(a.out)[n] = from_f32<T>(acc);
  }
}

// The fused path's launch geometry on the current device, or rows_per_block = 0 when it does not
// apply (MOEX_CUDA_FUSED_T1=0, no cooperative launch, or a block's down rows do not fit in shared
// memory: qwen-sized experts fit, mixtral / deepseek_v3 do not).
struct FusedT1Plan {
  int grid = 0, rows_per_block = 0;
  size_t smem = 0;
};
template <class T>
FusedT1Plan fused_t1_plan(const BatchedArgs& a) {
  FusedT1Plan f;
  const char* env = std::getenv("MOEX_CUDA_FUSED_T1");  // read per call, as the tests switch it
  const bool env_on = !(env && std::string_view(env) == "0");
  if (!env_on || a.T != 1 || a.transposed || a.K > FUSED_MAX_K || a.H >= (int64_t(1) << 24) || a.I >= (int64_t(1) << 24)) return f;
  // per device: SM count, cooperative launch, the opt-in shared memory limit, and the largest
  // dynamic shared memory set on the kernel so far (host calls once per device and size)
  struct DeviceInfo {
    int sms = -1, coop = 0, smem_max = 0;
    size_t smem_set = 0;
  };
  static std::mutex mu;
  static DeviceInfo info[64];
  int dev = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  std::lock_guard<std::mutex> lock(mu);
  DeviceInfo& d = info[dev < 0 || dev >= 64 ? 63 : dev];
  if (d.sms < 0) {
    check(cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute");
    check(cudaDeviceGetAttribute(&d.coop, cudaDevAttrCooperativeLaunch, dev), "cudaDeviceGetAttribute");
    check(cudaDeviceGetAttribute(&d.smem_max, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev), "cudaDeviceGetAttribute");
  }
  if (!d.coop || d.sms <= 0) return f;
  const int rows = int(ceil_div(a.H, int64_t(d.sms)));
  const size_t smem = fused_t1_smem_bytes(a.K, rows, a.I, sizeof(T));
  if (smem > size_t(d.smem_max) || int64_t(a.K) * rows * a.I >= (int64_t(1) << 31)) return f;
  if (smem > d.smem_set) {
    check(cudaFuncSetAttribute(batched_fused_t1<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
          "cudaFuncSetAttribute (batched_fused_t1)");
    int per_sm = 0;
    check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, batched_fused_t1<T>, FUSED_THREADS, smem),
          "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    if (per_sm < 1) return f;
    d.smem_set = smem;
  }
  f.grid = d.sms;  // one block per SM: all resident at once (the cooperative launch checks it)
  f.rows_per_block = rows;
  f.smem = smem;
  return f;
}

// A cooperative launch, with the PDL attribute as well where the driver takes both (checked once,
// outside stream capture; inside a capture with the answer unknown, cooperative alone).
template <class T>
void launch_fused_t1(const BatchedArgs& a, const FusedT1Plan& f, cudaStream_t stream) {
  static int pdl_with_coop = -1;  // -1 unknown, 0 refused, 1 taken
  const char* mode_env = std::getenv("MOEX_CUDA_FUSED_T1_MODE");
  const int mode = mode_env ? std::atoi(mode_env) : 0;
  if (mode & 1) {  // measurement: a plain PDL launch, the module-scope barrier
    launch_pdl("batched_fused_t1", batched_fused_t1<T>, dim3(unsigned(f.grid)), dim3(FUSED_THREADS), f.smem, stream, a,
               f.rows_per_block, mode);
    return;
  }
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  check(cudaStreamIsCapturing(stream, &capturing), "cudaStreamIsCapturing");
  const bool try_pdl = pdl_enabled() && (pdl_with_coop == 1 || (pdl_with_coop == -1 && capturing == cudaStreamCaptureStatusNone));
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = 1;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned(f.grid));
  cfg.blockDim = dim3(FUSED_THREADS);
  cfg.dynamicSmemBytes = f.smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = try_pdl ? 2 : 1;
  cudaError_t err = cudaLaunchKernelEx(&cfg, batched_fused_t1<T>, a, f.rows_per_block, mode);
  if (try_pdl && pdl_with_coop == -1) {
    pdl_with_coop = err == cudaSuccess ? 1 : 0;
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      cfg.numAttrs = 1;
      err = cudaLaunchKernelEx(&cfg, batched_fused_t1<T>, a, f.rows_per_block, mode);
    }
  }
  check(err, "batched_fused_t1");
}

// ---- transposed weights: 64 output columns × 4 k-slices per block ----
constexpr int TN_COLS = 64, TN_SLICES = THREADS / TN_COLS;

// up, weights [E, H, R]. Gated: the block's 64 columns are 32 gate and 32 up columns of 32 i's.
template <class T>
__global__ void __launch_bounds__(THREADS) batched_up_tn(BatchedArgs a) {
  __shared__ float part[TN_SLICES][TN_COLS];
  const int64_t p = blockIdx.x;
  const int64_t e = load_index(a.idx, a.idx64, p);
  if (e < 0 || e >= a.E) return;
  const int cx = threadIdx.x % TN_COLS, ks = threadIdx.x / TN_COLS;
  const int64_t H = a.H, I = a.I, R = a.has_gate ? 2 * I : I;
  const int per = a.has_gate ? TN_COLS / 2 : TN_COLS;
  const int64_t i0 = int64_t(blockIdx.y) * per;
  int64_t i, w;
  if (a.has_gate) {
    const bool up = cx >= per;
    i = i0 + (up ? cx - per : cx);
    w = a.interleaved ? 2 * i + (up ? 1 : 0) : (up ? I + i : i);
  } else {
    i = i0 + cx;
    w = i;
  }
  const T* x = static_cast<const T*>(a.hidden) + (p / a.K) * H;
  const T* W = static_cast<const T*>(a.gate_up) + e * H * R;
  float acc = 0.0f;
  if (i < I)
    for (int64_t k = ks; k < H; k += TN_SLICES) acc = fmaf(to_f32(x[k]), to_f32(W[k * R + w]), acc);
  part[ks][cx] = acc;
  __syncthreads();
  if (ks == 0) {
    float v = part[0][cx];
#pragma unroll
    for (int s = 1; s < TN_SLICES; ++s) v += part[s][cx];
    if (i < I && a.gate_up_bias) v += to_f32(static_cast<const T*>(a.gate_up_bias)[e * R + w]);
    part[0][cx] = v;
  }
  __syncthreads();
  if (threadIdx.x < per) {
    const int64_t io = i0 + threadIdx.x;
    if (io < I) {
      const float hv = a.has_gate ? gated_act(a.act, part[0][threadIdx.x], part[0][threadIdx.x + per])
                                  : plain_act(a.act, part[0][threadIdx.x]);
      static_cast<T*>(a.h)[p * I + io] = from_f32<T>(hv);
    }
  }
}

// down + weighted slot sum, weights [E, I, H].
template <class T>
__global__ void __launch_bounds__(THREADS) batched_down_tn(BatchedArgs a) {
  __shared__ float part[TN_SLICES][TN_COLS];
  const int64_t t = blockIdx.x;
  const int cx = threadIdx.x % TN_COLS, ks = threadIdx.x / TN_COLS;
  const int64_t H = a.H, I = a.I;
  const int64_t n = int64_t(blockIdx.y) * TN_COLS + cx;
  float acc = 0.0f;
  for (int64_t j = 0; j < a.K; ++j) {
    const int64_t p = t * a.K + j;
    const int64_t e = load_index(a.idx, a.idx64, p);
    if (e < 0 || e >= a.E) continue;  // uniform over the block
    const T* hp = static_cast<const T*>(a.h) + p * I;
    const T* W = static_cast<const T*>(a.down) + e * I * H;
    float s = 0.0f;
    if (n < H)
      for (int64_t k = ks; k < I; k += TN_SLICES) s = fmaf(to_f32(hp[k]), to_f32(W[k * H + n]), s);
    part[ks][cx] = s;
    __syncthreads();
    if (ks == 0 && n < H) {
      float y = part[0][cx];
#pragma unroll
      for (int q = 1; q < TN_SLICES; ++q) y += part[q][cx];
      if (a.down_bias) y += to_f32(static_cast<const T*>(a.down_bias)[e * H + n]);
      acc += load_any(a.topw, a.topw_code, p) * y;
    }
    __syncthreads();
  }
  if (ks == 0 && n < H) static_cast<T*>(a.out)[t * H + n] = from_f32<T>(acc);
}

template <class T>
void launch_typed(const BatchedArgs& a, bool vec16, cudaStream_t stream) {
  const int64_t S = a.T * a.K;
  MOEX_CHECK(S < (int64_t(1) << 31) && a.T < (int64_t(1) << 31), "batched_mm on CUDA: T*K = {} pairs is too many", S);
  const int warps = THREADS / 32;
  if (!a.transposed && vec16) {
    if constexpr (!std::is_same_v<T, float>) {  // one token: up and down in one kernel
      const FusedT1Plan f = fused_t1_plan<T>(a);
      if (f.rows_per_block > 0) {
        launch_fused_t1<T>(a, f, stream);
        return;
      }
    }
  }
  if (!a.transposed) {
    dim3 g_up(unsigned(S), unsigned(ceil_div(a.I, warps)));
    dim3 g_down(unsigned(a.T), unsigned(ceil_div(a.H, warps)));
    MOEX_CHECK(g_up.y <= 65535 && g_down.y <= 65535, "batched_mm on CUDA: sizes H={} I={} too large", a.H, a.I);
    if (vec16) {
      launch_pdl("batched_up_nt", batched_up_nt<T, true>, g_up, dim3(THREADS), 0, stream, a);
      // slots interleaved: K itself up to 8 (rounded up to a power of two), else groups of 8
      const auto down = a.K <= 1 ? batched_down_nt<T, true, 1> : a.K <= 2 ? batched_down_nt<T, true, 2>
                        : a.K <= 4 ? batched_down_nt<T, true, 4> : batched_down_nt<T, true, 8>;
      launch_pdl("batched_down_nt", down, g_down, dim3(THREADS), 0, stream, a);
    } else {
      launch_pdl("batched_up_nt", batched_up_nt<T, false>, g_up, dim3(THREADS), 0, stream, a);
      launch_pdl("batched_down_nt", batched_down_nt<T, false, 4>, g_down, dim3(THREADS), 0, stream, a);
    }
  } else {
    const int per = a.has_gate ? TN_COLS / 2 : TN_COLS;
    dim3 g_up(unsigned(S), unsigned(ceil_div(a.I, per)));
    dim3 g_down(unsigned(a.T), unsigned(ceil_div(a.H, TN_COLS)));
    MOEX_CHECK(g_up.y <= 65535 && g_down.y <= 65535, "batched_mm on CUDA: sizes H={} I={} too large", a.H, a.I);
    batched_up_tn<T><<<g_up, THREADS, 0, stream>>>(a);
    check_launch("batched_up_tn");
    batched_down_tn<T><<<g_down, THREADS, 0, stream>>>(a);
    check_launch("batched_down_tn");
  }
}

}  // namespace

bool batched_fused_t1_would_run(int64_t K, int64_t H, int64_t I, int dtype_bytes) {
  BatchedArgs a{};
  a.T = 1;
  a.K = K;
  a.H = H;
  a.I = I;
  if (H % 8 != 0 || I % 8 != 0) return false;  // the 16-byte path only
  if (dtype_bytes != 2) return false;
  return fused_t1_plan<__nv_bfloat16>(a).rows_per_block > 0;
}

void launch_batched(const BatchedArgs& a, DType dtype, bool vec16, cudaStream_t stream) {
  switch (dtype) {
    case DType::f32: launch_typed<float>(a, vec16, stream); break;
    case DType::f16: launch_typed<__half>(a, vec16, stream); break;
    case DType::bf16: launch_typed<__nv_bfloat16>(a, vec16, stream); break;
    default: detail::fail(ErrorCode::internal, "batched_mm on CUDA: unexpected dtype {}", dtype_name(dtype));
  }
}

}  // namespace moex::cuda
