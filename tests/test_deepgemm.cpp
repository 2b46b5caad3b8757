// The `deepgemm` backend on the GPU (backends/cuda/deepgemm.cu): bf16 and FP8 (f32 and UE8M0
// weight scales) experts against the f64 reference of the harness, in both layouts (contiguous
// padded for prefill, masked for decode), with the harness' edge cases and larger cases that cross
// every tile, K block and pipeline boundary, and the small-batch route; CUDA graph replay with new routing equals the direct
// call bit for bit; the opt-in pre-gathered token codes of the FP8 up GEMM (MOEX_CUDA_FP8_X_PREGATHER)
// equal the gathered default bit for bit; the requirement messages of this build's kernels. Without an sm_90 device
// every test is skipped with the reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "moex/check.hpp"
#include "moex/moex.hpp"
#include "cuda_test_util.hpp"
#include "test_util.hpp"

#ifdef MOEX_WITH_CUDA
#include <cuda_runtime.h>
#endif

using namespace moex;

namespace {

// deepgemm runs where a Hopper (9.0) device is present; anything else skips with the reason.
std::string no_hopper_reason() {
  const auto devs = cuda_devices();
  if (devs.empty()) return "no CUDA device: " + cuda_unavailable_reason();
  if (devs[0].compute_capability() != 90) return "deepgemm's kernels are sm_90a: device 0 is not compute capability 9.0";
  return {};
}
#define SKIP_WITHOUT_HOPPER()                                  \
  do {                                                         \
    const std::string why = no_hopper_reason();                \
    if (!why.empty()) GTEST_SKIP() << why;                     \
  } while (0)

// Sets MOEX_DEEPGEMM_LAYOUT for the scope (and restores what was there).
struct LayoutScope : test::ScopedEnv {
  explicit LayoutScope(const char* layout) : test::ScopedEnv("MOEX_DEEPGEMM_LAYOUT", layout) {}
};

// deepgemm's cases are bf16 experts (FP8 when q says so)
check::Case make_case(uint64_t seed, int64_t E, int64_t H, int64_t I, int64_t T, int64_t K, QuantSpec q) {
  return test::make_case(seed, DType::bf16, E, H, I, T, K, q);
}

// Cases every deepgemm call of this build must run (none may be skipped): several M, N and K
// tiles, partial K blocks (H = 208: 1.6 blocks of 128), I not a multiple of 128 (I = 192: the
// up half of a tile starts mid-block), skewed / dropped / one-expert routing, bias, interleaved
// and ungated layouts, T from decode sizes to several hundred.
std::vector<check::Case> must_run_cases(uint64_t seed, QuantSpec q) {
  std::vector<check::Case> out;
  auto add = [&](check::Case c) { out.push_back(c); };
  add(make_case(seed + 1, 8, 256, 384, 300, 2, q));
  { auto c = make_case(seed + 2, 16, 512, 192, 257, 4, q); c.routing = check::Routing::skewed; add(c); }
  { auto c = make_case(seed + 3, 12, 208, 128, 333, 3, q); c.routing = check::Routing::dropped; c.index_dtype = DType::i64; add(c); }
  { auto c = make_case(seed + 4, 8, 256, 256, 150, 2, q); c.spec.interleaved = true; c.spec.has_bias = true;
    c.spec.activation = ActivationSpec::gpt_oss(); add(c); }
  { auto c = make_case(seed + 5, 6, 320, 192, 160, 2, q); c.spec.has_gate = false; c.spec.activation.kind = Activation::gelu;
    c.spec.has_bias = true; add(c); }
  { auto c = make_case(seed + 6, 4, 512, 320, 300, 2, q); c.routing = check::Routing::one_expert; add(c); }
  add(make_case(seed + 7, 64, 512, 256, 1, 8, q));   // decode: one token, top-8 of 64
  add(make_case(seed + 8, 64, 512, 256, 8, 8, q));
  { auto c = make_case(seed + 9, 32, 256, 128, 64, 4, q); c.routing = check::Routing::empty_experts; add(c); }
  return out;
}

struct Tally {
  int passed = 0, skipped = 0;
  double worst = 0;
};

void run_all(const std::vector<check::Case>& cases, bool must_run, Tally& t) {
  for (const auto& c : cases) {
    const check::Result r = check::run_case("deepgemm", c, Device::cuda());
    if (r.status == check::Result::Status::skipped) {
      EXPECT_FALSE(must_run) << "deepgemm skipped " << c.describe() << ": " << r.message;
      EXPECT_NE(r.message.find("deepgemm"), std::string::npos) << r.message;  // a reason, naming the backend
      ++t.skipped;
      continue;
    }
    EXPECT_TRUE(test::deepgemm_accepts(c, r)) << c.describe() << ": " << r.message;
    if (test::deepgemm_accepts(c, r)) ++t.passed;
    t.worst = std::max(t.worst, r.rel_l2);
  }
}

class DeepGemmEquivalence : public ::testing::TestWithParam<const char*> {};

TEST_P(DeepGemmEquivalence, Bf16AndFp8MatchTheReference) {
  SKIP_WITHOUT_HOPPER();
  LayoutScope layout(GetParam());
  const uint64_t seed = 20261129;
  const QuantSpec kinds[] = {QuantSpec::none(), QuantSpec::fp8_block(128, 128, ScaleFormat::f32),
                             QuantSpec::fp8_block(128, 128, ScaleFormat::ue8m0)};
  for (const QuantSpec& q : kinds) {
    Tally t;
    run_all(must_run_cases(seed, q), true, t);
    std::printf("[%s] %s: %d passed, worst rel L2 %.2e\n", GetParam(), q.quantized() ? (q.scale_format == ScaleFormat::ue8m0 ? "fp8 ue8m0" : "fp8 f32") : "bf16",
                t.passed, t.worst);
  }
  // the harness' generated cases (edge cases first): each passes or is skipped with a reason
  Tally g;
  run_all(check::generate_cases(seed, 60, DType::bf16), false, g);
  std::printf("[%s] generated bf16 cases: %d passed, %d skipped (reasons checked), worst rel L2 %.2e\n", GetParam(), g.passed,
              g.skipped, g.worst);
  EXPECT_GE(g.passed, 8);  // most generated shapes have H or I off the 16-byte TMA rows: skipped
}

// "small": the small-batch route (batched_mm's GEMV kernels, FP8 through quant_decode.cu) forced at
// every T it takes; by default it serves a few rows per expert (deepgemm.cu small_batch_route).
INSTANTIATE_TEST_SUITE_P(Layouts, DeepGemmEquivalence, ::testing::Values("contiguous", "masked", "small"),
                         [](const auto& info) { return std::string(info.param); });

TEST(DeepGemm, RequirementsOfThisBuild) {
  SKIP_WITHOUT_HOPPER();
  Problem p;
  p.spec.num_experts = 8;
  p.spec.hidden = 256;
  p.spec.intermediate = 128;
  p.spec.dtype = DType::bf16;
  p.tokens = 4;
  p.top_k = 2;
  p.device = Device::cuda();
  EXPECT_TRUE(ExpertsInterface::global().supports("deepgemm", p).ok) << ExpertsInterface::global().supports("deepgemm", p).reason;
  Problem t = p;
  t.spec.transposed = true;
  Support s = ExpertsInterface::global().supports("deepgemm", t);
  EXPECT_FALSE(s.ok);
  EXPECT_NE(s.reason.find("grouped_mm"), std::string::npos) << s.reason;
  Problem odd = p;
  odd.spec.quant = QuantSpec::fp8_block();
  odd.spec.intermediate = 96;  // concatenated gate/up with I % 64 != 0
  s = ExpertsInterface::global().supports("deepgemm", odd);
  EXPECT_FALSE(s.ok);
  EXPECT_NE(s.reason.find("multiple of 64"), std::string::npos) << s.reason;
}

#ifdef MOEX_WITH_CUDA

// The small-batch route (deepgemm.cu small_batch_route), seen through the workspace it asks for:
// batched_mm's where the call goes to the GEMV kernels, deepgemm's own elsewhere. Host arithmetic
// only, so this runs without a GPU (the compute capability is injected).
TEST(DeepGemm, SmallBatchesTakeTheGemvRouteByPairsPerExpert) {
  for (const char* v : {"MOEX_DEEPGEMM_LAYOUT", "MOEX_DEEPGEMM_SMALL_T", "MOEX_CUDA_FP8_DECODE"}) unsetenv(v);
  auto deepgemm = ExpertsInterface::global().get("deepgemm");
  auto batched = ExpertsInterface::global().get("batched_mm");
  auto problem = [](int64_t E, int64_t K, int64_t T, QuantSpec q) {
    Problem p;
    p.spec.num_experts = E;
    p.spec.hidden = 256;
    p.spec.intermediate = 128;
    p.spec.dtype = DType::bf16;
    p.spec.quant = q;
    p.tokens = T;
    p.top_k = K;
    p.device = Device::cuda();
    p.compute_capability = 90;
    return p;
  };
  auto gemv = [&](const Problem& p) { return deepgemm->workspace_bytes(p) == batched->workspace_bytes(p); };
  const QuantSpec bf16 = QuantSpec::none(), fp8 = QuantSpec::fp8_block();
  // bf16: T <= 8 and T·K <= E
  EXPECT_TRUE(gemv(problem(256, 8, 1, bf16)));
  EXPECT_TRUE(gemv(problem(256, 8, 8, bf16)));    // 64 pairs, 256 experts
  EXPECT_FALSE(gemv(problem(256, 8, 16, bf16)));  // T = 16
  EXPECT_TRUE(gemv(problem(8, 2, 4, bf16)));      // 8 pairs, 8 experts
  EXPECT_FALSE(gemv(problem(8, 2, 8, bf16)));     // 16 pairs
  // FP8: T <= 64 and T·K <= 6·E
  EXPECT_TRUE(gemv(problem(256, 8, 64, fp8)));
  EXPECT_FALSE(gemv(problem(256, 8, 65, fp8)));   // above the decode path's T
  EXPECT_TRUE(gemv(problem(8, 2, 24, fp8)));      // 48 pairs = 6·E
  EXPECT_FALSE(gemv(problem(8, 2, 25, fp8)));
  // the switches
  setenv("MOEX_DEEPGEMM_LAYOUT", "masked", 1);
  EXPECT_FALSE(gemv(problem(256, 8, 1, fp8)));
  setenv("MOEX_DEEPGEMM_LAYOUT", "small", 1);
  EXPECT_TRUE(gemv(problem(8, 2, 64, bf16)));
  unsetenv("MOEX_DEEPGEMM_LAYOUT");
  setenv("MOEX_DEEPGEMM_SMALL_T", "0", 1);
  EXPECT_FALSE(gemv(problem(256, 8, 1, bf16)));
  unsetenv("MOEX_DEEPGEMM_SMALL_T");
}

using test::cuda_ok;
using test::to_host;


class DeepGemmGraph : public ::testing::TestWithParam<std::tuple<const char*, bool>> {};

// Capture once, replay with new routing (distinct experts, some dropped): equal to a direct call.
TEST_P(DeepGemmGraph, ReplayWithNewRoutingEqualsDirectCall) {
  SKIP_WITHOUT_HOPPER();
  const auto [layout_name, fp8] = GetParam();
  LayoutScope layout(layout_name);
  check::Case c = make_case(91, 16, 256, 128, 48, 4, fp8 ? QuantSpec::fp8_block() : QuantSpec::none());
  c.spec.has_bias = true;
  const check::Instance host = check::make_instance(c);
  const check::Instance dev = host.to(Device::cuda());
  const int64_t T = c.tokens, K = c.top_k, H = c.spec.hidden, E = c.spec.num_experts;
  Tensor out_graph = Tensor::empty(DType::bf16, {T, H}, Device::cuda());
  Tensor out_direct = Tensor::empty(DType::bf16, {T, H}, Device::cuda());
  auto backend = ExpertsInterface::global().get("deepgemm");
  ASSERT_TRUE(backend->graph_capturable());

  cudaStream_t stream = nullptr;
  cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  Workspace ws(Device::cuda());
  ws.reserve(backend->workspace_bytes(Problem::from(dev.experts(), dev.call(out_graph))));
  ws.set_frozen(true);  // an allocation inside the forward would throw
  RunOptions opts;
  opts.stream = stream;
  opts.workspace = &ws;
  experts_forward("deepgemm", dev.experts(), dev.call(out_graph), opts);  // warm-up
  cuda_ok(cudaStreamSynchronize(stream));

  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cuda_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  try {
    experts_forward("deepgemm", dev.experts(), dev.call(out_graph), opts);
  } catch (const std::exception& e) {
    cudaStreamEndCapture(stream, &graph);
    FAIL() << "forward threw during capture: " << e.what();
  }
  cuda_ok(cudaStreamEndCapture(stream, &graph));
  cuda_ok(cudaGraphInstantiate(&exec, graph, 0));

  std::mt19937_64 rng(5);
  for (int round = 0; round < 3; ++round) {
    std::vector<int32_t> idx(size_t(T * K));
    std::vector<float> w(size_t(T * K));
    std::vector<int32_t> perm(static_cast<size_t>(E));
    for (int64_t t = 0; t < T; ++t) {
      for (int32_t e = 0; e < E; ++e) perm[size_t(e)] = e;
      std::shuffle(perm.begin(), perm.end(), rng);
      for (int64_t j = 0; j < K; ++j) {
        idx[size_t(t * K + j)] = rng() % 9 == 0 ? -1 : perm[size_t(j)];
        w[size_t(t * K + j)] = float(rng() % 1000) / 1000.0f;
      }
    }
    ASSERT_EQ(host.top_k_index.view().dtype, DType::i32);
    ASSERT_EQ(host.top_k_weights.view().dtype, DType::f32);
    copy_bytes(dev.top_k_index.data(), Device::cuda(), idx.data(), Device::cpu(), idx.size() * 4);
    copy_bytes(dev.top_k_weights.data(), Device::cuda(), w.data(), Device::cpu(), w.size() * 4);
    cuda_ok(cudaMemset(out_graph.data(), 0xff, out_graph.nbytes()));
    cuda_ok(cudaMemset(out_direct.data(), 0x7f, out_direct.nbytes()));
    cuda_ok(cudaGraphLaunch(exec, stream));
    cuda_ok(cudaStreamSynchronize(stream));
    experts_forward("deepgemm", dev.experts(), dev.call(out_direct), opts);
    cuda_ok(cudaStreamSynchronize(stream));
    const auto a = to_host(out_graph), b = to_host(out_direct);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size()), 0) << layout_name << (fp8 ? " fp8" : " bf16") << " round " << round;
    // and right: the f64 reference (with the same activation quantization) on the new routing
    check::Instance h2 = host;
    std::memcpy(h2.top_k_index.data(), idx.data(), idx.size() * 4);
    std::memcpy(h2.top_k_weights.data(), w.data(), w.size() * 4);
    const std::vector<double> ref = check::reference_forward(h2.experts(), h2.call(TensorView(nullptr, DType::bf16, {T, H})));
    double err2 = 0, ref2 = 0;
    for (int64_t i = 0; i < T * H; ++i) {
      const double v = double(bf16_to_float(reinterpret_cast<const uint16_t*>(a.data())[i]));
      err2 += (v - ref[size_t(i)]) * (v - ref[size_t(i)]);
      ref2 += ref[size_t(i)] * ref[size_t(i)];
    }
    const double bar = fp8 ? test::kQgmmaFp8Bar : check::tolerance_for(c).rel_l2;
    EXPECT_LE(std::sqrt(err2 / std::max(ref2, 1e-300)), bar) << layout_name << " round " << round;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// MOEX_CUDA_FP8_X_PREGATHER=1 on deepgemm's QGMMA path (opt-in): the quantizer writes each pair's
// token codes at its layout row and the up GEMM loads them by TMA instead of gathering them with
// cp.async. Same codes, same scales, same MMAs in the same order: the output must equal the gathered
// default's bit for bit, on tiles where both warpgroups compute, tiles where warpgroup 1 is idle
// (skewed routing, few rows per expert), dropped slots, 2-CTA clusters (the up GEMMs), both scale
// formats, the fused h quantization (concatenated gate / up) and the separate pass (interleaved),
// both layouts.
TEST(DeepGemm, Fp8PregatheredTokenCodesAreBitIdentical) {
  SKIP_WITHOUT_HOPPER();
  std::vector<check::Case> cases;
  for (const QuantSpec& q : {QuantSpec::fp8_block(128, 128, ScaleFormat::f32), QuantSpec::fp8_block(128, 128, ScaleFormat::ue8m0)}) {
    cases.push_back(make_case(31, 8, 512, 384, 600, 2, q));  // ~150 rows per expert: both warpgroups busy
    { auto c = make_case(32, 16, 512, 256, 257, 4, q); c.routing = check::Routing::skewed; cases.push_back(c); }
    { auto c = make_case(33, 12, 256, 128, 333, 3, q); c.routing = check::Routing::dropped; cases.push_back(c); }
    { auto c = make_case(34, 8, 256, 256, 150, 2, q); c.spec.interleaved = true; c.spec.has_bias = true; cases.push_back(c); }
  }
  int compared = 0;
  for (const char* layout_name : {"contiguous", "masked"}) {
    LayoutScope layout(layout_name);
    for (const auto& c : cases) {
      const check::Instance host = check::make_instance(c);
      const check::Instance dev = host.to(Device::cuda());
      const int64_t T = c.tokens, H = c.spec.hidden;
      Tensor out_default = Tensor::empty(DType::bf16, {T, H}, Device::cuda());
      Tensor out_pregathered = Tensor::empty(DType::bf16, {T, H}, Device::cuda());
      cuda_ok(cudaMemset(out_default.data(), 0xff, out_default.nbytes()));
      cuda_ok(cudaMemset(out_pregathered.data(), 0x7f, out_pregathered.nbytes()));
      {
        test::ScopedEnv off("MOEX_CUDA_FP8_X_PREGATHER", nullptr);
        experts_forward("deepgemm", dev.experts(), dev.call(out_default));
      }
      {
        test::ScopedEnv on("MOEX_CUDA_FP8_X_PREGATHER", "1");
        experts_forward("deepgemm", dev.experts(), dev.call(out_pregathered));
      }
      cuda_ok(cudaDeviceSynchronize());
      const auto a = to_host(out_default), b = to_host(out_pregathered);
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size()), 0) << layout_name << " " << c.describe();
      ++compared;
    }
  }
  std::printf("FP8 QGMMA with pre-gathered token codes: %d cases compared bit for bit\n", compared);
}

INSTANTIATE_TEST_SUITE_P(Layouts, DeepGemmGraph,
                         ::testing::Combine(::testing::Values("contiguous", "masked", "small"), ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param)) + (std::get<1>(info.param) ? "_fp8" : "_bf16");
                         });

#endif  // MOEX_WITH_CUDA

}  // namespace
