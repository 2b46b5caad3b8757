// model/cuda_forward.hpp — the model runtime on a CUDA device (built only with CUDA; model.cpp
// uses it under MOEX_WITH_CUDA). Weights are uploaded once; the KV cache and every activation
// buffer are allocated up front for (max batch, max length, max rows) and reused; a step makes no
// host synchronisation until its sampled tokens (or logits) are read back.
//
//   dense linears   cuBLAS GemmEx, f32 compute (no TF32). bf16/f16 weights take the f32 input as
//                   two rounded terms hi + lo stacked as [2T, in] (one GEMM, the weights read once)
//   attention       model/cuda_kernels.cu (online softmax, causal, sliding window, sinks, GQA, MLA)
//   routers         the six routers of SPEC §3 as a kernel
//   experts         moex::experts_forward with Device::cuda views, the runtime's stream and workspace
//   decode steps    captured in a CUDA graph per (batch size, backend) when the backend is capturable
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/weights.hpp"
#include "moex/config.hpp"
#include "moex/device.hpp"

namespace moex::model {

struct CudaGenerateOptions {
  int64_t max_new_tokens = 16;
  std::vector<int64_t> eos;
  std::string prefill_backend = "grouped_mm", decode_backend = "grouped_mm";
  bool cuda_graphs = true;
  // Sampling: picks a token from one logits row [V] on the host (only the rows needed are copied).
  // Empty: greedy argmax on the device.
  std::function<int64_t(const float* logits, int64_t V)> pick;
};

// Counters of the last generate() (tests and the benchmark read them).
struct CudaGenerateStats {
  int64_t decode_steps = 0, graph_replays = 0, graph_captures = 0;
};

class CudaModel {
 public:
  // Uploads `w` (tensors already on `dev` are used in place) for the decoder `t`.
  CudaModel(const ModelWeights& w, const TextConfig& t, Device dev);
  ~CudaModel();
  CudaModel(const CudaModel&) = delete;
  CudaModel& operator=(const CudaModel&) = delete;

  // Random weights (uniform ±0.02-ish scaled, norms 1) built directly on `dev` for the GQA families
  // (qwen2_moe, qwen3_moe, olmoe, mixtral): the end-to-end benchmark's model without a checkpoint.
  static ModelWeights random_weights(const TextConfig& t, DType dtype, Device dev, uint64_t seed);

  // Allocates (or grows) the KV cache and activations for up to `max_batch` sequences of
  // `max_len` tokens and `max_rows` rows per step (logits for max_batch rows: generate's need;
  // forward() grows them to its rows). Growing drops the captured graphs.
  void reserve(int64_t max_batch, int64_t max_len, int64_t max_rows);

  // Logits [sum of lengths, V] (row-major f32, host) of B sequences from position 0.
  std::vector<float> forward(const std::vector<std::vector<int64_t>>& ids, const std::string& backend);

  // Prompt + new tokens per sequence (a sequence stops after an EOS id).
  std::vector<std::vector<int64_t>> generate(const std::vector<std::vector<int64_t>>& prompts,
                                             const CudaGenerateOptions& opts);
  const CudaGenerateStats& last_stats() const;

  // The KV cache: its element type (bf16 for bf16 models whose head dims are multiples of 8, as the
  // reference library's cache in the model dtype; f32 otherwise, or with MOEX_CUDA_KV_CACHE=f32) and
  // the bytes reserved for keys and values over all layers (0 before the first reserve()).
  DType kv_cache_dtype() const;
  size_t kv_cache_bytes() const;

  // Bytes of the weights one decode step at batch 1 reads (dense weights, norms, routers, the
  // embedding row, the lm_head and top_k experts per MoE layer): the memory floor's numerator.
  size_t decode_step_weight_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Device-to-device copy bandwidth of `dev` in bytes/s (read + write bytes / time of a large cudaMemcpy).
double measure_copy_bandwidth(Device dev);

}  // namespace moex::model
