// moex/model.hpp — the model runtime (SPEC §4): load a checkpoint in the reference library's
// format, choose the experts backend per sub-config, run forward passes and generate.
//
//   auto m = Model::from_pretrained("tests/fixtures/qwen3_moe", {.dtype = DType::bf16});
//   Tensor logits = m.forward({{1, 5, 9}});                       // [1, 3, V] f32
//   auto seqs = m.generate({{1, 5, 9}, {3, 4}}, {.max_new_tokens = 8});
//   m.set_experts_implementation("batched_mm");                   // no reload
//   m.set_experts_implementation({{"text_config", "eager"}});     // composite configs: per sub-config
//
// On the CPU the math is the f32 oracle of src/model/reference_forward.cpp (bf16/f16 weights:
// experts in that dtype). With `device = Device::cuda()` the weights are uploaded once and every
// step runs on the GPU (src/model/cuda_forward.cu): f32 activations, dense projections on cuBLAS,
// attention / norms / RoPE / routers / argmax as kernels, the experts through the chosen backend,
// decode steps replayed from CUDA graphs. Errors are moex::Error with one clear line.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "moex/config.hpp"
#include "moex/device.hpp"
#include "moex/tensor.hpp"

namespace moex {

// A backend name for every sub-config, or a map sub-config key → name where "" is the top level and
// applies to every sub-config not named. Empty = "grouped_mm" everywhere.
struct ExpertsImplementation {
  std::optional<std::string> name;
  std::map<std::string, std::string> map;

  ExpertsImplementation() = default;
  ExpertsImplementation(const char* n) : name(n) {}
  ExpertsImplementation(std::string n) : name(std::move(n)) {}
  ExpertsImplementation(std::map<std::string, std::string> m) : map(std::move(m)) {}
  ExpertsImplementation(std::initializer_list<std::pair<const std::string, std::string>> m) : map(m) {}
  bool empty() const { return !name && map.empty(); }
};

struct LoadOptions {
  DType dtype = DType::f32;         // f32, bf16 or f16: weights are converted at load
  Device device = Device::cpu();    // cpu, or cuda: weights, KV cache and activations on the GPU
  ExpertsImplementation experts_implementation;  // default grouped_mm
  std::function<void(size_t done, size_t total)> progress;  // called per tensor while loading
  // FP8 checkpoints (SPEC §6): turn the quantized experts back into `dtype` at load (other FP8
  // linears are always dequantized; only the experts run quantized).
  bool dequantize = false;
};

struct GenerateOptions {
  int64_t max_new_tokens = -1;              // -1: generation_config.json's, else 16
  std::optional<bool> do_sample;            // default: the generation config's (greedy if absent)
  std::optional<double> temperature;        // default: the generation config's; 0 = greedy
  std::optional<int64_t> top_k;             // 0 = off
  std::optional<double> top_p;              // 1 = off
  uint64_t seed = 0;
  std::optional<std::vector<int64_t>> eos_token_id;  // default: the generation config's
  // SPEC §4 decode-stage switching: on a non-CPU device, sub-configs on grouped_mm decode with
  // batched_mm (prefill keeps grouped_mm; the map is untouched). On the CPU nothing switches.
  bool decode_stage_switching = true;
  // CUDA: decode steps are captured in a CUDA graph per batch size and replayed, when the decode
  // backend is capturable (SPEC §2: batched_mm, grouped_mm; not eager). Off: launched one by one.
  bool cuda_graphs = true;
};

class Model {
 public:
  Model() = default;
  // Reads DIR/config.json (+ generation_config.json) and the weights (model.safetensors or the
  // shards of model.safetensors.index.json). Unknown backend names or sub-config keys are errors here.
  static Model from_pretrained(const std::string& dir, const LoadOptions& opts = {});

  const ModelConfig& config() const;
  DType dtype() const;
  Device device() const;

  // Switches backends without reloading (same rules as at load; names are validated). Switching
  // into or out of deepgemm_megamoe is refused (a load-time choice).
  void set_experts_implementation(const ExpertsImplementation& impl);
  // {"": top, "text_config": ..., ...}: one entry per sub-config that exists; a sub-config without
  // MoE layers (e.g. vision_config) reports `eager` whatever was asked for it.
  std::map<std::string, std::string> get_experts_implementation() const;
  // The backend the decoder's MoE layers use now.
  std::string decoder_experts_backend() const;

  // Logits [B, L, V] (f32) for B sequences of equal length L.
  Tensor forward(const std::vector<std::vector<int64_t>>& ids) const;
  // Prompt + new tokens per sequence (prompts may differ in length; a sequence stops after EOS).
  std::vector<std::vector<int64_t>> generate(const std::vector<std::vector<int64_t>>& prompts,
                                             const GenerateOptions& opts = {}) const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

// ---- FP8 quantizer (`moex quantize`, SPEC §6) ---------------------------------------------------

struct QuantizeOptions {
  int64_t block_n = 128, block_k = 128;  // weight block [out, in] of one scale
  bool ue8m0_scales = false;             // power-of-two scales (scale_fmt "ue8m0") instead of f32
  std::function<void(size_t done, size_t total)> progress;  // called per tensor
};

// Writes an FP8 block-scaled copy of the bf16/f16/f32 checkpoint `in_dir` to `out_dir` in the
// reference library's format (FineGrainedFP8Config): the routed experts and the decoder's linear
// layers the reference quantizes (attention projections, dense and shared-expert MLPs) become e4m3
// `X.weight` + `X.weight_scale_inv` [ceil(out/bn), ceil(in/bk)] (fused experts: `gate_up_proj` /
// `down_proj` + `*_scale_inv` [E, ·, ·]); embeddings, norms, routers, `lm_head`, vision towers and
// GPT-OSS experts (biased; the reference's FP8 experts have none) stay as stored and are listed in
// `modules_to_not_convert`. config.json gains `quantization_config`; generation/tokenizer files are
// copied; shards keep their names. Everything is written to a temporary directory beside `out_dir`
// and renamed at the end; an existing non-empty `out_dir` is an error (nothing is overwritten).
void quantize_checkpoint(const std::string& in_dir, const std::string& out_dir, const QuantizeOptions& opts = {});

// ---- helpers of the `moex forward` / `moex generate` commands (SPEC §5) ------------------------

// "1,2,3;4,5,6" → {{1,2,3},{4,5,6}} (spaces allowed). Throws Error(invalid_argument) naming the bad part.
std::vector<std::vector<int64_t>> parse_token_ids(std::string_view text);
// Writes F32 tensor `logits` [B, L, V] to a safetensors file.
void write_logits(const std::string& path, const Tensor& logits);
// [[1,2,3],[4,5]] as one line of JSON.
std::string sequences_to_json(const std::vector<std::vector<int64_t>>& seqs);

}  // namespace moex
