// tests/test_routers.cpp — the routers of SPEC §3 against hand-computed numbers.
// Expected values were computed independently in double precision (softmax / sigmoid / top-k /
// renormalisation by hand) and are pasted here as literals.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "moex/error.hpp"
#include "moex/routing.hpp"

namespace {

using moex::RouterConfig;
using moex::RouterKind;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr double kTol = 1e-6;

struct Routed {
  std::vector<int32_t> idx;
  std::vector<float> w;
};

RouterConfig make_cfg(RouterKind kind, int64_t E, int64_t K, bool norm = true) {
  RouterConfig c;
  c.kind = kind;
  c.num_experts = E;
  c.top_k = K;
  c.norm_topk_prob = norm;
  return c;
}

// Runs the router on [T, E] logits; outputs are poisoned first so every slot must be written.
Routed run(const RouterConfig& cfg, const std::vector<float>& logits) {
  const int64_t T = int64_t(logits.size()) / cfg.num_experts;
  Routed r;
  r.idx.assign(size_t(T * cfg.top_k), -777);
  r.w.assign(size_t(T * cfg.top_k), -777.0f);
  moex::route(cfg, logits.data(), T, r.idx.data(), r.w.data());
  return r;
}

void expect_idx(const Routed& r, const std::vector<int32_t>& want) {
  ASSERT_EQ(r.idx.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(r.idx[i], want[i]) << "slot " << i;
}
void expect_w(const Routed& r, const std::vector<double>& want, double tol = kTol) {
  ASSERT_EQ(r.w.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(r.w[i], want[i], tol) << "slot " << i;
}

template <class F>
void expect_invalid(F&& f) {
  try {
    f();
    ADD_FAILURE() << "expected moex::Error(invalid_argument)";
  } catch (const moex::Error& e) {
    EXPECT_EQ(e.code(), moex::ErrorCode::invalid_argument) << e.what();
    const std::string msg = e.what();
    EXPECT_FALSE(msg.empty());
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;  // one line
  }
}

const RouterKind kAllKinds[] = {RouterKind::mixtral,   RouterKind::qwen2_moe,   RouterKind::qwen3_moe,
                                RouterKind::olmoe,     RouterKind::deepseek_v3, RouterKind::gpt_oss};

// ---- names -------------------------------------------------------------------------------

TEST(RouterKindTest, NamesRoundTrip) {
  EXPECT_EQ(moex::router_kind_name(RouterKind::mixtral), "mixtral");
  EXPECT_EQ(moex::router_kind_name(RouterKind::qwen2_moe), "qwen2_moe");
  EXPECT_EQ(moex::router_kind_name(RouterKind::qwen3_moe), "qwen3_moe");
  EXPECT_EQ(moex::router_kind_name(RouterKind::olmoe), "olmoe");
  EXPECT_EQ(moex::router_kind_name(RouterKind::deepseek_v3), "deepseek_v3");
  EXPECT_EQ(moex::router_kind_name(RouterKind::gpt_oss), "gpt_oss");
  for (RouterKind k : kAllKinds) EXPECT_EQ(moex::parse_router_kind(moex::router_kind_name(k)), k);
}

TEST(RouterKindTest, UnknownNameThrowsListingValidOnes) {
  for (const char* bad : {"", "mixtral2", "Mixtral", "deepseek", "llama"}) {
    try {
      moex::parse_router_kind(bad);
      ADD_FAILURE() << "parse_router_kind accepted '" << bad << "'";
    } catch (const moex::Error& e) {
      EXPECT_TRUE(e.code() == moex::ErrorCode::not_found || e.code() == moex::ErrorCode::invalid_argument);
      const std::string msg = e.what();
      for (const char* ok : {"mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v3", "gpt_oss"})
        EXPECT_NE(msg.find(ok), std::string::npos) << msg;
    }
  }
}

// ---- softmax families ----------------------------------------------------------------------

TEST(RouterMixtral, SoftmaxTopKRenormalised) {
  // Token 0: p = softmax([1, 2, 0.5, 3]) = [0.085368894, 0.232056712, 0.051778851, 0.630795543];
  //   top-2 = experts 3, 1; renormalised: e^3/(e^3+e^2), e^2/(e^3+e^2).
  // Token 1: p = softmax([0.1, -0.2, 0.3, 0.0]); top-2 = experts 2, 0.
  const auto r = run(make_cfg(RouterKind::mixtral, 4, 2), {1.0f, 2.0f, 0.5f, 3.0f, 0.1f, -0.2f, 0.3f, 0.0f});
  expect_idx(r, {3, 1, 2, 0});
  expect_w(r, {0.7310585786300049, 0.26894142136999516, 0.549833997312478, 0.4501660026875221});
}

TEST(RouterMixtral, AlwaysRenormalisesEvenWithNormFlagOff) {
  const auto r = run(make_cfg(RouterKind::mixtral, 4, 2, /*norm=*/false), {1.0f, 2.0f, 0.5f, 3.0f});
  expect_idx(r, {3, 1});
  expect_w(r, {0.7310585786300049, 0.26894142136999516});
}

TEST(RouterQwen, NormTopkProbOffGivesRawSoftmax) {
  // p = softmax([0.5, -1, 2, 1.5, 0, 1]) =
  //   [0.093647401, 0.020895559, 0.419698532, 0.254560027, 0.056800020, 0.154398461]
  const std::vector<float> l = {0.5f, -1.0f, 2.0f, 1.5f, 0.0f, 1.0f};
  for (RouterKind k : {RouterKind::qwen2_moe, RouterKind::qwen3_moe, RouterKind::olmoe}) {
    SCOPED_TRACE(std::string(moex::router_kind_name(k)));
    const auto r = run(make_cfg(k, 6, 3, /*norm=*/false), l);
    expect_idx(r, {2, 3, 5});
    expect_w(r, {0.419698532, 0.254560027, 0.154398461});
  }
}

TEST(RouterQwen, NormTopkProbOnRenormalises) {
  const std::vector<float> l = {0.5f, -1.0f, 2.0f, 1.5f, 0.0f, 1.0f};
  for (RouterKind k : {RouterKind::qwen2_moe, RouterKind::qwen3_moe, RouterKind::olmoe}) {
    SCOPED_TRACE(std::string(moex::router_kind_name(k)));
    const auto r = run(make_cfg(k, 6, 3, /*norm=*/true), l);
    expect_idx(r, {2, 3, 5});
    expect_w(r, {0.506480391055654, 0.3071958857184984, 0.1863237232258476});
  }
}

TEST(RouterSoftmax, KEqualsEIsFullSortedSoftmax) {
  // softmax([0.3, -0.7, 1.1]) = [0.2782863948905397, 0.10237584343794708, 0.6193377616715132]
  for (bool norm : {false, true}) {
    const auto r = run(make_cfg(RouterKind::qwen3_moe, 3, 3, norm), {0.3f, -0.7f, 1.1f});
    expect_idx(r, {2, 0, 1});
    expect_w(r, {0.6193377616715132, 0.2782863948905397, 0.10237584343794708});
  }
  const auto m = run(make_cfg(RouterKind::mixtral, 3, 3), {0.3f, -0.7f, 1.1f});
  expect_idx(m, {2, 0, 1});
  expect_w(m, {0.6193377616715132, 0.2782863948905397, 0.10237584343794708});
}

TEST(RouterTies, ResolveToLowerExpertIndex) {
  // Experts 1, 2 and 4 tie on the largest logit: the two lower indices win, in index order.
  const std::vector<float> l = {1.0f, 2.0f, 2.0f, 0.0f, 2.0f};
  for (RouterKind k : {RouterKind::mixtral, RouterKind::qwen2_moe, RouterKind::olmoe, RouterKind::gpt_oss}) {
    SCOPED_TRACE(std::string(moex::router_kind_name(k)));
    const auto r = run(make_cfg(k, 5, 2), l);
    expect_idx(r, {1, 2});
    expect_w(r, {0.5, 0.5});
  }
  // All equal: experts 0..K-1, weights 1/K.
  const auto r = run(make_cfg(RouterKind::mixtral, 4, 3), {0.25f, 0.25f, 0.25f, 0.25f});
  expect_idx(r, {0, 1, 2});
  expect_w(r, {1.0 / 3, 1.0 / 3, 1.0 / 3});
  // +0.0 and -0.0 are equal: the lower index wins.
  const auto z = run(make_cfg(RouterKind::gpt_oss, 3, 1), {-1.0f, -0.0f, 0.0f});
  expect_idx(z, {1});
  expect_w(z, {1.0});
}

TEST(RouterTies, DeepSeekV3TiesResolveToLowerIndex) {
  auto cfg = make_cfg(RouterKind::deepseek_v3, 4, 2);
  const auto r = run(cfg, {0.5f, 1.0f, 1.0f, 1.0f});
  expect_idx(r, {1, 2});
  expect_w(r, {0.5, 0.5});
  // Group ties (n_group=2, topk_group=1): both groups score the same, group 0 is kept.
  cfg.n_group = 2;
  cfg.topk_group = 1;
  const auto g = run(cfg, {0.3f, 0.7f, 0.7f, 0.3f});
  expect_idx(g, {1, 0});
}

// ---- NaN / infinities ------------------------------------------------------------------------

TEST(RouterNaN, NaNLogitsAreNeverSelectedOverNumbers) {
  // Numbers at experts 1 (1.0) and 3 (0.5). NaN logits count as probability 0:
  // softmax over the numbers = [0.6224593312018546, 0.37754066879814546].
  const std::vector<float> l = {kNaN, 1.0f, kNaN, 0.5f};
  {
    const auto r = run(make_cfg(RouterKind::qwen2_moe, 4, 2, /*norm=*/false), l);
    expect_idx(r, {1, 3});
    expect_w(r, {0.6224593312018546, 0.37754066879814546});
  }
  {
    const auto r = run(make_cfg(RouterKind::mixtral, 4, 2), l);
    expect_idx(r, {1, 3});
    expect_w(r, {0.6224593312018546, 0.37754066879814546});
  }
  {  // GPT-OSS: softmax over the selected [1.0, 0.5].
    const auto r = run(make_cfg(RouterKind::gpt_oss, 4, 2), l);
    expect_idx(r, {1, 3});
    expect_w(r, {0.6224593312018546, 0.37754066879814546});
  }
  {  // DeepSeek-V3 (a NaN c ranks last even when its group is masked).
    auto cfg = make_cfg(RouterKind::deepseek_v3, 4, 2, /*norm=*/false);
    const auto r = run(cfg, {kNaN, 0.2f, 1.0f, kNaN});
    expect_idx(r, {2, 1});
    expect_w(r, {0.7310585786300049, 0.549833997312478});
    cfg.norm_topk_prob = true;
    expect_w(run(cfg, {kNaN, 0.2f, 1.0f, kNaN}), {0.570741522248336, 0.4292584777516641});
  }
}

TEST(RouterNaN, MoreSlotsThanNumbersFillWithLowestNaNAtWeightZero) {
  const std::vector<float> l = {kNaN, 2.0f, kNaN, 1.0f};
  const auto r = run(make_cfg(RouterKind::gpt_oss, 4, 3), l);
  expect_idx(r, {1, 3, 0});
  expect_w(r, {0.7310585786300049, 0.2689414213699951, 0.0});
  const auto m = run(make_cfg(RouterKind::mixtral, 4, 4), l);
  expect_idx(m, {1, 3, 0, 2});
  expect_w(m, {0.7310585786300049, 0.2689414213699951, 0.0, 0.0});
  // -inf is a number: it beats NaN.
  const auto n = run(make_cfg(RouterKind::olmoe, 3, 2, false), {kNaN, -kInf, 0.0f});
  expect_idx(n, {2, 1});
  expect_w(n, {1.0, 0.0});
}

TEST(RouterNaN, AllNaNRowDoesNotCrashAndStaysInRange) {
  // A row with no number at all has no distribution: experts 0..K-1, NaN weights. The other
  // rows are unaffected.
  for (RouterKind k : kAllKinds) {
    SCOPED_TRACE(std::string(moex::router_kind_name(k)));
    auto cfg = make_cfg(k, 4, 2);
    const auto r = run(cfg, {kNaN, kNaN, kNaN, kNaN, 1.0f, 2.0f, 0.5f, 3.0f});
    EXPECT_EQ(r.idx[0], 0);
    EXPECT_EQ(r.idx[1], 1);
    EXPECT_TRUE(std::isnan(r.w[0]));
    EXPECT_TRUE(std::isnan(r.w[1]));
    EXPECT_EQ(r.idx[2], 3);
    EXPECT_EQ(r.idx[3], 1);
    EXPECT_FALSE(std::isnan(r.w[2]));
    EXPECT_FALSE(std::isnan(r.w[3]));
  }
}

TEST(RouterNaN, InfiniteLogitsFollowTheLimit) {
  const auto r = run(make_cfg(RouterKind::qwen2_moe, 4, 2, false), {1.0f, kInf, -kInf, 0.0f});
  expect_idx(r, {1, 0});
  expect_w(r, {1.0, 0.0});
  const auto two = run(make_cfg(RouterKind::mixtral, 4, 2), {kInf, 1.0f, kInf, 0.0f});
  expect_idx(two, {0, 2});
  expect_w(two, {0.5, 0.5});
  const auto g = run(make_cfg(RouterKind::gpt_oss, 3, 2), {-kInf, 3.0f, kInf});
  expect_idx(g, {2, 1});
  expect_w(g, {1.0, 0.0});
}

// ---- DeepSeek-V3 -----------------------------------------------------------------------------

TEST(RouterDeepSeekV3, CorrectionBiasChangesSelectionNotWeights) {
  // s = sigmoid([2, 1, 0, -1]) = [0.8807970779778823, 0.7310585786300049, 0.5, 0.2689414213699951]
  const std::vector<float> l = {2.0f, 1.0f, 0.0f, -1.0f};
  auto cfg = make_cfg(RouterKind::deepseek_v3, 4, 2);
  cfg.routed_scaling_factor = 2.5f;
  // No bias: experts 0, 1; weights s/(s0+s1) * 2.5.
  auto r = run(cfg, l);
  expect_idx(r, {0, 1});
  expect_w(r, {1.3661227579017519, 1.1338772420982481});
  // Bias [0, 0, 0.5, 0.9]: c = [0.8808, 0.7311, 1.0, 1.1689] -> experts 3, 2, weighted by the
  // UNBIASED s: s3/(s3+s2)*2.5, s2/(s3+s2)*2.5.
  const std::vector<float> bias = {0.0f, 0.0f, 0.5f, 0.9f};
  cfg.e_score_correction_bias = bias.data();
  r = run(cfg, l);
  expect_idx(r, {3, 2});
  expect_w(r, {0.8743885226355472, 1.6256114773644528});
  // Without renormalisation: s * 2.5.
  cfg.norm_topk_prob = false;
  r = run(cfg, l);
  expect_idx(r, {3, 2});
  expect_w(r, {0.6723535534249878, 1.25});
}

TEST(RouterDeepSeekV3, TopkGroupMasksGroupWithLargestExpertButWeakerPair) {
  // E=8, n_group=4 (groups of 2), topk_group=2, K=2.
  // s = [0.95257413, 0.04742587 | 0.59868766, 0.57444252 | 0.58661758, 0.52497919 |
  //      0.11920292, 0.26894142]; group scores = [1.0, 1.17313018, 1.11159677, 0.38814434].
  // Group 0 holds the single largest expert (0.9526) but loses: groups 1, 2 are kept, and the
  // top-2 of the masked scores are experts 2 and 4.
  const std::vector<float> l = {3.0f, -3.0f, 0.4f, 0.3f, 0.35f, 0.1f, -2.0f, -1.0f};
  auto cfg = make_cfg(RouterKind::deepseek_v3, 8, 2);
  cfg.n_group = 4;
  cfg.topk_group = 2;
  cfg.routed_scaling_factor = 2.5f;
  auto r = run(cfg, l);
  expect_idx(r, {2, 4});
  expect_w(r, {1.2627288743836584, 1.2372711256163413});
  // With every group kept, expert 0 wins.
  cfg.topk_group = 4;
  r = run(cfg, l);
  expect_idx(r, {0, 2});
  // Bias [0,..,0, 0.5, 0.5] lifts group 3 (c sum 1.38814434) above group 2: kept groups 3 and 1,
  // chosen experts 7 (c 0.76894142) and 6 (c 0.61920292, above expert 2's 0.59868766);
  // weights from the unbiased s: s7/(s7+s6)*2.5, s6/(s7+s6)*2.5.
  const std::vector<float> bias = {0, 0, 0, 0, 0, 0, 0.5f, 0.5f};
  cfg.topk_group = 2;
  cfg.e_score_correction_bias = bias.data();
  r = run(cfg, l);
  expect_idx(r, {7, 6});
  expect_w(r, {1.7322255621428964, 0.7677744378571036});
}

TEST(RouterDeepSeekV3, MaskedGroupsScoreZeroLikeTheReference) {
  // The reference masks dropped groups with 0.0 (masked_fill), not -inf: when the kept group's
  // biased scores are negative, experts of a dropped group (score 0) win the slots.
  // s = sigmoid([1, 0.5, -0.5, -1]) = [0.73105858, 0.62245933, 0.37754067, 0.26894142];
  // c = s - 0.8 = [-0.0689, -0.1775, -0.4225, -0.5311]; group 0 (-0.2465) is kept over group 1
  // (-0.9535); masked c = [-0.0689, -0.1775, 0, 0] -> experts 2, 3 (tie, lower index first).
  const std::vector<float> l = {1.0f, 0.5f, -0.5f, -1.0f};
  const std::vector<float> bias = {-0.8f, -0.8f, -0.8f, -0.8f};
  auto cfg = make_cfg(RouterKind::deepseek_v3, 4, 2);
  cfg.n_group = 2;
  cfg.topk_group = 1;
  cfg.e_score_correction_bias = bias.data();
  const auto r = run(cfg, l);
  expect_idx(r, {2, 3});
  expect_w(r, {0.5839924640448316, 0.4160075359551684});
}

TEST(RouterDeepSeekV3, GroupSizeOneUsesTheSingleValue) {
  // E=4, n_group=4: each group score is its single expert's score.
  // s = sigmoid([0.1, 0.9, 0.5, 0.7]); kept groups 1, 3 -> experts 1, 3, no renormalisation.
  auto cfg = make_cfg(RouterKind::deepseek_v3, 4, 2, /*norm=*/false);
  cfg.n_group = 4;
  cfg.topk_group = 2;
  const auto r = run(cfg, {0.1f, 0.9f, 0.5f, 0.7f});
  expect_idx(r, {1, 3});
  expect_w(r, {0.7109495026250039, 0.6681877721681662});
}

// ---- GPT-OSS ---------------------------------------------------------------------------------

TEST(RouterGptOss, SoftmaxOverTheTopKOnly) {
  // top-2 of [1, 3, 2, -1] = experts 1, 2; softmax([3, 2]) = [0.7311, 0.2689], whereas softmax
  // over all E gives 0.6572 and 0.2418 at those experts.
  for (bool norm : {true, false}) {  // norm_topk_prob is not used by gpt_oss
    const auto r = run(make_cfg(RouterKind::gpt_oss, 4, 2, norm), {1.0f, 3.0f, 2.0f, -1.0f});
    expect_idx(r, {1, 2});
    expect_w(r, {0.7310585786300049, 0.2689414213699951});
    EXPECT_GT(std::fabs(r.w[0] - 0.6572330228318554), 0.05);
  }
  // K = E: the full softmax, sorted.
  const auto all = run(make_cfg(RouterKind::gpt_oss, 4, 4), {1.0f, 3.0f, 2.0f, -1.0f});
  expect_idx(all, {1, 2, 0, 3});
  expect_w(all, {0.6572330228318554, 0.24178251715880075, 0.0889468172974043, 0.01203764271193945});
}

// ---- many tokens -------------------------------------------------------------------------------

TEST(RouterMany, ParallelBatchMatchesRowByRowAndIsWellFormed) {
  const int64_t T = 3000, E = 64, K = 6;
  std::vector<float> logits(size_t(T * E));
  uint64_t st = 0x9E3779B97F4A7C15ull;
  for (auto& v : logits) {
    st = st * 6364136223846793005ull + 1442695040888963407ull;
    v = float(int((st >> 33) % 2001) - 1000) / 250.0f;  // [-4, 4], with many exact ties
  }
  std::vector<float> bias(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) bias[size_t(e)] = 0.01f * float(e % 7);
  for (RouterKind k : kAllKinds) {
    SCOPED_TRACE(std::string(moex::router_kind_name(k)));
    auto cfg = make_cfg(k, E, K);
    if (k == RouterKind::deepseek_v3) {
      cfg.n_group = 8;
      cfg.topk_group = 3;
      cfg.routed_scaling_factor = 2.5f;
      cfg.e_score_correction_bias = bias.data();
    }
    const auto all = run(cfg, logits);
    std::vector<int32_t> idx(static_cast<size_t>(K));
    std::vector<float> w(static_cast<size_t>(K));
    for (int64_t t = 0; t < T; ++t) {
      moex::route(cfg, logits.data() + t * E, 1, idx.data(), w.data());
      for (int64_t j = 0; j < K; ++j) {
        ASSERT_EQ(all.idx[size_t(t * K + j)], idx[size_t(j)]) << "t=" << t << " j=" << j;
        ASSERT_EQ(all.w[size_t(t * K + j)], w[size_t(j)]) << "t=" << t << " j=" << j;
      }
      // Distinct, in range; descending logits for the softmax families / gpt_oss, ties by index.
      for (int64_t j = 0; j < K; ++j) {
        ASSERT_GE(idx[size_t(j)], 0);
        ASSERT_LT(idx[size_t(j)], E);
        for (int64_t i = 0; i < j; ++i) ASSERT_NE(idx[size_t(i)], idx[size_t(j)]);
        if (k != RouterKind::deepseek_v3 && j > 0) {
          const float a = logits[size_t(t * E + idx[size_t(j - 1)])], b = logits[size_t(t * E + idx[size_t(j)])];
          ASSERT_TRUE(a > b || (a == b && idx[size_t(j - 1)] < idx[size_t(j)]));
        }
      }
      if (k != RouterKind::deepseek_v3) {
        double sum = 0;
        for (int64_t j = 0; j < K; ++j) sum += w[size_t(j)];
        ASSERT_NEAR(sum, 1.0, 1e-5);
      }
    }
  }
}

TEST(RouterMany, LargeBatchRuns) {
  const int64_t T = 16384, E = 256, K = 8;
  std::vector<float> logits(size_t(T * E));
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(float(i) * 0.37f) * 3.0f;
  auto cfg = make_cfg(RouterKind::deepseek_v3, E, K);
  cfg.n_group = 8;
  cfg.topk_group = 4;
  const auto r = run(cfg, logits);
  for (int32_t v : r.idx) ASSERT_TRUE(v >= 0 && v < E);
  for (float v : r.w) ASSERT_TRUE(std::isfinite(v));
  const auto m = run(make_cfg(RouterKind::mixtral, E, K), logits);
  for (int32_t v : m.idx) ASSERT_TRUE(v >= 0 && v < E);
}

// ---- bad input ---------------------------------------------------------------------------------

TEST(RouterBadInput, InvalidConfigsThrow) {
  std::vector<float> l(16, 0.0f);
  std::vector<int32_t> idx(16);
  std::vector<float> w(16);
  auto call = [&](RouterConfig c, int64_t T = 1) { moex::route(c, l.data(), T, idx.data(), w.data()); };
  for (RouterKind k : kAllKinds) {
    SCOPED_TRACE(std::string(moex::router_kind_name(k)));
    expect_invalid([&] { call(make_cfg(k, 0, 1)); });    // E = 0
    expect_invalid([&] { call(make_cfg(k, -3, 1)); });   // E < 0
    expect_invalid([&] { call(make_cfg(k, 4, 0)); });    // K = 0
    expect_invalid([&] { call(make_cfg(k, 4, -1)); });   // K < 0
    expect_invalid([&] { call(make_cfg(k, 4, 5)); });    // K > E
    expect_invalid([&] { call(make_cfg(k, 4, 2), -1); });  // T < 0
    const auto c = make_cfg(k, 4, 2);
    expect_invalid([&] { moex::route(c, nullptr, 1, idx.data(), w.data()); });
    expect_invalid([&] { moex::route(c, l.data(), 1, nullptr, w.data()); });
    expect_invalid([&] { moex::route(c, l.data(), 1, idx.data(), nullptr); });
    // T = 0 is valid (nothing to do), even with null buffers.
    EXPECT_NO_THROW(moex::route(c, nullptr, 0, nullptr, nullptr));
    EXPECT_NO_THROW(moex::route(c, l.data(), 0, idx.data(), w.data()));
  }
  expect_invalid([&] { call(make_cfg(static_cast<RouterKind>(99), 4, 2)); });
}

TEST(RouterBadInput, InvalidDeepSeekV3GroupConfigsThrow) {
  std::vector<float> l(16, 0.0f);
  std::vector<int32_t> idx(16);
  std::vector<float> w(16);
  auto ds = [](int64_t E, int64_t K, int64_t G, int64_t TG) {
    auto c = make_cfg(RouterKind::deepseek_v3, E, K);
    c.n_group = G;
    c.topk_group = TG;
    return c;
  };
  auto call = [&](const RouterConfig& c) { moex::route(c, l.data(), 1, idx.data(), w.data()); };
  expect_invalid([&] { call(ds(8, 2, 3, 1)); });   // E % n_group != 0
  expect_invalid([&] { call(ds(8, 2, 0, 1)); });   // n_group = 0
  expect_invalid([&] { call(ds(8, 2, 4, 0)); });   // topk_group = 0
  expect_invalid([&] { call(ds(8, 2, 4, 5)); });   // topk_group > n_group
  expect_invalid([&] { call(ds(8, 5, 4, 2)); });   // K > topk_group * group size (4)
  auto nan_scale = ds(8, 2, 4, 2);
  nan_scale.routed_scaling_factor = kNaN;
  expect_invalid([&] { call(nan_scale); });
  EXPECT_NO_THROW(call(ds(8, 4, 4, 2)));  // K == topk_group * group size is fine
  EXPECT_NO_THROW(call(ds(8, 8, 1, 1)));  // one group: K = E
  // The group fields are ignored by the other families.
  auto mix = ds(8, 2, 3, 7);
  mix.kind = RouterKind::mixtral;
  EXPECT_NO_THROW(call(mix));
}

}  // namespace
