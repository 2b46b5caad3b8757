// model/cuda_kernels.cu — see cuda_kernels.cuh. Simple, correct kernels first: f32 arithmetic
// everywhere (RoPE angles in f64 as the CPU runtime), one block per row for the row-wise kernels.
#include "model/cuda_kernels.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cfloat>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/mma_ptx.cuh"
#include "backends/cuda/pdl.cuh"
#include "model/cuda_qkv_post.cuh"
#include "model/cuda_warp.cuh"

namespace moex::model::cuda {

namespace {

using ::moex::cuda::check;
using ::moex::cuda::check_launch;
using ::moex::cuda::load_any;
using ::moex::cuda::launch_pdl;
using ::moex::cuda::pdl_launch_dependents;
using ::moex::cuda::pdl_wait;

inline unsigned blocks_for(int64_t n, int threads) { return unsigned((n + threads - 1) / threads); }

__device__ __forceinline__ void store_any(void* p, int dtype, int64_t i, float v) {
  if (dtype == 0) static_cast<float*>(p)[i] = v;
  else if (dtype == 1) static_cast<__half*>(p)[i] = __float2half_rn(v);
  else static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
}
__device__ __forceinline__ float round_to(int dtype, float v) {
  if (dtype == 1) return __half2float(__float2half_rn(v));
  if (dtype == 2) return __bfloat162float(__float2bfloat16_rn(v));
  return v;
}

// Four consecutive values at element i of a buffer of dtype code 0/1/2 (i % 4 == 0; the buffer
// 16-byte aligned for f32, 8-byte aligned for f16/bf16): one 16- or 8-byte access.
__device__ __forceinline__ float4 load4(const void* p, int dtype, int64_t i) {
  if (dtype == 0) return *reinterpret_cast<const float4*>(static_cast<const float*>(p) + i);
  const uint2 u = *reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(p) + i);
  float2 a, b;
  if (dtype == 1) {
    a = __half22float2(*reinterpret_cast<const __half2*>(&u.x));
    b = __half22float2(*reinterpret_cast<const __half2*>(&u.y));
  } else {
    a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.x));
    b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.y));
  }
  return make_float4(a.x, a.y, b.x, b.y);
}
__device__ __forceinline__ void store4(void* p, int dtype, int64_t i, float4 v) {
  if (dtype == 0) {
    *reinterpret_cast<float4*>(static_cast<float*>(p) + i) = v;
    return;
  }
  uint2 u;
  if (dtype == 1) {
    const __half2 a = __floats2half2_rn(v.x, v.y), b = __floats2half2_rn(v.z, v.w);
    u.x = *reinterpret_cast<const uint32_t*>(&a);
    u.y = *reinterpret_cast<const uint32_t*>(&b);
  } else {
    const __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
    u.x = *reinterpret_cast<const uint32_t*>(&a);
    u.y = *reinterpret_cast<const uint32_t*>(&b);
  }
  *reinterpret_cast<uint2*>(static_cast<uint16_t*>(p) + i) = u;
}
__device__ __forceinline__ float4 round4(int dtype, float4 v) {
  return make_float4(round_to(dtype, v.x), round_to(dtype, v.y), round_to(dtype, v.z), round_to(dtype, v.w));
}
__device__ __forceinline__ float4 sub4(float4 a, float4 b) { return make_float4(a.x - b.x, a.y - b.y, a.z - b.z, a.w - b.w); }
// Whether buffers can take load4/store4 at multiples of 4 elements.
inline bool vec4_ok(const void* p, int dtype) {
  return (reinterpret_cast<uintptr_t>(p) & (dtype == 0 ? 15u : 7u)) == 0;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
__device__ float block_sum(float v) {
  __shared__ float part[32];
  __shared__ float total;
  v = warp_sum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // `part` may still be read by a previous call
  if (lane == 0) part[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float t = lane < int(blockDim.x >> 5) ? part[lane] : 0.0f;
    t = warp_sum(t);
    if (lane == 0) total = t;
  }
  __syncthreads();
  return total;
}

__device__ __forceinline__ float act_f(int kind, float g) {
  switch (kind) {
    case int(Activation::silu): return g / (1.0f + expf(-g));
    case int(Activation::relu): return g > 0.0f ? g : 0.0f;
    case int(Activation::gelu): return 0.5f * g * (1.0f + erff(g * 0.70710678118654752f));
    default: return 0.5f * g * (1.0f + tanhf(0.79788456080286536f * (g + 0.044715f * g * g * g)));
  }
}

// ---- embeddings, norms, splits -----------------------------------------------------------------

// One thread per element: a 2-D grid (column blocks, rows) keeps every load independent (a loop
// over the row in one block serialises its round trips: 5 us for one row of 2048).
__global__ void embed_kernel(const int32_t* ids, const void* embed, int dt, int64_t T, int64_t H, float* x) {
  MOEX_CUDA_TRACE_BLOCK(k_embed);
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= H) return;
  for (int64_t r = blockIdx.y; r < T; r += gridDim.y) x[r * H + i] = load_any(embed, dt, int64_t(ids[r]) * H + i);
}

// The input value i of RMSNorm row r (see RmsNormParams): embedding, gathered or own row, + add.
__device__ __forceinline__ float norm_input(const RmsNormParams& p, int64_t r, int64_t src, int64_t i) {
  float a = p.ids ? load_any(p.embed, p.embed_dtype, int64_t(p.ids[r]) * p.n + i) : p.x[src * p.x_pitch + i];
  if (p.add) a += load_any(p.add, p.add_dtype, src * p.n + i);
  return a;
}
// wi: p.w[i], loaded by the caller (early, or here at the call)
__device__ __forceinline__ void norm_output(const RmsNormParams& p, int64_t r, int64_t i, float v, float inv, float wi) {
  const float o = wi * (v * inv);
  if (p.out) p.out[r * p.out_pitch + i] = o;
  if (p.split) {
    const float hi = round_to(p.split_dtype, o);
    store_any(p.split, p.split_dtype, r * p.n + i, hi);
    store_any(p.split, p.split_dtype, (p.T + r) * p.n + i, o - hi);
  }
}

// One block per row, the row in registers (PER values per thread, coalesced: i = tid + k·blockDim):
// x is read once and every load of a thread is issued before the reduction.
template <int PER>
__global__ void __launch_bounds__(1024) rmsnorm_reg_kernel(RmsNormParams p) {
  MOEX_CUDA_TRACE_BLOCK(k_rmsnorm);
  // p.w_early: the weights (constant: allowed before the wait, pdl.cuh) requested now, so that after
  // the reduction no load remains on the kernel's path
  float wv[PER];
  if (p.w_early) {
#pragma unroll
    for (int k = 0; k < PER; ++k) {
      const int64_t i = threadIdx.x + int64_t(k) * blockDim.x;
      wv[k] = i < p.n ? __ldg(p.w + i) : 0.0f;
    }
  }
  pdl_wait();  // launched with PDL (pdl.cuh): everything below reads or writes the stream's data
  MOEX_CUDA_TRACE_WAITED();
  // Released right away: releasing after the reduction (the row's loads done, so that the qkv GEMV's
  // weight requests do not queue ahead of them) measured no faster, at exit slower (H200,
  // 2026-12-04, docs/PERF.md thirty-third session); once the row is loaded, with x an L2 hit since
  // the experts' weights stream past L2, 0.01-0.03 ms per step slower (thirty-fifth session).
  pdl_launch_dependents();
  const int64_t r = blockIdx.x;
  const int64_t src = p.rows ? int64_t(p.rows[r]) : r;
  const bool write_x = (p.ids || p.add) && !p.rows;
  float v[PER];
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < PER; ++k) {
    const int64_t i = threadIdx.x + int64_t(k) * blockDim.x;
    v[k] = i < p.n ? norm_input(p, r, src, i) : 0.0f;
    ss += v[k] * v[k];
  }
  MOEX_CUDA_TRACE_MARK(0);  // the row's values in registers (thread 0's)
  ss = block_sum(ss);       // synchronises: in-place outputs (out == x) are written after every read
  MOEX_CUDA_TRACE_MARK(1);  // reduced
  const float inv = rsqrtf(ss / float(p.n) + p.eps);
#pragma unroll
  for (int k = 0; k < PER; ++k) {
    const int64_t i = threadIdx.x + int64_t(k) * blockDim.x;
    if (i >= p.n) continue;
    if (write_x) p.x[src * p.x_pitch + i] = v[k];
    norm_output(p, r, i, v[k], inv, p.w_early ? wv[k] : p.w[i]);
  }
}

// Rows too long for registers: two passes over the row (x re-read from L1/L2).
__global__ void rmsnorm_kernel(RmsNormParams p) {
  MOEX_CUDA_TRACE_BLOCK(k_rmsnorm);
  pdl_wait();
  MOEX_CUDA_TRACE_WAITED();
  pdl_launch_dependents();
  const int64_t r = blockIdx.x;
  const int64_t src = p.rows ? int64_t(p.rows[r]) : r;
  const bool write_x = (p.ids || p.add) && !p.rows;
  float* xr = p.x + src * p.x_pitch;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < p.n; i += blockDim.x) {
    const float a = norm_input(p, r, src, i);
    if (write_x) xr[i] = a;  // read back below by the same thread
    ss += a * a;
  }
  ss = block_sum(ss);
  const float inv = rsqrtf(ss / float(p.n) + p.eps);
  for (int64_t i = threadIdx.x; i < p.n; i += blockDim.x)
    norm_output(p, r, i, write_x ? xr[i] : norm_input(p, r, src, i), inv, p.w[i]);
}

// ---- RMSNorm inside another kernel (the decode step's post-attention norm in the router) -------------
// A kernel that needs norm(x) of its input rows (the router's cluster kernel) computes it itself
// instead of waiting for a separate RMSNorm kernel — one PDL hand-off and one launch fewer on the
// decode step's latency chain. It computes it exactly as rmsnorm_reg_kernel<4> does with
// rmsnorm_reg_threads(n) threads: the same per-thread sums over the same entries, the same warp
// reductions and the same block sum, so the same bits. Each of this block's threads plays V of those
// threads: virtual thread vt = threadIdx.x + j·blockDim.x, j < V.
// Tried and removed (H100, 2026-12-06, forty-seventh session, docs/PERF.md): the input norm the same
// way inside the qkv GEMV at batch 1 (each of its 1 280 blocks normalising the row x + experts output,
// the add left to the o GEMV) — bit-identical, but the step 4.24-4.31 ms against 3.56-3.62 without it:
// 1 280 copies of the row's loads and block reduction on the chain cost far more than the kernel they
// replace.
// The block size launch_rmsnorm gives rmsnorm_reg_kernel<4> (n <= 4096): four entries per thread.
__host__ __device__ inline int rmsnorm_reg_threads(int64_t n) {
  const int64_t t = (n + 3) / 4 + 31;
  return int((t > 32 ? t : 32) / 32 * 32);
}

// Entry k (0..3) of this thread's virtual thread j in rmsnorm_reg_kernel<4>'s layout of B threads: its
// index in the row, or -1 where that thread has no such entry (vt >= B, or past n).
__device__ __forceinline__ int64_t norm_entry(int j, int k, int B, int64_t n) {
  const int vt = int(threadIdx.x) + j * int(blockDim.x);
  const int64_t i = vt + int64_t(k) * B;
  return vt < B && i < n ? i : -1;
}

// The norm weights of this thread's entries (constant: read before pdl_wait).
template <int V>
struct NormWeights {
  float w[V][4];
};
template <int V>
__device__ __forceinline__ void norm_weights_load(const RmsNormParams& p, NormWeights<V>& nw) {
  const int B = rmsnorm_reg_threads(p.n);
#pragma unroll
  for (int j = 0; j < V; ++j)
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int64_t i = norm_entry(j, k, B, p.n);
      nw.w[j][k] = i >= 0 ? __ldg(p.w + i) : 0.0f;
    }
}

// Row r of norm(x + add) into dst [n] (shared memory); with `outputs`, also what the RMSNorm kernel
// writes (p.out, p.split; p.x is not written: the caller has no residual add here). The weights are
// in `nw` (norm_weights_load, before pdl_wait). The row goes through dst (x + add first, normalised in
// place by the thread that wrote it): no per-thread copy of it in registers across the reduction.
// Needs V·blockDim.x >= rmsnorm_reg_threads(n) (<= 1024: n <= 4096). Synchronises the block; dst is
// complete on return.
template <int V>
__device__ void norm_row_into(const RmsNormParams& p, int64_t r, const NormWeights<V>& nw, float* dst, bool outputs) {
  __shared__ float part[32];
  __shared__ float total;
  const int B = rmsnorm_reg_threads(p.n), nwarps = int(blockDim.x >> 5);
  const int lane = int(threadIdx.x & 31), warp = int(threadIdx.x >> 5);
  float ss[V];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    ss[j] = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; ++k) {  // rmsnorm_reg_kernel's loop, for its thread vt
      const int64_t i = norm_entry(j, k, B, p.n);
      const float v = i >= 0 ? norm_input(p, r, r, i) : 0.0f;
      if (i >= 0) dst[i] = v;
      ss[j] += v * v;
    }
  }
  __syncthreads();  // `part` may still be read by a previous row
#pragma unroll
  for (int j = 0; j < V; ++j) {  // block_sum's first stage, per virtual warp
    const float w = warp_sum(ss[j]);
    const int vw = warp + j * nwarps;
    if (lane == 0 && vw < B / 32) part[vw] = w;
  }
  __syncthreads();
  if (warp == 0) {  // and its second
    float t = lane < B / 32 ? part[lane] : 0.0f;
    t = warp_sum(t);
    if (lane == 0) total = t;
  }
  __syncthreads();
  const float inv = rsqrtf(total / float(p.n) + p.eps);
#pragma unroll
  for (int j = 0; j < V; ++j)
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int64_t i = norm_entry(j, k, B, p.n);
      if (i < 0) continue;
      const float v = dst[i], wi = nw.w[j][k];
      dst[i] = wi * (v * inv);  // norm_output's arithmetic
      if (outputs) norm_output(p, r, i, v, inv, wi);
    }
  __syncthreads();
}

// split [2T, n] = (hi, lo) of x [T, n]: four values per thread, grid-stride over T · n/4.
__global__ void split4_kernel(const float* x, int64_t xp, int64_t T, int64_t n, void* split, int sdt) {
  const int64_t n4 = n / 4;
  for (int64_t q = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; q < T * n4; q += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = q / n4, c = (q - r * n4) * 4;
    const float4 v = *reinterpret_cast<const float4*>(x + r * xp + c);
    const float4 hi = round4(sdt, v);
    store4(split, sdt, r * n + c, hi);
    store4(split, sdt, (T + r) * n + c, sub4(v, hi));
  }
}
__global__ void split_kernel(const float* x, int64_t xp, int64_t T, int64_t n, void* split, int sdt) {
  const int64_t r = blockIdx.y;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = x[r * xp + i];
    const float hi = round_to(sdt, v);
    store_any(split, sdt, r * n + i, hi);
    store_any(split, sdt, (T + r) * n + i, v - hi);
  }
}

__device__ __forceinline__ float finish_one(const float* g, bool two, const float* bias, float gate, int64_t T, int64_t n,
                                            int64_t r, int64_t i) {
  float v = g[r * n + i];
  if (two) v += g[(T + r) * n + i];
  if (bias) v += bias[i];
  return v * gate;
}
// Four columns per thread, grid-stride over T · n/4 (n % 4 == 0, y_pitch % 4 == 0, aligned).
__global__ void finish_linear4_kernel(const float* g, bool two, const float* bias, const float* row_gate, int64_t T,
                                      int64_t n, float* y, int64_t yp, bool acc) {
  const int64_t n4 = n / 4;
  for (int64_t q = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; q < T * n4; q += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = q / n4, c = (q - r * n4) * 4;
    const float gate = row_gate ? 1.0f / (1.0f + expf(-row_gate[r])) : 1.0f;
    float4 v = *reinterpret_cast<const float4*>(g + r * n + c);
    if (two) {
      const float4 l = *reinterpret_cast<const float4*>(g + (T + r) * n + c);
      v = make_float4(v.x + l.x, v.y + l.y, v.z + l.z, v.w + l.w);
    }
    if (bias) {
      const float4 b = *reinterpret_cast<const float4*>(bias + c);
      v = make_float4(v.x + b.x, v.y + b.y, v.z + b.z, v.w + b.w);
    }
    v = make_float4(v.x * gate, v.y * gate, v.z * gate, v.w * gate);
    float4* yv = reinterpret_cast<float4*>(y + r * yp + c);
    if (acc) {
      const float4 o = *yv;
      v = make_float4(o.x + v.x, o.y + v.y, o.z + v.z, o.w + v.w);
    }
    *yv = v;
  }
}
__global__ void finish_linear_kernel(const float* g, bool two, const float* bias, const float* row_gate, int64_t T,
                                     int64_t n, float* y, int64_t yp, bool acc) {
  const int64_t r = blockIdx.y;
  const float gate = row_gate ? 1.0f / (1.0f + expf(-row_gate[r])) : 1.0f;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = finish_one(g, two, bias, gate, T, n, r, i);
    if (acc) y[r * yp + i] += v;
    else y[r * yp + i] = v;
  }
}

template <bool L2>
__device__ void route_warp(const RouterParams& p, int64_t t, int lane, const float* l);  // the routers section

// One warp per output row, kGemvWarps rows per block; lane l reads 8 weights (16 bytes) at columns
// 8l, 8l + 256, ... and the matching x values of each of the TM rows (x stays in L1/L2: every warp
// of the grid reads the same rows). The weights stream through with up to eight 16-byte loads in
// flight per lane (issued before their FMAs: one load in flight per lane reached only 1.8 TB/s).
// Tried and slower (H200, thirty-fifth session, docs/PERF.md): rows longer than the eight early chunks
// (the o projection) asking L2 for their rest before the wait; first-wave blocks asking L2 for the
// rows of the block one wave after them (the qkv projection); the decode attention asking L2 for the
// o projection's and the router's weights. DRAM traffic during a latency-bound kernel delays it more
// than the later kernel gains.
constexpr int kGemvWarps = 4;

// XS: x is in shared memory (the router cluster kernel normalising its own input rows), else global
// memory read through the read-only path.
template <int TM, class W, bool XS = false>
__device__ __forceinline__ void gemv_chunk(const uint4& raw, const float* x, int64_t xp, int64_t c, float* sum) {
  const W* wv = reinterpret_cast<const W*>(&raw);
  float wf[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) wf[k] = ::moex::cuda::to_f32(wv[k]);
#pragma unroll
  for (int t = 0; t < TM; ++t) {
    const float4* xv = reinterpret_cast<const float4*>(x + t * xp + c);
    const float4 a = XS ? xv[0] : __ldg(xv);
    const float4 b = XS ? xv[1] : __ldg(xv + 1);
    sum[t] = fmaf(wf[0], a.x, sum[t]);
    sum[t] = fmaf(wf[1], a.y, sum[t]);
    sum[t] = fmaf(wf[2], a.z, sum[t]);
    sum[t] = fmaf(wf[3], a.w, sum[t]);
    sum[t] = fmaf(wf[4], b.x, sum[t]);
    sum[t] = fmaf(wf[5], b.y, sum[t]);
    sum[t] = fmaf(wf[6], b.z, sum[t]);
    sum[t] = fmaf(wf[7], b.w, sum[t]);
  }
}

// Chunks c, c + 256, ... of the lane (columns in order), U 16-byte weight loads issued at a time;
// returns the first chunk left (fewer than U remain).
template <int U, int TM, class W, bool XS = false>
__device__ __forceinline__ int64_t gemv_run(const W* wr, int64_t c, int64_t in, const float* x, int64_t xp, float* sum) {
  for (; c + (U - 1) * 256 < in; c += U * 256) {
    uint4 raw[U];
#pragma unroll
    for (int u = 0; u < U; ++u) raw[u] = __ldcs(reinterpret_cast<const uint4*>(wr + c + u * 256));
#pragma unroll
    for (int u = 0; u < U; ++u) gemv_chunk<TM, W, XS>(raw[u], x, xp, c + u * 256, sum);
  }
  return c;
}

// The warp's TM dot products with weight row wr, reduced over the warp (every lane gets them): lane
// l takes chunks 8l, 8l + 256, ... in order; when `early`, its first eight chunks are already in
// `first` (requested before pdl_wait) and taken in the order gemv_run<8> would take them.
template <int TM, class W, bool XS = false>
__device__ __forceinline__ void gemv_row(const W* wr, int lane, int64_t in, const float* x, int64_t xp, bool early,
                                         const uint4 (&first)[8], float (&sum)[TM]) {
  int64_t c = int64_t(lane) * 8;
#pragma unroll
  for (int t = 0; t < TM; ++t) sum[t] = 0.0f;
  if (early) {
#pragma unroll
    for (int u = 0; u < 8; ++u) gemv_chunk<TM, W, XS>(first[u], x, xp, c + u * 256, sum);
    c += 8 * 256;
  }
  c = gemv_run<8, TM, W, XS>(wr, c, in, x, xp, sum);  // in = 2048: the lane's whole row in one go
  c = gemv_run<4, TM, W, XS>(wr, c, in, x, xp, sum);
  gemv_run<1, TM, W, XS>(wr, c, in, x, xp, sum);
#pragma unroll
  for (int t = 0; t < TM; ++t) sum[t] = warp_sum(sum[t]);
}

// The fused input RMSNorm (GemvFuse::norm_w, one row): chunk c of v = x + add (add in W's type, the previous
// layer's experts output) feeds the lane's sum of squares ss and its dot product with v ⊙ norm_w.
template <class W>
__device__ __forceinline__ void gemv_chunk_norm(const uint4& raw, const float* x, const W* add, const float* nw, int64_t c,
                                                float& sum, float& ss) {
  const W* wv = reinterpret_cast<const W*>(&raw);
  const float4 xa = __ldg(reinterpret_cast<const float4*>(x + c)), xb = __ldg(reinterpret_cast<const float4*>(x + c) + 1);
  const float4 ga = __ldg(reinterpret_cast<const float4*>(nw + c)), gb = __ldg(reinterpret_cast<const float4*>(nw + c) + 1);
  const uint4 ar = __ldg(reinterpret_cast<const uint4*>(add + c));
  const W* av = reinterpret_cast<const W*>(&ar);
  const float xs[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
  const float gs[8] = {ga.x, ga.y, ga.z, ga.w, gb.x, gb.y, gb.z, gb.w};
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const float v = xs[k] + ::moex::cuda::to_f32(av[k]);  // norm_input's x + add
    ss = fmaf(v, v, ss);
    sum = fmaf(::moex::cuda::to_f32(wv[k]), gs[k] * v, sum);
  }
}

// gemv_row for one row with the input RMSNorm fused: the warp reads the whole row (every lane its chunks
// 8l, 8l + 256, ...), so it computes the row's sum of squares itself, and returns
// rsqrt(mean(v²) + eps) · Σ_k W[k] · (norm_w[k] · v[k]) — the normed row's dot product, without the
// RMSNorm kernel and its hand-off. Not the RMSNorm kernel's bits (it rounds w · (v · inv) per element
// and sums v² in another order): the same value to f32 rounding.
template <class W>
__device__ __forceinline__ float gemv_row_norm(const W* wr, int lane, int64_t in, const float* x, const W* add,
                                               const float* nw, float eps, bool early, const uint4 (&first)[8]) {
  int64_t c = int64_t(lane) * 8;
  float sum = 0.0f, ss = 0.0f;
  if (early) {
#pragma unroll
    for (int u = 0; u < 8; ++u) gemv_chunk_norm<W>(first[u], x, add, nw, c + u * 256, sum, ss);
    c += 8 * 256;
  }
  for (; c + 3 * 256 < in; c += 4 * 256) {
    uint4 raw[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) raw[u] = __ldcs(reinterpret_cast<const uint4*>(wr + c + u * 256));
#pragma unroll
    for (int u = 0; u < 4; ++u) gemv_chunk_norm<W>(raw[u], x, add, nw, c + u * 256, sum, ss);
  }
  for (; c < in; c += 256) gemv_chunk_norm<W>(__ldcs(reinterpret_cast<const uint4*>(wr + c)), x, add, nw, c, sum, ss);
  sum = warp_sum(sum);
  ss = warp_sum(ss);
  return sum * rsqrtf(ss / float(in) + eps);
}

// ROUTE: y holds router logits [TM, E] (rp.logits); the last block to finish routes the TM rows
// (the other blocks' logits made visible by their fences before the ticket).
// NORM (TM = 1): x is the residual row before the input RMSNorm, fused as GemvFuse says (gemv_row_norm).
// fz.acc_add (with acc): y = (y + acc_add) + v, the residual add the skipped RMSNorm would have made.
template <int TM, class W, bool ROUTE, bool NORM = false>
__global__ void __launch_bounds__(kGemvWarps * 32, NORM ? 5 : 1)
    gemv_kernel(const W* w, int64_t out, int64_t in, const float* x, int64_t xp, const float* bias, const float* row_gate,
                float* y, int64_t yp, bool acc, RouterParams rp, unsigned* ticket, GemvFuse fz) {
  static_assert(!NORM || (TM == 1 && !ROUTE), "the fused input norm is for one-row GEMVs");
  MOEX_CUDA_TRACE_BLOCK(k_gemv);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t row = blockIdx.x * int64_t(kGemvWarps) + warp;
  // The lane's first eight weight chunks are requested before waiting for the previous kernel
  // (weights are constant; launched with PDL, pdl.cuh): the row streams in while x is produced.
  const W* wr = w + (row < out ? row : 0) * in;
  int64_t c = int64_t(lane) * 8;
  const bool early = row < out && c + 7 * 256 < in;
  uint4 first[8];
  if (early) {
#pragma unroll
    for (int u = 0; u < 8; ++u) first[u] = __ldcs(reinterpret_cast<const uint4*>(wr + c + u * 256));
  }
  pdl_wait();
  MOEX_CUDA_TRACE_WAITED();
  pdl_launch_dependents();
  if (row < out) {
    float sum[TM];
    if constexpr (NORM)
      sum[0] = gemv_row_norm<W>(wr, lane, in, x, static_cast<const W*>(fz.norm_add), fz.norm_w, fz.norm_eps, early, first);
    else
      gemv_row<TM, W>(wr, lane, in, x, xp, early, first, sum);
    if (lane == 0) {
      const float bv = bias ? bias[row] : 0.0f;
#pragma unroll
      for (int t = 0; t < TM; ++t) {
        float v = sum[t] + bv;
        if (row_gate) v *= 1.0f / (1.0f + expf(-row_gate[t]));
        if (acc && fz.acc_add) y[t * yp + row] = (y[t * yp + row] + load_any(fz.acc_add, fz.acc_add_dtype, t * out + row)) + v;
        else if (acc) y[t * yp + row] += v;
        else y[t * yp + row] = v;
      }
    }
  }
  if constexpr (ROUTE) {
    __shared__ bool last;
    __threadfence();  // this thread's logits, device-wide, before the block takes its ticket
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(ticket, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    for (int64_t t = warp; t < rp.T; t += kGemvWarps) {
      route_warp<true>(rp, t, lane, rp.logits + t * rp.E);
      __syncwarp();  // lanes 1.. leave route_warp before lane 0 has written the token
    }
    if (threadIdx.x == 0) *ticket = 0u;  // ready for the next launch (graph replays included)
  }
}

// The router GEMV and the routing in one thread-block cluster (decode steps, compute capability
// >= 9.0): kRouterCtas CTAs of kRouterWarps warps; warp g of the C·W computes logits rows g, g + C·W,
// ... with gemv_kernel's loads and arithmetic (its first row's first eight chunks requested before
// the wait), writes each logit to p.logits and into CTA 0's shared memory (once every CTA has
// started: the first cluster barrier phase), and after the second phase CTA 0's warp t routes token
// t from there. Where the 32-block kernel pays a device-wide
// fence, an atomic ticket and the logits' round trip through L2 before its last block routes, this
// pays a cluster barrier. Same logits, bit for bit, hence the same routing.
constexpr int kRouterCtas = 8, kRouterWarps = 16;

// NV > 0 (the post-attention RMSNorm fused, np.x set): every CTA normalises the TM rows of np
// (norm_row_into, NV virtual threads per thread, bit for bit the RMSNorm kernel's result) into shared
// memory after its wait and reads its x from there; CTA 0 also writes the norm's outputs (np.out,
// np.split) for the experts and any later reader.
template <int TM, class W, int NV = 0>
__global__ void __launch_bounds__(kRouterWarps * 32)
    gemv_router_cluster_kernel(const W* w, int64_t in, const float* x, int64_t xp, const float* bias, RouterParams rp,
                               RmsNormParams np) {
  namespace mc = ::moex::cuda;
  MOEX_CUDA_TRACE_BLOCK(k_gemv_router);
  __shared__ float logits[kGemvMaxRows * kRouterMaxExperts];  // [TM, E] in CTA 0
  extern __shared__ float s_rows[];  // NV > 0: [TM, in] the normalised rows
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const uint32_t rank = mc::cluster_ctarank();
  mc::cluster_arrive_relaxed();  // this CTA has started (waited for below, before any remote write)
  const int64_t E = rp.E, stride = int64_t(kRouterCtas) * kRouterWarps;
  int64_t row = int64_t(rank) * kRouterWarps + warp;
  bool early = row < E && int64_t(lane) * 8 + 7 * 256 < in;
  uint4 first[8];
  if (early) {  // weights only: allowed before pdl_wait (pdl.cuh)
    const W* wr = w + row * in + int64_t(lane) * 8;
#pragma unroll
    for (int u = 0; u < 8; ++u) first[u] = __ldcs(reinterpret_cast<const uint4*>(wr + u * 256));
  }
  [[maybe_unused]] NormWeights<(NV > 0 ? NV : 1)> nw;
  if constexpr (NV > 0) norm_weights_load<NV>(np, nw);
  pdl_wait();
  MOEX_CUDA_TRACE_WAITED();
  pdl_launch_dependents();
  if constexpr (NV > 0) {
    for (int t = 0; t < TM; ++t) norm_row_into<NV>(np, t, nw, s_rows + t * in, rank == 0);
  }
  mc::cluster_wait();  // every CTA of the cluster has started: CTA 0's shared memory may be written
  for (; row < E; row += stride) {
    float sum[TM];
    if constexpr (NV > 0) gemv_row<TM, W, true>(w + row * in, lane, in, s_rows, in, early, first, sum);
    else gemv_row<TM, W>(w + row * in, lane, in, x, xp, early, first, sum);
    early = false;  // `first` held the first row's chunks only
    if (lane == 0) {
      const float bv = bias ? bias[row] : 0.0f;
#pragma unroll
      for (int t = 0; t < TM; ++t) {
        const float v = sum[t] + bv;
        const_cast<float*>(rp.logits)[t * E + row] = v;
        mc::store_cluster_f32(mc::ptx::smem_u32(&logits[t * E + row]), 0, v);
      }
    }
  }
  MOEX_CUDA_TRACE_MARK(0);  // this CTA's logits computed
  mc::cluster_sync();       // every logit is in CTA 0's shared memory
  MOEX_CUDA_TRACE_MARK(1);  // every CTA's logits visible
  if (rank != 0) return;
  for (int t = warp; t < TM && t < rp.T; t += kRouterWarps) route_warp<false>(rp, t, lane, logits + t * E);
}

// np (optional): the post-attention RMSNorm fused (gemv_router_cluster_kernel's NV > 0); its
// normalised rows in dynamic shared memory (T · in floats, <= kFusedNormSmem).
constexpr size_t kFusedNormSmem = size_t(64) << 10;

template <int TM, class W, int NV>
void launch_router_cluster_n(const W* w, int64_t in, const float* x, int64_t xp, const float* bias, const RouterParams& p,
                             const RmsNormParams& np, cudaStream_t s) {
  const auto kernel = gemv_router_cluster_kernel<TM, W, NV>;
  const size_t smem = NV > 0 ? size_t(TM) * size_t(in) * sizeof(float) : 0;
  if constexpr (NV > 0) {
    static const bool attr_set = [&] {
      check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kFusedNormSmem)),
            "router kernel attribute");
      return true;
    }();
    (void)attr_set;
  }
  ::moex::cuda::launch_pdl_cluster("gemv_router_cluster_kernel", kernel, dim3(kRouterCtas), dim3(kRouterCtas),
                                   dim3(kRouterWarps * 32), smem, s, w, in, x, xp, bias, p, np);
}

template <class W>
void launch_router_cluster(const W* w, int64_t in, const float* x, int64_t xp, const float* bias, const RouterParams& p,
                           const RmsNormParams* np, cudaStream_t s) {
  // virtual RMSNorm threads per thread: rmsnorm_reg_threads(n) over the CTA's 512
  const int nv = np ? (rmsnorm_reg_threads(np->n) + kRouterWarps * 32 - 1) / (kRouterWarps * 32) : 0;
  const RmsNormParams none{};
  switch (p.T) {
#define MOEX_ROUTER_CASE(n)                                                                                   \
  case n:                                                                                                     \
    if (nv == 0) launch_router_cluster_n<n, W, 0>(w, in, x, xp, bias, p, none, s);                           \
    else if (nv == 1) launch_router_cluster_n<n, W, 1>(w, in, x, xp, bias, p, *np, s);                       \
    else launch_router_cluster_n<n, W, 2>(w, in, x, xp, bias, p, *np, s);                                    \
    break;
    MOEX_ROUTER_CASE(1)
    MOEX_ROUTER_CASE(2)
    MOEX_ROUTER_CASE(3)
    MOEX_ROUTER_CASE(4)
    MOEX_ROUTER_CASE(5)
    MOEX_ROUTER_CASE(6)
    MOEX_ROUTER_CASE(7)
    MOEX_ROUTER_CASE(8)
#undef MOEX_ROUTER_CASE
    default: ::moex::detail::fail(ErrorCode::internal, "router: {} rows exceed {}", p.T, kGemvMaxRows);
  }
}

template <class W, bool ROUTE>
void launch_gemv_t(const W* w, int64_t out, int64_t in, const float* x, int64_t xp, int64_t T, const float* bias,
                   const float* gate, float* y, int64_t yp, bool acc, const RouterParams& rp, unsigned* ticket,
                   cudaStream_t s, const GemvFuse& fz = {}) {
  const unsigned grid = unsigned((out + kGemvWarps - 1) / kGemvWarps);
  if constexpr (!ROUTE) {
    if (fz.norm_w) {
      MOEX_ASSERT(T == 1);  // the fused input norm takes one row
      launch_pdl("gemv_kernel", gemv_kernel<1, W, false, true>, dim3(grid), dim3(kGemvWarps * 32), 0, s, w, out, in, x,
                 xp, bias, gate, y, yp, acc, rp, ticket, fz);
      return;
    }
  }
  switch (T) {
#define MOEX_GEMV_CASE(n)                                                                                    \
  case n:                                                                                                    \
    launch_pdl("gemv_kernel", gemv_kernel<n, W, ROUTE>, dim3(grid), dim3(kGemvWarps * 32), 0, s, w, out, in, x, xp, \
               bias, gate, y, yp, acc, rp, ticket, fz);                                                      \
    break;
    MOEX_GEMV_CASE(1)
    MOEX_GEMV_CASE(2)
    MOEX_GEMV_CASE(3)
    MOEX_GEMV_CASE(4)
    MOEX_GEMV_CASE(5)
    MOEX_GEMV_CASE(6)
    MOEX_GEMV_CASE(7)
    MOEX_GEMV_CASE(8)
#undef MOEX_GEMV_CASE
    default: ::moex::detail::fail(ErrorCode::internal, "gemv: {} rows exceed {}", T, kGemvMaxRows);
  }
}

__global__ void to_dtype4_kernel(const float* x, int64_t n, void* out, int dt) {
  for (int64_t i = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) * 4; i < n; i += int64_t(gridDim.x) * blockDim.x * 4)
    store4(out, dt, i, *reinterpret_cast<const float4*>(x + i));
}
__global__ void add_from4_kernel(const void* in, int dt, int64_t n, float* x) {
  for (int64_t i = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) * 4; i < n; i += int64_t(gridDim.x) * blockDim.x * 4) {
    const float4 a = load4(in, dt, i);
    float4* xv = reinterpret_cast<float4*>(x + i);
    const float4 o = *xv;
    *xv = make_float4(o.x + a.x, o.y + a.y, o.z + a.z, o.w + a.w);
  }
}

__global__ void to_dtype_kernel(const float* x, int64_t n, void* out, int dt) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    store_any(out, dt, i, x[i]);
}
__global__ void add_from_kernel(const void* in, int dt, int64_t n, float* x) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] += load_any(in, dt, i);
}

__global__ void gated_act_kernel(const float* gu, int64_t T, int64_t I, int act, float* h) {
  const int64_t r = blockIdx.y;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < I; i += int64_t(gridDim.x) * blockDim.x)
    h[r * I + i] = act_f(act, gu[r * 2 * I + i]) * gu[r * 2 * I + I + i];
}

// ---- RoPE ----------------------------------------------------------------------------------------

// In shared memory: src[0..dim) → dst[0..dim) rotated (reads src, writes dst; dst != src).
__device__ void rope_to(const float* src, float* dst, const RopeParams& rp, int64_t pos) {
  const int h = rp.dim / 2;
  for (int i = threadIdx.x; i < h; i += blockDim.x) {
    const double ang = double(pos) * rp.inv_freq[i];
    double sn, cs;
    sincos(ang, &sn, &cs);
    const double c = cs * rp.factor, s = sn * rp.factor;
    const double x1 = rp.interleave ? src[2 * i] : src[i];
    const double x2 = rp.interleave ? src[2 * i + 1] : src[i + h];
    dst[i] = float(x1 * c - x2 * s);
    dst[i + h] = float(x2 * c + x1 * s);
  }
}

// Grid (row, group of kQkvWarps head slots), a warp per head slot: slots [0, nh) are q heads,
// [nh, nh + nkv) k heads, then v heads. The RoPE cos/sin of the row's position are computed once
// per block into shared memory (f64, as the CPU runtime) and shared by its heads (the old kernel
// evaluated them per head and synchronised its block five times per head: 110 us at 2048 rows).
constexpr int kQkvWarps = 8;
__global__ void __launch_bounds__(kQkvWarps * 32) qkv_post_kernel(QkvPostParams p) {
  pdl_wait();
  pdl_launch_dependents();
  extern __shared__ double qsm[];
  const int h2 = p.rope.dim / 2;
  double* cs = qsm;                                        // [h2]: cos · factor
  double* sn = qsm + h2;                                   // [h2]: sin · factor
  float* abuf = reinterpret_cast<float*>(qsm + 2 * h2);    // [kQkvWarps, hd]: a warp's head
  const int64_t r = blockIdx.x;
  rope_table(p.rope, p.pos[r], cs, sn);
  const int hd = p.hd;
  // norm over the whole q (k) projection: its inverse RMS, block-wide
  float inv_q = 1.0f, inv_k = 1.0f;
  if (p.norm_mode == 2) {
    const float* row = p.qkv + r * int64_t(p.nh + 2 * p.nkv) * hd;
    const int nq = p.nh * hd, nk = p.nkv * hd;
    float sq = 0.0f, sk = 0.0f;
    for (int i = threadIdx.x; i < nq; i += blockDim.x) sq += row[i] * row[i];
    for (int i = threadIdx.x; i < nk; i += blockDim.x) sk += row[nq + i] * row[nq + i];
    sq = block_sum(sq);
    sk = block_sum(sk);
    inv_q = rsqrtf(sq / float(nq) + p.eps);
    inv_k = rsqrtf(sk / float(nk) + p.eps);
  }
  __syncthreads();  // the cos/sin table
  const int warp = threadIdx.x >> 5;
  const int hs = blockIdx.y * kQkvWarps + warp;
  if (hs >= p.nh + 2 * p.nkv) return;
  qkv_post_slot(p, r, hs, abuf + warp * hd, cs, sn, inv_q, inv_k, nullptr);
}

// One block per (row, head).
__global__ void mla_post_kernel(MlaPostParams p) {
  extern __shared__ float sm[];  // [2 * rd]
  const int64_t r = blockIdx.x;
  const int h = blockIdx.y;
  const int qk = p.nope + p.rd;
  const int64_t pos = p.pos[r];
  float* a = sm;
  float* b = sm + p.rd;
  // q: RoPE on its last rd values
  float* qh = p.q + (r * p.nh + h) * qk;
  for (int i = threadIdx.x; i < p.rd; i += blockDim.x) a[i] = qh[p.nope + i];
  __syncthreads();
  rope_to(a, b, p.rope, pos);
  __syncthreads();
  for (int i = threadIdx.x; i < p.rd; i += blockDim.x) qh[p.nope + i] = b[i];
  __syncthreads();
  // k_rot (shared by the heads), rotated
  for (int i = threadIdx.x; i < p.rd; i += blockDim.x) a[i] = p.ckv[r * p.ckv_pitch + p.kv_lora + i];
  __syncthreads();
  rope_to(a, b, p.rope, pos);
  __syncthreads();
  const int64_t cache_row = (int64_t(p.slot[r]) * p.max_len + pos) * p.nh + h;
  const int64_t kd = cache_row * qk, vd = cache_row * p.vd;  // element offsets in the caches
  const float* src = p.kvb + (r * p.nh + h) * (p.nope + p.vd);
  for (int i = threadIdx.x; i < p.nope; i += blockDim.x) store_any(p.k_cache, p.kv_dtype, kd + i, src[i]);
  for (int i = threadIdx.x; i < p.rd; i += blockDim.x) store_any(p.k_cache, p.kv_dtype, kd + p.nope + i, b[i]);
  for (int i = threadIdx.x; i < p.vd; i += blockDim.x) store_any(p.v_cache, p.kv_dtype, vd + i, src[p.nope + i]);
}

// ---- attention -----------------------------------------------------------------------------------

// Block (tile, head), kAttnRows warps: warp w owns query row tile.row0 + w. Keys are staged in
// shared memory 32 at a time (shared by the tile's rows, which belong to one sequence):
// lane j scores key j (full dot product), the warp keeps an online softmax, and lane d
// accumulates output dims d, d + 32, ... over the 32 staged values.
__global__ void __launch_bounds__(kAttnRows * 32) attention_kernel(AttentionParams p) {
  extern __shared__ float sm[];
  const int dq = p.dq, dv = p.dv, kp = dq + 1;  // padded K rows: conflict-free column reads
  float* ks = sm;                   // [32, dq + 1]
  float* vs = ks + 32 * kp;         // [32, dv]
  float* qs = vs + 32 * dv;         // [kAttnRows, dq], then [kAttnRows, 32] probabilities
  const AttnTile tile = p.tiles[blockIdx.x];
  const int group = p.nh / p.nkv;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  // warp → (row, head): rows of the tile (one head per block), or heads of one kv head (one row)
  int h, kh;
  bool active;
  int64_t row;
  if (p.heads_per_block) {
    kh = blockIdx.y;
    active = warp < group;
    h = kh * group + (active ? warp : 0);
    row = tile.row0;
  } else {
    h = blockIdx.y;
    kh = h / group;
    active = warp < tile.nrows;
    row = tile.row0 + (active ? warp : 0);
  }
  const int64_t pos = p.pos[row];
  const int64_t slot = p.slot[tile.row0];
  const int64_t j0 = p.window > 0 ? max(int64_t(0), pos - p.window + 1) : 0;
  // the block's key range: the union of its rows' ranges
  const int64_t last = p.pos[tile.row0 + tile.nrows - 1];
  const int64_t first = p.window > 0 ? max(int64_t(0), int64_t(p.pos[tile.row0]) - p.window + 1) : 0;
  for (int i = lane; i < dq; i += 32) qs[warp * dq + i] = active ? p.q[(row * p.nh + h) * dq + i] : 0.0f;
  constexpr int kMaxPer = kAttnMaxDim / 32;
  float acc[kMaxPer];
#pragma unroll
  for (int i = 0; i < kMaxPer; ++i) acc[i] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  // element offsets of the kv head's key / value at position 0 of the slot, in caches of p.kv_dtype
  const int64_t kbase = (slot * p.max_len * p.nkv + kh) * int64_t(dq);
  const int64_t vbase = (slot * p.max_len * p.nkv + kh) * int64_t(dv);
  const int64_t kstride = int64_t(p.nkv) * dq, vstride = int64_t(p.nkv) * dv;
  for (int64_t t0 = first; t0 <= last; t0 += 32) {
    __syncthreads();
    const int n = int(min(int64_t(32), last + 1 - t0));
    for (int e = threadIdx.x; e < 32 * dq; e += blockDim.x) {
      const int j = e / dq, d = e % dq;
      ks[j * kp + d] = j < n ? load_any(p.k_cache, p.kv_dtype, kbase + (t0 + j) * kstride + d) : 0.0f;
    }
    for (int e = threadIdx.x; e < 32 * dv; e += blockDim.x) {
      const int j = e / dv, d = e % dv;
      vs[j * dv + d] = j < n ? load_any(p.v_cache, p.kv_dtype, vbase + (t0 + j) * vstride + d) : 0.0f;
    }
    __syncthreads();
    if (!active) continue;
    const int64_t key = t0 + lane;
    float s = -INFINITY;
    if (lane < n && key >= j0 && key <= pos) {
      const float* qv = qs + warp * dq;
      const float* kv = ks + lane * kp;
      float d4[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // four independent chains (instruction-level parallelism)
      int d = 0;
      for (; d + 4 <= dq; d += 4) {
#pragma unroll
        for (int u = 0; u < 4; ++u) d4[u] = fmaf(qv[d + u], kv[d + u], d4[u]);
      }
      for (; d < dq; ++d) d4[0] = fmaf(qv[d], kv[d], d4[0]);
      s = ((d4[0] + d4[1]) + (d4[2] + d4[3])) * p.scaling;
    }
    const float tmax = warp_max(s);
    if (tmax == -INFINITY) continue;  // every key of this tile is masked for this row
    const float mn = fmaxf(m, tmax);
    const float corr = expf(m - mn);  // m = -inf → 0
    const float pj = s == -INFINITY ? 0.0f : expf(s - mn);
    l = l * corr + warp_sum(pj);
    m = mn;
#pragma unroll
    for (int i = 0; i < kMaxPer; ++i) acc[i] *= corr;
    // the 32 probabilities through shared memory: independent broadcast loads instead of a chain of shuffles
    float* ps = qs + kAttnRows * dq + warp * 32;
    ps[lane] = pj;
    __syncwarp();
    for (int j = 0; j < n; ++j) {
      const float pv = ps[j];
#pragma unroll
      for (int i = 0; i < kMaxPer; ++i) {
        const int d = lane + 32 * i;
        if (d < dv) acc[i] = fmaf(pv, vs[j * dv + d], acc[i]);
      }
    }
    __syncwarp();  // ps is rewritten by the next tile
  }
  if (!active) return;
  if (p.sinks) {
    const float sink = p.sinks[h];
    const float mf = fmaxf(m, sink);
    const float corr = expf(m - mf);
    l = l * corr + expf(sink - mf);
#pragma unroll
    for (int i = 0; i < kMaxPer; ++i) acc[i] *= corr;
  }
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  float* o = p.out + (row * p.nh + h) * int64_t(dv);
#pragma unroll
  for (int i = 0; i < kMaxPer; ++i) {
    const int d = lane + 32 * i;
    if (d < dv) o[d] = acc[i] * inv;
  }
}

// One block per (head g, query i) row of S.
__global__ void softmax_rows_kernel(const float* S, int64_t n, float scaling, int window, const float* sinks, int head0,
                                    void* P, int pdt) {
  const int64_t row = blockIdx.x;  // g * n + i
  const int g = int(row / n);
  const int64_t i = row % n;
  const int64_t j0 = window > 0 ? max(int64_t(0), i - window + 1) : 0;
  const float* s = S + row * n;
  float m = -INFINITY;
  for (int64_t j = j0 + threadIdx.x; j <= i; j += blockDim.x) m = fmaxf(m, s[j] * scaling);
  // block max through the sum helper's shared memory: reduce -m as a max via warp shuffles
  __shared__ float part[32];
  __shared__ float bmax;
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = m;
  __syncthreads();
  if (threadIdx.x < 32) {
    float v = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : -INFINITY;
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (threadIdx.x == 0) bmax = v;
  }
  __syncthreads();
  m = bmax;
  const float sink = sinks ? sinks[head0 + g] : -INFINITY;
  if (sinks) m = fmaxf(m, sink);
  float l = 0.0f;
  for (int64_t j = j0 + threadIdx.x; j <= i; j += blockDim.x) l += expf(s[j] * scaling - m);
  l = block_sum(l);
  if (sinks) l += expf(sink - m);
  const float inv = 1.0f / l;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const float v = (j >= j0 && j <= i) ? expf(s[j] * scaling - m) * inv : 0.0f;
    store_any(P, pdt, row * n + j, v);
  }
}

// ---- routers -------------------------------------------------------------------------------------

// Order-preserving float → uint32 (NaN lowest, -0 == +0), then the "descending value, lower
// index first" key of routers.cpp.
__device__ __forceinline__ uint32_t ordered_bits(float v) {
  if (isnan(v)) return 0u;
  if (v == 0.0f) v = 0.0f;
  const uint32_t b = __float_as_uint(v);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ uint64_t sel_key(float v, int i) {
  return (uint64_t(ordered_bits(v)) << 32) | uint64_t(0xFFFFFFFFu - uint32_t(i));
}

// Top-k of v[0..n) into out[0..k), best first (selection by repeated maximum of the keys).
__device__ void top_k_dev(const float* v, int n, int k, int32_t* out) {
  for (int j = 0; j < k; ++j) {
    uint64_t best = 0;
    int bi = -1;
    for (int i = 0; i < n; ++i) {
      bool taken = false;
      for (int q = 0; q < j; ++q) taken = taken || out[q] == i;
      if (taken) continue;
      const uint64_t key = sel_key(v[i], i);
      if (bi < 0 || key > best) {
        best = key;
        bi = i;
      }
    }
    out[j] = bi;
  }
}

// In-place softmax over x[0..n), NaN entries left out (written as nan_out); +inf maxima share the mass.
__device__ void softmax_dev(float* x, int n, float nan_out) {
  float m = -INFINITY;
  bool any = false;
  for (int i = 0; i < n; ++i) {
    if (isnan(x[i])) continue;
    if (!any || x[i] > m) m = x[i];
    any = true;
  }
  if (isinf(m)) {
    int cnt = 0;
    for (int i = 0; i < n; ++i) cnt += (!isnan(x[i]) && x[i] == m) ? 1 : 0;
    const float share = 1.0f / float(cnt);
    for (int i = 0; i < n; ++i) x[i] = isnan(x[i]) ? nan_out : (x[i] == m ? share : 0.0f);
    return;
  }
  float z = 0.0f;
  for (int i = 0; i < n; ++i) {
    if (isnan(x[i])) continue;
    x[i] = expf(x[i] - m);
    z += x[i];
  }
  for (int i = 0; i < n; ++i) x[i] = isnan(x[i]) ? nan_out : x[i] / z;
}

// One thread per token; the scores live in per-thread local memory.
__global__ void router_kernel(RouterParams p) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= p.T) return;
  const float* l = p.logits + t * p.E;
  int32_t* idx = p.idx + t * p.K;
  float* w = p.w + t * p.K;
  const int E = p.E, K = p.K;
  float sc[kRouterMaxExperts];
  float c[kRouterMaxExperts];
  int32_t sel[kRouterMaxK];
  bool any_number = false;
  for (int e = 0; e < E && !any_number; ++e) any_number = !isnan(l[e]);
  if (!any_number) {
    for (int j = 0; j < K; ++j) {
      idx[j] = j;
      w[j] = NAN;
    }
    return;
  }
  if (p.kind == 0) {  // softmax families
    for (int e = 0; e < E; ++e) sc[e] = l[e];
    softmax_dev(sc, E, NAN);
    top_k_dev(sc, E, K, sel);
    float sum = 0.0f;
    for (int j = 0; j < K; ++j) {
      const float v = sc[sel[j]];
      w[j] = isnan(v) ? 0.0f : v;
      sum += w[j];
    }
    if (p.renorm)
      for (int j = 0; j < K; ++j) w[j] /= sum;
  } else if (p.kind == 1) {  // deepseek_v3
    const int G = p.n_group, gs = E / G;
    for (int e = 0; e < E; ++e) {
      sc[e] = 1.0f / (1.0f + expf(-l[e]));
      c[e] = p.correction_bias ? sc[e] + p.correction_bias[e] : sc[e];
    }
    // group scores (sum of the top 2 of c per group) as keys, then the best topk_group groups
    uint64_t gkeys[kRouterMaxExperts];
    for (int g = 0; g < G; ++g) {
      const float* cg = c + g * gs;
      int a = 0;
      for (int i = 1; i < gs; ++i)
        if (ordered_bits(cg[i]) > ordered_bits(cg[a])) a = i;
      float gscore = cg[a];
      if (gs >= 2) {
        int b = -1;
        for (int i = 0; i < gs; ++i) {
          if (i == a) continue;
          if (b < 0 || ordered_bits(cg[i]) > ordered_bits(cg[b])) b = i;
        }
        gscore = cg[a] + cg[b];
      }
      gkeys[g] = sel_key(gscore, g);
    }
    // keep[g] via repeated maximum: mark kept groups by clearing their key to 0 after taking them
    bool keep[kRouterMaxExperts];
    for (int g = 0; g < G; ++g) keep[g] = false;
    for (int j = 0; j < p.topk_group; ++j) {
      int bi = -1;
      for (int g = 0; g < G; ++g)
        if (!keep[g] && (bi < 0 || gkeys[g] > gkeys[bi])) bi = g;
      keep[bi] = true;
    }
    for (int e = 0; e < E; ++e)
      if (!keep[e / gs] && !isnan(c[e])) c[e] = 0.0f;
    top_k_dev(c, E, K, sel);
    float sum = 0.0f;
    for (int j = 0; j < K; ++j) {
      const float v = sc[sel[j]];
      w[j] = isnan(v) ? 0.0f : v;
      sum += w[j];
    }
    if (p.renorm) {
      const float den = sum + 1e-20f;
      for (int j = 0; j < K; ++j) w[j] /= den;
    }
    for (int j = 0; j < K; ++j) w[j] *= p.scaling;
  } else {  // gpt_oss: top-K of the logits, softmax over those K
    top_k_dev(l, E, K, sel);
    float tw[kRouterMaxK];
    for (int j = 0; j < K; ++j) tw[j] = l[sel[j]];
    softmax_dev(tw, K, 0.0f);
    for (int j = 0; j < K; ++j) w[j] = tw[j];
  }
  for (int j = 0; j < K; ++j) idx[j] = sel[j];
}

// The softmax families and GPT-OSS with a warp per token (the per-thread kernel above serves
// DeepSeek-V3's group-limited selection): lane l holds experts l, l + 32, ...; top-K by K rounds of
// a warp-wide maximum of the 64-bit selection keys (the key's high half gives the value back).
constexpr int kRouterPerLane = kRouterMaxExperts / 32;

__device__ __forceinline__ float from_ordered_bits(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k);
}
__device__ __forceinline__ uint64_t warp_max_u64(uint64_t v) {
  for (int o = 16; o > 0; o >>= 1) {
    const uint64_t other = __shfl_xor_sync(0xffffffffu, v, o);
    v = other > v ? other : v;
  }
  return v;
}

// Token t's routing by one warp (lane = its lane) from its logits l [E]: read through L2 (__ldcg)
// when L2 (the ticket kernel: other blocks just wrote them), plainly otherwise (shared memory in the
// cluster kernel). PER = experts per lane, E <= 32·PER (route_warp picks the smallest: qwen3's 128
// experts take 4 per lane, not kRouterPerLane's 16). Selected expert j and its value end in lane j
// (registers: no per-thread arrays in local memory on the decode step's path).
template <bool L2, int PER>
__device__ void route_warp_n(const RouterParams& p, int64_t t, int lane, const float* l) {
  int32_t* idx = p.idx + t * p.K;
  float* w = p.w + t * p.K;
  const int E = p.E, K = p.K;
  float v[PER];
  bool any = false;
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int e = lane + 32 * i;
    v[i] = e < E ? (L2 ? __ldcg(l + e) : l[e]) : NAN;
    any = any || (e < E && !isnan(v[i]));
  }
  if (!__any_sync(0xffffffffu, any)) {  // no distribution at all: experts 0..K-1, NaN weights
    for (int j = lane; j < K; j += 32) {
      idx[j] = j;
      w[j] = NAN;
    }
    return;
  }
  if (p.kind == 0) {  // p = softmax(l) over E (NaN logits left out and ranked last)
    float m = -INFINITY;
    bool has = false;
#pragma unroll
    for (int i = 0; i < PER; ++i)
      if (lane + 32 * i < E && !isnan(v[i])) {
        m = has ? fmaxf(m, v[i]) : v[i];
        has = true;
      }
    m = warp_max(has ? m : -INFINITY);
    if (isinf(m)) {  // infinite maximum: the entries equal to it share the mass
      float cnt = 0.0f;
#pragma unroll
      for (int i = 0; i < PER; ++i) cnt += (lane + 32 * i < E && !isnan(v[i]) && v[i] == m) ? 1.0f : 0.0f;
      cnt = warp_sum(cnt);
#pragma unroll
      for (int i = 0; i < PER; ++i)
        if (!isnan(v[i])) v[i] = v[i] == m ? 1.0f / cnt : 0.0f;
    } else {
      float z = 0.0f;
#pragma unroll
      for (int i = 0; i < PER; ++i)
        if (lane + 32 * i < E && !isnan(v[i])) {
          v[i] = expf(v[i] - m);
          z += v[i];
        }
      z = warp_sum(z);
#pragma unroll
      for (int i = 0; i < PER; ++i)
        if (!isnan(v[i])) v[i] = v[i] / z;
    }
  }
  // top-K of v (probabilities, or GPT-OSS's raw logits), best first, ties → lower expert: the keys
  // are computed once (0 = none: a real key is never 0), each lane keeps its best, and per round
  // only the lane whose expert was taken rescans its own keys. (A butterfly of sorted 8-key lists,
  // 5 shuffle levels in all instead of 5 per slot, gave the same routing and was no faster in the
  // 48-layer decode step: H200, 2026-12-05, docs/PERF.md thirty-eighth session; removed.)
  uint64_t key[PER];
  uint64_t mine = 0;
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int e = lane + 32 * i;
    key[i] = e < E ? sel_key(v[i], e) : 0;
    mine = key[i] > mine ? key[i] : mine;
  }
  int32_t my_e = 0;      // lane j < K: the j-th selected expert
  float my_val = 0.0f;   // and its value
  for (int j = 0; j < K; ++j) {
    const uint64_t best = warp_max_u64(mine);
    const int32_t e = int32_t(0xFFFFFFFFu - uint32_t(best & 0xFFFFFFFFu));
    if (best != 0 && best == mine) {  // this lane's expert: drop it, find the lane's next best
      mine = 0;
#pragma unroll
      for (int i = 0; i < PER; ++i) {
        if (key[i] == best) key[i] = 0;
        mine = key[i] > mine ? key[i] : mine;
      }
    }
    if (lane == j) {
      my_e = e;
      my_val = from_ordered_bits(uint32_t(best >> 32));
    }
  }
  if (p.kind == 0) {
    const float wj = isnan(my_val) ? 0.0f : my_val;  // a NaN logit weighs 0
    float sum = 0.0f;  // Σ_j w_j in slot order (every lane the same sum)
    for (int j = 0; j < K; ++j) sum += __shfl_sync(0xffffffffu, wj, j);
    if (lane < K) {
      idx[lane] = my_e;
      w[lane] = p.renorm ? wj / sum : wj;
    }
  } else {  // gpt_oss: softmax over the K selected logits (lane 0, softmax_dev's rules)
    float val[kRouterMaxK];
    for (int j = 0; j < K; ++j) val[j] = __shfl_sync(0xffffffffu, my_val, j);
    if (lane == 0) {
      softmax_dev(val, K, 0.0f);
      for (int j = 0; j < K; ++j) w[j] = val[j];
    }
    if (lane < K) idx[lane] = my_e;
  }
}

template <bool L2>
__device__ void route_warp(const RouterParams& p, int64_t t, int lane, const float* l) {
  if (p.E <= 128 && !p.wide) route_warp_n<L2, 4>(p, t, lane, l);
  else if (p.E <= 256 && !p.wide) route_warp_n<L2, 8>(p, t, lane, l);
  else route_warp_n<L2, kRouterPerLane>(p, t, lane, l);
}

__global__ void router_warp_kernel(RouterParams p) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x >> 5) + (threadIdx.x >> 5);
  if (t >= p.T) return;
  route_warp<true>(p, t, threadIdx.x & 31, p.logits + t * p.E);
}

// ---- misc ----------------------------------------------------------------------------------------

__global__ void gather_rows_kernel(const float* in, const int32_t* rows, int64_t n, int64_t H, float* out) {
  const int64_t d = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (d >= H) return;
  for (int64_t r = blockIdx.y; r < n; r += gridDim.y) out[r * H + d] = in[int64_t(rows[r]) * H + d];
}

// Argmax: a 64-bit key per entry, larger = better: the value's order bits (routers' ordered_bits)
// above the complemented index (ties → lower index); NaN entries get key 0 (below every number,
// -inf included). Each block reduces chunks of kArgmaxChunk entries (16 independent loads per
// thread in flight), then the last block of the row to finish reduces the blocks' keys.
constexpr int kArgmaxThreads = 256;
constexpr int kArgmaxPer = 16;
constexpr int64_t kArgmaxChunk = int64_t(kArgmaxThreads) * kArgmaxPer;
constexpr int kArgmaxMaxBlocks = 64;

__device__ __forceinline__ unsigned long long argmax_key(float v, int64_t i) {
  return isnan(v) ? 0ull : (static_cast<unsigned long long>(ordered_bits(v)) << 32) | (0xFFFFFFFFull - uint64_t(i));
}
__device__ unsigned long long block_max_u64(unsigned long long v) {
  __shared__ unsigned long long part[32];
  v = warp_max_u64(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) part[warp] = v;
  __syncthreads();
  v = lane < int(blockDim.x >> 5) ? part[lane] : 0ull;
  return warp_max_u64(v);  // every warp reduces the same partials: every thread gets the result
}

// scratch: [rows] u32 tickets (padded to 8 bytes), then [rows, gridDim.x] u64 keys.
__global__ void __launch_bounds__(kArgmaxThreads) argmax_kernel(const float* logits, int64_t V, int32_t* next,
                                                                 unsigned* tickets, unsigned long long* keys) {
  MOEX_CUDA_TRACE_BLOCK(k_argmax);
  pdl_wait();
  MOEX_CUDA_TRACE_WAITED();
  pdl_launch_dependents();
  const int64_t r = blockIdx.y;
  const float* row = logits + r * V;
  unsigned long long best = 0;
  for (int64_t c0 = blockIdx.x * kArgmaxChunk; c0 < V; c0 += int64_t(gridDim.x) * kArgmaxChunk) {
    float v[kArgmaxPer];
#pragma unroll
    for (int k = 0; k < kArgmaxPer; ++k) {
      const int64_t i = c0 + k * kArgmaxThreads + threadIdx.x;
      v[k] = i < V ? __ldcs(row + i) : NAN;
    }
#pragma unroll
    for (int k = 0; k < kArgmaxPer; ++k) {
      const unsigned long long key = argmax_key(v[k], c0 + k * kArgmaxThreads + threadIdx.x);
      best = key > best ? key : best;
    }
  }
  best = block_max_u64(best);
  __shared__ bool last;
  if (threadIdx.x == 0) {
    keys[r * gridDim.x + blockIdx.x] = best;
    __threadfence();
    last = atomicAdd(&tickets[r], 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  unsigned long long all = 0;
  for (int i = threadIdx.x; i < int(gridDim.x); i += blockDim.x) {
    const unsigned long long k = __ldcg(keys + r * gridDim.x + i);
    all = k > all ? k : all;
  }
  all = block_max_u64(all);
  if (threadIdx.x == 0) {
    // std::max_element: a NaN first entry is never replaced; all NaN → 0 as well
    next[r] = isnan(row[0]) || all == 0 ? 0 : int32_t(0xFFFFFFFFu - uint32_t(all & 0xFFFFFFFFull));
    tickets[r] = 0u;  // ready for the next launch (graph replays included)
  }
}

__device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

__global__ void fill_random_kernel(void* p, int dt, int64_t n, uint64_t seed, float scale, float value) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float v = value;
    if (scale != 0.0f) {
      const uint64_t h = mix64(seed * 0x100000001B3ull + uint64_t(i));
      v = (float(h >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f) * scale;
    }
    store_any(p, dt, i, v);
  }
}

unsigned grid_1d(int64_t n) { return unsigned(std::min<int64_t>(blocks_for(n, 256), 65535 * 16)); }
unsigned grid_x(int64_t n) { return unsigned(std::min<int64_t>(blocks_for(n, 256), 1024)); }

}  // namespace

void launch_embed(const int32_t* ids, const void* embed, int dt, int64_t T, int64_t H, float* x, cudaStream_t s) {
  if (T == 0) return;
  embed_kernel<<<dim3(blocks_for(H, 256), unsigned(std::min<int64_t>(T, 65535))), 256, 0, s>>>(ids, embed, dt, T, H, x);
  check_launch("embed_kernel");
}

void launch_rmsnorm(const RmsNormParams& p, cudaStream_t s) {
  if (p.T == 0) return;
  MOEX_ASSERT(p.T < (int64_t(1) << 31));
  // the row in registers: 4 values a thread up to 4096 (<= 1024 threads), 8 up to 8192
  auto threads = [&](int per) { return unsigned(std::max<int64_t>(32, (p.n + per - 1) / per + 31) / 32 * 32); };
  if (p.n <= 4 * 1024) {  // rmsnorm_reg_threads: the layout norm_row_into reproduces bit for bit
    launch_pdl("rmsnorm_kernel", rmsnorm_reg_kernel<4>, dim3(unsigned(p.T)), dim3(unsigned(rmsnorm_reg_threads(p.n))), 0, s, p);
  } else if (p.n <= 8 * 1024) {
    launch_pdl("rmsnorm_kernel", rmsnorm_reg_kernel<8>, dim3(unsigned(p.T)), dim3(threads(8)), 0, s, p);
  } else {
    launch_pdl("rmsnorm_kernel", rmsnorm_kernel, dim3(unsigned(p.T)), dim3(512), 0, s, p);
  }
}

void launch_split(const float* x, int64_t xp, int64_t T, int64_t n, void* split, int sdt, cudaStream_t s) {
  if (T == 0) return;
  if (n % 4 == 0 && xp % 4 == 0 && ::moex::cuda::aligned16(x) && vec4_ok(split, sdt)) {
    split4_kernel<<<grid_1d(T * n / 4), 256, 0, s>>>(x, xp, T, n, split, sdt);
    check_launch("split4_kernel");
    return;
  }
  split_kernel<<<dim3(grid_x(n), unsigned(T)), 256, 0, s>>>(x, xp, T, n, split, sdt);
  check_launch("split_kernel");
}

void launch_finish_linear(const float* g, bool two, const float* bias, const float* row_gate, int64_t T, int64_t n,
                          float* y, int64_t yp, bool acc, cudaStream_t s) {
  if (T == 0) return;
  if (n % 4 == 0 && yp % 4 == 0 && ::moex::cuda::aligned16(g) && ::moex::cuda::aligned16(y) &&
      (!bias || ::moex::cuda::aligned16(bias))) {
    finish_linear4_kernel<<<grid_1d(T * n / 4), 256, 0, s>>>(g, two, bias, row_gate, T, n, y, yp, acc);
    check_launch("finish_linear4_kernel");
    return;
  }
  finish_linear_kernel<<<dim3(grid_x(n), unsigned(T)), 256, 0, s>>>(g, two, bias, row_gate, T, n, y, yp, acc);
  check_launch("finish_linear_kernel");
}

bool gemv_ok(const void* w, int64_t in, const float* x, int64_t xp, int64_t T) {
  return T >= 1 && T <= kGemvMaxRows && in % 8 == 0 && xp % 4 == 0 && ::moex::cuda::aligned16(w) &&
         ::moex::cuda::aligned16(x);
}

void launch_gemv(const void* w, int wdt, int64_t out, int64_t in, const float* x, int64_t xp, int64_t T, const float* bias,
                 const float* gate, float* y, int64_t yp, bool acc, cudaStream_t s, const GemvFuse& fz) {
  if (T == 0 || out == 0) return;
  MOEX_ASSERT(!fz.norm_w || gemv_norm_ok(w, wdt, in, x, T, fz));
  MOEX_ASSERT(!fz.acc_add || acc);
  const RouterParams none{};
  if (wdt == 1)
    launch_gemv_t<__half, false>(static_cast<const __half*>(w), out, in, x, xp, T, bias, gate, y, yp, acc, none, nullptr, s,
                                 fz);
  else
    launch_gemv_t<__nv_bfloat16, false>(static_cast<const __nv_bfloat16*>(w), out, in, x, xp, T, bias, gate, y, yp, acc,
                                        none, nullptr, s, fz);
}

bool gemv_norm_ok(const void* w, int wdt, int64_t in, const float* x, int64_t T, const GemvFuse& fz) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return T == 1 && (wdt == 1 || wdt == 2) && fz.norm_w && fz.norm_add && fz.norm_add_dtype == wdt && in % 8 == 0 &&
         aligned(w) && aligned(x) && aligned(fz.norm_w) && aligned(fz.norm_add);
}

namespace {
bool router_cluster_on() {
  static const bool on = [] {
    const char* e = std::getenv("MOEX_CUDA_ROUTER_CLUSTER");
    return !(e && std::string(e) == "0");
  }();
  return on;
}
}  // namespace

bool router_fuses_norm_ok(int64_t T, const RmsNormParams& np) {
  return router_cluster_on() && ::moex::cuda::current_device_cc() >= 90 && T >= 1 && T <= kGemvMaxRows && np.T == T &&
         np.n <= 4096 && size_t(T) * size_t(np.n) * sizeof(float) <= kFusedNormSmem && np.x && np.w && !np.ids &&
         !np.rows && !np.add;
}

void launch_gemv_router(const void* w, int wdt, int64_t in, const float* x, int64_t xp, const float* bias,
                        const RouterParams& p, unsigned* ticket, cudaStream_t s, RouterKernel kernel,
                        const RmsNormParams* norm) {
  if (p.T == 0) return;
  MOEX_ASSERT(p.kind != 1 && p.T <= kGemvMaxRows && gemv_ok(w, in, x, xp, p.T) && ticket && p.E <= kRouterMaxExperts);
  const bool cluster_ok = ::moex::cuda::current_device_cc() >= 90;
  MOEX_CHECK(kernel != RouterKernel::cluster || cluster_ok, "router: the cluster kernel needs compute capability 9.0");
  MOEX_ASSERT(!norm || (kernel == RouterKernel::automatic && router_fuses_norm_ok(p.T, *norm) && norm->n == in));
  if (kernel == RouterKernel::cluster || (kernel == RouterKernel::automatic && router_cluster_on() && cluster_ok)) {
    if (wdt == 1) launch_router_cluster(static_cast<const __half*>(w), in, x, xp, bias, p, norm, s);
    else launch_router_cluster(static_cast<const __nv_bfloat16*>(w), in, x, xp, bias, p, norm, s);
    return;
  }
  float* y = const_cast<float*>(p.logits);
  if (wdt == 1)
    launch_gemv_t<__half, true>(static_cast<const __half*>(w), p.E, in, x, xp, p.T, bias, nullptr, y, p.E, false, p,
                                ticket, s);
  else
    launch_gemv_t<__nv_bfloat16, true>(static_cast<const __nv_bfloat16*>(w), p.E, in, x, xp, p.T, bias, nullptr, y, p.E,
                                       false, p, ticket, s);
}

void launch_to_dtype(const float* x, int64_t T, int64_t n, void* out, int dt, cudaStream_t s) {
  if (T * n == 0) return;
  if ((T * n) % 4 == 0 && ::moex::cuda::aligned16(x) && vec4_ok(out, dt)) {
    to_dtype4_kernel<<<grid_1d(T * n / 4), 256, 0, s>>>(x, T * n, out, dt);
    check_launch("to_dtype4_kernel");
    return;
  }
  to_dtype_kernel<<<grid_1d(T * n), 256, 0, s>>>(x, T * n, out, dt);
  check_launch("to_dtype_kernel");
}

void launch_add_from(const void* in, int dt, int64_t T, int64_t n, float* x, cudaStream_t s) {
  if (T * n == 0) return;
  if ((T * n) % 4 == 0 && ::moex::cuda::aligned16(x) && vec4_ok(in, dt)) {
    add_from4_kernel<<<grid_1d(T * n / 4), 256, 0, s>>>(in, dt, T * n, x);
    check_launch("add_from4_kernel");
    return;
  }
  add_from_kernel<<<grid_1d(T * n), 256, 0, s>>>(in, dt, T * n, x);
  check_launch("add_from_kernel");
}

void launch_gated_act(const float* gu, int64_t T, int64_t I, int act, float* h, cudaStream_t s) {
  if (T == 0) return;
  gated_act_kernel<<<dim3(grid_x(I), unsigned(T)), 256, 0, s>>>(gu, T, I, act, h);
  check_launch("gated_act_kernel");
}

void launch_qkv_post(const QkvPostParams& p, cudaStream_t s) {
  if (p.T == 0) return;
  MOEX_ASSERT(p.kv_dtype == 0 || p.kv_dtype == 2);
  const int slots = p.nh + 2 * p.nkv;
  const size_t smem = size_t(p.rope.dim / 2) * 2 * sizeof(double) + size_t(kQkvWarps) * p.hd * sizeof(float);
  launch_pdl("qkv_post_kernel", qkv_post_kernel, dim3(unsigned(p.T), unsigned((slots + kQkvWarps - 1) / kQkvWarps)),
             dim3(kQkvWarps * 32), smem, s, p);
}

void launch_mla_post(const MlaPostParams& p, cudaStream_t s) {
  if (p.T == 0) return;
  MOEX_ASSERT(p.kv_dtype == 0 || p.kv_dtype == 2);
  mla_post_kernel<<<dim3(unsigned(p.T), unsigned(p.nh)), 128, size_t(2 * p.rd) * sizeof(float), s>>>(p);
  check_launch("mla_post_kernel");
}

void launch_attention(const AttentionParams& p, cudaStream_t s) {
  if (p.num_tiles == 0) return;
  const size_t smem =
      (size_t(32) * (p.dq + 1) + size_t(32) * p.dv + size_t(kAttnRows) * p.dq + size_t(kAttnRows) * 32) * sizeof(float);
  static bool configured = false;  // once per process: the kernel's dynamic shared memory limit
  if (!configured) {
    check(cudaFuncSetAttribute(attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               int((size_t(32) * (kAttnMaxDim + 1) + size_t(32) * kAttnMaxDim +
                                    size_t(kAttnRows) * kAttnMaxDim + size_t(kAttnRows) * 32) *
                                   sizeof(float))),
          "cudaFuncSetAttribute(attention_kernel)");
    configured = true;
  }
  MOEX_ASSERT(!p.heads_per_block || p.nh / p.nkv <= kAttnRows);
  MOEX_ASSERT(p.kv_dtype == 0 || p.kv_dtype == 2);
  attention_kernel<<<dim3(unsigned(p.num_tiles), unsigned(p.heads_per_block ? p.nkv : p.nh)), kAttnRows * 32, smem, s>>>(p);
  check_launch("attention_kernel");
}

void launch_softmax_rows(const float* S, int64_t group, int64_t n, float scaling, int window, const float* sinks,
                         int head0, void* P, int pdt, cudaStream_t s) {
  if (group * n == 0) return;
  softmax_rows_kernel<<<unsigned(group * n), 256, 0, s>>>(S, n, scaling, window, sinks, head0, P, pdt);
  check_launch("softmax_rows_kernel");
}

void launch_router(const RouterParams& p, cudaStream_t s) {
  if (p.T == 0) return;
  if (p.kind == 1) {
    router_kernel<<<blocks_for(p.T, 64), 64, 0, s>>>(p);
    check_launch("router_kernel");
  } else {
    router_warp_kernel<<<blocks_for(p.T, 4), 128, 0, s>>>(p);
    check_launch("router_warp_kernel");
  }
}

void launch_gather_rows(const float* in, const int32_t* rows, int64_t n, int64_t H, float* out, cudaStream_t s) {
  if (n == 0) return;
  gather_rows_kernel<<<dim3(blocks_for(H, 256), unsigned(std::min<int64_t>(n, 65535))), 256, 0, s>>>(in, rows, n, H, out);
  check_launch("gather_rows_kernel");
}

size_t argmax_scratch_bytes(int64_t rows) {
  return size_t((rows + 1) / 2 * 2) * sizeof(unsigned) + size_t(rows * kArgmaxMaxBlocks) * sizeof(unsigned long long);
}

void launch_argmax(const float* logits, int64_t rows, int64_t V, int32_t* next, void* scratch, cudaStream_t s) {
  if (rows == 0) return;
  MOEX_ASSERT(scratch && rows <= 65535 && V < (int64_t(1) << 32));
  auto* tickets = static_cast<unsigned*>(scratch);
  auto* keys = reinterpret_cast<unsigned long long*>(tickets + (rows + 1) / 2 * 2);
  const unsigned blocks = unsigned(std::clamp<int64_t>((V + kArgmaxChunk - 1) / kArgmaxChunk, 1, kArgmaxMaxBlocks));
  launch_pdl("argmax_kernel", argmax_kernel, dim3(blocks, unsigned(rows)), dim3(kArgmaxThreads), 0, s, logits, V, next,
             tickets, keys);
}

void launch_fill_random(void* p, int dt, int64_t n, uint64_t seed, float scale, float value, cudaStream_t s) {
  if (n == 0) return;
  fill_random_kernel<<<grid_1d(n), 256, 0, s>>>(p, dt, n, seed, scale, value);
  check_launch("fill_random_kernel");
}

}  // namespace moex::model::cuda
