// The equivalence harness over every registered backend on the CPU: seeded random problems with
// the edge cases first, each against the f64 reference with SPEC §8 tolerances; unsupported
// backends are reported as skipped with their reason, never silently passed.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include "moex/check.hpp"
#include "moex/moex.hpp"
#include "test_util.hpp"

using namespace moex;

namespace {

uint64_t seed_from_env() {
  const char* s = std::getenv("MOEX_TEST_SEED");
  return s ? std::strtoull(s, nullptr, 10) : 20261129;
}

// Registers `name`: grouped_mm that forgets the last output row (the harness must see it unwritten).
void register_skip_last_row(const char* name) {
  ExpertsInterface::global().register_backend(name, [](const Experts& ex, const ExpertsCall& call, const RunContext& ctx) {
    const int64_t T = call.hidden.shape[0];
    Tensor tmp = Tensor::empty(call.out.dtype, {T, call.out.shape[1]});
    RunOptions o = ctx.options;
    experts_forward("grouped_mm", ex, ExpertsCall{call.hidden, call.top_k_index, call.top_k_weights, tmp}, o);
    std::memcpy(call.out.data, tmp.data(), size_t(T - 1) * size_t(call.out.shape[1]) * dtype_size(call.out.dtype));
  });
}

class Equivalence : public ::testing::TestWithParam<DType> {};

TEST_P(Equivalence, EveryBackendMatchesTheReference) {
  const DType dt = GetParam();
  const uint64_t seed = seed_from_env();
  std::printf("seed %llu (set MOEX_TEST_SEED to change)\n", (unsigned long long)seed);
  const auto backends = ExpertsInterface::global().names();
  const auto cases = check::generate_cases(seed + uint64_t(dt), 200, dt);
  int passed = 0, skipped = 0;
  for (const auto& c : cases) {
    const auto results = check::run_case(backends, c, Device::cpu());
    for (size_t b = 0; b < backends.size(); ++b) {
      const auto& r = results[b];
      if (r.status == check::Result::Status::skipped) {
        ++skipped;
        EXPECT_FALSE(r.message.empty()) << backends[b] << " skipped without a reason";
        continue;
      }
      EXPECT_EQ(r.status, check::Result::Status::passed) << backends[b] << " " << c.describe() << ": " << r.message;
      ++passed;
    }
  }
  // the three CPU backends must have run every case
  EXPECT_GE(passed, 3 * int(cases.size()));
  std::printf("%d passed, %d skipped (unsupported on the CPU, with reasons)\n", passed, skipped);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, Equivalence, ::testing::Values(DType::f32, DType::f16, DType::bf16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(Equivalence, HarnessCatchesAWrongBackend) {
  // A backend that forgets the last output row must fail (unwritten elements are detected),
  // and one that drops the routing weight must fail on the error bound: the harness can fail.
  auto& reg = ExpertsInterface::global();
  register_skip_last_row("broken_skip_row");
  reg.register_backend("broken_weights", [](const Experts& ex, const ExpertsCall& call, const RunContext& ctx) {
    Tensor ones = Tensor::empty(DType::f32, {call.top_k_weights.shape[0], call.top_k_weights.shape[1]});
    for (int64_t i = 0; i < ones.numel(); ++i) ones.ptr<float>()[i] = 1.0f;
    RunOptions o = ctx.options;
    experts_forward("grouped_mm", ex, ExpertsCall{call.hidden, call.top_k_index, ones, call.out}, o);
  });
  check::Case c;
  c.seed = 5;
  c.spec.num_experts = 4;
  c.spec.hidden = 32;
  c.spec.intermediate = 16;
  c.spec.dtype = DType::f32;
  c.tokens = 6;
  c.top_k = 2;
  auto r1 = check::run_case("broken_skip_row", c);
  EXPECT_EQ(r1.status, check::Result::Status::failed);
  EXPECT_NE(r1.message.find("never written"), std::string::npos) << r1.message;
  auto r2 = check::run_case("broken_weights", c);
  EXPECT_EQ(r2.status, check::Result::Status::failed);
  reg.unregister_backend("broken_skip_row");
  reg.unregister_backend("broken_weights");
}

// A prepared case (instance and references made once) gives run_case's verdicts run after run, with a
// fresh poisoned output each time: a broken backend between two good runs still fails.
TEST(Equivalence, PreparedCaseRunsLikeRunCase) {
  auto& reg = ExpertsInterface::global();
  register_skip_last_row("broken_skip_row2");
  const check::Case c = test::make_case(11, DType::bf16, 6, 48, 32, 9, 2);
  const check::PreparedCase prepared(c, Device::cpu());
  const auto direct = check::run_case("grouped_mm", c);
  const auto first = prepared.run("grouped_mm");
  const auto broken = prepared.run("broken_skip_row2");
  const auto again = prepared.run("grouped_mm");
  EXPECT_EQ(direct.status, check::Result::Status::passed) << direct.message;
  EXPECT_EQ(first.status, check::Result::Status::passed) << first.message;
  EXPECT_EQ(again.status, check::Result::Status::passed) << again.message;
  EXPECT_EQ(first.rel_l2, direct.rel_l2);
  EXPECT_EQ(again.rel_l2, direct.rel_l2);
  EXPECT_EQ(broken.status, check::Result::Status::failed);
  EXPECT_NE(broken.message.find("never written"), std::string::npos) << broken.message;
  EXPECT_EQ(prepared.spec().seed, 11u);
  reg.unregister_backend("broken_skip_row2");
}

TEST(Equivalence, DeterministicAcrossRunsAndThreadCounts) {
  // Each output element is computed by one thread in a fixed order: bitwise equal results.
  check::Case c;
  c.seed = 77;
  c.spec.num_experts = 16;
  c.spec.hidden = 200;
  c.spec.intermediate = 96;
  c.spec.dtype = DType::bf16;
  c.tokens = 57;
  c.top_k = 4;
  c.routing = check::Routing::skewed;
  const auto in = check::make_instance(c);
  for (const char* b : {"eager", "batched_mm", "grouped_mm"}) {
    Tensor first = Tensor::empty(DType::bf16, {57, 200});
    RunOptions o1;
    o1.num_threads = 1;
    experts_forward(b, in.experts(), in.call(first), o1);
    for (int threads : {1, 2, 3, 4}) {
      Tensor again = Tensor::empty(DType::bf16, {57, 200});
      RunOptions o;
      o.num_threads = threads;
      experts_forward(b, in.experts(), in.call(again), o);
      EXPECT_EQ(std::memcmp(first.data(), again.data(), first.nbytes()), 0) << b << " with " << threads << " threads";
    }
  }
}

TEST(Equivalence, DroppedSlotsContributeZeroInEveryBackend) {
  // Same problem twice: once with slot 1 dropped (-1 and E), once with slot 1 given weight 0.
  check::Case c;
  c.seed = 3;
  c.spec.num_experts = 6;
  c.spec.hidden = 48;
  c.spec.intermediate = 20;
  c.spec.dtype = DType::f32;
  c.tokens = 10;
  c.top_k = 2;
  auto in = check::make_instance(c);
  Tensor zero_w = Tensor::empty(DType::f32, {10, 2});
  std::memcpy(zero_w.data(), in.top_k_weights.data(), zero_w.nbytes());
  for (int t = 0; t < 10; ++t) zero_w.ptr<float>()[t * 2 + 1] = 0.0f;
  for (int t = 0; t < 10; ++t) in.top_k_index.ptr<int32_t>()[t * 2 + 1] = (t % 2) ? -1 : 6 + t;
  for (const char* b : {"eager", "batched_mm", "grouped_mm"}) {
    Tensor dropped = Tensor::empty(DType::f32, {10, 48});
    experts_forward(b, in.experts(), in.call(dropped));
    // reference: only slot 0 counts
    auto ref = check::reference_forward(in.experts(), ExpertsCall{in.hidden, in.top_k_index, zero_w, dropped});
    for (int i = 0; i < 10 * 48; ++i) EXPECT_NEAR(dropped.ptr<float>()[i], ref[size_t(i)], 1e-5) << b;
  }
}

}  // namespace

TEST(Equivalence, ManyRowsPerExpertAcrossChunksAndTiles) {
  // hundreds of rows on one expert (past the 64-row chunks of the fused up projection and the AMX
  // row blocks), sizes off every tile, every layout
  for (DType dt : {DType::f32, DType::bf16}) {
    for (int variant = 0; variant < 4; ++variant) {
      check::Case c;
      c.seed = 1000 + uint64_t(variant);
      c.spec.num_experts = 3;
      c.spec.hidden = 136;
      c.spec.intermediate = 200;
      c.spec.dtype = dt;
      c.spec.transposed = variant == 1;
      c.spec.interleaved = variant == 2;
      c.spec.has_bias = variant == 2;
      c.spec.has_gate = variant != 3;
      if (variant == 2) c.spec.activation = ActivationSpec::gpt_oss();
      c.tokens = 300;
      c.top_k = 2;
      c.routing = check::Routing::one_expert;
      for (const char* b : {"eager", "batched_mm", "grouped_mm"}) {
        const auto r = check::run_case(b, c);
        EXPECT_EQ(r.status, check::Result::Status::passed) << b << " " << c.describe() << ": " << r.message;
      }
    }
  }
}
