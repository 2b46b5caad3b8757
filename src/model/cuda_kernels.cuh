// model/cuda_kernels.cuh — the CUDA kernels of the model runtime (model/cuda_forward.cu) and
// their launchers: embeddings, RMSNorm, the f32 → (hi, lo) split that feeds the dense GEMMs,
// q/k/v post-processing (norms, RoPE, KV-cache writes), attention, routers, activations, argmax.
// Activations are f32 row-major; weights of norms/biases/sinks are f32 on the device.
// Every launcher checks its launch (moex::Error on failure).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace moex::model::cuda {

// Per-row metadata of a step, on the device: the row's position in its sequence and the KV-cache
// slot of the sequence. Attention runs over tiles of up to kAttnRows consecutive rows of one sequence.
constexpr int kAttnRows = 8;
struct AttnTile {
  int row0, nrows;
};

// x [T, H] f32 = embed[ids] (embed [V, H] of dtype code 0 f32 / 1 f16 / 2 bf16).
void launch_embed(const int32_t* ids, const void* embed, int embed_dtype, int64_t T, int64_t H, float* x, cudaStream_t s);

// RMSNorm: out[r, :n] = w ⊙ in[r, :n] / sqrt(mean(in²) + eps) for rows r < T (row pitches in
// elements), where the input row of output row r is
//   embed[ids[r]] (when `ids`: the embedding lookup fused in; written to x row r as well), or
//   x[rows[r]] (when `rows`: a gather, e.g. the rows whose logits are wanted; x is not written), or
//   x[r];
// plus add[src row] when `add` ([rows of x, n] of dtype code add_dtype: the residual add of the
// experts' output fused into the next norm; x written back unless `rows`).
// `split` (optional, dtype code 1 or 2): also writes hi = round(out) in rows [0, T) and
// lo = round(out − hi) in rows [T, 2T) of a [2T, n] buffer (the two-term input of a GEMM).
// One block per row; rows of n <= 8192 stay in registers (x is read once).
struct RmsNormParams {
  float* x = nullptr;
  int64_t x_pitch = 0;
  const int32_t* ids = nullptr;
  const void* embed = nullptr;
  int embed_dtype = 0;
  const int32_t* rows = nullptr;
  const void* add = nullptr;  // [rows of x, n] contiguous
  int add_dtype = 0;
  const float* w = nullptr;
  float eps = 0.0f;
  int64_t T = 0, n = 0;
  float* out = nullptr;
  int64_t out_pitch = 0;
  void* split = nullptr;
  int split_dtype = 0;
  // w_early: the kernel (rows in registers, n <= 8192) reads its weights w before the PDL wait, off
  // the critical path after its reduction — the same bits (CudaModel's MOEX_CUDA_WEIGHTS_EARLY)
  bool w_early = false;
};
void launch_rmsnorm(const RmsNormParams& p, cudaStream_t s);

// split [2T, n] (dtype code 1/2) = (hi, lo) of x [T, n] f32 (pitch x_pitch).
void launch_split(const float* x, int64_t x_pitch, int64_t T, int64_t n, void* split, int split_dtype, cudaStream_t s);

// y [T, n] (pitch y_pitch) (+)= row_gate · (g[r] (+ g[T + r] when two_terms) + bias); g is [(1|2)T, n] f32.
// row_gate (optional): sigmoid(row_gate[r]) scales the row (the qwen2_moe shared-expert gate).
void launch_finish_linear(const float* g, bool two_terms, const float* bias, const float* row_gate, int64_t T, int64_t n,
                          float* y, int64_t y_pitch, bool accumulate, cudaStream_t s);

// Skinny linear for decode steps: y [T, out] (pitch y_pitch) (+)= gate · (x · Wᵀ + bias) with W
// [out, in] bf16/f16 (dtype code 1/2) read once with 16-byte loads, x [T, in] f32 (pitch x_pitch)
// used exactly (f32 products, f32 accumulation), T <= kGemvMaxRows. Needs in % 8 == 0, 16-byte
// aligned W and x rows (x_pitch % 4 == 0); gemv_ok() says whether a call qualifies.
constexpr int kGemvMaxRows = 8;
bool gemv_ok(const void* w, int64_t in, const float* x, int64_t x_pitch, int64_t T);
// What a one-row decode GEMV may take over from the kernels around it (CudaModel's MOEX_CUDA_FUSE_IN_NORM):
// - norm_w: x is the residual row before the input RMSNorm; the GEMV adds norm_add (the previous layer's
//   experts output [in], dtype code norm_add_dtype = W's) and normalises the row itself (rsqrt(mean(v²) + eps)
//   · Σ W·(norm_w ⊙ v), v = x + norm_add), so that no RMSNorm kernel runs before it. gemv_norm_ok() says
//   whether a call qualifies (one row, 16-byte aligned pointers).
// - acc_add (with accumulate): y = (y + acc_add) + x · Wᵀ, acc_add [T, out] of dtype code acc_add_dtype — the
//   residual add of the skipped RMSNorm, made by the o projection instead (the same additions in the same order).
struct GemvFuse {
  const void* norm_add = nullptr;
  int norm_add_dtype = 0;
  const float* norm_w = nullptr;
  float norm_eps = 0.0f;
  const void* acc_add = nullptr;
  int acc_add_dtype = 0;
};
bool gemv_norm_ok(const void* w, int w_dtype, int64_t in, const float* x, int64_t T, const GemvFuse& fz);
void launch_gemv(const void* w, int w_dtype, int64_t out, int64_t in, const float* x, int64_t x_pitch, int64_t T,
                 const float* bias, const float* row_gate, float* y, int64_t y_pitch, bool accumulate, cudaStream_t s,
                 const GemvFuse& fz = {});

// out [T, n] in dtype code (0/1/2) = x [T, n] f32; or x [T, n] f32 += in [T, n] of dtype code.
void launch_to_dtype(const float* x, int64_t T, int64_t n, void* out, int dtype, cudaStream_t s);
void launch_add_from(const void* in, int dtype, int64_t T, int64_t n, float* x, cudaStream_t s);

// h [T, I] = act(gu[:, :I]) * gu[:, I:] with gu [T, 2I] f32 (dense MLPs; act: moex::Activation as int).
void launch_gated_act(const float* gu, int64_t T, int64_t I, int act, float* h, cudaStream_t s);

// RoPE: inverse frequencies (dim/2 doubles) and the attention factor that scales cos/sin.
struct RopeParams {
  const double* inv_freq = nullptr;
  double factor = 1.0;
  int dim = 0;
  bool interleave = false;
};

// GQA post-processing of qkv [T, (nh + 2 nkv) hd] f32: optional q/k RMSNorm (norm_mode 1: per head
// with [hd] weights; 2: over the whole projection with [nh·hd] / [nkv·hd] weights), clip, RoPE;
// q → q_out [T, nh, hd]; k, v → the layer's cache [slots, max_len, nkv, hd] at (slot[r], pos[r]).
struct QkvPostParams {
  const float* qkv;
  int64_t T;
  int nh, nkv, hd;
  int norm_mode;
  const float *q_norm, *k_norm;
  float eps;
  float clip;  // <= 0: none
  RopeParams rope;
  const int32_t *pos, *slot;
  float* q_out;
  void *k_cache, *v_cache;  // [slots, max_len, nkv, hd] of kv_dtype
  int kv_dtype = 0;         // the KV cache's elements: 0 f32, 2 bf16 (values rounded to nearest even)
  int64_t max_len;
  // heads of at most 256 dims: every load of a head slot issued before its arithmetic (and, in the
  // decode attention, both slots of a warp before either is finished); false: the loop form, one
  // load in flight per lane. The same bits either way (CudaModel's MOEX_CUDA_POST_LOADS_FIRST).
  bool loads_first = true;
};
void launch_qkv_post(const QkvPostParams& p, cudaStream_t s);

// DeepSeek-V3 MLA post-processing: q [T, nh, nope + rd] gets RoPE on its last rd values (in
// place); the cache gets k = [kvb nope part, rope(k_rot)] and v = kvb's v part per head.
//   kvb [T, nh, nope + vd], ckv [T, ckv_pitch] (k_rot at column kv_lora).
struct MlaPostParams {
  float* q;
  const float* kvb;
  const float* ckv;
  int64_t ckv_pitch, kv_lora;
  int64_t T;
  int nh, nope, rd, vd;
  RopeParams rope;
  const int32_t *pos, *slot;
  void *k_cache, *v_cache;  // [slots, max_len, nh, nope + rd | vd] of kv_dtype
  int kv_dtype = 0;         // 0 f32, 2 bf16
  int64_t max_len;
};
void launch_mla_post(const MlaPostParams& p, cudaStream_t s);

// Causal attention over each row's sequence cache (keys 0..pos[r], or the last `window` of them),
// GQA (head h reads kv head h / (nh / nkv)), optional sinks [nh]. q [T, nh, dq], out [T, nh, dv].
struct AttentionParams {
  const float* q;
  const void *k_cache, *v_cache;  // [slots, max_len, nkv, dq|dv] of kv_dtype
  int kv_dtype = 0;               // 0 f32, 2 bf16
  int64_t max_len;
  int nh, nkv, dq, dv;
  float scaling;
  int window;  // 0 = none
  const float* sinks;
  const AttnTile* tiles;
  int num_tiles;
  // Every tile is one row (decode steps) and nh / nkv <= kAttnRows: a block serves one (row, kv head)
  // and its warps the query heads of that kv head, sharing the staged keys/values.
  bool heads_per_block;
  const int32_t *pos, *slot;
  float* out;
};
// Largest dq / dv the kernel handles.
constexpr int kAttnMaxDim = 256;
void launch_attention(const AttentionParams& p, cudaStream_t s);

// Prefill attention through GEMMs (bf16/f16 models, sequences from position 0): the softmax of
// one kv-head group's scores S [group, n, n] f32 (row i = query at position i, column j = key j)
// into probabilities P [group, n, n] of dtype code 1/2: scaled, causal, optional window and sinks
// (sinks [nh] indexed by head0 + g); masked entries are 0.
void launch_softmax_rows(const float* S, int64_t group, int64_t n, float scaling, int window, const float* sinks,
                         int head0, void* P, int p_dtype, cudaStream_t s);

// Routers (SPEC §3, same math as routing/routers.cpp): logits [T, E] f32 → idx [T, K] i32, w [T, K] f32.
// kind: 0 softmax (renorm when `renorm`), 1 deepseek_v3, 2 gpt_oss.
struct RouterParams {
  const float* logits;
  int64_t T;
  int E, K;
  int kind;
  bool renorm;
  const float* correction_bias;  // deepseek_v3, optional
  int n_group, topk_group;
  float scaling;
  int32_t* idx;
  float* w;
  // the warp routers scan kRouterMaxExperts / 32 values per lane whatever E is (the layout before the
  // thirty-fourth session; A/B measurement, CudaModel's MOEX_CUDA_ROUTE_WIDE=1) — the same routing
  bool wide = false;
};
constexpr int kRouterMaxExperts = 512;
constexpr int kRouterMaxK = 32;
void launch_router(const RouterParams& p, cudaStream_t s);

// The router linear and the router in one kernel (decode steps; kind 0 or 2): p.logits [T, E] =
// x · Wᵀ (+ bias) by the GEMV above (gemv_ok must hold), then the T rows routed. Two kernels:
// `ticket` (32-row blocks; the last block to finish routes; `ticket`: one u32 in device memory, zero
// before the first call, left zero) and, on compute capability >= 9.0, `cluster` (one cluster of 8
// CTAs; the logits gathered in CTA 0's shared memory; the same logits bit for bit). `automatic`:
// cluster where it runs (MOEX_CUDA_ROUTER_CLUSTER=0: ticket always).
// `norm` (automatic only, where router_fuses_norm_ok): the RMSNorm producing x fused into the cluster
// kernel — every CTA normalises the T rows of norm (x + nothing: no pending add) itself, bit for bit
// as launch_rmsnorm would, and CTA 0 writes the norm's outputs (out, split); `x` is then not read.
// The decode step's post-attention norm: one kernel fewer on the step's latency chain.
enum class RouterKernel { automatic, ticket, cluster };
bool router_fuses_norm_ok(int64_t T, const RmsNormParams& norm);
void launch_gemv_router(const void* w, int w_dtype, int64_t in, const float* x, int64_t x_pitch, const float* bias,
                        const RouterParams& p, unsigned* ticket, cudaStream_t s,
                        RouterKernel kernel = RouterKernel::automatic, const RmsNormParams* norm = nullptr);

// rows_out [n, H] = rows_in[rows[i]] (f32).
void launch_gather_rows(const float* in, const int32_t* rows, int64_t n, int64_t H, float* out, cudaStream_t s);

// next[r] = argmax of logits row r [V] with std::max_element's semantics (the CPU runtime's greedy
// pick): the first maximum (ties → lowest id), NaN entries skipped, except that a NaN at id 0
// (and so an all-NaN row) gives 0. Several blocks per row; the last one to finish reduces their
// partial results. `scratch`: argmax_scratch_bytes(rows) of device memory, zero before the first
// call (left zero after each).
size_t argmax_scratch_bytes(int64_t rows);
void launch_argmax(const float* logits, int64_t rows, int64_t V, int32_t* next, void* scratch, cudaStream_t s);

// Fills n values of dtype code 0/1/2 with uniform(-scale, scale) from a counter hash of (seed, i);
// scale == 0 writes `value` everywhere.
void launch_fill_random(void* p, int dtype, int64_t n, uint64_t seed, float scale, float value, cudaStream_t s);

}  // namespace moex::model::cuda
