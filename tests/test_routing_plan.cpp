// Properties of the routing plan and the padded layout (pure index math, DESIGN habit 7).
#include <gtest/gtest.h>

#include <random>

#include "moex/moex.hpp"

using namespace moex;

TEST(RoutingPlan, PropertiesOnRandomRoutings) {
  std::mt19937 rng(11);
  for (int iter = 0; iter < 300; ++iter) {
    const int64_t E = 1 + rng() % 20, K = 1 + rng() % std::min<int64_t>(E, 6), T = rng() % 50;
    std::vector<int32_t> idx(size_t(T * K));
    for (auto& v : idx) v = int32_t(rng() % (E + 3)) - 1;  // includes -1 and >= E (dropped)
    const RoutingPlan plan = build_routing_plan(idx.data(), T, K, E);
    ASSERT_EQ(plan.expert_offsets.size(), size_t(E + 1));
    EXPECT_EQ(plan.expert_offsets[0], 0);
    int64_t valid = 0;
    for (auto v : idx) valid += (v >= 0 && v < E);
    EXPECT_EQ(plan.num_valid(), valid);
    EXPECT_EQ(plan.expert_offsets[size_t(E)], valid);
    for (int64_t e = 0; e < E; ++e) EXPECT_LE(plan.expert_offsets[size_t(e)], plan.expert_offsets[size_t(e + 1)]);
    // every valid pair appears exactly once, in its expert's block; permute then un-permute is the identity
    std::vector<int> seen(size_t(T * K), 0);
    for (int64_t e = 0; e < E; ++e)
      for (int64_t r = plan.expert_offsets[size_t(e)]; r < plan.expert_offsets[size_t(e + 1)]; ++r) {
        const int32_t p = plan.sorted_pairs[size_t(r)];
        EXPECT_EQ(idx[size_t(p)], e);
        EXPECT_EQ(plan.pair_to_row[size_t(p)], r);
        ++seen[size_t(p)];
        if (r > plan.expert_offsets[size_t(e)]) EXPECT_LT(plan.sorted_pairs[size_t(r - 1)], p);  // stable
      }
    for (int64_t p = 0; p < T * K; ++p) {
      const bool ok = idx[size_t(p)] >= 0 && idx[size_t(p)] < E;
      EXPECT_EQ(seen[size_t(p)], ok ? 1 : 0);
      if (!ok) EXPECT_EQ(plan.pair_to_row[size_t(p)], -1);
    }
    // padded layout: aligned starts, room for every count, within the static bound
    for (int64_t align : {1, 8, 128}) {
      const auto pad = padded_expert_offsets(plan, align);
      for (int64_t e = 0; e < E; ++e) {
        EXPECT_EQ(pad[size_t(e)] % align, 0);
        EXPECT_GE(pad[size_t(e + 1)] - pad[size_t(e)], plan.count(e));
        EXPECT_LT(pad[size_t(e + 1)] - pad[size_t(e)], plan.count(e) + align);
      }
      EXPECT_LE(pad[size_t(E)], padded_rows_bound(T * K, E, align));
    }
  }
}

TEST(RoutingPlan, TensorEntryPointAndErrors) {
  std::vector<int64_t> idx{2, 0, 2, 1, -5, 2};
  TensorView v(idx.data(), DType::i64, {3, 2});
  const RoutingPlan plan = build_routing_plan(v, 3);
  EXPECT_EQ(plan.expert_offsets, (std::vector<int64_t>{0, 1, 2, 5}));
  EXPECT_EQ(plan.sorted_pairs, (std::vector<int32_t>{1, 3, 0, 2, 5}));
  TensorView bad(idx.data(), DType::f32, {3, 2});
  EXPECT_THROW(build_routing_plan(bad, 3), Error);
  EXPECT_THROW(padded_expert_offsets(plan, 0), Error);
}
