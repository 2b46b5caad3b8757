// routing/plan.cpp — the routing plan: a counting sort of token–expert pairs by expert.
#include "core/check.hpp"
#include "moex/routing.hpp"

namespace moex {

namespace {

template <class Index>
RoutingPlan build_plan(const Index* idx, int64_t T, int64_t K, int64_t E) {
  MOEX_CHECK(T >= 0 && K >= 1 && E >= 1, "routing plan: bad sizes T={} K={} E={}", T, K, E);
  RoutingPlan plan;
  plan.tokens = T;
  plan.top_k = K;
  plan.num_experts = E;
  const int64_t S = T * K;
  // 1. histogram of pairs per expert (dropped slots counted nowhere)
  std::vector<int64_t> counts(size_t(E), 0);
  for (int64_t p = 0; p < S; ++p) {
    const int64_t e = int64_t(idx[p]);
    if (e >= 0 && e < E) ++counts[size_t(e)];
  }
  // 2. exclusive scan → offsets
  plan.expert_offsets.assign(size_t(E + 1), 0);
  for (int64_t e = 0; e < E; ++e) plan.expert_offsets[size_t(e + 1)] = plan.expert_offsets[size_t(e)] + counts[size_t(e)];
  // 3. stable scatter in pair order
  plan.sorted_pairs.assign(size_t(plan.expert_offsets[size_t(E)]), 0);
  plan.pair_to_row.assign(size_t(S), -1);
  std::vector<int64_t> cursor(plan.expert_offsets.begin(), plan.expert_offsets.end() - 1);
  for (int64_t p = 0; p < S; ++p) {
    const int64_t e = int64_t(idx[p]);
    if (e < 0 || e >= E) continue;
    const int64_t row = cursor[size_t(e)]++;
    plan.sorted_pairs[size_t(row)] = int32_t(p);
    plan.pair_to_row[size_t(p)] = int32_t(row);
  }
  return plan;
}

}  // namespace

RoutingPlan build_routing_plan(const int32_t* idx, int64_t tokens, int64_t top_k, int64_t num_experts) {
  return build_plan(idx, tokens, top_k, num_experts);
}

RoutingPlan build_routing_plan(const TensorView& top_k_index, int64_t num_experts) {
  MOEX_CHECK(top_k_index.rank == 2 && top_k_index.is_contiguous(), "routing plan: top_k_index must be a contiguous [T, K] tensor");
  MOEX_CHECK(top_k_index.device.is_cpu(), "routing plan: top_k_index must be on the CPU");
  const int64_t T = top_k_index.shape[0], K = top_k_index.shape[1];
  MOEX_CHECK(T * K < (int64_t(1) << 31), "routing plan: T*K = {} pairs exceeds 2^31", T * K);
  if (top_k_index.dtype == DType::i32) return build_plan(top_k_index.ptr<int32_t>(), T, K, num_experts);
  MOEX_CHECK(top_k_index.dtype == DType::i64, "routing plan: top_k_index must be i32 or i64");
  return build_plan(top_k_index.ptr<int64_t>(), T, K, num_experts);
}

std::vector<int64_t> padded_expert_offsets(const RoutingPlan& plan, int64_t align) {
  MOEX_CHECK(align >= 1, "padded layout: alignment must be >= 1 (got {})", align);
  const int64_t E = plan.num_experts;
  std::vector<int64_t> out(size_t(E + 1), 0);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t c = plan.count(e);
    out[size_t(e + 1)] = out[size_t(e)] + (c + align - 1) / align * align;
  }
  return out;
}

}  // namespace moex
