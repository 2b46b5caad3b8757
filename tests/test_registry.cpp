// The registry: built-in names, unknown names, user backends used everywhere a built-in name is,
// and the requirement messages of the Hopper/Blackwell backends (capabilities injected).
#include <gtest/gtest.h>

#include <atomic>

#include "moex/check.hpp"
#include "moex/moex.hpp"

using namespace moex;

TEST(Registry, BuiltinNamesInOrder) {
  auto names = ExpertsInterface::global().names();
  ASSERT_GE(names.size(), 6u);
  const std::vector<std::string> want{"eager", "batched_mm", "grouped_mm", "deepgemm", "deepgemm_megamoe", "sonicmoe"};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(names[i], want[i]);
}

TEST(Registry, UnknownNameListsValidOnes) {
  try {
    ExpertsInterface::global().get("fastest_mm");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::not_found);
    const std::string msg = e.what();
    EXPECT_NE(msg.find("fastest_mm"), std::string::npos);
    EXPECT_NE(msg.find("grouped_mm"), std::string::npos);
    EXPECT_NE(msg.find("eager"), std::string::npos);
  }
}

TEST(Registry, EagerCannotBeRemoved) { EXPECT_THROW(ExpertsInterface::global().unregister_backend("eager"), Error); }

TEST(Registry, UserBackendWorksLikeABuiltinName) {
  // A user backend that delegates to grouped_mm and counts its calls.
  static std::atomic<int> calls{0};
  auto& reg = ExpertsInterface::global();
  reg.register_backend(
      "my_counting_mm",
      [](const Experts& ex, const ExpertsCall& call, const RunContext& ctx) {
        ++calls;
        RunOptions o = ctx.options;
        experts_forward("grouped_mm", ex, call, o);
      },
      [](const Problem& p) { return p.device.is_cpu() ? Support::yes() : Support::no("my_counting_mm runs on the CPU only"); });
  EXPECT_TRUE(reg.contains("my_counting_mm"));
  // through the equivalence harness, like every built-in backend
  int checked = 0;
  for (const auto& c : check::generate_cases(99, 25, DType::bf16)) {
    auto r = check::run_case("my_counting_mm", c, Device::cpu());
    EXPECT_EQ(r.status, check::Result::Status::passed) << c.describe() << ": " << r.message;
    ++checked;
  }
  EXPECT_GT(calls.load(), 0);
  // its reason reaches the caller through supports()
  Problem p;
  p.device = Device::cuda(0);
  EXPECT_EQ(reg.supports("my_counting_mm", p).reason, "my_counting_mm runs on the CPU only");
  // replacing keeps the position, unregistering removes it
  const auto before = reg.names();
  reg.register_backend("my_counting_mm", [](const Experts&, const ExpertsCall&, const RunContext&) {});
  EXPECT_EQ(reg.names(), before);
  EXPECT_TRUE(reg.unregister_backend("my_counting_mm"));
  EXPECT_FALSE(reg.contains("my_counting_mm"));
  EXPECT_FALSE(reg.unregister_backend("my_counting_mm"));
}

TEST(Registry, BadRegistrationsAreErrors) {
  auto& reg = ExpertsInterface::global();
  EXPECT_THROW(reg.register_backend("has space", [](const Experts&, const ExpertsCall&, const RunContext&) {}), Error);
  EXPECT_THROW(reg.register_backend("", [](const Experts&, const ExpertsCall&, const RunContext&) {}), Error);
  EXPECT_THROW(reg.register_backend("no_run", RunFn{}), Error);
  EXPECT_THROW(reg.register_backend(std::shared_ptr<const ExpertsBackend>{}), Error);
}

namespace {
Problem cuda_problem(int cc, DType dt = DType::bf16) {
  Problem p;
  p.spec.num_experts = 8;
  p.spec.hidden = 256;
  p.spec.intermediate = 128;
  p.spec.dtype = dt;
  p.tokens = 4;
  p.top_k = 2;
  p.device = Device::cuda(0);
  p.compute_capability = cc;
  return p;
}
std::string reason(const std::string& backend, const Problem& p) { return ExpertsInterface::global().supports(backend, p).reason; }
bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
}  // namespace

TEST(Registry, HopperBackendsStateTheirRequirements) {
  Problem cpu = cuda_problem(90);
  cpu.device = Device::cpu();
  for (const char* b : {"deepgemm", "deepgemm_megamoe", "sonicmoe"}) {
    const std::string r = reason(b, cpu);
    EXPECT_TRUE(has(r, "CUDA")) << b << ": " << r;
    EXPECT_TRUE(has(r, "grouped_mm")) << b << ": " << r;  // names what to use instead
  }
  EXPECT_TRUE(has(reason("deepgemm", cuda_problem(80)), "compute capability >= 9.0")) << reason("deepgemm", cuda_problem(80));
  EXPECT_TRUE(has(reason("deepgemm", cuda_problem(80)), "8.0"));
  EXPECT_TRUE(has(reason("deepgemm", cuda_problem(90, DType::f32)), "bf16 or FP8"));
  Problem fp4 = cuda_problem(90);
  fp4.spec.quant = QuantSpec::fp4_group();
  EXPECT_TRUE(has(reason("deepgemm", fp4), "FP4")) << reason("deepgemm", fp4);
  EXPECT_TRUE(has(reason("deepgemm", fp4), "FP8"));
  Problem stat = cuda_problem(90);
  stat.spec.quant = QuantSpec::fp8_block();
  stat.spec.quant.activation_scheme = ActivationScheme::static_;
  EXPECT_TRUE(has(reason("deepgemm", stat), "static"));
  Problem blk = cuda_problem(90);
  blk.spec.quant = QuantSpec::fp8_block(64, 64);
  EXPECT_TRUE(has(reason("deepgemm", blk), "128x128"));
  Problem f32s = cuda_problem(100);
  f32s.spec.quant = QuantSpec::fp8_block(128, 128, ScaleFormat::f32);
  EXPECT_TRUE(has(reason("deepgemm", f32s), "UE8M0")) << reason("deepgemm", f32s);
  EXPECT_TRUE(has(reason("deepgemm_megamoe", cuda_problem(90)), "10.0"));
  EXPECT_TRUE(has(reason("deepgemm_megamoe", cuda_problem(100)), "FP4"));
  Problem nogate = cuda_problem(90);
  nogate.spec.has_gate = false;
  EXPECT_TRUE(has(reason("sonicmoe", nogate), "gated"));
  EXPECT_TRUE(has(reason("sonicmoe", cuda_problem(90, DType::f16)), "bf16"));
}

TEST(Registry, CpuBackendsRunDynamicFp8AndRefuseWhatTheyCannotHonour) {
  Problem p = cuda_problem(0);
  p.device = Device::cpu();
  for (const char* b : {"eager", "batched_mm", "grouped_mm"}) {
    p.spec.quant = QuantSpec::fp8_block();
    EXPECT_TRUE(ExpertsInterface::global().supports(b, p).ok) << b;
    p.spec.quant = QuantSpec::fp4_group(32);
    EXPECT_TRUE(ExpertsInterface::global().supports(b, p).ok) << b;
    p.spec.quant = QuantSpec::fp8_block();
    p.spec.quant.activation_scheme = ActivationScheme::static_;
    auto s = ExpertsInterface::global().supports(b, p);
    EXPECT_FALSE(s.ok);
    EXPECT_TRUE(has(s.reason, "static")) << s.reason;
    p.spec.quant = QuantSpec::fp8_block(64, 64);
    s = ExpertsInterface::global().supports(b, p);
    EXPECT_FALSE(s.ok);
    EXPECT_TRUE(has(s.reason, "64x64")) << s.reason;
  }
}
