// moex/routing.hpp — routers of the six model families (SPEC §3) and the routing plan the
// sorting backends share (pairs sorted by expert, per-expert offsets, inverse permutation).
#pragma once
#include <cstdint>
#include <string_view>
#include <vector>

#include "moex/tensor.hpp"

namespace moex {

enum class RouterKind { mixtral, qwen2_moe, qwen3_moe, olmoe, deepseek_v3, gpt_oss };
std::string_view router_kind_name(RouterKind k);
RouterKind parse_router_kind(std::string_view s);

struct RouterConfig {
  RouterKind kind = RouterKind::mixtral;
  int64_t num_experts = 0;      // E
  int64_t top_k = 1;            // K
  bool norm_topk_prob = true;   // renormalise the K weights (always on for mixtral, unused by gpt_oss)
  // DeepSeek-V3 only:
  int64_t n_group = 1;
  int64_t topk_group = 1;
  float routed_scaling_factor = 1.0f;
  const float* e_score_correction_bias = nullptr;  // [E] f32, selection only; nullptr = zeros
};

// Routes T tokens from their router logits (f32, [T, E]; GPT-OSS logits include the router
// bias). Writes top_k_index [T, K] and top_k_weights [T, K]. Ties go to the lower expert index;
// NaN logits never win a slot over a number. Throws Error(invalid_argument) on a bad config.
void route(const RouterConfig& cfg, const float* logits, int64_t tokens, int32_t* top_k_index, float* top_k_weights);

// Token–expert pairs sorted by expert (stable: by pair id t*K+j within an expert).
//   pair p = t*K + j; S = T*K; dropped slots (index < 0 or >= E) are left out.
struct RoutingPlan {
  int64_t tokens = 0, top_k = 0, num_experts = 0;
  std::vector<int64_t> expert_offsets;  // [E+1]; expert e owns sorted rows [offsets[e], offsets[e+1])
  std::vector<int32_t> sorted_pairs;    // [num_valid] pair id of each sorted row
  std::vector<int32_t> pair_to_row;     // [S] sorted row of each pair, -1 when dropped
  int64_t num_valid() const { return int64_t(sorted_pairs.size()); }
  int64_t count(int64_t e) const { return expert_offsets[size_t(e + 1)] - expert_offsets[size_t(e)]; }
};

// Builds the plan from a [T, K] i32/i64 CPU index tensor.
RoutingPlan build_routing_plan(const TensorView& top_k_index, int64_t num_experts);
// Same from raw indices.
RoutingPlan build_routing_plan(const int32_t* idx, int64_t tokens, int64_t top_k, int64_t num_experts);

// Padded ("TMA-aligned contiguous") layout: every expert's block starts at a multiple of `align`.
// Returns [E+1] padded offsets; rows between count and the next offset are padding (-1).
// The total never exceeds the static bound S + min(S, E) * (align - 1).
std::vector<int64_t> padded_expert_offsets(const RoutingPlan& plan, int64_t align);
inline int64_t padded_rows_bound(int64_t pairs, int64_t num_experts, int64_t align) {
  return pairs + (pairs < num_experts ? pairs : num_experts) * (align - 1);
}

}  // namespace moex
