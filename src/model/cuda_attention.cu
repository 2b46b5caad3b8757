// model/cuda_attention.cu — see cuda_attention.cuh.
#include "model/cuda_attention.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/pdl.cuh"
#include "backends/cuda/mma_ptx.cuh"
#include "model/cuda_qkv_post.cuh"
#include "model/cuda_warp.cuh"

namespace moex::model::cuda {

namespace {

using ::moex::cuda::check;
using ::moex::cuda::check_launch;
namespace ptx = ::moex::cuda::ptx;


// ---- decode (flash-decoding) ------------------------------------------------------------------------

constexpr int kDecThreads = 256;
constexpr int kDecWarps = kDecThreads / 32;
constexpr int kDecKeys = 32;                        // keys per shared-memory tile
constexpr int kDecWarpKeys = kDecKeys / kDecWarps;  // keys a warp scores per tile (its rows of the tile)
static_assert(kDecodeHeads == kDecWarps, "one warp per query head in the softmax step");
static_assert(kDecWarpKeys * kDecodeHeads == 32, "a warp's scores of a tile are one value per lane");

// Shared memory of the decode kernel, in floats:
//   qs [8][dq] | ks [2][32][dq] | vs [2][32][dv] | ss [8][32] | corr [8] | ml [8][2] | linv [8] | wz [8][splits]
//   | post_fused: the RoPE table, cos [rope_half] and sin [rope_half] in f64
// After the key loop ks/vs hold the per-warp outputs [8 warps][heads][dv] of the cross-warp sum.
constexpr int kDecRopeHalfMax = 128;
size_t decode_smem_floats(int dq, int dv, int rope_half = 0) {
  return size_t(kDecodeHeads) * dq + size_t(2 * kDecKeys) * dq + size_t(2 * kDecKeys) * dv + size_t(kDecWarps) * kDecKeys + 8 + 16 + 8 +
         size_t(kDecodeHeads) * kDecodeMaxSplits + size_t(4) * rope_half;  // dq, dv multiples of 4: the table 8-byte aligned
}

// The float4 / float2 at this CTA's shared-memory address of `local` in CTA `cta` of the cluster
// (distributed shared memory). volatile: kept after the cluster barrier that makes them valid.
__device__ __forceinline__ float4 load_cluster_f4(const float* local, uint32_t cta) {
  uint32_t remote;
  float4 v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(ptx::smem_u32(local)), "r"(cta));
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(remote));
  return v;
}
__device__ __forceinline__ float2 load_cluster_f2(const float* local, uint32_t cta) {
  uint32_t remote;
  float2 v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(ptx::smem_u32(local)), "r"(cta));
  asm volatile("ld.shared::cluster.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(remote));
  return v;
}

// Sum of 32 values per lane over the warp, one result per lane: lane l gets the sum of everyone's
// v[l] (a butterfly that halves the values each step: 31 shuffles instead of 32 · 5).
template <int O>
__device__ __forceinline__ void reduce_scatter_step(float (&v)[32], int lane) {
  const bool up = (lane & O) != 0;
#pragma unroll
  for (int i = 0; i < O; ++i) {
    const float send = up ? v[i] : v[i + O];
    const float keep = up ? v[i + O] : v[i];
    v[i] = keep + __shfl_xor_sync(0xffffffffu, send, O);
  }
}
__device__ __forceinline__ float warp_reduce_scatter32(float (&v)[32], int lane) {
  reduce_scatter_step<16>(v, lane);
  reduce_scatter_step<8>(v, lane);
  reduce_scatter_step<4>(v, lane);
  reduce_scatter_step<2>(v, lane);
  reduce_scatter_step<1>(v, lane);
  return v[0];
}

// The lane's N float4 slices (dims 4·lane + 128·i) of a shared-memory row of `width` floats; zero
// past the width.
template <int N>
__device__ __forceinline__ void row_slices(const float* row, int width, int lane, float4 (&out)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const int d = 4 * lane + 128 * i;
    out[i] = d < width ? *reinterpret_cast<const float4*>(row + d) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
}
// The same of a row of bf16 (a bf16 KV cache's tile): 8 bytes per slice, widened exactly to f32.
template <int N>
__device__ __forceinline__ void row_slices(const __nv_bfloat16* row, int width, int lane, float4 (&out)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const int d = 4 * lane + 128 * i;
    if (d < width) {
      const uint2 raw = *reinterpret_cast<const uint2*>(row + d);
      const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
      const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
      out[i] = make_float4(lo.x, lo.y, hi.x, hi.y);
    } else {
      out[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  }
}

// Block (row, head block, key chunk z): head block = up to 8 query heads h0 .. h0 + hc - 1 of kv
// head kh. The row's keys j0 .. pos are cut into chunks of a multiple of 32 keys, at most `splits`
// of them; chunks past the row's length exit at once (no partial, no ticket). Per 32-key tile:
// (1) scores: warp w takes keys 4w .. 4w + 3 for all heads, lane = dims 4·lane + 128·i (K rows
// and each head's q read once per tile, contiguous: conflict-free), then one reduce-scatter gives lane (key, head);
// (2) online softmax: warp h updates (m, l) of head h and writes p; (3) P·V: warp w takes keys
// w, w+8, ... and lane the dims 4·lane + 128·i for every head (each V row read once).
// NQ / NV = dq / dv slices of 128 (1 or 2). One non-empty chunk normalises itself; otherwise the
// last of the non-empty chunks to finish (an atomic ticket) merges their partials.
// CLUSTER: p.cluster — rows of at most kDecodeClusterMax chunks merge through distributed shared
// memory instead (a separate instantiation: without it the kernel's code has no cluster barrier).
// KV: the cache's element type (float, or __nv_bfloat16 for p.kv_dtype 2). The shared-memory layout
// is the f32 one whatever KV is (a bf16 tile fills the first half of its buffer), so that the fused
// post-processing's scratch and the cross-warp sum keep their places.
template <class KV, int NQ, int NV, bool CLUSTER>
__global__ void __launch_bounds__(kDecThreads, 2) decode_attention_kernel(DecodeAttentionParams p) {
  MOEX_CUDA_TRACE_BLOCK(k_decode_attention);
  if (!p.early) {
    ::moex::cuda::pdl_wait();  // launched with PDL (pdl.cuh)
    MOEX_CUDA_TRACE_WAITED();
    ::moex::cuda::pdl_launch_dependents();
  }
  extern __shared__ __align__(16) float dsm[];
  const int dq = p.dq, dv = p.dv;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t row = blockIdx.x;
  const int group = p.nh / p.nkv, chunks = (group + kDecodeHeads - 1) / kDecodeHeads;
  const int kh = int(blockIdx.y) / chunks, c = int(blockIdx.y) % chunks;
  const int hc = min(kDecodeHeads, group - c * kDecodeHeads);
  const int h0 = kh * group + c * kDecodeHeads;
  const int z = blockIdx.z, splits = p.splits;

  // this block's keys [a, b): chunk z of j0 .. pos, chunks rounded up to whole tiles; nz non-empty
  const int64_t pos = p.pos[row], slot = p.slot[row];
  const int64_t j0 = p.window > 0 ? max(int64_t(0), pos - p.window + 1) : 0;
  const int64_t len = pos + 1 - j0;
  int64_t chunk = (len + splits - 1) / splits;
  chunk = (chunk + kDecKeys - 1) / kDecKeys * kDecKeys;
  const int nz = int((len + chunk - 1) / chunk);
  if (z >= nz) return;  // an empty chunk: the merge counts only the nz others
  const int64_t a = j0 + z * chunk, b = min(pos + 1, a + chunk);
  const int ntiles = int((b - a + kDecKeys - 1) / kDecKeys);

  float* qs = dsm;
  float* ks = qs + kDecodeHeads * dq;
  float* vs = ks + 2 * kDecKeys * dq;
  float* ss = vs + 2 * kDecKeys * dv;
  float* corr_s = ss + kDecWarps * kDecKeys;
  float* ml = corr_s + 8;
  float* linv = ml + 16;
  float* wz = linv + 8;

  const int64_t kstride = int64_t(p.nkv) * dq, vstride = int64_t(p.nkv) * dv;
  const KV* kbase = static_cast<const KV*>(p.k_cache) + (slot * p.max_len * p.nkv + kh) * int64_t(dq);
  const KV* vbase = static_cast<const KV*>(p.v_cache) + (slot * p.max_len * p.nkv + kh) * int64_t(dv);
  // the tiles as KV rows: buffer buf's row r of keys at ks_kv + (buf · kDecKeys + r) · dq (values: vs_kv, dv)
  KV* const ks_kv = reinterpret_cast<KV*>(ks);
  KV* const vs_kv = reinterpret_cast<KV*>(vs);
  constexpr int kVec = 16 / int(sizeof(KV));  // elements per 16-byte copy
  const int dq4 = dq / 4, dv4 = dv / 4, dqc = dq / kVec, dvc = dv / kVec;
  // K/V rows of tile i into buffer buf; rows past b are zero-filled (read nothing, masked below)
  auto issue = [&](int i, int buf) {
    const int64_t t0 = a + int64_t(i) * kDecKeys;
    for (int e = tid; e < kDecKeys * dqc; e += kDecThreads) {
      const int r = e / dqc, c = e % dqc;
      const int64_t key = min(t0 + r, b - 1);
      ptx::cp_async16(ptx::smem_u32(ks_kv + (buf * kDecKeys + r) * dq + kVec * c), kbase + key * kstride + kVec * c,
                      t0 + r < b);
    }
    for (int e = tid; e < kDecKeys * dvc; e += kDecThreads) {
      const int r = e / dvc, c = e % dvc;
      const int64_t key = min(t0 + r, b - 1);
      ptx::cp_async16(ptx::smem_u32(vs_kv + (buf * kDecKeys + r) * dv + kVec * c), vbase + key * vstride + kVec * c,
                      t0 + r < b);
    }
    ptx::cp_async_commit();
  };
  double* rope_cs = reinterpret_cast<double*>(wz + kDecodeHeads * kDecodeMaxSplits);  // post_fused: the RoPE table
  double* rope_sn = rope_cs + p.post.rope.dim / 2;
  // p.early: what does not depend on the previous kernel (the qkv GEMV, or qkv_post_kernel) before
  // waiting for it — the first tile of a chunk that ends before pos (those keys were written by
  // earlier steps, and every kernel two or more back has finished once this one runs, pdl.cuh) and
  // the RoPE table. pos and slot were written before the step's first kernel.
  const bool issued = p.early && z < nz - 1;
  // p.norm_w_early: the q (and, in the last chunk, k) norm weights into ss (free until the key loop;
  // 2·dq <= kDecWarps·kDecKeys floats), ordered before their use by the barrier after the RoPE table
  const bool norm_w_smem = p.norm_w_early && p.post_fused && p.post.norm_mode == 1 && 2 * dq <= kDecWarps * kDecKeys;
  if (norm_w_smem) {
    for (int i = tid; i < dq; i += kDecThreads) {
      ss[i] = __ldg(p.post.q_norm + i);
      if (z == nz - 1) ss[dq + i] = __ldg(p.post.k_norm + i);
    }
  }
  if (p.early) {
    if (issued) issue(0, 0);
    if (p.post_fused) rope_table(p.post.rope, pos, rope_cs, rope_sn);
    ::moex::cuda::pdl_wait();
    MOEX_CUDA_TRACE_WAITED();
    // released right away: after the key loop (the o GEMV's weight requests then no longer queue
    // ahead of this kernel's loads) measured 0.03 ms per step slower, at exit 0.17 (H200, 2026-12-04);
    // again with the KV cache in L2 (thirty-fifth session): once q is ready +0.03, after the key loop
    // +0.02 ms per step
    ::moex::cuda::pdl_launch_dependents();
  }
  if (p.post_fused) {
    // the step's q of the block's heads (into qs) and, in the block of the row's last chunk, its kv
    // head's k and v (into the cache, at pos): qkv_post_kernel's arithmetic, warp per head, the warp's
    // scratch in K buffer 0, free until the first tile is issued below — or, early, in buffer 1 (free
    // until the loop issues tile 1; buffer 0 may be loading already)
    if (!p.early) rope_table(p.post.rope, pos, rope_cs, rope_sn);
    __syncthreads();
    float* scratch = ks + (p.early ? kDecKeys * dq : 0);
    const int jobs = hc + (z == nz - 1 ? 2 : 0);  // chunks == 1 here (decode_attention_fuses_post): c == 0
    auto slot_of = [&](int j) { return j < hc ? h0 + j : j == hc ? p.nh + kh : p.nh + p.nkv + kh; };
    auto norm_w_of = [&](int j) -> const float* { return !norm_w_smem || j > hc ? nullptr : j < hc ? ss : ss + dq; };
    float* wscratch = scratch + warp * dq;
    if (p.post.loads_first && dq <= kPostMaxDims && jobs <= 2 * kDecWarps) {
      // at most two slots per warp (8 q heads + k + v on 8 warps): both slots' loads issued before
      // either is finished, so that the second costs no second L2 round trip
      const int j1 = warp, j2 = warp + kDecWarps;
      QkvPostRegs g1, g2;
      if (j1 < jobs) qkv_post_load(p.post, row, slot_of(j1), norm_w_of(j1), g1);
      if (j2 < jobs) qkv_post_load(p.post, row, slot_of(j2), norm_w_of(j2), g2);
      if (j1 < jobs)
        qkv_post_finish(p.post, row, slot_of(j1), wscratch, rope_cs, rope_sn, 1.0f, 1.0f, j1 < hc ? qs + j1 * dq : nullptr, g1);
      __syncwarp();  // the scratch is rewritten by the warp's second slot
      if (j2 < jobs)
        qkv_post_finish(p.post, row, slot_of(j2), wscratch, rope_cs, rope_sn, 1.0f, 1.0f, j2 < hc ? qs + j2 * dq : nullptr, g2);
    } else {
      for (int j = warp; j < jobs; j += kDecWarps) {
        qkv_post_slot(p.post, row, slot_of(j), wscratch, rope_cs, rope_sn, 1.0f, 1.0f, j < hc ? qs + j * dq : nullptr,
                      norm_w_of(j));
        __syncwarp();  // the scratch is rewritten by the warp's next head
      }
    }
    for (int e = tid; e < (kDecodeHeads - hc) * dq; e += kDecThreads) qs[hc * dq + e] = 0.0f;
    __syncthreads();  // q complete; the key at pos is in the cache before this block's copies read it
    if (!issued) issue(0, 0);
  } else {
    if (!issued) issue(0, 0);
    // q of the block's heads into qs (rows of heads >= hc zero: their scores are computed and unused)
    for (int e = tid; e < kDecodeHeads * dq4; e += kDecThreads) {
      const int h = e / dq4, q4 = e % dq4;
      *reinterpret_cast<float4*>(qs + h * dq + 4 * q4) =
          h < hc ? __ldg(reinterpret_cast<const float4*>(p.q + (row * p.nh + h0 + h) * dq + 4 * q4))
                 : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  }

  MOEX_CUDA_TRACE_MARK(0);        // q ready
  float m = -INFINITY, l = 0.0f;  // warp h's running max / sum of head h (lane-uniform)
  float acc[kDecodeHeads][NV][4];
#pragma unroll
  for (int h = 0; h < kDecodeHeads; ++h)
#pragma unroll
    for (int i = 0; i < NV; ++i)
#pragma unroll
      for (int u = 0; u < 4; ++u) acc[h][i][u] = 0.0f;

  for (int it = 0; it < ntiles; ++it) {
    const int buf = it & 1;
    if (it + 1 < ntiles) {
      issue(it + 1, buf ^ 1);
      ptx::cp_async_wait<1>();
    } else {
      ptx::cp_async_wait<0>();
    }
    __syncthreads();
    const int64_t t0 = a + int64_t(it) * kDecKeys;
    const KV* kt = ks_kv + buf * kDecKeys * dq;
    const KV* vt = vs_kv + buf * kDecKeys * dv;
    {  // (1) scores of keys 4·warp + kk for every head: per-lane partial dots, then reduce-scatter
      float4 kv[kDecWarpKeys][NQ];
#pragma unroll
      for (int kk = 0; kk < kDecWarpKeys; ++kk) row_slices<NQ>(kt + (warp * kDecWarpKeys + kk) * dq, dq, lane, kv[kk]);
      float part[32];  // [kk][h]
#pragma unroll
      for (int h = 0; h < kDecodeHeads; ++h) {
        float4 q[NQ];
        row_slices<NQ>(qs + h * dq, dq, lane, q);
#pragma unroll
        for (int kk = 0; kk < kDecWarpKeys; ++kk) {
          float s = 0.0f;
#pragma unroll
          for (int i = 0; i < NQ; ++i) {
            s = fmaf(q[i].x, kv[kk][i].x, s);
            s = fmaf(q[i].y, kv[kk][i].y, s);
            s = fmaf(q[i].z, kv[kk][i].z, s);
            s = fmaf(q[i].w, kv[kk][i].w, s);
          }
          part[kk * kDecodeHeads + h] = s;
        }
      }
      const float s = warp_reduce_scatter32(part, lane);  // lane = kk · 8 + h
      ss[(lane % kDecodeHeads) * kDecKeys + warp * kDecWarpKeys + lane / kDecodeHeads] = s;
    }
    __syncthreads();
    if (warp < hc) {  // (2) online softmax of head `warp` (in place: row `warp` is only touched here)
      float s = ss[warp * kDecKeys + lane];
      const bool valid = t0 + lane < b;
      s = valid ? s * p.scaling : -INFINITY;
      const float mn = fmaxf(m, warp_max(s));  // finite: key t0 < b is valid
      const float corr = expf(m - mn);         // m = -inf → 0
      const float pj = valid ? expf(s - mn) : 0.0f;
      l = l * corr + warp_sum(pj);
      m = mn;
      ss[warp * kDecKeys + lane] = pj;
      if (lane == 0) corr_s[warp] = corr;
    }
    __syncthreads();
    // (3) acc[h] = corr[h] · acc[h] + Σ_j p[h][j] · v[j] over this warp's keys
#pragma unroll
    for (int h = 0; h < kDecodeHeads; ++h) {
      if (h < hc) {
        const float cr = corr_s[h];
#pragma unroll
        for (int i = 0; i < NV; ++i)
#pragma unroll
          for (int u = 0; u < 4; ++u) acc[h][i][u] *= cr;
      }
    }
    const int jend = int(min(int64_t(kDecKeys), b - t0));  // zero-filled rows past b add nothing
    for (int j = warp; j < jend; j += kDecWarps) {
      float4 v[NV];
      row_slices<NV>(vt + j * dv, dv, lane, v);
#pragma unroll
      for (int h = 0; h < kDecodeHeads; ++h) {
        if (h < hc) {
          const float pj = ss[h * kDecKeys + j];
#pragma unroll
          for (int i = 0; i < NV; ++i) {
            acc[h][i][0] = fmaf(pj, v[i].x, acc[h][i][0]);
            acc[h][i][1] = fmaf(pj, v[i].y, acc[h][i][1]);
            acc[h][i][2] = fmaf(pj, v[i].z, acc[h][i][2]);
            acc[h][i][3] = fmaf(pj, v[i].w, acc[h][i][3]);
          }
        }
      }
    }
    __syncthreads();  // buffers and ss are rewritten by the next tile
  }
  MOEX_CUDA_TRACE_MARK(1);  // key loop done
  if (warp < hc && lane == 0) {
    ml[2 * warp] = m;
    ml[2 * warp + 1] = l;
  }
  // cross-warp sum of acc through shared memory (ks/vs are free: the loop ended on a barrier)
  float* red = ks;  // [8 warps][hc][dv] (64 · dv floats <= ks + vs)
#pragma unroll
  for (int h = 0; h < kDecodeHeads; ++h) {
    if (h < hc) {
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        const int d = 4 * lane + 128 * i;
        if (d < dv)
          *reinterpret_cast<float4*>(red + (warp * hc + h) * dv + d) =
              make_float4(acc[h][i][0], acc[h][i][1], acc[h][i][2], acc[h][i][3]);
      }
    }
  }
  __syncthreads();
  // this block's output of head h, dims 4·d4 .. 4·d4 + 3: the sum of the 8 warps' parts
  auto block_out = [&](int h, int d4) {
    float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int w = 0; w < kDecWarps; ++w) {
      const float4 x = *reinterpret_cast<const float4*>(red + (w * hc + h) * dv + 4 * d4);
      o = make_float4(o.x + x.x, o.y + x.y, o.z + x.z, o.w + x.w);
    }
    return o;
  };
  auto store_out = [&](int h, int d4, float4 o, float s) {
    *reinterpret_cast<float4*>(p.out + (row * p.nh + h0 + h) * dv + 4 * d4) = make_float4(o.x * s, o.y * s, o.z * s, o.w * s);
  };
  if (nz == 1) {
    // the only chunk: normalise here (sink included), as attention_kernel does
    if (tid < hc) {
      const float mh = ml[2 * tid], lh = ml[2 * tid + 1];
      float scale = 1.0f, L = lh;
      if (p.sinks) {
        const float sink = p.sinks[h0 + tid], mf = fmaxf(mh, sink), cr = expf(mh - mf);
        L = lh * cr + expf(sink - mf);
        scale = cr;
      }
      linv[tid] = L > 0.0f ? scale / L : 0.0f;
    }
    __syncthreads();
    for (int e = tid; e < hc * dv4; e += kDecThreads) store_out(e / dv4, e % dv4, block_out(e / dv4, e % dv4), linv[e / dv4]);
    return;
  }
  // The merge of the nz chunks' partials, shared by the cluster and the ticket path (the same
  // arithmetic in the same order, so the same bits): merge weights wz[h][k] = exp(m_k - M) and 1 / L
  // per head (warp h, lane k; load_ml(ml_of(h), k) = chunk k's (m, l)), then output elements e0,
  // e0 + step, ...: sum_k wz[h][k] · load_part(part_of(h, d4), k), normalised.
  constexpr int kMlPerLane = kDecodeMaxSplits / 32;
  constexpr int kMergeLoads = 8;  // partial loads in flight per thread
  auto merge = [&](auto ml_of, auto load_ml, auto part_of, auto load_part, int e0, int step) {
    if (warp < hc) {
      const float* mlh = ml_of(warp);
      float2 mlk[kMlPerLane];
      float M = -INFINITY;
#pragma unroll
      for (int i = 0; i < kMlPerLane; ++i) {
        const int k = lane + 32 * i;
        mlk[i] = k < nz ? load_ml(mlh, k) : make_float2(-INFINITY, 0.0f);
        M = fmaxf(M, mlk[i].x);
      }
      M = warp_max(M);
      const float sink = p.sinks ? p.sinks[h0 + warp] : -INFINITY;
      const float mf = fmaxf(M, sink);
      float L = 0.0f;
#pragma unroll
      for (int i = 0; i < kMlPerLane; ++i) {
        const int k = lane + 32 * i;
        const float w = mlk[i].x == -INFINITY ? 0.0f : expf(mlk[i].x - mf);
        if (k < nz) wz[warp * kDecodeMaxSplits + k] = w;
        L = fmaf(mlk[i].y, w, L);
      }
      L = warp_sum(L);
      if (p.sinks) L += expf(sink - mf);
      if (lane == 0) linv[warp] = L > 0.0f ? 1.0f / L : 0.0f;
    }
    __syncthreads();
    MOEX_CUDA_TRACE_MARK(3);  // merge weights computed
    for (int e = e0; e < hc * dv4; e += step) {
      const int h = e / dv4, d4 = e % dv4;
      const float* src = part_of(h, d4);
      const float* wh = wz + h * kDecodeMaxSplits;
      float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      for (int k0 = 0; k0 < nz; k0 += kMergeLoads) {
        float4 x[kMergeLoads];
#pragma unroll
        for (int u = 0; u < kMergeLoads; ++u) x[u] = k0 + u < nz ? load_part(src, k0 + u) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int u = 0; u < kMergeLoads; ++u) {
          const float w = k0 + u < nz ? wh[k0 + u] : 0.0f;
          o = make_float4(fmaf(w, x[u].x, o.x), fmaf(w, x[u].y, o.y), fmaf(w, x[u].z, o.z), fmaf(w, x[u].w, o.w));
        }
      }
      store_out(h, d4, o, linv[h]);
    }
  };
  if constexpr (CLUSTER) if (nz <= kDecodeClusterMax) {
    // a row of at most kDecodeClusterMax chunks: they all lie in the row's first cluster (dims (1, 1,
    // min(splits, kDecodeClusterMax)); chunk z is CTA rank z). Its partial goes into qs ([hc][dv]; q
    // is no longer read, dv <= dq), its (m, l) is already in ml; after the barrier every CTA merges
    // ~1/nz of the output elements from all chunks' shared memory, and no CTA leaves before the
    // second barrier, while others may still read it. Empty chunks left at the top (nothing of theirs
    // is read; exited threads do not hold a cluster barrier). nz is the row's, so every CTA of a
    // cluster takes the same path; rows of more chunks take the ticket path below.
    float* po = qs;
    for (int e = tid; e < hc * dv4; e += kDecThreads) {
      const int h = e / dv4, d4 = e % dv4;
      *reinterpret_cast<float4*>(po + h * dv + 4 * d4) = block_out(h, d4);
    }
    ::moex::cuda::cluster_sync();  // release / acquire: every chunk's po and ml are visible
    MOEX_CUDA_TRACE_MARK(2);       // every chunk's partial visible
    merge([&](int h) { return ml + 2 * h; }, [](const float* a, int k) { return load_cluster_f2(a, uint32_t(k)); },
          [&](int h, int d4) { return po + h * dv + 4 * d4; },
          [](const float* a, int k) { return load_cluster_f4(a, uint32_t(k)); }, tid * nz + z, kDecThreads * nz);
    ::moex::cuda::cluster_sync();
    return;
  }
  // several chunks: this block's partial, then the last non-empty chunk of (row, head block) merges
  float* part_acc = p.partial;                                    // [T, nh, splits, dv]
  float* part_ml = p.partial + size_t(p.T) * p.nh * splits * dv;  // [T, nh, splits, 2]
  if (tid < hc) {
    const size_t q = (size_t(row) * p.nh + h0 + tid) * splits + z;
    *reinterpret_cast<float2*>(part_ml + 2 * q) = make_float2(ml[2 * tid], ml[2 * tid + 1]);
  }
  for (int e = tid; e < hc * dv4; e += kDecThreads) {
    const int h = e / dv4, d4 = e % dv4;
    *reinterpret_cast<float4*>(part_acc + ((size_t(row) * p.nh + h0 + h) * splits + z) * dv + 4 * d4) = block_out(h, d4);
  }
  __threadfence();  // the partial is visible device-wide before the ticket is taken
  __syncthreads();
  __shared__ int is_last;
  if (tid == 0) {
    int32_t* ctr = p.counters + row * gridDim.y + blockIdx.y;
    const int ticket = atomicAdd(ctr, 1);
    is_last = ticket == nz - 1;
    if (is_last) *ctr = 0;  // every non-empty chunk has taken its ticket: ready for the next launch
  }
  __syncthreads();
  MOEX_CUDA_TRACE_MARK(2);  // partial published, ticket taken
  if (!is_last) return;
  __threadfence();
  // merge, (m, l) read in one pass
  merge([&](int h) { return part_ml + 2 * ((size_t(row) * p.nh + h0 + h) * splits); },
        [](const float* a, int k) { return __ldcg(reinterpret_cast<const float2*>(a + 2 * k)); },
        [&](int h, int d4) { return part_acc + (size_t(row) * p.nh + h0 + h) * splits * dv + 4 * d4; },
        [&](const float* a, int k) { return __ldcg(reinterpret_cast<const float4*>(a + size_t(k) * dv)); }, tid, kDecThreads);
}

// ---- prefill (flash attention on the tensor cores) ---------------------------------------------------

constexpr int kFlashRows = 64;  // query rows per head of a block (16 per warp)
constexpr int kFlashKeys = 64;  // keys per shared-memory tile
constexpr float kLog2e = 1.4426950408889634f;

// Element offset of (row, 16-byte chunk) in a [rows][D] tile with the XOR swizzle of the 8 chunks
// of a row group: ldmatrix's 8 row addresses fall in 8 different bank groups.
// Rows of fewer than 8 chunks (D < 64) are not swizzled (2-way conflicts at most, small heads).
template <int D>
__device__ __forceinline__ int swz(int row, int chunk) {
  if constexpr (D >= 64) return row * D + ((chunk ^ (row & 7)) << 3);
  else return row * D + (chunk << 3);
}

template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (low half) = lo
  return *reinterpret_cast<uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// Block (query block qb of 64 rows, HB query heads h0 .. h0 + HB - 1 of one kv head); 4 warps per
// head, warp = 16 query rows. Q [16, D] of a warp stays in registers (A fragments); per key tile of
// 64: S = Q·Kᵀ (16 × 64, f32), causal/window mask, online softmax in the log2 domain, P rounded to T
// and reused as A fragments, O += P·V (16 × D, f32). K/V tiles are double-buffered by cp.async and
// shared by the HB heads. Query blocks run longest-first (the causal work is uneven).
template <class T, int D, int HB>
__global__ void __launch_bounds__(128 * HB) flash_prefill_kernel(FlashPrefillParams p) {
  extern __shared__ __align__(128) unsigned char fsm[];
  T* qs = reinterpret_cast<T*>(fsm);  // [HB][64][D]
  T* ks = qs + HB * kFlashRows * D;   // [2][64][D]
  T* vs = ks + 2 * kFlashKeys * D;    // [2][64][D]
  constexpr int kThreads = 128 * HB, kChunks = D / 8;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int qb = int(gridDim.x) - 1 - int(blockIdx.x);
  const int64_t m0 = int64_t(qb) * kFlashRows, n = p.n;
  const int h0 = int(blockIdx.y) * HB;
  const int kh = h0 / (p.nh / p.nkv);
  const int64_t last_key = min(n - 1, m0 + kFlashRows - 1);
  const int64_t first_key = p.window > 0 ? max(int64_t(0), m0 - p.window + 1) : 0;
  const int t_first = int(first_key / kFlashKeys), t_last = int(last_key / kFlashKeys);
  const int64_t kv_pitch = int64_t(p.nkv) * D;
  const T* kg = static_cast<const T*>(p.k) + kh * D;
  const T* vg = static_cast<const T*>(p.v) + kh * D;

  auto issue = [&](int t, int buf) {
    for (int e = tid; e < kFlashKeys * kChunks; e += kThreads) {
      const int r = e / kChunks, c = e % kChunks;
      const int64_t key = min(int64_t(t) * kFlashKeys + r, n - 1);  // rows past the end: finite copies, masked
      ptx::cp_async16(ptx::smem_u32(ks + buf * kFlashKeys * D + swz<D>(r, c)), kg + key * kv_pitch + c * 8, true);
      ptx::cp_async16(ptx::smem_u32(vs + buf * kFlashKeys * D + swz<D>(r, c)), vg + key * kv_pitch + c * 8, true);
    }
    ptx::cp_async_commit();
  };
  issue(t_first, 0);
  // Q rows (f32) rounded to T into shared memory; rows past the end are zero
  for (int e = tid; e < HB * kFlashRows * (D / 4); e += kThreads) {
    const int hh = e / (kFlashRows * (D / 4)), rem = e % (kFlashRows * (D / 4));
    const int r = rem / (D / 4), c4 = rem % (D / 4);
    const int64_t i = m0 + r;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (i < n) v = *reinterpret_cast<const float4*>(p.q + ((p.row0 + i) * p.nh + h0 + hh) * D + 4 * c4);
    uint2 packed;
    packed.x = pack2<T>(v.x, v.y);
    packed.y = pack2<T>(v.z, v.w);
    *reinterpret_cast<uint2*>(qs + hh * kFlashRows * D + swz<D>(r, c4 >> 1) + (c4 & 1) * 4) = packed;
  }

  const int hh = warp / 4, wr = (warp % 4) * 16;  // the warp's head (of the block) and first row
  const int h = h0 + hh;
  const int g = lane >> 2, tg = lane & 3;  // fragment row group and column pair
  const int64_t i_lo = m0 + wr + g, i_hi = i_lo + 8;  // the thread's two query rows
  const float sl2 = p.scaling * kLog2e;
  float o[D / 8][4];
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[dt][e] = 0.0f;
  float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.0f, 0.0f};  // per-thread partial sums (reduced at the end)
  uint32_t qf[D / 16][4];

  for (int t = t_first; t <= t_last; ++t) {
    const int buf = (t - t_first) & 1;
    if (t < t_last) {
      issue(t + 1, buf ^ 1);
      ptx::cp_async_wait<1>();
    } else {
      ptx::cp_async_wait<0>();
    }
    __syncthreads();
    if (t == t_first) {
      const T* qw = qs + hh * kFlashRows * D;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)
        ptx::ldmatrix_x4(ptx::smem_u32(qw + swz<D>(wr + (lane & 15), kk * 2 + (lane >> 4))), qf[kk][0], qf[kk][1],
                         qf[kk][2], qf[kk][3]);
    }
    const T* kt = ks + buf * kFlashKeys * D;
    const T* vt = vs + buf * kFlashKeys * D;
    // S = Q · Kᵀ: s[nt] is the 16 × 8 block of keys nt·8 .. nt·8 + 7
    float s[kFlashKeys / 8][4];
#pragma unroll
    for (int nt = 0; nt < kFlashKeys / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
      for (int np = 0; np < kFlashKeys / 16; ++np) {
        uint32_t b0[2], b1[2];
        ptx::ldmatrix_x4(ptx::smem_u32(kt + swz<D>(np * 16 + (lane & 7) + ((lane >> 4) << 3), kk * 2 + ((lane >> 3) & 1))),
                         b0[0], b0[1], b1[0], b1[1]);
        ptx::mma16816<T>(s[2 * np], qf[kk], b0);
        ptx::mma16816<T>(s[2 * np + 1], qf[kk], b1);
      }
    }
    // scale into the log2 domain and mask (only tiles crossing the diagonal or the window edge)
    const int64_t kbase = int64_t(t) * kFlashKeys;
    const bool need_mask = kbase + kFlashKeys - 1 > m0 ||
                           (p.window > 0 && kbase < m0 + kFlashRows - 1 - p.window + 1);
#pragma unroll
    for (int nt = 0; nt < kFlashKeys / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[nt][e] * sl2;
        if (need_mask) {
          const int64_t j = kbase + nt * 8 + 2 * tg + (e & 1), i = e < 2 ? i_lo : i_hi;
          if (j > i || (p.window > 0 && j <= i - p.window)) x = -INFINITY;
        }
        s[nt][e] = x;
      }
    // online softmax per row (the 4 lanes of a row group share it)
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < kFlashKeys / 8; ++nt) {
      mx[0] = fmaxf(mx[0], fmaxf(s[nt][0], s[nt][1]));
      mx[1] = fmaxf(mx[1], fmaxf(s[nt][2], s[nt][3]));
    }
    float mu[2], corr[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float mn = fmaxf(mrow[r], mx[r]);
      mu[r] = mn == -INFINITY ? 0.0f : mn;  // a row with every key masked so far: p = 0, no NaN
      corr[r] = exp2f(mrow[r] - mu[r]);
      mrow[r] = mn;
    }
    float ls[2] = {0.0f, 0.0f};
#pragma unroll
    for (int nt = 0; nt < kFlashKeys / 8; ++nt) {
      s[nt][0] = exp2f(s[nt][0] - mu[0]);
      s[nt][1] = exp2f(s[nt][1] - mu[0]);
      s[nt][2] = exp2f(s[nt][2] - mu[1]);
      s[nt][3] = exp2f(s[nt][3] - mu[1]);
      ls[0] += s[nt][0] + s[nt][1];
      ls[1] += s[nt][2] + s[nt][3];
    }
    lrow[0] = lrow[0] * corr[0] + ls[0];
    lrow[1] = lrow[1] * corr[1] + ls[1];
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      o[dt][0] *= corr[0];
      o[dt][1] *= corr[0];
      o[dt][2] *= corr[1];
      o[dt][3] *= corr[1];
    }
    // O += P · V: the S accumulators of keys kk·16 .. kk·16 + 15 are the A fragment of step kk
#pragma unroll
    for (int kk = 0; kk < kFlashKeys / 16; ++kk) {
      const uint32_t a[4] = {pack2<T>(s[2 * kk][0], s[2 * kk][1]), pack2<T>(s[2 * kk][2], s[2 * kk][3]),
                             pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]), pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t b0[2], b1[2];
        ptx::ldmatrix_x4_trans(
            ptx::smem_u32(vt + swz<D>(kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3), dp * 2 + (lane >> 4))), b0[0],
            b0[1], b1[0], b1[1]);
        ptx::mma16816<T>(o[2 * dp], a, b0);
        ptx::mma16816<T>(o[2 * dp + 1], a, b1);
      }
    }
    __syncthreads();  // the buffer is refilled by the next tile's prefetch
  }

  // sums over the row group, the sink, 1 / l; rows past the end are not written
  float scale[2];
  const float sink = p.sinks ? p.sinks[h] * kLog2e : -INFINITY;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float l = lrow[r];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    float cr = 1.0f;
    if (p.sinks) {
      const float mf = fmaxf(mrow[r], sink);
      cr = exp2f(mrow[r] - mf);
      l = l * cr + exp2f(sink - mf);
    }
    scale[r] = l > 0.0f ? cr / l : 0.0f;
  }
  const int64_t pitch = int64_t(p.nh) * D;
  float* out_lo = p.out + (p.row0 + i_lo) * pitch + h * D + 2 * tg;
  float* out_hi = p.out + (p.row0 + i_hi) * pitch + h * D + 2 * tg;
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt) {
    if (i_lo < n) *reinterpret_cast<float2*>(out_lo + dt * 8) = make_float2(o[dt][0] * scale[0], o[dt][1] * scale[0]);
    if (i_hi < n) *reinterpret_cast<float2*>(out_hi + dt * 8) = make_float2(o[dt][2] * scale[1], o[dt][3] * scale[1]);
  }
}

template <class T, int D, int HB>
void launch_flash_typed(const FlashPrefillParams& p, cudaStream_t s) {
  const size_t smem = size_t(HB * kFlashRows + 4 * kFlashKeys) * D * sizeof(T);
  static bool configured = false;  // once per process and instantiation: over 48 KB of dynamic shared memory
  if (!configured) {
    check(cudaFuncSetAttribute(flash_prefill_kernel<T, D, HB>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
          "cudaFuncSetAttribute(flash_prefill_kernel)");
    configured = true;
  }
  const unsigned qblocks = unsigned((p.n + kFlashRows - 1) / kFlashRows);
  flash_prefill_kernel<T, D, HB><<<dim3(qblocks, unsigned(p.nh / HB)), 128 * HB, smem, s>>>(p);
  check_launch("flash_prefill_kernel");
}

template <class T>
void launch_flash_dtype(const FlashPrefillParams& p, cudaStream_t s) {
  const bool pair = (p.nh / p.nkv) % 2 == 0;  // two heads of a kv head per block share its K/V tiles
  if (p.d == 16) {
    if (pair) launch_flash_typed<T, 16, 2>(p, s);
    else launch_flash_typed<T, 16, 1>(p, s);
  } else if (p.d == 32) {
    if (pair) launch_flash_typed<T, 32, 2>(p, s);
    else launch_flash_typed<T, 32, 1>(p, s);
  } else if (p.d == 64) {
    if (pair) launch_flash_typed<T, 64, 2>(p, s);
    else launch_flash_typed<T, 64, 1>(p, s);
  } else {
    if (pair) launch_flash_typed<T, 128, 2>(p, s);
    else launch_flash_typed<T, 128, 1>(p, s);
  }
}

}  // namespace

// ---- decode launchers -----------------------------------------------------------------------------

bool decode_attention_ok(int dq, int dv) { return dq > 0 && dv > 0 && dq % 4 == 0 && dv % 4 == 0 && dq <= 256 && dv <= 256; }

int decode_attention_splits(int64_t T, int nh, int nkv, int64_t max_len, int num_sms) {
  const int64_t group = nh / nkv, blocks = std::max<int64_t>(1, T * nkv * ((group + kDecodeHeads - 1) / kDecodeHeads));
  int64_t s = (2 * int64_t(std::max(num_sms, 1)) + blocks - 1) / blocks;
  s = std::min(s, (max_len + kDecKeys - 1) / kDecKeys);
  return int(std::clamp<int64_t>(s, 1, kDecodeMaxSplits));
}

bool decode_attention_cluster_ok(int splits, int dq, int dv) {
  return splits >= 2 && splits <= kDecodeMaxSplits && (splits <= kDecodeClusterMax || splits % kDecodeClusterMax == 0) &&
         dv <= dq && ::moex::cuda::current_device_cc() >= 90;
}

int decode_attention_cluster_splits(int splits) {
  return splits <= kDecodeClusterMax ? splits : splits / kDecodeClusterMax * kDecodeClusterMax;
}

size_t decode_attention_partial_floats(int64_t T, int nh, int dv, int splits) {
  return size_t(T) * size_t(nh) * size_t(splits) * size_t(dv + 2);
}

int64_t decode_attention_counters(int64_t T, int nh, int nkv) {
  const int group = nh / nkv;
  return T * nkv * ((group + kDecodeHeads - 1) / kDecodeHeads);
}

bool decode_attention_fuses_post(const QkvPostParams& post, int nh, int nkv, int dq, int dv) {
  return nkv >= 1 && nh % nkv == 0 && nh / nkv <= kDecodeHeads && post.norm_mode != 2 && post.hd == dq && dq == dv &&
         post.nh == nh && post.nkv == nkv && post.rope.dim >= 0 && post.rope.dim / 2 <= kDecRopeHalfMax &&
         post.rope.dim <= post.hd && (post.rope.dim == 0 || post.rope.inv_freq);
}

// The decode kernel for q / v dims above 128 (NQ / NV = 2) and the cluster merge.
using DecodeKernel = void (*)(DecodeAttentionParams);
template <class KV>
static DecodeKernel decode_kernel_typed(bool q2, bool v2, bool cluster) {
  static const DecodeKernel kernels[2][2][2] = {  // [cluster][q2][v2]
      {{decode_attention_kernel<KV, 1, 1, false>, decode_attention_kernel<KV, 1, 2, false>},
       {decode_attention_kernel<KV, 2, 1, false>, decode_attention_kernel<KV, 2, 2, false>}},
      {{decode_attention_kernel<KV, 1, 1, true>, decode_attention_kernel<KV, 1, 2, true>},
       {decode_attention_kernel<KV, 2, 1, true>, decode_attention_kernel<KV, 2, 2, true>}}};
  return kernels[cluster][q2][v2];
}
static DecodeKernel decode_kernel_for(bool bf16, bool q2, bool v2, bool cluster) {
  return bf16 ? decode_kernel_typed<__nv_bfloat16>(q2, v2, cluster) : decode_kernel_typed<float>(q2, v2, cluster);
}

void launch_decode_attention(const DecodeAttentionParams& p, cudaStream_t s) {
  if (p.T == 0) return;
  MOEX_ASSERT(decode_attention_ok(p.dq, p.dv) && p.nkv >= 1 && p.nh % p.nkv == 0 && p.splits >= 1 &&
              p.splits <= kDecodeMaxSplits);
  MOEX_ASSERT(p.splits == 1 || (p.partial && p.counters));
  MOEX_ASSERT(p.kv_dtype == 0 || (p.kv_dtype == 2 && p.dq % 8 == 0 && p.dv % 8 == 0));
  MOEX_ASSERT((p.post_fused || ::moex::cuda::aligned16(p.q)) && ::moex::cuda::aligned16(p.k_cache) &&
              ::moex::cuda::aligned16(p.v_cache) && ::moex::cuda::aligned16(p.out) && ::moex::cuda::aligned16(p.partial));
  MOEX_ASSERT(!p.post_fused || (decode_attention_fuses_post(p.post, p.nh, p.nkv, p.dq, p.dv) &&
                                p.post.k_cache == p.k_cache && p.post.v_cache == p.v_cache &&
                                p.post.kv_dtype == p.kv_dtype && p.post.pos == p.pos &&
                                p.post.slot == p.slot && p.post.max_len == p.max_len && p.post.T == p.T));
  const int group = p.nh / p.nkv, chunks = (group + kDecodeHeads - 1) / kDecodeHeads;
  const size_t smem = decode_smem_floats(p.dq, p.dv, p.post_fused ? p.post.rope.dim / 2 : 0) * sizeof(float);
  static bool configured = false;  // once per process: the largest shared memory any call needs (dims <= 256)
  if (!configured) {
    const int most = int(decode_smem_floats(256, 256, kDecRopeHalfMax) * sizeof(float));
    for (bool bf16 : {false, true})
      for (bool q2 : {false, true})
        for (bool v2 : {false, true})
          for (bool cluster : {false, true})
            check(cudaFuncSetAttribute(reinterpret_cast<const void*>(decode_kernel_for(bf16, q2, v2, cluster)),
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, most),
                  "cudaFuncSetAttribute(decode_attention_kernel)");
    configured = true;
  }
  MOEX_ASSERT(!p.cluster || decode_attention_cluster_ok(p.splits, p.dq, p.dv));
  // with p.cluster the key chunks of a (row, head block) form clusters of up to kDecodeClusterMax
  // CTAs along z (CTA rank = z mod the cluster size; splits is a whole number of clusters)
  const int cz = p.cluster ? std::min(p.splits, kDecodeClusterMax) : 1;
  const dim3 grid(unsigned(p.T), unsigned(p.nkv * chunks), unsigned(p.splits));
  const dim3 cluster(1, 1, unsigned(cz));
  ::moex::cuda::launch_pdl_cluster("decode_attention_kernel", decode_kernel_for(p.kv_dtype == 2, p.dq > 128, p.dv > 128, p.cluster), grid,
                                   cluster, dim3(kDecThreads), smem, s, p);
}

// ---- prefill launchers ----------------------------------------------------------------------------

bool flash_prefill_ok(int dq, int dv, int nh, int nkv) {
  return dq == dv && (dq == 16 || dq == 32 || dq == 64 || dq == 128) && nkv >= 1 && nh % nkv == 0;
}

void launch_flash_prefill(const FlashPrefillParams& p, cudaStream_t s) {
  if (p.n == 0) return;
  MOEX_ASSERT(flash_prefill_ok(p.d, p.d, p.nh, p.nkv) && (p.dtype == 1 || p.dtype == 2));
  MOEX_ASSERT(::moex::cuda::aligned16(p.k) && ::moex::cuda::aligned16(p.v) && ::moex::cuda::aligned16(p.q));
  if (p.dtype == 2) launch_flash_dtype<__nv_bfloat16>(p, s);
  else launch_flash_dtype<__half>(p, s);
}

}  // namespace moex::model::cuda
