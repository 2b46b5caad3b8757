// model/cuda_qkv_post.cuh — the per-head arithmetic of the GQA post-processing (QkvPostParams,
// cuda_kernels.cuh): q/k RMSNorm, clip, RoPE, written to q or the KV cache. Shared by
// qkv_post_kernel (cuda_kernels.cu) and the decode attention kernel, which runs it itself for its
// heads at decode steps (cuda_attention.cu: one kernel less per layer), so that both give the same
// bits.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "model/cuda_kernels.cuh"
#include "model/cuda_warp.cuh"

namespace moex::model::cuda {

// cs[i] = cos(pos · inv_freq[i]) · factor, sn[i] = sin(…) · factor for i < dim / 2, in f64 (as the
// CPU runtime); block-wide (threads strided), the caller synchronises before reading.
__device__ __forceinline__ void rope_table(const RopeParams& rope, int64_t pos, double* cs, double* sn) {
  for (int i = threadIdx.x; i < rope.dim / 2; i += blockDim.x) {
    double sv, cv;
    sincos(double(pos) * rope.inv_freq[i], &sv, &cv);
    cs[i] = cv * rope.factor;
    sn[i] = sv * rope.factor;
  }
}

// One warp: head slot hs of row r (slots [0, nh) are q heads, [nh, nh + nkv) k heads, then v heads)
// from p.qkv, through `a` ([hd] floats of the warp's scratch), normalised (norm_mode 1: the head's
// RMS; 2: inv_q / inv_k, the projection's, computed by the caller), clipped, rotated by the table
// (cs, sn) of the row's position, and stored: q heads at q_dst ([hd]; null: p.q_out's row), k and v
// heads in the layer's cache at (slot[r], pos[r]). norm_w (norm_mode 1 only, optional): this head
// kind's [hd] norm weights already in shared memory (the decode attention's early copy), read instead
// of p.q_norm / p.k_norm — the same values.
//
// Split in two for heads of at most kPostMaxDims dims: qkv_post_load issues every load of the slot
// (its row and its norm weights) at once into registers, qkv_post_finish does the arithmetic and the
// stores. A loop that loads, stores into `a` and loads again serialises its loads (the compiler cannot
// move a load above a store that may alias it): on the H200 the decode attention's post-processing
// took 4 µs for two heads per warp, one L2 round trip per 32 dims. A warp with two slots loads both
// before finishing either (the decode attention's last key chunk: 8 q heads + k + v on 8 warps).
constexpr int kPostPerLane = 8;
constexpr int kPostMaxDims = 32 * kPostPerLane;

struct QkvPostRegs {
  float v[kPostPerLane];  // row value of dim lane + 32·k (0 past hd)
  float w[kPostPerLane];  // its norm weight (norm_mode != 0, q and k heads)
};

__device__ __forceinline__ int qkv_post_kind(const QkvPostParams& p, int hs) {
  return hs < p.nh ? 0 : hs < p.nh + p.nkv ? 1 : 2;
}
__device__ __forceinline__ int qkv_post_head(const QkvPostParams& p, int hs) {
  const int kind = qkv_post_kind(p, hs);
  return kind == 0 ? hs : kind == 1 ? hs - p.nh : hs - p.nh - p.nkv;
}

// hd <= kPostMaxDims
__device__ __forceinline__ void qkv_post_load(const QkvPostParams& p, int64_t r, int hs, const float* norm_w,
                                              QkvPostRegs& g) {
  const int lane = threadIdx.x & 31, hd = p.hd;
  const int kind = qkv_post_kind(p, hs);
  const float* row = p.qkv + r * int64_t(p.nh + 2 * p.nkv) * hd + int64_t(hs) * hd;  // q heads, k heads, v heads
#pragma unroll
  for (int k = 0; k < kPostPerLane; ++k) {
    const int i = lane + 32 * k;
    g.v[k] = i < hd ? row[i] : 0.0f;
  }
  if (kind < 2 && p.norm_mode != 0) {
    const float* w = norm_w ? norm_w : kind == 0 ? p.q_norm : p.k_norm;
    const int woff = p.norm_mode == 1 ? 0 : qkv_post_head(p, hs) * hd;  // per-head [hd] weights, or the projection's
#pragma unroll
    for (int k = 0; k < kPostPerLane; ++k) {
      const int i = lane + 32 * k;
      g.w[k] = i < hd ? w[woff + i] : 0.0f;
    }
  }
}

// Where a head slot's values go: a q row (f32), or its row of the KV cache (f32, or bf16 when
// p.kv_dtype == 2: rounded to nearest even, as the reference's cache in the model dtype).
struct PostOut {
  float* f = nullptr;
  __nv_bfloat16* b = nullptr;
  __device__ __forceinline__ void put(int i, float v) const {
    if (b) b[i] = __float2bfloat16_rn(v);
    else f[i] = v;
  }
};

// The stores of a q or k slot from `a` (normalised and clipped): rotated, or copied past the rotary dims.
__device__ __forceinline__ void qkv_post_rotate(const QkvPostParams& p, const float* a, const double* cs,
                                                const double* sn, PostOut dst) {
  const int lane = threadIdx.x & 31, hd = p.hd, h2 = p.rope.dim / 2;
  for (int i = lane; i < h2; i += 32) {
    const double c = cs[i], s = sn[i];
    const double x1 = p.rope.interleave ? a[2 * i] : a[i];
    const double x2 = p.rope.interleave ? a[2 * i + 1] : a[i + h2];
    dst.put(i, float(x1 * c - x2 * s));
    dst.put(i + h2, float(x2 * c + x1 * s));
  }
  for (int i = p.rope.dim + lane; i < hd; i += 32) dst.put(i, a[i]);  // beyond the rotary dim: unchanged
}

__device__ __forceinline__ PostOut qkv_post_dst(const QkvPostParams& p, int64_t r, int hs, float* q_dst) {
  const int kind = qkv_post_kind(p, hs), head = qkv_post_head(p, hs);
  PostOut o;
  if (kind == 0) {
    o.f = q_dst ? q_dst : p.q_out + (r * p.nh + head) * p.hd;
    return o;
  }
  const int64_t at = ((int64_t(p.slot[r]) * p.max_len + p.pos[r]) * p.nkv + head) * p.hd;
  void* cache = kind == 1 ? p.k_cache : p.v_cache;
  if (p.kv_dtype == 2) o.b = static_cast<__nv_bfloat16*>(cache) + at;
  else o.f = static_cast<float*>(cache) + at;
  return o;
}

// hd <= kPostMaxDims; g from qkv_post_load of the same slot. The arithmetic of qkv_post_slot's loop
// form in the same order: the same bits.
__device__ __forceinline__ void qkv_post_finish(const QkvPostParams& p, int64_t r, int hs, float* a, const double* cs,
                                                const double* sn, float inv_q, float inv_k, float* q_dst,
                                                const QkvPostRegs& g) {
  const int lane = threadIdx.x & 31, hd = p.hd;
  const int kind = qkv_post_kind(p, hs);
  const PostOut dst = qkv_post_dst(p, r, hs, q_dst);
  if (kind == 2) {  // v: clipped only
#pragma unroll
    for (int k = 0; k < kPostPerLane; ++k)
      if (lane + 32 * k < hd) dst.put(lane + 32 * k, p.clip > 0.0f ? fminf(fmaxf(g.v[k], -p.clip), p.clip) : g.v[k]);
    return;
  }
  float o[kPostPerLane];
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < kPostPerLane; ++k) {
    o[k] = g.v[k];
    if (lane + 32 * k < hd) ss += g.v[k] * g.v[k];
  }
  if (p.norm_mode != 0) {
    const float inv = p.norm_mode == 1 ? rsqrtf(warp_sum(ss) / float(hd) + p.eps) : kind == 0 ? inv_q : inv_k;
#pragma unroll
    for (int k = 0; k < kPostPerLane; ++k) o[k] = g.w[k] * (o[k] * inv);
  }
  if (p.clip > 0.0f)
#pragma unroll
    for (int k = 0; k < kPostPerLane; ++k) o[k] = fminf(fmaxf(o[k], -p.clip), p.clip);
#pragma unroll
  for (int k = 0; k < kPostPerLane; ++k)
    if (lane + 32 * k < hd) a[lane + 32 * k] = o[k];
  __syncwarp();  // the rotation pairs values of other lanes
  qkv_post_rotate(p, a, cs, sn, dst);
}

__device__ __forceinline__ void qkv_post_slot(const QkvPostParams& p, int64_t r, int hs, float* a, const double* cs,
                                              const double* sn, float inv_q, float inv_k, float* q_dst,
                                              const float* norm_w = nullptr) {
  if (p.hd <= kPostMaxDims && p.loads_first) {
    QkvPostRegs g;
    qkv_post_load(p, r, hs, norm_w, g);
    qkv_post_finish(p, r, hs, a, cs, sn, inv_q, inv_k, q_dst, g);
    return;
  }
  // heads longer than kPostMaxDims, or loads_first off: the loop form (one load in flight per lane and 32 dims)
  const int lane = threadIdx.x & 31, hd = p.hd;
  const int kind = qkv_post_kind(p, hs);
  const float* row = p.qkv + r * int64_t(p.nh + 2 * p.nkv) * hd + int64_t(hs) * hd;
  float ss = 0.0f;
  for (int i = lane; i < hd; i += 32) {
    const float v = row[i];
    a[i] = v;
    ss += v * v;
  }
  if (kind < 2 && p.norm_mode != 0) {
    const float* w = norm_w ? norm_w : kind == 0 ? p.q_norm : p.k_norm;
    const float inv = p.norm_mode == 1 ? rsqrtf(warp_sum(ss) / float(hd) + p.eps) : kind == 0 ? inv_q : inv_k;
    const int woff = p.norm_mode == 1 ? 0 : qkv_post_head(p, hs) * hd;
    for (int i = lane; i < hd; i += 32) a[i] = w[woff + i] * (a[i] * inv);
  }
  if (p.clip > 0.0f)
    for (int i = lane; i < hd; i += 32) a[i] = fminf(fmaxf(a[i], -p.clip), p.clip);
  __syncwarp();  // the rotation pairs values of other lanes
  const PostOut dst = qkv_post_dst(p, r, hs, q_dst);
  if (kind == 2) {
    for (int i = lane; i < hd; i += 32) dst.put(i, a[i]);
    return;
  }
  qkv_post_rotate(p, a, cs, sn, dst);
}

}  // namespace moex::model::cuda
