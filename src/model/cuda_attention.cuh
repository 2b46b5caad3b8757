// model/cuda_attention.cuh — the fast attention kernels of the CUDA model runtime
// (model/cuda_forward.cu); the simple kernels they replace stay in cuda_kernels.cuh
// (attention_kernel, softmax_rows + cuBLAS) and remain selectable (MOEX_CUDA_ATTENTION_FLASH=0).
//
// * Decode ("flash-decoding", f32): one query row per sequence attends over its KV cache. The keys
//   of a row are split into at most `splits` chunks (of whole 32-key tiles) so that even batch 1
//   fills the GPU: a block serves (row, up to 8 query heads of one kv head, key chunk), reads each
//   K/V row once for all of its heads (a warp scores 4 keys for every head, lanes over the dims)
//   and writes a partial (max, sum, unnormalised output); the last of the row's non-empty chunks
//   to finish (an atomic ticket) merges the partials with all their loads in flight. Chunks past
//   the row's length exit at once; a row of one chunk is normalised by its block. The grid depends
//   only on static bounds (rows, heads, splits); each row's length is read on the device:
//   CUDA-graph capturable, deterministic (fixed merge order).
// * Prefill (bf16/f16 models, sequences from position 0): a fused flash-attention kernel on the
//   tensor cores (mma.sync m16n8k16, f32 accumulation, online softmax, causal block skipping).
//   Q, K, V are rounded to the model dtype as the GEMM path does; P is rounded before P·V.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "model/cuda_kernels.cuh"

namespace moex::model::cuda {

// ---- decode ---------------------------------------------------------------------------------------

// Query heads served by one decode block (a kv head's group is chunked by this).
constexpr int kDecodeHeads = 8;
constexpr int kDecodeMaxSplits = 128;
constexpr int kDecodeClusterMax = 8;  // CTAs of a decode-attention cluster (the portable limit)

struct DecodeAttentionParams {
  const float* q;                  // [T, nh, dq]
  const void *k_cache, *v_cache;  // [slots, max_len, nkv, dq|dv] of kv_dtype
  // 0 f32; 2 bf16 (dq and dv multiples of 8): the tiles are staged as bf16 and widened to f32 in the
  // key loop — the same arithmetic on the rounded values
  int kv_dtype = 0;
  int64_t max_len;
  int64_t T;
  int nh, nkv, dq, dv;
  float scaling;
  int window;           // 0 = none: keys max(0, pos - window + 1) .. pos
  const float* sinks;   // [nh] or null
  const int32_t *pos, *slot;  // [T]: the row's position (its last key) and cache slot
  int splits;           // decode_attention_splits(...): a static bound, not the rows' lengths
  float* partial;       // decode_attention_partial_floats(...) floats of scratch
  int32_t* counters;    // decode_attention_counters(...) ints, zero before the first launch (left zero)
  float* out;           // [T, nh, dv]
  // post_fused: q, k and v of the step are post-processed by this kernel (decode_attention_fuses_post)
  // from post.qkv — each block its heads' q into shared memory (q above is not read), the block of a
  // row's last key chunk its kv head's k and v into the cache — instead of by qkv_post_kernel first.
  bool post_fused = false;
  QkvPostParams post{};
  // early: a chunk that ends before the row's last key requests its first tile, and the RoPE table is
  // computed, before waiting for the previous kernel (PDL) — the same bits, earlier loads. Requires
  // that the cache rows before pos and pos / slot were written at least two kernels back.
  bool early = false;
  // norm_w_early (post_fused, post.norm_mode 1, dq <= 128): the q and k norm weights copied into shared
  // memory at the kernel's start (with early: before the wait), so that the post-processing reads no
  // global memory after the q / k rows — the same bits (CudaModel's MOEX_CUDA_WEIGHTS_EARLY)
  bool norm_w_early = false;
  // cluster: the chunks of a (row, head block) run as thread-block clusters of min(splits,
  // kDecodeClusterMax) CTAs (decode_attention_cluster_ok). A row whose non-empty chunks fit in one
  // cluster merges them through distributed shared memory after a cluster barrier, spread over the
  // chunks' CTAs, instead of through partials in global memory, a fence and an atomic ticket taken by
  // the last chunk — the same arithmetic in the same order, the same bits. Longer rows take the
  // ticket merge as without it.
  bool cluster = false;
};

// Whether the decode kernel handles these head dims (multiples of 4, at most 256).
bool decode_attention_ok(int dq, int dv);
// Whether the decode kernel can run this GQA post-processing itself (post_fused): one head block per
// kv head (nh / nkv <= kDecodeHeads), per-head or no q/k norm (norm_mode 2 needs the whole
// projection), hd == dq == dv, a rotary dim of at most 256.
bool decode_attention_fuses_post(const QkvPostParams& post, int nh, int nkv, int dq, int dv);
// Key chunks per (row, head block): enough blocks for ~2 waves on `num_sms` SMs at any batch,
// at most one chunk per 32 keys of max_len and kDecodeMaxSplits.
int decode_attention_splits(int64_t T, int nh, int nkv, int64_t max_len, int num_sms);
// Whether DecodeAttentionParams::cluster may be set: 2..kDecodeClusterMax splits or a multiple of it
// (whole clusters: no CTA launched only to exit), dv <= dq (a chunk's merged partial takes its q
// buffer), compute capability >= 9.0 on the current device.
bool decode_attention_cluster_ok(int splits, int dq, int dv);
// The split count to use with DecodeAttentionParams::cluster: `splits` rounded down to whole clusters
// (decode_attention_splits' bound of ~2 waves is not exceeded).
int decode_attention_cluster_splits(int splits);
size_t decode_attention_partial_floats(int64_t T, int nh, int dv, int splits);
int64_t decode_attention_counters(int64_t T, int nh, int nkv);
void launch_decode_attention(const DecodeAttentionParams& p, cudaStream_t s);

// ---- prefill --------------------------------------------------------------------------------------

struct FlashPrefillParams {
  const float* q;      // [*, nh, d] f32: rows row0 .. row0 + n - 1 are the sequence (positions 0 .. n-1)
  const void *k, *v;   // [n, nkv, d] in the model dtype (the cache rows, rounded)
  int64_t row0, n;
  int nh, nkv, d;
  int dtype;           // 1 f16, 2 bf16
  float scaling;
  int window;          // 0 = none
  const float* sinks;  // [nh] or null
  float* out;          // [*, nh, d] f32, rows row0 .. row0 + n - 1 written
};

// Whether the prefill kernel handles the shape: dq == dv in {16, 32, 64, 128}, nh a multiple of nkv.
bool flash_prefill_ok(int dq, int dv, int nh, int nkv);
void launch_flash_prefill(const FlashPrefillParams& p, cudaStream_t s);

}  // namespace moex::model::cuda
