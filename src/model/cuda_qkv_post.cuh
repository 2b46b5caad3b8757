// model/cuda_qkv_post.cuh — the per-head arithmetic of the GQA post-processing (QkvPostParams,
// cuda_kernels.cuh): q/k RMSNorm, clip, RoPE, written to q or the KV cache. Shared by
// qkv_post_kernel (cuda_kernels.cu) and the decode attention kernel, which runs it itself for its
// heads at decode steps (cuda_attention.cu: one kernel less per layer), so that both give the same
// bits.
#pragma once
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
__device__ __forceinline__ void qkv_post_slot(const QkvPostParams& p, int64_t r, int hs, float* a, const double* cs,
                                              const double* sn, float inv_q, float inv_k, float* q_dst,
                                              const float* norm_w = nullptr) {
  const int lane = threadIdx.x & 31, hd = p.hd, h2 = p.rope.dim / 2;
  const int kind = hs < p.nh ? 0 : hs < p.nh + p.nkv ? 1 : 2;
  const int head = kind == 0 ? hs : kind == 1 ? hs - p.nh : hs - p.nh - p.nkv;
  const float* row = p.qkv + r * int64_t(p.nh + 2 * p.nkv) * hd + int64_t(hs) * hd;  // q heads, k heads, v heads
  float ss = 0.0f;
  for (int i = lane; i < hd; i += 32) {
    const float v = row[i];
    a[i] = v;
    ss += v * v;
  }
  if (kind < 2 && p.norm_mode != 0) {
    const float* w = norm_w ? norm_w : kind == 0 ? p.q_norm : p.k_norm;
    const float inv = p.norm_mode == 1 ? rsqrtf(warp_sum(ss) / float(hd) + p.eps) : kind == 0 ? inv_q : inv_k;
    const int woff = p.norm_mode == 1 ? 0 : head * hd;  // per-head [hd] weights, or the projection's
    for (int i = lane; i < hd; i += 32) a[i] = w[woff + i] * (a[i] * inv);
  }
  if (p.clip > 0.0f)
    for (int i = lane; i < hd; i += 32) a[i] = fminf(fmaxf(a[i], -p.clip), p.clip);
  __syncwarp();  // the rotation pairs values of other lanes
  float* dst;
  if (kind == 0) {
    dst = q_dst ? q_dst : p.q_out + (r * p.nh + head) * hd;
  } else {
    const int64_t cache_row = (int64_t(p.slot[r]) * p.max_len + p.pos[r]) * p.nkv + head;
    dst = (kind == 1 ? p.k_cache : p.v_cache) + cache_row * hd;
  }
  if (kind == 2) {
    for (int i = lane; i < hd; i += 32) dst[i] = a[i];
    return;
  }
  for (int i = lane; i < h2; i += 32) {
    const double c = cs[i], s = sn[i];
    const double x1 = p.rope.interleave ? a[2 * i] : a[i];
    const double x2 = p.rope.interleave ? a[2 * i + 1] : a[i + h2];
    dst[i] = float(x1 * c - x2 * s);
    dst[i + h2] = float(x2 * c + x1 * s);
  }
  for (int i = p.rope.dim + lane; i < hd; i += 32) dst[i] = a[i];  // beyond the rotary dim: unchanged
}

}  // namespace moex::model::cuda
