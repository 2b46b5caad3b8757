// model/reference_forward.hpp — the f32 forward pass of the six families on the CPU (the model
// runtime's CPU path): packed batches of sequences, with a simple KV cache per sequence. It follows the
// reference library's eager code path operation by operation (activations in f32, norms and softmax in
// f64), proves the checkpoint loading, the configs and the fixtures end to end (parity tests) and
// serves as the oracle of the CUDA runtime. Its hot parts run on the CPU kernels: the dense linears
// (bf16 weights packed by pack_linears_for_cpu; inputs of >= 8 rows rounded to bf16 unless
// MOEX_CPU_LINEAR_TERMS=2, fewer rows as two bf16 terms), the prefill attention scores 16 keys at a
// time, the routed experts through any registered experts backend.
#pragma once
#include <cstdint>
#include <memory>
#include <new>
#include <utility>
#include <string_view>
#include <vector>

#include "model/weights.hpp"

namespace moex::model {

// std::allocator whose value-initialisation leaves elements uninitialised: the forward's buffers are
// written whole by their producers, so zero-filling them first (a serial memset of up to T·V floats
// for the logits) is wasted.
template <class T>
struct UninitAllocator : std::allocator<T> {
  template <class U>
  struct rebind {
    using other = UninitAllocator<U>;
  };
  UninitAllocator() = default;
  template <class U>
  UninitAllocator(const UninitAllocator<U>&) noexcept {}
  template <class U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... A>
  void construct(U* p, A&&... a) {
    ::new (static_cast<void*>(p)) U(std::forward<A>(a)...);
  }
};
// Row-major f32 rows of the forward (activations, logits).
using Floats = std::vector<float, UninitAllocator<float>>;

// The keys and values of one sequence, per layer: keys in tiles of 16 positions, [ceil(len / 16),
// kv_heads, k_dim, 16] (zeros past len; the attention's layout, reference_forward.cpp), values
// [len, kv_heads, v_dim] (DeepSeek-V3 MLA: both expanded per head).
struct KvCache {
  std::vector<Floats> k, v;
  int64_t length = 0;  // tokens cached = position of the next token
};

// Runs T new tokens of one sequence at positions cache.length .. cache.length+T-1, appending their
// keys/values to `cache`; returns their logits [T, V] (row-major f32).
std::vector<float> forward_tokens(const ModelWeights& w, const TextConfig& t, const int64_t* ids, int64_t T,
                                  KvCache& cache, std::string_view experts_backend = "grouped_mm");

// Which rows' logits forward_batch computes: every row (forward), or each chunk's last row (the
// prefill and decode steps of generation, which pick the next token from it).
enum class LogitRows { all, last };

// New tokens of one sequence for forward_batch.
struct SequenceChunk {
  const int64_t* ids = nullptr;
  int64_t n = 0;
  KvCache* cache = nullptr;  // distinct per chunk
};

// Runs several sequences' new tokens packed into one batch (row-wise work — norms, projections,
// routing, the experts call — over all rows at once; attention per sequence over its own cache).
// Returns the logits of all rows [sum n, V] in chunk order, or with LogitRows::last of each chunk's
// last row [chunks, V].
Floats forward_batch(const ModelWeights& w, const TextConfig& t, const std::vector<SequenceChunk>& chunks,
                     std::string_view experts_backend = "grouped_mm", LogitRows rows = LogitRows::all);

// Logits [L, V] (row-major f32) for the token ids of one sequence. With f32 weights everything is f32
// (accumulations in f64). With bf16/f16 weights the dense parts compute in f32 with the weights widened
// exactly (inputs of >= 8 rows rounded to bf16 where the CPU has bf16 dot products, fewer rows as two
// bf16 terms on packed weights: linear_terms / terms_for in the .cpp) and the routed experts run in
// the weights' dtype (hidden rounded once, output in that dtype): a mixed-precision path, more
// accurate than the reference's all-bf16 one.
std::vector<float> reference_logits(const ModelWeights& w, const TextConfig& t, const std::vector<int64_t>& ids,
                                    std::string_view experts_backend = "grouped_mm");

// Greedy continuation by repeated full forwards (O(n^2); for tests): at most `max_new_tokens` new
// ids, stopping after an id in `eos`. Returns prompt + new ids.
std::vector<int64_t> reference_greedy(const ModelWeights& w, const TextConfig& t, std::vector<int64_t> ids,
                                      int64_t max_new_tokens, const std::vector<int64_t>& eos,
                                      std::string_view experts_backend = "grouped_mm");

// The forward's attention (exposed for tests): n new queries at positions pos0 .. pos0+n-1 over Tk
// cached keys (positions 0 .. Tk-1), causal, nh query heads over nkv key/value heads (GQA), window > 0:
// sliding window, sinks: [nh] or null. q [n, nh, dq], k [Tk, nkv, dq], v [Tk, nkv, dv] → [n, nh * dv].
// Scores in f32 (8 fixed lanes), softmax in f64, value sums in f32 in key order; 16 or more queries
// score 16 keys at a time over transposed key tiles, with the same bits.
std::vector<float> causal_attention(const float* q, const float* k, const float* v, int64_t n, int64_t Tk, int64_t pos0, int64_t nh,
                                    int64_t nkv, int64_t dq, int64_t dv, double scaling, int64_t window, const float* sinks);

// Packs every dense linear of `w` (attention, dense and shared MLPs, routers, lm_head) for the CPU's
// packed kernels: bf16 models for the packed bf16 kernel where the kernel table has it (AVX512_BF16
// without AMX), f32 models for the packed f32 kernel; does nothing otherwise (f16 models, AMX tables).
// Memory: one more copy of those weights (rows padded to 32, bf16 in to even), kept beside the
// originals (f32 linears of fewer than 8 rows and the embedding read those). `threads` threads.
void pack_linears_for_cpu(ModelWeights& w, int threads);

// RoPE inverse frequencies (dim/2 values) and the attention factor that scales cos/sin, for the
// rotary dimension `dim` (head_dim; DeepSeek-V3: qk_rope_head_dim).
void rope_inv_freq(const RopeConfig& r, int64_t dim, int64_t max_position_embeddings, std::vector<double>& inv_freq,
                   double& attention_factor);

}  // namespace moex::model
