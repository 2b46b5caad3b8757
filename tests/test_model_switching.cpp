// Which experts backend runs at each generation step (SPEC §4 decode-stage switching), observed
// through a recording backend registered like any user backend. On the CPU nothing switches; the
// experts-implementation map is never changed by generation, also when generation throws.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "moex/model.hpp"
#include "moex/moex.hpp"

using namespace moex;

namespace {

std::string fixture(const char* name) {
  const char* root = std::getenv("MOEX_SOURCE_DIR");
  return std::string(root ? root : ".") + "/tests/fixtures/" + name;
}

std::vector<int64_t>& recorded() {
  static std::vector<int64_t> calls;  // T of each experts call
  return calls;
}

void register_recorders() {
  auto& reg = ExpertsInterface::global();
  reg.register_backend("recording_mm", [](const Experts& ex, const ExpertsCall& call, const RunContext& ctx) {
    recorded().push_back(call.hidden.shape[0]);
    RunOptions o = ctx.options;
    experts_forward("grouped_mm", ex, call, o);
  });
  reg.register_backend("failing_decode_mm", [](const Experts& ex, const ExpertsCall& call, const RunContext& ctx) {
    if (call.hidden.shape[0] == 1) throw Error(ErrorCode::internal, "failing_decode_mm: decode step refused (test)");
    RunOptions o = ctx.options;
    experts_forward("grouped_mm", ex, call, o);
  });
}

// The test backends for the scope of one test, unregistered after it: the equivalence tests run
// every registered backend when the whole test binary runs in one process.
struct ScopedRecorders {
  ScopedRecorders() { register_recorders(); }
  ~ScopedRecorders() {
    auto& reg = ExpertsInterface::global();
    reg.unregister_backend("recording_mm");
    reg.unregister_backend("failing_decode_mm");
  }
};

}  // namespace

TEST(ModelSwitching, CpuDecodesWithTheSameBackendAndTheMapStays) {
  ScopedRecorders recorders;
  Model m = Model::from_pretrained(fixture("qwen3_moe"), {.experts_implementation = "recording_mm"});
  int64_t moe_layers = 0;
  for (int64_t l = 0; l < m.config().text.num_hidden_layers; ++l) moe_layers += m.config().text.is_moe_layer(l);
  ASSERT_GT(moe_layers, 0);
  for (bool switching : {true, false}) {
    recorded().clear();
    GenerateOptions g;
    g.max_new_tokens = 4;
    g.eos_token_id = std::vector<int64_t>{-1};
    g.decode_stage_switching = switching;
    const auto out = m.generate({{1, 5, 9, 13, 2, 7}}, g);
    ASSERT_EQ(out[0].size(), 10u);
    // the prefill (6 tokens) then 3 decode steps of 1 token, every MoE layer through recording_mm
    ASSERT_EQ(int64_t(recorded().size()), moe_layers * 4);
    for (int64_t i = 0; i < moe_layers; ++i) EXPECT_EQ(recorded()[size_t(i)], 6);
    for (size_t i = size_t(moe_layers); i < recorded().size(); ++i) EXPECT_EQ(recorded()[i], 1);
    EXPECT_EQ(m.get_experts_implementation().at(""), "recording_mm");
  }
}

TEST(ModelSwitching, MapIsIntactWhenGenerationThrows) {
  ScopedRecorders recorders;
  Model m = Model::from_pretrained(fixture("mixtral"), {.experts_implementation = "failing_decode_mm"});
  GenerateOptions g;
  g.max_new_tokens = 3;
  g.eos_token_id = std::vector<int64_t>{-1};
  EXPECT_THROW(m.generate({{1, 2, 3}}, g), Error);
  EXPECT_EQ(m.get_experts_implementation().at(""), "failing_decode_mm");
  m.set_experts_implementation("grouped_mm");
  EXPECT_EQ(m.generate({{1, 2, 3}}, g)[0].size(), 6u);
}
