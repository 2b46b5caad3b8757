// routing/routers.cpp — the routers of the six model families (SPEC §3).
//
// Every router maps router logits [T, E] (f32) to top_k_index [T, K] (i32) and
// top_k_weights [T, K] (f32). All router arithmetic is f32 (float), as in the reference.
//
// Top-K convention (shared by every family):
//   * slots are written in descending order of the selection score;
//   * equal scores resolve to the LOWER expert index (+0.0 and -0.0 are equal);
//   * NaN ranks below every number (-inf included): a NaN expert only gets a slot when fewer
//     than K experts of the row hold a number, and then the lowest-index NaN experts fill the rest.
//   Scores are turned into 64-bit integer keys (order-preserving float bits in the high half,
//   the complemented expert index in the low half), so the sort uses plain integer comparison:
//   a strict total order even with NaN, hence no UB in std::partial_sort.
//
// NaN logits in the weights: a NaN logit counts as probability 0 (it is left out of the softmax
// and gets weight 0 if it is selected at all). A row whose logits are ALL NaN has no
// distribution: it gets experts 0..K-1 with NaN weights, so the garbage stays visible.
// Infinite logits follow the limit of the softmax (+inf entries share the mass equally; a row
// whose numbers are all -inf is uniform over them).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "moex/error.hpp"
#include "moex/routing.hpp"

namespace moex {

namespace {

constexpr RouterKind kAllKinds[] = {RouterKind::mixtral,   RouterKind::qwen2_moe,   RouterKind::qwen3_moe,
                                    RouterKind::olmoe,     RouterKind::deepseek_v3, RouterKind::gpt_oss};

const char* kind_name_or_null(RouterKind k) {
  switch (k) {
    case RouterKind::mixtral: return "mixtral";
    case RouterKind::qwen2_moe: return "qwen2_moe";
    case RouterKind::qwen3_moe: return "qwen3_moe";
    case RouterKind::olmoe: return "olmoe";
    case RouterKind::deepseek_v3: return "deepseek_v3";
    case RouterKind::gpt_oss: return "gpt_oss";
  }
  return nullptr;
}

std::string valid_kinds_list() {
  std::string s;
  for (RouterKind k : kAllKinds) {
    if (!s.empty()) s += ", ";
    s += kind_name_or_null(k);
  }
  return s;
}

[[noreturn]] void bad_arg(const std::string& msg) { throw Error(ErrorCode::invalid_argument, "route: " + msg); }

// Order-preserving map float -> uint32 (larger float, larger key). NaN -> 0 (below every number,
// -inf maps to 0x007FFFFF); -0.0 is folded onto +0.0 so they tie.
inline uint32_t ordered_bits(float v) {
  if (std::isnan(v)) return 0u;
  if (v == 0.0f) v = 0.0f;
  const uint32_t b = std::bit_cast<uint32_t>(v);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Key for "descending by value, then ascending by index": larger key = earlier slot.
inline uint64_t sel_key(float v, int64_t i) {
  return (uint64_t(ordered_bits(v)) << 32) | uint64_t(0xFFFFFFFFu - uint32_t(i));
}
inline int32_t key_index(uint64_t key) { return int32_t(0xFFFFFFFFu - uint32_t(key & 0xFFFFFFFFu)); }

// Top-k of v[0..n): writes the k chosen indices, best first, to out[0..k).
// keys: scratch of n entries.
void top_k(const float* v, int64_t n, int64_t k, uint64_t* keys, int32_t* out) {
  for (int64_t i = 0; i < n; ++i) keys[i] = sel_key(v[i], i);
  std::partial_sort(keys, keys + k, keys + n, std::greater<uint64_t>());
  for (int64_t j = 0; j < k; ++j) out[j] = key_index(keys[j]);
}

// In-place softmax over x[0..n) (f32). NaN entries are left out of the normalisation
// (probability 0) and are written as `nan_out` (NaN to keep them ranked last for a later top-K,
// 0 for final weights). Callers guarantee at least one non-NaN entry.
//   x: [n] logits in, probabilities out.
void softmax_inplace(float* x, int64_t n, float nan_out) {
  float m = -std::numeric_limits<float>::infinity();
  bool any = false;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(x[i])) continue;
    if (!any || x[i] > m) m = x[i];
    any = true;
  }
  if (std::isinf(m)) {
    // Limit of the softmax: the entries equal to the (infinite) max share the mass equally.
    int64_t cnt = 0;
    for (int64_t i = 0; i < n; ++i) cnt += (!std::isnan(x[i]) && x[i] == m) ? 1 : 0;
    const float share = 1.0f / float(cnt);
    for (int64_t i = 0; i < n; ++i) x[i] = std::isnan(x[i]) ? nan_out : (x[i] == m ? share : 0.0f);
    return;
  }
  float z = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(x[i])) continue;
    x[i] = std::exp(x[i] - m);
    z += x[i];
  }
  for (int64_t i = 0; i < n; ++i) x[i] = std::isnan(x[i]) ? nan_out : x[i] / z;
}

inline float sigmoidf(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// Per-thread scratch.
struct Scratch {
  float* score;        // [E] selection scores / probabilities
  float* aux;          // [E] DeepSeek-V3: biased scores c
  uint64_t* keys;      // [E] sort keys (DeepSeek-V3 also uses it for the group keys: n_group <= E)
  unsigned char* keep; // [n_group] DeepSeek-V3 group mask
};

// Softmax families (Mixtral, Qwen2/3-MoE, OLMoE).
//   l: [E] logits; idx, w: [K]
void route_softmax(const RouterConfig& cfg, bool renorm, const float* l, int32_t* idx, float* w, Scratch& s) {
  const int64_t E = cfg.num_experts, K = cfg.top_k;
  // p = softmax(l) over E; NaN logits stay NaN in p so that they rank last in the top-K.
  std::memcpy(s.score, l, size_t(E) * sizeof(float));
  softmax_inplace(s.score, E, std::numeric_limits<float>::quiet_NaN());
  top_k(s.score, E, K, s.keys, idx);  // idx: [K], best first
  float sum = 0.0f;
  for (int64_t j = 0; j < K; ++j) {
    const float p = s.score[idx[j]];
    w[j] = std::isnan(p) ? 0.0f : p;  // a NaN logit weighs 0
    sum += w[j];
  }
  if (renorm)  // sum >= max p >= 1/E > 0: the best expert always holds a number here
    for (int64_t j = 0; j < K; ++j) w[j] /= sum;
}

// DeepSeek-V3: sigmoid scores, group-limited selection on biased scores, unbiased weights.
//   l: [E] logits; bias: [E] or nullptr; idx, w: [K]
void route_deepseek_v3(const RouterConfig& cfg, const float* l, int32_t* idx, float* w, Scratch& s) {
  const int64_t E = cfg.num_experts, K = cfg.top_k;
  const int64_t G = cfg.n_group, gs = E / G;  // G groups of gs contiguous experts
  float* sc = s.score;  // s = sigmoid(l): [E]
  float* c = s.aux;     // c = s + bias:   [E]
  for (int64_t e = 0; e < E; ++e) {
    sc[e] = sigmoidf(l[e]);
    c[e] = cfg.e_score_correction_bias ? sc[e] + cfg.e_score_correction_bias[e] : sc[e];
  }
  // Group score = sum of the top 2 of c in the group (the single value when gs == 1), stored
  // directly as selection keys: keys[0..G) (a NaN in the top 2 makes the group rank last).
  for (int64_t g = 0; g < G; ++g) {
    const float* cg = c + g * gs;
    int64_t a = 0;  // best (ties -> lower index)
    for (int64_t i = 1; i < gs; ++i)
      if (ordered_bits(cg[i]) > ordered_bits(cg[a])) a = i;
    float gscore = cg[a];
    if (gs >= 2) {
      int64_t b = -1;  // second best
      for (int64_t i = 0; i < gs; ++i) {
        if (i == a) continue;
        if (b < 0 || ordered_bits(cg[i]) > ordered_bits(cg[b])) b = i;
      }
      gscore = cg[a] + cg[b];
    }
    s.keys[g] = sel_key(gscore, g);
  }
  // Keep the best topk_group groups (ties -> lower group index): keep: [G].
  std::partial_sort(s.keys, s.keys + cfg.topk_group, s.keys + G, std::greater<uint64_t>());
  std::memset(s.keep, 0, size_t(G));
  for (int64_t j = 0; j < cfg.topk_group; ++j) s.keep[key_index(s.keys[j])] = 1;
  // Masked c: experts of dropped groups get 0.0 (as the reference's masked_fill(0.0)); a NaN c
  // stays NaN so that it never wins over a number.
  for (int64_t e = 0; e < E; ++e)
    if (!s.keep[e / gs] && !std::isnan(c[e])) c[e] = 0.0f;
  top_k(c, E, K, s.keys, idx);  // idx: [K], best masked c first
  // Weights: the unbiased s at the chosen experts.
  float sum = 0.0f;
  for (int64_t j = 0; j < K; ++j) {
    const float v = sc[idx[j]];
    w[j] = std::isnan(v) ? 0.0f : v;  // a NaN logit weighs 0
    sum += w[j];
  }
  if (cfg.norm_topk_prob) {
    const float den = sum + 1e-20f;
    for (int64_t j = 0; j < K; ++j) w[j] /= den;
  }
  for (int64_t j = 0; j < K; ++j) w[j] *= cfg.routed_scaling_factor;
}

// GPT-OSS: top-K of the raw logits (router bias already added), softmax over those K only.
//   l: [E] logits; idx, w: [K]
void route_gpt_oss(const RouterConfig& cfg, const float* l, int32_t* idx, float* w, Scratch& s) {
  const int64_t E = cfg.num_experts, K = cfg.top_k;
  top_k(l, E, K, s.keys, idx);  // idx: [K], largest logit first
  for (int64_t j = 0; j < K; ++j) w[j] = l[idx[j]];
  softmax_inplace(w, K, 0.0f);  // w: [K]; the best slot holds a number, NaN slots weigh 0
}

void route_row(const RouterConfig& cfg, const float* l, int32_t* idx, float* w, Scratch& s) {
  const int64_t E = cfg.num_experts, K = cfg.top_k;
  bool any_number = false;
  for (int64_t e = 0; e < E && !any_number; ++e) any_number = !std::isnan(l[e]);
  if (!any_number) {  // no distribution at all: experts 0..K-1, NaN weights
    for (int64_t j = 0; j < K; ++j) {
      idx[j] = int32_t(j);
      w[j] = std::numeric_limits<float>::quiet_NaN();
    }
    return;
  }
  switch (cfg.kind) {
    case RouterKind::mixtral: route_softmax(cfg, true, l, idx, w, s); break;
    case RouterKind::qwen2_moe:
    case RouterKind::qwen3_moe:
    case RouterKind::olmoe: route_softmax(cfg, cfg.norm_topk_prob, l, idx, w, s); break;
    case RouterKind::deepseek_v3: route_deepseek_v3(cfg, l, idx, w, s); break;
    case RouterKind::gpt_oss: route_gpt_oss(cfg, l, idx, w, s); break;
  }
}

void validate(const RouterConfig& cfg, const float* logits, int64_t tokens, const int32_t* idx, const float* w) {
  const char* name = kind_name_or_null(cfg.kind);
  if (!name) bad_arg("unknown router kind " + std::to_string(int(cfg.kind)) + " (valid: " + valid_kinds_list() + ")");
  const std::string who = std::string(name) + " router: ";
  const int64_t E = cfg.num_experts, K = cfg.top_k;
  if (E < 1) bad_arg(who + "num_experts must be >= 1, got " + std::to_string(E));
  if (E > int64_t(std::numeric_limits<int32_t>::max()))
    bad_arg(who + "num_experts " + std::to_string(E) + " does not fit the i32 expert index");
  if (K < 1 || K > E)
    bad_arg(who + "top_k must be in [1, num_experts=" + std::to_string(E) + "], got " + std::to_string(K));
  if (tokens < 0) bad_arg(who + "tokens must be >= 0, got " + std::to_string(tokens));
  if (cfg.kind == RouterKind::deepseek_v3) {
    const int64_t G = cfg.n_group;
    if (G < 1) bad_arg(who + "n_group must be >= 1, got " + std::to_string(G));
    if (E % G != 0)
      bad_arg(who + "num_experts=" + std::to_string(E) + " is not divisible by n_group=" + std::to_string(G));
    if (cfg.topk_group < 1 || cfg.topk_group > G)
      bad_arg(who + "topk_group must be in [1, n_group=" + std::to_string(G) + "], got " +
              std::to_string(cfg.topk_group));
    const int64_t reachable = cfg.topk_group * (E / G);
    if (K > reachable)
      bad_arg(who + "top_k=" + std::to_string(K) + " exceeds the experts of the kept groups (topk_group=" +
              std::to_string(cfg.topk_group) + " x group size " + std::to_string(E / G) + " = " +
              std::to_string(reachable) + ")");
    if (!std::isfinite(cfg.routed_scaling_factor))
      bad_arg(who + "routed_scaling_factor must be finite, got " + std::to_string(cfg.routed_scaling_factor));
  }
  if (tokens > 0) {
    if (!logits) bad_arg(who + "logits is null with tokens=" + std::to_string(tokens));
    if (!idx) bad_arg(who + "top_k_index is null with tokens=" + std::to_string(tokens));
    if (!w) bad_arg(who + "top_k_weights is null with tokens=" + std::to_string(tokens));
  }
}

}  // namespace

std::string_view router_kind_name(RouterKind k) {
  const char* n = kind_name_or_null(k);
  return n ? std::string_view(n) : std::string_view("unknown");
}

RouterKind parse_router_kind(std::string_view s) {
  for (RouterKind k : kAllKinds)
    if (s == kind_name_or_null(k)) return k;
  throw Error(ErrorCode::not_found,
              "unknown router kind '" + std::string(s) + "' (valid: " + valid_kinds_list() + ")");
}

// logits: [T, E] f32 row-major; top_k_index: [T, K] i32; top_k_weights: [T, K] f32.
void route(const RouterConfig& cfg, const float* logits, int64_t tokens, int32_t* top_k_index, float* top_k_weights) {
  validate(cfg, logits, tokens, top_k_index, top_k_weights);
  if (tokens == 0) return;
  const int64_t E = cfg.num_experts, K = cfg.top_k;
  const int64_t G = cfg.kind == RouterKind::deepseek_v3 ? cfg.n_group : 1;

  // Parallel over tokens only when the work pays for the threads.
  [[maybe_unused]] const bool par = tokens >= 64 && tokens * E >= (int64_t(1) << 14);
  int nthreads = 1;
#ifdef _OPENMP
  if (par) nthreads = std::max(1, omp_get_max_threads());
#endif
  // All scratch allocated up front (outside the parallel region, so a bad_alloc is an ordinary
  // exception): per thread score [E], aux [E], keys [E], keep [G].
  std::vector<float> fbuf(size_t(nthreads) * size_t(E) * 2);
  std::vector<uint64_t> kbuf(size_t(nthreads) * size_t(E));
  std::vector<unsigned char> gbuf(size_t(nthreads) * size_t(G));
  auto scratch_of = [&](int t) {
    return Scratch{fbuf.data() + size_t(t) * size_t(E) * 2, fbuf.data() + size_t(t) * size_t(E) * 2 + size_t(E),
                   kbuf.data() + size_t(t) * size_t(E), gbuf.data() + size_t(t) * size_t(G)};
  };

#ifdef _OPENMP
#pragma omp parallel num_threads(nthreads) if (par)
#endif
  {
    int tid = 0;
#ifdef _OPENMP
    tid = omp_get_thread_num();
#endif
    Scratch s = scratch_of(tid);
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
    for (int64_t t = 0; t < tokens; ++t)
      route_row(cfg, logits + t * E, top_k_index + t * K, top_k_weights + t * K, s);
  }
}

}  // namespace moex
