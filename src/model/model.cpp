// model/model.cpp — moex::Model: loading, experts-implementation map, forward, generation.
#include "moex/model.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include "core/check.hpp"
#include "model/cuda_forward.hpp"
#include "model/reference_forward.hpp"
#include "model/weights.hpp"
#include "moex/backend.hpp"
#include "moex/safetensors.hpp"

namespace moex {

namespace {

constexpr const char* kDefaultBackend = "grouped_mm";
constexpr const char* kMegaMoe = "deepgemm_megamoe";

std::string join_keys(const std::vector<std::string>& keys) {
  std::string s;
  for (const auto& k : keys) s += (s.empty() ? "" : ", ") + (k.empty() ? std::string("\"\"") : k);
  return s;
}

}  // namespace

struct Model::Impl {
  ModelConfig cfg;
  DType dtype = DType::f32;
  Device device = Device::cpu();
  model::ModelWeights weights;                 // CPU runtime (released after a CUDA upload)
  std::shared_ptr<model::CudaModel> cuda;      // CUDA runtime: device-resident weights, cache, graphs
  std::map<std::string, std::string> impl;  // "" + every sub-config key

  std::vector<std::string> keys() const {
    std::vector<std::string> k{""};
    for (const auto& s : cfg.sub_configs) k.push_back(s.key);
    return k;
  }

  // Resolves a name or map against the current map (`base`), validating names and keys.
  std::map<std::string, std::string> resolve(const ExpertsImplementation& e,
                                              const std::map<std::string, std::string>& base) const {
    const std::vector<std::string> valid = keys();
    auto check_name = [](const std::string& n) {
      if (!ExpertsInterface::global().contains(n)) (void)ExpertsInterface::global().get(n);  // throws, listing names
    };
    std::map<std::string, std::string> out;
    if (e.empty()) {
      for (const auto& k : valid) out[k] = kDefaultBackend;
      return without_moe_eager(out);
    }
    if (e.name) {
      MOEX_CHECK(e.map.empty(), "experts_implementation: give a name or a map, not both");
      check_name(*e.name);
      for (const auto& k : valid) out[k] = *e.name;
      return without_moe_eager(out);
    }
    for (const auto& [k, n] : e.map) {
      if (std::find(valid.begin(), valid.end(), k) == valid.end())
        detail::fail(ErrorCode::not_found, "experts_implementation: unknown sub-config '{}' for {} (valid: {})", k,
                     cfg.model_type, join_keys(valid));
      check_name(n);
    }
    out = base;
    const auto top = e.map.find("");
    if (top != e.map.end())
      for (const auto& k : valid)
        if (!e.map.count(k)) out[k] = top->second;
    for (const auto& [k, n] : e.map) out[k] = n;
    for (const auto& k : valid)
      if (!out.count(k)) out[k] = out.count("") ? out[""] : kDefaultBackend;
    return without_moe_eager(out);
  }

  // A sub-config without MoE layers (e.g. a vision tower) reports `eager` (as the reference does).
  std::map<std::string, std::string> without_moe_eager(std::map<std::string, std::string> m) const {
    for (const auto& s : cfg.sub_configs)
      if (!s.has_moe) m[s.key] = "eager";
    return m;
  }

  std::string decoder_backend() const {
    auto it = impl.find(cfg.text_key);
    return it == impl.end() ? impl.at("") : it->second;
  }
};

Model Model::from_pretrained(const std::string& dir, const LoadOptions& opts) {
  MOEX_CHECK(opts.dtype == DType::f32 || opts.dtype == DType::bf16 || opts.dtype == DType::f16,
             "model dtype must be f32, bf16 or f16, got {}", dtype_name(opts.dtype));
  if (opts.device.is_cuda()) {
#ifndef MOEX_WITH_CUDA
    detail::fail(ErrorCode::unsupported, "this moex was built without CUDA (asked for {}); use --device cpu",
                 to_string(opts.device));
#else
    const std::string why = cuda_unavailable_reason();
    if (!why.empty())
      detail::fail(ErrorCode::unsupported, "the model runtime cannot use {}: {}", to_string(opts.device), why);
#endif
  }
  auto impl = std::make_shared<Impl>();
  impl->cfg = load_model_config(dir);
  impl->dtype = opts.dtype;
  impl->device = opts.device;
  // Names and keys are validated before the (possibly long) weight loading.
  impl->impl = impl->resolve(opts.experts_implementation, {});
  const Checkpoint ck = Checkpoint::open(dir);
  impl->weights = model::load_weights(ck, impl->cfg, opts.dtype, opts.progress, opts.dequantize);
  if (opts.device.is_cpu()) model::pack_linears_for_cpu(impl->weights, omp_get_max_threads());
#ifdef MOEX_WITH_CUDA
  if (opts.device.is_cuda()) {
    // Uploaded once; the host copy is released (the CPU path is not used for this model).
    impl->cuda = std::make_shared<model::CudaModel>(impl->weights, impl->cfg.text, opts.device);
    impl->weights = {};
  }
#endif
  Model m;
  m.impl_ = std::move(impl);
  return m;
}

#define require(p) MOEX_CHECK((p) != nullptr, "Model used before from_pretrained()")

const ModelConfig& Model::config() const {
  require(impl_);
  return impl_->cfg;
}
DType Model::dtype() const {
  require(impl_);
  return impl_->dtype;
}
Device Model::device() const {
  require(impl_);
  return impl_->device;
}

void Model::set_experts_implementation(const ExpertsImplementation& e) {
  require(impl_);
  auto next = impl_->resolve(e, impl_->impl);
  for (const auto& [k, n] : next) {
    const std::string& old = impl_->impl.at(k);
    if (old != n && (old == kMegaMoe || n == kMegaMoe))
      detail::fail(ErrorCode::unsupported,
                   "cannot switch sub-config '{}' from {} to {} at run time: deepgemm_megamoe is a load-time choice "
                   "(reload the model with it)",
                   k, old, n);
  }
  impl_->impl = std::move(next);
}

std::map<std::string, std::string> Model::get_experts_implementation() const {
  require(impl_);
  return impl_->impl;
}

std::string Model::decoder_experts_backend() const {
  require(impl_);
  return impl_->decoder_backend();
}

Tensor Model::forward(const std::vector<std::vector<int64_t>>& ids) const {
  require(impl_);
  MOEX_CHECK(!ids.empty(), "forward: no sequences");
  const int64_t B = int64_t(ids.size()), L = int64_t(ids[0].size()), V = impl_->cfg.text.vocab_size;
  MOEX_CHECK(L > 0, "forward: empty sequence");
  for (size_t b = 0; b < ids.size(); ++b)
    MOEX_CHECK(int64_t(ids[b].size()) == L, "forward: sequence {} has {} tokens but sequence 0 has {} (forward needs equal lengths)",
               b, ids[b].size(), L);
  Tensor out = Tensor::empty(DType::f32, {B, L, V});
#ifdef MOEX_WITH_CUDA
  if (impl_->cuda) {
    const auto logits = impl_->cuda->forward(ids, impl_->decoder_backend());
    std::copy(logits.begin(), logits.end(), out.ptr<float>());
    return out;
  }
#endif
  std::vector<model::KvCache> caches(static_cast<size_t>(B));
  std::vector<model::SequenceChunk> chunks;
  for (int64_t b = 0; b < B; ++b) chunks.push_back({ids[size_t(b)].data(), L, &caches[size_t(b)]});
  const auto logits = model::forward_batch(impl_->weights, impl_->cfg.text, chunks, impl_->decoder_backend());
  std::copy(logits.begin(), logits.end(), out.ptr<float>());
  return out;
}

namespace {

// Picks the next token from one row of logits.
int64_t next_token(const float* logits, int64_t V, bool sample, double temperature, int64_t top_k, double top_p,
                   std::mt19937_64& rng) {
  if (!sample || temperature == 0.0) return std::max_element(logits, logits + V) - logits;  // ties → lowest id
  std::vector<double> l(logits, logits + V);
  for (auto& x : l) x /= temperature;
  std::vector<int64_t> order(static_cast<size_t>(V));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return l[size_t(a)] > l[size_t(b)]; });
  int64_t keep = V;
  if (top_k > 0) keep = std::min(keep, top_k);
  const double mx = l[size_t(order[0])];
  double den = 0;
  for (int64_t i = 0; i < keep; ++i) den += std::exp(l[size_t(order[size_t(i)])] - mx);
  if (top_p < 1.0) {
    // Smallest prefix (in descending probability) whose mass reaches top_p; at least one token.
    double cum = 0;
    int64_t n = 0;
    while (n < keep) {
      cum += std::exp(l[size_t(order[size_t(n)])] - mx) / den;
      ++n;
      if (cum >= top_p) break;
    }
    keep = std::max<int64_t>(n, 1);
    den = 0;
    for (int64_t i = 0; i < keep; ++i) den += std::exp(l[size_t(order[size_t(i)])] - mx);
  }
  const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng) * den;
  double cum = 0;
  for (int64_t i = 0; i < keep; ++i) {
    cum += std::exp(l[size_t(order[size_t(i)])] - mx);
    if (u < cum) return order[size_t(i)];
  }
  return order[size_t(keep - 1)];
}

}  // namespace

std::vector<std::vector<int64_t>> Model::generate(const std::vector<std::vector<int64_t>>& prompts,
                                                  const GenerateOptions& opts) const {
  require(impl_);
  const GenerationConfig& g = impl_->cfg.generation;
  const int64_t max_new = opts.max_new_tokens >= 0 ? opts.max_new_tokens : g.max_new_tokens.value_or(16);
  const bool sample = opts.do_sample.value_or(g.do_sample);
  const double temperature = opts.temperature.value_or(g.temperature);
  const int64_t top_k = opts.top_k.value_or(g.top_k);
  const double top_p = opts.top_p.value_or(g.top_p);
  const std::vector<int64_t> eos = opts.eos_token_id.value_or(g.eos_token_id);
  MOEX_CHECK(temperature >= 0, "generate: temperature {} must be >= 0", temperature);
  MOEX_CHECK(top_k >= 0, "generate: top_k {} must be >= 0", top_k);
  MOEX_CHECK(top_p > 0 && top_p <= 1, "generate: top_p {} must be in (0, 1]", top_p);
  const int64_t V = impl_->cfg.text.vocab_size;

  // Decode-stage switching (SPEC §4): grouped_mm → batched_mm for the decode steps on a non-CPU
  // device. The map itself is never modified, so it is intact however generation ends.
  const std::string prefill_backend = impl_->decoder_backend();
  const bool switch_decode = opts.decode_stage_switching && !impl_->device.is_cpu() && prefill_backend == "grouped_mm";
  const std::string decode_backend = switch_decode ? "batched_mm" : prefill_backend;

  std::mt19937_64 rng(opts.seed);
  for (const auto& prompt : prompts) MOEX_CHECK(!prompt.empty(), "generate: empty prompt");
  std::vector<std::vector<int64_t>> out(prompts.begin(), prompts.end());
  if (max_new <= 0 || prompts.empty()) return out;
#ifdef MOEX_WITH_CUDA
  if (impl_->cuda) {
    model::CudaGenerateOptions c;
    c.max_new_tokens = max_new;
    c.eos = eos;
    c.prefill_backend = prefill_backend;
    c.decode_backend = decode_backend;
    c.cuda_graphs = opts.cuda_graphs;
    if (sample && temperature != 0.0)  // greedy runs on the device; sampling reads the rows it needs
      c.pick = [&](const float* row, int64_t vocab) { return next_token(row, vocab, true, temperature, top_k, top_p, rng); };
    return impl_->cuda->generate(prompts, c);
  }
#endif
  // Prefill every prompt in one packed batch, then decode all unfinished sequences together.
  const size_t B = prompts.size();
  std::vector<model::KvCache> caches(B);
  std::vector<size_t> active(B);
  std::iota(active.begin(), active.end(), size_t(0));
  std::vector<model::SequenceChunk> chunks;
  for (size_t b = 0; b < B; ++b) chunks.push_back({out[b].data(), int64_t(out[b].size()), &caches[b]});
  // only each sequence's last row of logits: row i of `logits` belongs to the i-th active sequence
  model::Floats logits = model::forward_batch(impl_->weights, impl_->cfg.text, chunks, prefill_backend, model::LogitRows::last);
  std::vector<int64_t> last_row(B);
  std::iota(last_row.begin(), last_row.end(), int64_t(0));
  for (int64_t n = 0; n < max_new && !active.empty(); ++n) {
    std::vector<size_t> still;
    for (size_t i = 0; i < active.size(); ++i) {
      const size_t b = active[i];
      const int64_t tok = next_token(logits.data() + last_row[i] * V, V, sample, temperature, top_k, top_p, rng);
      out[b].push_back(tok);
      if (std::find(eos.begin(), eos.end(), tok) == eos.end()) still.push_back(b);
    }
    active = std::move(still);
    if (n + 1 == max_new || active.empty()) break;
    chunks.clear();
    for (size_t b : active) chunks.push_back({&out[b].back(), 1, &caches[b]});
    logits = model::forward_batch(impl_->weights, impl_->cfg.text, chunks, decode_backend, model::LogitRows::last);
    last_row.resize(active.size());
    std::iota(last_row.begin(), last_row.end(), int64_t(0));
  }
  return out;
}

std::vector<std::vector<int64_t>> parse_token_ids(std::string_view text) {
  std::vector<std::vector<int64_t>> out;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = std::min(text.find(';', start), text.size());
    const std::string_view seq = text.substr(start, end - start);
    std::vector<int64_t> ids;
    size_t p = 0;
    while (p <= seq.size()) {
      const size_t q = std::min(seq.find(',', p), seq.size());
      std::string_view tok = seq.substr(p, q - p);
      while (!tok.empty() && tok.front() == ' ') tok.remove_prefix(1);
      while (!tok.empty() && tok.back() == ' ') tok.remove_suffix(1);
      if (tok.empty()) {
        if (!(seq.find_first_not_of(' ') == std::string_view::npos && ids.empty()))
          detail::fail(ErrorCode::invalid_argument, "--ids: empty token id in sequence {} ('{}')", out.size(), seq);
      } else {
        int64_t v = 0;
        bool ok = tok.size() <= 18;
        for (char c : tok) ok = ok && c >= '0' && c <= '9';
        if (!ok) detail::fail(ErrorCode::invalid_argument, "--ids: '{}' is not a token id (a non-negative integer)", tok);
        for (char c : tok) v = v * 10 + (c - '0');
        ids.push_back(v);
      }
      p = q + 1;
    }
    if (ids.empty()) detail::fail(ErrorCode::invalid_argument, "--ids: sequence {} is empty (format: \"1,2,3;4,5,6\")", out.size());
    out.push_back(std::move(ids));
    start = end + 1;
  }
  return out;
}

void write_logits(const std::string& path, const Tensor& logits) {
  MOEX_CHECK(logits.dtype() == DType::f32 && logits.view().rank == 3, "write_logits: expected f32 [B, L, V], got {}",
             logits.view().describe());
  write_safetensors(path, {{"logits", logits.view()}}, {{"format", "pt"}});
}

std::string sequences_to_json(const std::vector<std::vector<int64_t>>& seqs) {
  std::string s = "[";
  for (size_t i = 0; i < seqs.size(); ++i) {
    s += i ? ", [" : "[";
    for (size_t j = 0; j < seqs[i].size(); ++j) s += (j ? ", " : "") + std::to_string(seqs[i][j]);
    s += "]";
  }
  return s + "]";
}

}  // namespace moex
