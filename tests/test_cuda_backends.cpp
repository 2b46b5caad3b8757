// The CUDA backends (eager, batched_mm, grouped_mm) on the GPU: the equivalence harness against
// the f64 reference for f32/f16/bf16 with the edge cases, plus larger cases that cross every
// tile and pipeline boundary; CUDA graph capture and replay with new routing data (bit for bit
// against a direct call); no allocation in a forward after warm-up; requirement messages; the
// quantized cases on batched_mm with the tensor-core FP8 GEMV forced on and off.
// Without a CUDA device every test is skipped with the reason.
//
// MOEX_CUDA_PERF=1 also runs CudaPerf.Shapes: the SPEC §9 shapes timed with CUDA events (graph
// replay for the capturable backends); MOEX_CUDA_PERF_QUANT=none,fp8 times bf16 and FP8 experts.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "moex/check.hpp"
#include "moex/moex.hpp"
#include "cuda_test_util.hpp"
#include "test_util.hpp"

#ifdef MOEX_WITH_CUDA
#include <cuda_runtime.h>

#include "backends/cuda/plan_probe.hpp"
#endif

using namespace moex;

namespace {

using test::ScopedEnv;

const std::vector<std::string> kCudaBackends = {"eager", "batched_mm", "grouped_mm"};

uint64_t seed_from_env() {
  const char* s = std::getenv("MOEX_TEST_SEED");
  return s ? std::strtoull(s, nullptr, 10) : 20261129;
}
int count_from_env(int dflt) {
  const char* s = std::getenv("MOEX_CUDA_TEST_CASES");
  return s ? std::atoi(s) : dflt;
}

using test::make_case;

// Cases larger than the generator's: several M/N/K tiles, pipeline depth, 16-byte and
// element-wise load paths, every layout variant.
std::vector<check::Case> large_cases(uint64_t seed, DType dt) {
  std::vector<check::Case> out;
  auto add = [&](check::Case c) { out.push_back(c); };
  add(make_case(seed + 1, dt, 8, 256, 384, 300, 2));                       // several tiles everywhere
  { auto c = make_case(seed + 2, dt, 16, 512, 192, 257, 4); c.routing = check::Routing::skewed; add(c); }
  { auto c = make_case(seed + 3, dt, 8, 384, 256, 200, 2); c.spec.transposed = true; add(c); }
  { auto c = make_case(seed + 4, dt, 8, 256, 200, 150, 2); c.spec.transposed = true; c.spec.interleaved = true;
    c.spec.has_bias = true; c.spec.activation = ActivationSpec::gpt_oss(); add(c); }
  { auto c = make_case(seed + 5, dt, 8, 264, 136, 190, 3); c.spec.interleaved = true; c.spec.has_bias = true; add(c); }
  { auto c = make_case(seed + 6, dt, 6, 320, 160, 160, 2); c.spec.has_gate = false; c.spec.activation.kind = Activation::gelu;
    c.spec.has_bias = true; add(c); }
  { auto c = make_case(seed + 7, dt, 6, 320, 160, 160, 2); c.spec.has_gate = false; c.spec.transposed = true; add(c); }
  { auto c = make_case(seed + 8, dt, 12, 200, 100, 333, 3); c.routing = check::Routing::dropped; c.index_dtype = DType::i64; add(c); }
  { auto c = make_case(seed + 9, dt, 4, 130, 66, 140, 2); c.routing = check::Routing::one_expert; add(c); }   // odd sizes
  { auto c = make_case(seed + 10, dt, 4, 136, 72, 129, 4); c.routing = check::Routing::one_expert; c.spec.transposed = true;
    add(c); }
  { auto c = make_case(seed + 11, dt, 8, 256, 128, 260, 2); c.integer_valued = true; c.spec.activation.kind = Activation::relu;
    add(c); }
  { auto c = make_case(seed + 12, dt, 8, 256, 128, 260, 2); c.integer_valued = true; c.spec.activation.kind = Activation::relu;
    c.spec.transposed = true; c.spec.has_bias = true; add(c); }
  // Hopper TMA kernel (sm90_tma_grouped_gemm.cu): several 256-wide N tiles with a partial one
  // (I = 704 = 5.5 × 128 gated columns), 11 k tiles of 64 over I, persistent blocks walking
  // more work items than SMs, partial and skewed row blocks, bias on the concatenated layout.
  { auto c = make_case(seed + 13, dt, 8, 1024, 704, 700, 2); c.routing = check::Routing::skewed; c.spec.has_bias = true;
    add(c); }
  { auto c = make_case(seed + 14, dt, 16, 512, 328, 900, 4); c.spec.interleaved = true; add(c); }
  return out;
}

// FP8 block-scaled and FP4 experts (SPEC §6) beyond the generator's four: several GEMM tiles and
// 128-k blocks, the 16-byte and element-wise load paths (H, I multiples of 16/32 or not),
// partial scale blocks, both layouts, decode-sized T, every epilogue.
std::vector<check::Case> quant_cases(uint64_t seed, DType dt) {
  std::vector<check::Case> out;
  auto add = [&](check::Case c, QuantSpec q) {
    c.spec.quant = q;
    out.push_back(c);
  };
  const QuantSpec fp8 = QuantSpec::fp8_block(128, 128, ScaleFormat::f32);
  const QuantSpec fp8_ue8m0 = QuantSpec::fp8_block(128, 128, ScaleFormat::ue8m0);
  add(make_case(seed + 21, dt, 8, 512, 384, 300, 2), fp8);                                  // 16-byte paths, many tiles
  add(make_case(seed + 22, dt, 8, 512, 384, 1, 4), fp8_ue8m0);                              // decode, T = 1
  { auto c = make_case(seed + 23, dt, 16, 264, 136, 200, 4); c.routing = check::Routing::skewed; add(c, fp8); }  // partial blocks
  { auto c = make_case(seed + 24, dt, 6, 200, 100, 77, 2); c.spec.has_bias = true; add(c, fp8_ue8m0); }  // element-wise loads
  { auto c = make_case(seed + 25, dt, 8, 256, 192, 150, 2); c.spec.transposed = true; c.spec.interleaved = true;
    c.spec.has_bias = true; c.spec.activation = ActivationSpec::gpt_oss(); add(c, QuantSpec::fp8_block(1, 128)); }
  { auto c = make_case(seed + 26, dt, 6, 320, 160, 40, 2); c.spec.has_gate = false; c.spec.activation.kind = Activation::gelu;
    c.spec.transposed = true; add(c, fp8); }
  { auto c = make_case(seed + 27, dt, 8, 384, 256, 64, 3); c.spec.interleaved = true; c.routing = check::Routing::dropped;
    add(c, QuantSpec::fp8_block(64, 128, ScaleFormat::f32)); }
  // in % 32 == 0 with partial 128-k blocks (the tensor-core GEMV's zero-filled lanes); out not a
  // multiple of its 16-row tiles on one side (clamped rows), the CUDA-core kernel on the other
  { auto c = make_case(seed + 31, dt, 8, 352, 224, 24, 3); c.routing = check::Routing::dropped; add(c, fp8_ue8m0); }
  { auto c = make_case(seed + 32, dt, 6, 352, 200, 20, 2); c.spec.has_gate = false; c.spec.has_bias = true;
    c.spec.activation.kind = Activation::relu; add(c, fp8); }
  { auto c = make_case(seed + 33, dt, 6, 200, 352, 20, 2); c.spec.has_bias = true; add(c, QuantSpec::fp8_block(64, 128)); }
  add(make_case(seed + 28, dt, 8, 512, 256, 260, 2), QuantSpec::fp4_group(32));             // FP4 16-byte paths
  { auto c = make_case(seed + 29, dt, 6, 200, 72, 33, 2); c.spec.has_bias = true; add(c, QuantSpec::fp4_group(16)); }  // element-wise
  { auto c = make_case(seed + 30, dt, 4, 256, 128, 8, 2); c.spec.has_gate = false; c.spec.activation.kind = Activation::relu;
    add(c, QuantSpec::fp4_group(64)); }
  return out;
}

// Runs `backend` on case c with every routing slot dropped (index -1), its output poisoned with NaN
// first; returns how many output bytes are not zero (+0 is all zero bytes in every dtype).
int64_t nonzero_bytes_with_every_slot_dropped(const std::string& backend, const check::Case& c) {
  check::Instance host = check::make_instance(c);
  int32_t* idx = static_cast<int32_t*>(host.top_k_index.data());
  for (int64_t i = 0; i < host.top_k_index.numel(); ++i) idx[i] = -1;
  const check::Instance dev = host.to(Device::cuda());
  Tensor poison = Tensor::empty(c.spec.dtype, {c.tokens, c.spec.hidden}, Device::cpu());
  std::memset(poison.data(), 0xff, size_t(poison.nbytes()));  // NaN in every dtype
  Tensor out = poison.to(Device::cuda());
  experts_forward(backend, dev.experts(), dev.call(out));
  const Tensor back = out.to(Device::cpu());  // (the copy waits for the forward)
  const uint8_t* bytes = static_cast<const uint8_t*>(back.data());
  int64_t nonzero = 0;
  for (int64_t i = 0; i < back.nbytes(); ++i) nonzero += bytes[i] != 0;
  return nonzero;
}

// The FP8 decode path (quant_decode.cu; MOEX_CUDA_FP8_DECODE=1 forces it at any T): T in
// {1, 3, 8, 64, 200} (200: experts with more rows than one 32-row pass), H or I not multiples of
// 128 (partial k blocks, partial column blocks, partial 128-groups of h), skewed / dropped /
// one-expert routing, f32 and UE8M0 scales, block_n 1 / 64 / 128, every epilogue, biases, i64
// indices, K = E, and shapes that make the host pick 1 and 8 k slices per block.
std::vector<check::Case> decode_cases(uint64_t seed, DType dt) {
  std::vector<check::Case> out;
  auto add = [&](check::Case c, QuantSpec q) {
    c.spec.quant = q;
    out.push_back(c);
  };
  const QuantSpec fp8 = QuantSpec::fp8_block(128, 128, ScaleFormat::f32);
  const QuantSpec ue8m0 = QuantSpec::fp8_block(128, 128, ScaleFormat::ue8m0);
  add(make_case(seed + 41, dt, 8, 512, 384, 1, 4), ue8m0);
  { auto c = make_case(seed + 42, dt, 16, 272, 208, 3, 4); c.spec.has_bias = true; add(c, fp8); }
  { auto c = make_case(seed + 43, dt, 8, 256, 176, 8, 2); c.spec.interleaved = true; c.spec.has_bias = true;
    c.spec.activation = ActivationSpec::gpt_oss(); add(c, QuantSpec::fp8_block(1, 128)); }
  { auto c = make_case(seed + 44, dt, 16, 384, 256, 64, 4); c.routing = check::Routing::skewed; add(c, ue8m0); }
  { auto c = make_case(seed + 45, dt, 8, 208, 144, 64, 3); c.routing = check::Routing::dropped; c.index_dtype = DType::i64;
    c.spec.has_bias = true; add(c, QuantSpec::fp8_block(64, 128, ScaleFormat::f32)); }
  { auto c = make_case(seed + 46, dt, 8, 256, 192, 200, 2); c.routing = check::Routing::skewed; add(c, fp8); }
  { auto c = make_case(seed + 47, dt, 6, 320, 160, 200, 2); c.spec.has_gate = false; c.spec.activation.kind = Activation::gelu;
    c.spec.has_bias = true; c.routing = check::Routing::dropped; add(c, ue8m0); }
  { auto c = make_case(seed + 48, dt, 4, 256, 128, 64, 2); c.routing = check::Routing::one_expert; add(c, fp8); }
  add(make_case(seed + 49, dt, 4, 144, 80, 1, 4), fp8);                      // K = E
  // few rows per expert on average (8-row passes) but skewed: some experts need several passes
  { auto c = make_case(seed + 53, dt, 64, 256, 128, 64, 2); c.routing = check::Routing::skewed; add(c, fp8); }
  { auto c = make_case(seed + 50, dt, 8, 1024, 704, 8, 2); c.spec.interleaved = true; add(c, ue8m0); }
  add(make_case(seed + 51, dt, 4, 2048, 256, 1, 2), fp8);                    // up: 8 k slices, down: 1
  { auto c = make_case(seed + 52, dt, 8, 336, 112, 3, 2); c.spec.has_gate = false; c.spec.activation.kind = Activation::relu;
    c.routing = check::Routing::dropped; add(c, QuantSpec::fp8_block(64, 128, ScaleFormat::ue8m0)); }
  // T = 1 with K = 8, dropped slots and biases; T = 1 with K = 3
  { auto c = make_case(seed + 54, dt, 16, 272, 208, 1, 8); c.routing = check::Routing::dropped; c.spec.has_bias = true;
    add(c, ue8m0); }
  add(make_case(seed + 55, dt, 8, 384, 256, 1, 3), fp8);
  // zero weight blocks with scale 0 (Case::zero_weight_blocks)
  { auto c = make_case(seed + 56, dt, 8, 512, 384, 4, 2); c.zero_weight_blocks = true; add(c, fp8); }
  // T = 1 with K = E = 8 on a wider H; two tokens whose slots share experts (two columns in one slot),
  // interleaved with biases
  add(make_case(seed + 57, dt, 8, 1024, 384, 1, 8), ue8m0);
  { auto c = make_case(seed + 58, dt, 6, 512, 256, 2, 4); c.routing = check::Routing::skewed; c.spec.interleaved = true;
    c.spec.has_bias = true; add(c, fp8); }
  return out;
}

// batched_mm and grouped_mm through the decode path (forced on) against the same-quantization
// f64 reference (SPEC §8: <= 2e-3) and the unquantized one (<= 8e-2); outputs poisoned first
// (check::run_case), every element must be written.
class CudaFp8Decode : public ::testing::TestWithParam<DType> {};

TEST_P(CudaFp8Decode, MatchesTheReference) {
  SKIP_WITHOUT_CUDA();
  const DType dt = GetParam();
  ScopedEnv force("MOEX_CUDA_FP8_DECODE", "1");
  const uint64_t seed = seed_from_env();
  std::printf("seed %llu (set MOEX_TEST_SEED to change)\n", (unsigned long long)seed);
  double worst = 0;
  for (const auto& c : decode_cases(seed, dt)) {
    for (const std::string name : {"batched_mm", "grouped_mm"}) {
      const auto r = check::run_case(name, c, Device::cuda());
      EXPECT_EQ(r.status, check::Result::Status::passed)
          << name << " " << c.describe() << ": " << check::status_name(r.status) << ": " << r.message;
      worst = std::max(worst, r.rel_l2);
    }
  }
  std::printf("FP8 decode path: worst rel L2 %.2e\n", worst);
}

// The path's A/B switches each select other kernels than the default on these small shapes: the
// unstaged activations (the default for rows too long to stage, e.g. mixtral's down projection),
// the plan read after pdl_wait, h quantized by decode_up at every T, and by decode_down at every T, the TMA
// ring off / forced, the wide form, decode_up's k slices forced to 1 and 8; a k-slice count it lacks is an error.
TEST_P(CudaFp8Decode, EverySwitchMatchesTheReference) {
  SKIP_WITHOUT_CUDA();
  const DType dt = GetParam();
  ScopedEnv force("MOEX_CUDA_FP8_DECODE", "1");
  const uint64_t seed = seed_from_env();
  const std::pair<const char*, const char*> switches[] = {{"MOEX_CUDA_FP8_DECODE_STAGE", "0"},
                                                          {"MOEX_CUDA_FP8_DECODE_EARLY", "0"},
                                                          {"MOEX_CUDA_FP8_DECODE_HQ", "up"},
                                                          {"MOEX_CUDA_FP8_DECODE_HQ", "down"},
                                                          {"MOEX_CUDA_FP8_DECODE_TMA", "0"},
                                                          {"MOEX_CUDA_FP8_DECODE_TMA", "1"},
                                                          {"MOEX_CUDA_FP8_DECODE_TMA_WIDE", "1"},
                                                          {"MOEX_CUDA_FP8_DECODE_KS_UP", "1"},
                                                          {"MOEX_CUDA_FP8_DECODE_KS_UP", "8"}};
  std::vector<check::PreparedCase> prepared;  // each case and its references once, for every switch
  for (const auto& c : decode_cases(seed, dt)) prepared.emplace_back(c, Device::cuda());
  for (const auto& [name, value] : switches) {
    ScopedEnv variant(name, value);
    double worst = 0;
    for (const auto& pc : prepared) {
      const auto r = pc.run("grouped_mm");
      EXPECT_EQ(r.status, check::Result::Status::passed)
          << name << "=" << value << " " << pc.spec().describe() << ": " << check::status_name(r.status) << ": " << r.message;
      worst = std::max(worst, r.rel_l2);
    }
    std::printf("FP8 decode path, %s=%s: worst rel L2 %.2e\n", name, value, worst);
  }
  {  // a k-slice count the kernels do not have: a clear error, no launch
    ScopedEnv bad("MOEX_CUDA_FP8_DECODE_KS_UP", "3");
    const auto c = decode_cases(seed, dt).front();
    const check::Instance dev = check::make_instance(c).to(Device::cuda());
    Tensor out = Tensor::empty(dt, {c.tokens, c.spec.hidden}, Device::cuda());
    EXPECT_THROW(experts_forward("grouped_mm", dev.experts(), dev.call(out)), Error);
  }
}

// The TMA weight ring (MOEX_CUDA_FP8_DECODE_TMA=1: wherever it can run) against the register ring
// (=0): the same chunks, MMAs and promotion, so the same bytes, on every decode case, with the
// default ring depth and with 2 and 3 stages (T <= 8 and the
// 8-row-pass cases at T = 64 run the NT = 1 kernels that have it; partial k blocks are zero-filled
// by the TMA where the register ring clamps into the row), for both h-quantization placements, and
// with the block scales loaded in the k loop (MOEX_CUDA_FP8_DECODE_TMA_SCALES=0) and with stages of one k
// block (MOEX_CUDA_FP8_DECODE_TMA_BOX=128; the default is two, so that "2" / "3" stages above are one stage of two).
TEST_P(CudaFp8Decode, TmaRingIsBitIdentical) {
  SKIP_WITHOUT_CUDA();
  const auto devs = cuda_devices();
  if (devs[0].compute_capability() != 90) GTEST_SKIP() << "the TMA ring is sm_90: device 0 is not compute capability 9.0";
  const DType dt = GetParam();
  ScopedEnv force("MOEX_CUDA_FP8_DECODE", "1");
  int compared = 0;
  for (const char* hq : {"up", "down"}) {
    ScopedEnv h_quant("MOEX_CUDA_FP8_DECODE_HQ", hq);
    for (const auto& c : decode_cases(seed_from_env(), dt)) {
      const check::Instance dev = check::make_instance(c).to(Device::cuda());
      auto run = [&](const char* tma) {
        ScopedEnv env("MOEX_CUDA_FP8_DECODE_TMA", tma);
        Tensor out = Tensor::empty(dt, {c.tokens, c.spec.hidden}, Device::cuda());
        experts_forward("grouped_mm", dev.experts(), dev.call(out));
        return test::to_host(out);
      };
      const auto reference = run("0");
      EXPECT_EQ(run("1"), reference) << "HQ=" << hq << " " << c.describe();
      for (const char* stages : {"2", "3"}) {  // rings that wrap more often (and not a power of two)
        ScopedEnv depth("MOEX_CUDA_FP8_DECODE_TMA_STAGES", stages);
        EXPECT_EQ(run("1"), reference) << "HQ=" << hq << " stages=" << stages << " " << c.describe();
      }
      {  // the block scales loaded in the k loop instead of staged before the wait
        ScopedEnv scales("MOEX_CUDA_FP8_DECODE_TMA_SCALES", "0");
        EXPECT_EQ(run("1"), reference) << "HQ=" << hq << " scales in the loop " << c.describe();
      }
      {  // stages of one k block (128-byte boxes), with 2 and 3 stages
        ScopedEnv box("MOEX_CUDA_FP8_DECODE_TMA_BOX", "128");
        EXPECT_EQ(run("1"), reference) << "HQ=" << hq << " 128-byte boxes " << c.describe();
        ScopedEnv depth("MOEX_CUDA_FP8_DECODE_TMA_STAGES", "3");
        EXPECT_EQ(run("1"), reference) << "HQ=" << hq << " 128-byte boxes, 3 stages " << c.describe();
      }
      ++compared;
    }
  }
  std::printf("TMA ring against the register ring: %d cases, bit for bit\n", compared);
}

// Every slot dropped (index -1): no expert is hit, no up or down block has work; the output must
// still be written, all zeros (poisoned with NaN first).
TEST_P(CudaFp8Decode, AllSlotsDroppedGiveZeros) {
  SKIP_WITHOUT_CUDA();
  const DType dt = GetParam();
  ScopedEnv force("MOEX_CUDA_FP8_DECODE", "1");
  for (const int64_t T : {1, 3, 8, 64}) {
    check::Case c = make_case(97, dt, 8, 256, 128, T, 2);
    c.spec.quant = QuantSpec::fp8_block();
    for (const std::string name : {"batched_mm", "grouped_mm"})
      EXPECT_EQ(nonzero_bytes_with_every_slot_dropped(name, c), 0) << name << " T=" << T << ": bytes not zero";
  }
}

// grouped_mm's choice between the decode path and the TMA kernels on Hopper (quant_common.cuh,
// kDecodeMaxPairsPerExpert): up to 6 pairs per expert the default output is the forced decode
// path's, bit for bit; above, the TMA kernels'. Both paths are deterministic; the test first checks
// that their outputs differ on each case, so that it can tell them apart.
TEST(CudaFp8Route, GroupedMmTakesTheTmaKernelsAboveSixPairsPerExpert) {
  SKIP_WITHOUT_CUDA();
  const auto devs = cuda_devices();
  if (devs[0].compute_capability() != 90) GTEST_SKIP() << "the TMA kernels are sm_90a: device 0 is not compute capability 9.0";
  for (const auto& [T, decode] : {std::pair<int64_t, bool>{24, true}, {25, false}, {64, false}, {8, true}}) {
    check::Case c = make_case(123, DType::bf16, 8, 256, 128, T, 2);  // E = 8, K = 2: 6·E = 48 pairs at T = 24
    c.spec.quant = QuantSpec::fp8_block();
    const check::Instance dev = check::make_instance(c).to(Device::cuda());
    auto run = [&](const char* mode) {
      ScopedEnv env("MOEX_CUDA_FP8_DECODE", mode);
      Tensor out = Tensor::empty(DType::bf16, {T, c.spec.hidden}, Device::cuda());
      experts_forward("grouped_mm", dev.experts(), dev.call(out));
      return test::to_host(out);
    };
    const auto forced_decode = run("1"), forced_tma = run("0"), chosen = run(nullptr);
    ASSERT_NE(forced_decode, forced_tma) << "T=" << T << ": the two paths gave the same bytes; the test cannot tell them apart";
    EXPECT_EQ(chosen, decode ? forced_decode : forced_tma) << "T=" << T << " (" << T * 2 << " pairs, 8 experts): expected the "
                                                           << (decode ? "decode path" : "TMA kernels");
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaFp8Decode, ::testing::Values(DType::f32, DType::f16, DType::bf16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// grouped_mm's FP8 prefill path on Hopper (deepgemm.cu's TMA kernels in the contiguous layout):
// 128x128-block experts with H, I multiples of 16 (and I of 64 when gate / up are concatenated)
// above the decode path's T, or at any T with that path turned off. Experts holding 1-16, 17-32,
// 33-64, 65-128 and more rows (each wgmma N of the exact kernel, several M tiles per expert),
// partial 128-k blocks on both GEMMs (H = 208, I = 704), skewed / dropped / one-expert / empty
// routing, every epilogue with and without bias, f32 and UE8M0 scales. The default (the exact up
// GEMM, the QGMMA down GEMM), both GEMMs exact (MOEX_CUDA_FP8_TMA=exact), each with the exact GEMMs
// on the untransposed kernel too (MOEX_CUDA_FP8_X_NT=1) and on the wide kernels (MOEX_CUDA_FP8_X_WIDE=1 / 2:
// 256 weight rows per tile, one rescaled accumulator set; 2 pipelined), the converting kernel for the up GEMM
// (MOEX_CUDA_FP8_X_CONV=1: gated concatenated cases with I % 128 == 0), and the
// portable mma.sync path (=0) must
// meet SPEC §8 (2e-3 against the same-quantization f64 reference, 8e-2 against the unquantized one).
std::vector<check::Case> fp8_prefill_cases(uint64_t seed, DType dt) {
  std::vector<check::Case> out;
  auto add = [&](check::Case c, QuantSpec q) {
    c.spec.quant = q;
    out.push_back(c);
  };
  const QuantSpec fp8 = QuantSpec::fp8_block(128, 128, ScaleFormat::f32);
  const QuantSpec ue8m0 = QuantSpec::fp8_block(128, 128, ScaleFormat::ue8m0);
  add(make_case(seed + 61, dt, 8, 512, 384, 300, 2), fp8);  // ~75 rows per expert
  { auto c = make_case(seed + 62, dt, 16, 512, 192, 257, 4); c.routing = check::Routing::skewed; add(c, ue8m0); }
  { auto c = make_case(seed + 63, dt, 12, 208, 128, 333, 3); c.routing = check::Routing::dropped; c.index_dtype = DType::i64;
    add(c, fp8); }
  { auto c = make_case(seed + 64, dt, 8, 256, 256, 150, 2); c.spec.interleaved = true; c.spec.has_bias = true;
    c.spec.activation = ActivationSpec::gpt_oss(); add(c, ue8m0); }
  { auto c = make_case(seed + 65, dt, 6, 320, 192, 160, 2); c.spec.has_gate = false; c.spec.activation.kind = Activation::gelu;
    c.spec.has_bias = true; add(c, fp8); }
  { auto c = make_case(seed + 66, dt, 4, 512, 320, 300, 2); c.routing = check::Routing::one_expert; add(c, fp8); }
  { auto c = make_case(seed + 67, dt, 8, 1024, 704, 700, 2); c.routing = check::Routing::skewed; c.spec.has_bias = true;
    add(c, fp8); }
  add(make_case(seed + 68, dt, 16, 384, 256, 90, 2), fp8);     // ~11 rows per expert
  add(make_case(seed + 69, dt, 8, 256, 128, 120, 2), ue8m0);   // ~30 rows per expert
  // decode sizes (run with the decode path off): 1-3 rows per expert, empty experts
  add(make_case(seed + 70, dt, 64, 256, 128, 40, 4), ue8m0);
  { auto c = make_case(seed + 71, dt, 32, 256, 128, 64, 4); c.routing = check::Routing::empty_experts; add(c, fp8); }
  add(make_case(seed + 72, dt, 8, 512, 384, 1, 4), fp8);
  // gated with bias and I % 128 == 0 (the wide kernel's up GEMM with its bias), and zero weight
  // blocks with scale 0 (Case::zero_weight_blocks) over several k blocks
  { auto c = make_case(seed + 73, dt, 8, 640, 256, 400, 2); c.spec.has_bias = true; add(c, fp8); }
  { auto c = make_case(seed + 74, dt, 8, 768, 384, 500, 2); c.zero_weight_blocks = true; add(c, fp8); }
  return out;
}

class CudaFp8Prefill : public ::testing::TestWithParam<DType> {};

TEST_P(CudaFp8Prefill, TmaAndPortablePathsMatchTheReference) {
  SKIP_WITHOUT_CUDA();
  const DType dt = GetParam();
  ScopedEnv no_decode("MOEX_CUDA_FP8_DECODE", "0");
  const uint64_t seed = seed_from_env();
  // {MOEX_CUDA_FP8_TMA, MOEX_CUDA_FP8_X_PREGATHER, MOEX_CUDA_FP8_X_NT, MOEX_CUDA_FP8_X_FEW,
  // MOEX_CUDA_FP8_X_WIDE, MOEX_CUDA_FP8_X_CONV}: the
  // default (exact up GEMM, QGMMA down GEMM; these cases' <= 8192 pairs take the token codes written
  // at the layout rows by the quantizer; the few-row exact kernel where S <= 32 E), the same with the
  // codes gathered by the up GEMM, both GEMMs exact, the portable path; the first three again with
  // the untransposed exact kernel; the few-row kernel forced on every case (tiles of 65-128 rows in
  // two passes) for the up GEMM and for both exact GEMMs, and forced off; the wide kernel (few-row
  // kernel off, so that it runs every case it fits: I % 128 == 0 for the up GEMM, every down GEMM) with
  // the A rows by TMA and gathered, for the up GEMM and for both; its pipelined form (2); the converting
  // up GEMM (its codes always pre-gathered) with the QGMMA down GEMM (h quantized in its epilogue) and
  // with the exact one
  const char* const modes[][6] = {
      {"hybrid", "", "", "", "", ""},  {"hybrid", "0", "", "", "", ""},  {"exact", "0", "", "", "", ""},
      {"0", "0", "", "", "", ""},      {"hybrid", "", "1", "", "", ""},  {"hybrid", "0", "1", "", "", ""},
      {"exact", "0", "1", "", "", ""}, {"hybrid", "", "", "1", "", ""},  {"exact", "", "", "1", "", ""},
      {"hybrid", "", "", "0", "", ""}, {"hybrid", "", "", "0", "1", ""}, {"hybrid", "0", "", "0", "1", ""},
      {"exact", "", "", "0", "1", ""}, {"exact", "0", "", "0", "1", ""}, {"hybrid", "", "", "0", "2", ""},
      {"exact", "0", "", "0", "2", ""}, {"hybrid", "", "", "", "", "1"}, {"exact", "", "", "", "", "1"}};
  // MOEX_TEST_FP8_CONV_ONLY=1: only the converting kernel's modes (a short GPU call after a change to it)
  const char* conv_only = std::getenv("MOEX_TEST_FP8_CONV_ONLY");
  // each case and its f64 references once, for every mode (the references were most of this test's time)
  std::vector<check::PreparedCase> prepared;
  for (const auto& c : fp8_prefill_cases(seed, dt)) prepared.emplace_back(c, Device::cuda());
  for (const auto& mode : modes) {
    if (conv_only && *conv_only == '1' && !*mode[5]) continue;
    ScopedEnv path("MOEX_CUDA_FP8_TMA", mode[0]);
    ScopedEnv pregather("MOEX_CUDA_FP8_X_PREGATHER", mode[1]);
    ScopedEnv untransposed("MOEX_CUDA_FP8_X_NT", mode[2]);
    ScopedEnv few_rows("MOEX_CUDA_FP8_X_FEW", mode[3]);
    ScopedEnv wide("MOEX_CUDA_FP8_X_WIDE", mode[4]);
    ScopedEnv conv("MOEX_CUDA_FP8_X_CONV", mode[5]);
    double worst = 0;
    for (const auto& pc : prepared) {
      const auto r = pc.run("grouped_mm");
      EXPECT_EQ(r.status, check::Result::Status::passed) << "MOEX_CUDA_FP8_TMA=" << mode[0] << " MOEX_CUDA_FP8_X_PREGATHER="
                                                         << mode[1] << " MOEX_CUDA_FP8_X_NT=" << mode[2]
                                                         << " MOEX_CUDA_FP8_X_FEW=" << mode[3]
                                                         << " MOEX_CUDA_FP8_X_WIDE=" << mode[4]
                                                         << " MOEX_CUDA_FP8_X_CONV=" << mode[5]
                                                         << " " << pc.spec().describe() << ": " << check::status_name(r.status)
                                                         << ": " << r.message;
      worst = std::max(worst, r.rel_l2);
    }
    std::printf("FP8 prefill, MOEX_CUDA_FP8_TMA=%s MOEX_CUDA_FP8_X_PREGATHER=%s MOEX_CUDA_FP8_X_NT=%s MOEX_CUDA_FP8_X_FEW=%s "
                "MOEX_CUDA_FP8_X_WIDE=%s MOEX_CUDA_FP8_X_CONV=%s: worst rel L2 %.2e\n",
                mode[0], mode[1], mode[2], mode[3], mode[4], mode[5], worst);
  }
}

// The few-row exact kernel (six stages of 64-row A tiles; tiles of more rows in two passes) does the
// four-stage kernel's arithmetic in the same order for every output element (each 128-k block's
// HGMMA partial sums, then the promotion), so grouped_mm's FP8 output must not change by a bit when
// it is forced on or off: experts of 1-64 rows (one pass) and of 65-128 rows (two passes).
// grouped_mm's bf16 output on the device instance of case c with the environment variable var set to
// value (the bit-for-bit route tests below).
static std::vector<char> fp8_output_with(const check::Instance& dev, const check::Case& c, const char* var, const char* value) {
  ScopedEnv env(var, value);
  Tensor out = Tensor::empty(DType::bf16, {c.tokens, c.spec.hidden}, Device::cuda());
  experts_forward("grouped_mm", dev.experts(), dev.call(out));
  return test::to_host(out);
}

TEST(CudaFp8Route, FewRowExactKernelMatchesTheFourStageKernelBitForBit) {
  SKIP_WITHOUT_CUDA();
  const auto devs = cuda_devices();
  if (devs[0].compute_capability() != 90) GTEST_SKIP() << "the TMA kernels are sm_90a: device 0 is not compute capability 9.0";
  ScopedEnv no_decode("MOEX_CUDA_FP8_DECODE", "0");
  for (const auto& [T, tma_path] : {std::pair<int64_t, const char*>{64, "hybrid"}, {300, "hybrid"}, {200, "exact"}}) {
    check::Case c = make_case(321 + T, DType::bf16, 8, 384, 256, T, 2);  // 16 / 75 / 50 rows per expert on average
    c.spec.quant = QuantSpec::fp8_block();
    const check::Instance dev = check::make_instance(c).to(Device::cuda());
    ScopedEnv path("MOEX_CUDA_FP8_TMA", tma_path);
    const auto four_stage = fp8_output_with(dev, c, "MOEX_CUDA_FP8_X_FEW", "0");
    EXPECT_EQ(fp8_output_with(dev, c, "MOEX_CUDA_FP8_X_FEW", "1"), four_stage)
        << "T=" << T << " MOEX_CUDA_FP8_TMA=" << tma_path << ": the few-row kernel";
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaFp8Prefill, ::testing::Values(DType::f32, DType::f16, DType::bf16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

class CudaEquivalence : public ::testing::TestWithParam<DType> {};

TEST_P(CudaEquivalence, EveryCudaBackendMatchesTheReference) {
  SKIP_WITHOUT_CUDA();
  const DType dt = GetParam();
  const uint64_t seed = seed_from_env();
  std::printf("seed %llu (set MOEX_TEST_SEED to change)\n", (unsigned long long)seed);
  auto cases = check::generate_cases(seed + uint64_t(dt), count_from_env(120), dt);
  for (const auto& c : large_cases(seed, dt)) cases.push_back(c);
  for (const auto& c : quant_cases(seed, dt)) cases.push_back(c);
  int passed = 0, quantized = 0;
  double worst[3] = {0, 0, 0}, worst_quant[3] = {0, 0, 0};
  for (const auto& c : cases) {
    const auto results = check::run_case(kCudaBackends, c, Device::cuda());
    for (size_t b = 0; b < kCudaBackends.size(); ++b) {
      const auto& r = results[b];
      EXPECT_EQ(r.status, check::Result::Status::passed)
          << kCudaBackends[b] << " " << c.describe() << ": " << check::status_name(r.status) << ": " << r.message;
      if (r.status == check::Result::Status::passed) ++passed;
      double& w = c.spec.quant.quantized() ? worst_quant[b] : worst[b];
      w = std::max(w, r.rel_l2);
      quantized += c.spec.quant.quantized();
    }
  }
  std::printf("%d passed of %d (%d quantized); worst rel L2: eager %.2e, batched_mm %.2e, grouped_mm %.2e; "
              "quantized: eager %.2e, batched_mm %.2e, grouped_mm %.2e\n",
              passed, int(cases.size() * kCudaBackends.size()), quantized, worst[0], worst[1], worst[2], worst_quant[0],
              worst_quant[1], worst_quant[2]);
}

// batched_mm's up kernel with several intermediate channels per warp (MOEX_CUDA_UP_CHANNELS; by
// default 2 only where one per warp would not fit one wave of blocks, e.g. qwen3 at batch 1): the
// same cases must still match the reference, partial last channels and dropped slots included.
TEST_P(CudaEquivalence, BatchedMmWithSeveralChannelsPerWarpMatchesTheReference) {
  SKIP_WITHOUT_CUDA();
  const DType dt = GetParam();
  const uint64_t seed = seed_from_env();
  auto cases = check::generate_cases(seed + 7 + uint64_t(dt), count_from_env(40), dt);
  for (const char* channels : {"2", "3"}) {
    ScopedEnv force("MOEX_CUDA_UP_CHANNELS", channels);
    double worst = 0;
    for (const auto& c : cases) {
      const auto r = check::run_case("batched_mm", c, Device::cuda());
      EXPECT_EQ(r.status, check::Result::Status::passed)
          << "MOEX_CUDA_UP_CHANNELS=" << channels << " " << c.describe() << ": " << check::status_name(r.status) << ": "
          << r.message;
      worst = std::max(worst, r.rel_l2);
    }
    std::printf("batched_mm, MOEX_CUDA_UP_CHANNELS=%s: %zu cases, worst rel L2 %.2e\n", channels, cases.size(), worst);
  }
}

// batched_mm's expert-shared form (MOEX_CUDA_BATCHED_SHARED; by default where T·K >= E): the pairs
// sorted by expert and each expert's weight rows read once for all its pairs, each pair's arithmetic
// unchanged. Forced on, every case must pass the harness (poisoned output, guards, the f64 reference)
// and give the per-pair kernels' output bit for bit; with every slot dropped, zeros.
TEST_P(CudaEquivalence, BatchedMmExpertSharedFormMatchesThePerPairKernelsBitForBit) {
  SKIP_WITHOUT_CUDA();
  const DType dt = GetParam();
  const uint64_t seed = seed_from_env();
  auto cases = check::generate_cases(seed + 11 + uint64_t(dt), count_from_env(40), dt);
  // many pairs per expert: full and partial 8-row tiles, more tiles than one per expert
  for (const int64_t T : {37, 64, 200}) cases.push_back(make_case(seed + uint64_t(T), dt, 8, 256, 136, T, 2));
  int compared = 0;
  double worst = 0;
  for (const auto& c : cases) {
    {
      ScopedEnv on("MOEX_CUDA_BATCHED_SHARED", "1");
      const auto r = check::run_case("batched_mm", c, Device::cuda());
      EXPECT_EQ(r.status, check::Result::Status::passed)
          << "expert-shared " << c.describe() << ": " << check::status_name(r.status) << ": " << r.message;
      worst = std::max(worst, r.rel_l2);
    }
    const check::Instance dev = check::make_instance(c).to(Device::cuda());
    auto run = [&](const char* shared) {
      ScopedEnv env("MOEX_CUDA_BATCHED_SHARED", shared);
      Tensor out = Tensor::empty(dt, {c.tokens, c.spec.hidden}, Device::cuda());
      experts_forward("batched_mm", dev.experts(), dev.call(out));
      return test::to_host(out);
    };
    EXPECT_EQ(run("1"), run("0")) << "expert-shared against per-pair: " << c.describe();
    ++compared;
  }
  {  // every slot dropped: no tile, no up or down block with work; the output still written, zeros
    ScopedEnv on("MOEX_CUDA_BATCHED_SHARED", "1");
    EXPECT_EQ(nonzero_bytes_with_every_slot_dropped("batched_mm", make_case(seed + 5, dt, 8, 256, 128, 64, 2)), 0)
        << "all slots dropped: bytes not zero";
  }
  std::printf("batched_mm expert-shared form: %d cases bit for bit with the per-pair kernels, worst rel L2 %.2e\n",
              compared, worst);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaEquivalence, ::testing::Values(DType::f32, DType::f16, DType::bf16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// batched_mm on quantized experts with the tensor-core FP8 GEMV forced on (MOEX_CUDA_FP8_MMA_GEMV=1)
// and off (=0): both must match the reference; restores the variable's previous value.
class CudaFp8MmaGemv : public ::testing::TestWithParam<std::tuple<DType, const char*>> {};

TEST_P(CudaFp8MmaGemv, BatchedMmQuantizedCasesMatchTheReference) {
  SKIP_WITHOUT_CUDA();
  const auto [dt, setting] = GetParam();
  ScopedEnv gemv("MOEX_CUDA_FP8_MMA_GEMV", setting);
  ScopedEnv no_decode("MOEX_CUDA_FP8_DECODE", "0");  // the GEMVs, not the decode path
  const uint64_t seed = seed_from_env();
  double worst = 0;
  for (const auto& c : quant_cases(seed, dt)) {
    const auto r = check::run_case("batched_mm", c, Device::cuda());
    EXPECT_EQ(r.status, check::Result::Status::passed)
        << "MOEX_CUDA_FP8_MMA_GEMV=" << setting << " " << c.describe() << ": " << check::status_name(r.status) << ": "
        << r.message;
    worst = std::max(worst, r.rel_l2);
  }
  std::printf("MOEX_CUDA_FP8_MMA_GEMV=%s: worst rel L2 %.2e\n", setting, worst);
}

INSTANTIATE_TEST_SUITE_P(Settings, CudaFp8MmaGemv,
                         ::testing::Combine(::testing::Values(DType::f32, DType::f16, DType::bf16),
                                            ::testing::Values("1", "0")),
                         [](const auto& info) {
                           return std::string(dtype_name(std::get<0>(info.param))) +
                                  (std::string(std::get<1>(info.param)) == "1" ? "_mma" : "_cuda_cores");
                         });

TEST(CudaBackends, RequirementMessages) {
  SKIP_WITHOUT_CUDA();
  Problem p;
  p.spec.num_experts = 4;
  p.spec.hidden = 64;
  p.spec.intermediate = 32;
  p.tokens = 3;
  p.top_k = 2;
  p.device = Device::cuda();
  for (const auto& name : kCudaBackends) {
    EXPECT_TRUE(ExpertsInterface::global().supports(name, p).ok) << name;
    Problem old = p;
    old.compute_capability = 75;
    Support s = ExpertsInterface::global().supports(name, old);
    EXPECT_FALSE(s.ok);
    EXPECT_NE(s.reason.find("8.0"), std::string::npos) << s.reason;
    // quantized experts: FP8 128x128 / 1x128 and FP4 run; what cannot be honoured is refused
    Problem q = p;
    q.spec.quant = QuantSpec::fp8_block();
    EXPECT_TRUE(ExpertsInterface::global().supports(name, q).ok) << name;
    q.spec.quant = QuantSpec::fp4_group(32);
    EXPECT_TRUE(ExpertsInterface::global().supports(name, q).ok) << name;
    q.spec.quant = QuantSpec::fp8_block();
    q.spec.quant.activation_scheme = ActivationScheme::static_;
    s = ExpertsInterface::global().supports(name, q);
    EXPECT_FALSE(s.ok);
    EXPECT_NE(s.reason.find("static"), std::string::npos) << s.reason;
    q.spec.quant = QuantSpec::fp8_block(128, 64);
    s = ExpertsInterface::global().supports(name, q);
    EXPECT_FALSE(s.ok);
    EXPECT_NE(s.reason.find("128 wide"), std::string::npos) << s.reason;
    q.spec.quant = QuantSpec::fp4_group(32);
    q.spec.transposed = true;
    s = ExpertsInterface::global().supports(name, q);
    EXPECT_FALSE(s.ok);
    EXPECT_NE(s.reason.find("FP4"), std::string::npos) << s.reason;
  }
}

#ifdef MOEX_WITH_CUDA

using test::cuda_ok;
using test::to_host;

// New routing for the same shapes: distinct experts per token, some dropped slots.
void random_routing(const check::Case& c, uint64_t seed, std::vector<char>& idx_bytes, std::vector<char>& w_bytes) {
  std::mt19937_64 rng(seed);
  const int64_t T = c.tokens, K = c.top_k, E = c.spec.num_experts;
  idx_bytes.assign(size_t(T * K) * dtype_size(c.index_dtype), 0);
  w_bytes.assign(size_t(T * K) * dtype_size(c.weights_dtype), 0);
  std::vector<int64_t> perm(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t e = 0; e < E; ++e) perm[size_t(e)] = e;
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t j = 0; j < K; ++j) {
      int64_t e = perm[size_t(j)];
      if (rng() % 10 == 0) e = (rng() & 1) ? -1 : E + 3;  // dropped slot
      const int64_t p = t * K + j;
      if (c.index_dtype == DType::i32) reinterpret_cast<int32_t*>(idx_bytes.data())[p] = int32_t(e);
      else reinterpret_cast<int64_t*>(idx_bytes.data())[p] = e;
      const float w = float(rng() % 1000) / 1000.0f;
      if (c.weights_dtype == DType::f32) reinterpret_cast<float*>(w_bytes.data())[p] = w;
      else if (c.weights_dtype == DType::bf16) reinterpret_cast<uint16_t*>(w_bytes.data())[p] = float_to_bf16(w);
      else reinterpret_cast<uint16_t*>(w_bytes.data())[p] = float_to_f16(w);
    }
  }
}


// The device plan's tile table in both tile orders: every routed row of every expert lies in
// exactly one tile of its expert, tiles hold at most tile_m consecutive rows of one expert, valid
// tiles come first, each expert's tiles sit at consecutive positions; in the paired order every pair
// of tiles (2p, 2p + 1) shares its expert except one "mixed" pair per two experts with an odd tile
// count, made of those two experts' last tiles.
TEST(CudaRoutingPlan, TileTableInBothOrders) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(20261201);
  for (int iter = 0; iter < 60; ++iter) {
    // iter 2: more experts than the shared-memory counts hold (the global-atomic kernels); iter 3:
    // few experts, many pairs (shared atomics under contention, many blocks)
    const int64_t E = iter == 0 ? 1 : iter == 2 ? 7000 : iter == 3 ? 8 : 1 + rng() % (iter < 40 ? 40 : 300);
    const int64_t tile_m = iter % 3 == 0 ? 64 : 128;
    const int64_t S = iter == 1 ? 0 : iter == 2 || iter == 3 ? 30011 : rng() % (iter < 30 ? 2000 : 40000);
    std::vector<int32_t> idx(static_cast<size_t>(S));
    const bool skewed = iter % 4 == 1;  // most pairs on a few experts: many tiles per expert
    for (auto& v : idx) {
      v = int32_t(skewed ? (rng() % 8 == 0 ? rng() % E : rng() % std::min<int64_t>(E, 3)) : rng() % E);
      if (rng() % 17 == 0) v = (rng() & 1) ? -1 : int32_t(E + 2);  // dropped
    }
    std::vector<int64_t> count(static_cast<size_t>(E), 0);
    for (auto v : idx)
      if (v >= 0 && v < E) ++count[size_t(v)];
    size_t tiles_plain = 0;
    // the plain order, then the paired one, with the three plan kernels (MOEX_CUDA_PLAN_FUSED=0) and
    // with the one-block plan (the default, taken where S <= 4096 and E <= 6144) against the same checks
    for (const auto& [paired, fused] : {std::pair<bool, bool>{false, false}, {true, false}, {false, true}, {true, true}}) {
      ScopedEnv plan_kernels("MOEX_CUDA_PLAN_FUSED", fused ? nullptr : "0");
      SCOPED_TRACE(::testing::Message() << "iter " << iter << " E " << E << " S " << S << " tile_m " << tile_m
                                        << " paired " << paired << " fused " << fused);
      const cuda::PlanProbe pr = cuda::probe_device_plan(idx, E, tile_m, paired);
      // the permutation: every kept pair in one row of its expert's block, dropped pairs in none
      ASSERT_EQ(pr.pair_to_row.size(), idx.size());
      std::vector<int> row_seen(pr.sorted_pairs.size(), 0);
      for (size_t p = 0; p < idx.size(); ++p) {
        const int v = idx[p], row = pr.pair_to_row[p];
        if (v < 0 || v >= E) {
          EXPECT_EQ(row, -1) << "dropped pair " << p;
          continue;
        }
        ASSERT_GE(row, pr.offsets[size_t(v)]) << "pair " << p;
        ASSERT_LT(row, pr.offsets[size_t(v + 1)]) << "pair " << p;
        EXPECT_EQ(pr.sorted_pairs[size_t(row)], int(p));
        EXPECT_EQ(++row_seen[size_t(row)], 1) << "row " << row << " holds two pairs";
      }
      std::vector<int64_t> covered(static_cast<size_t>(E), 0), singles(static_cast<size_t>(E), 0);
      size_t valid = 0;
      bool seen_invalid = false;
      std::vector<std::vector<std::pair<int, int>>> ranges(static_cast<size_t>(E));
      for (const auto& t : pr.tiles) {
        if (t[0] < 0) {
          seen_invalid = true;
          continue;
        }
        ASSERT_FALSE(seen_invalid) << "a valid tile after an empty one";
        ASSERT_LT(t[0], E);
        const int e = t[0];
        EXPECT_GE(t[1], pr.offsets[size_t(e)]);
        EXPECT_LE(t[2], pr.offsets[size_t(e + 1)]);
        EXPECT_LT(t[1], t[2]);
        EXPECT_LE(t[2] - t[1], tile_m);
        EXPECT_EQ((t[1] - pr.offsets[size_t(e)]) % tile_m, 0);
        covered[size_t(e)] += t[2] - t[1];
        ranges[size_t(e)].push_back({t[1], t[2]});
        ++valid;
      }
      for (int64_t e = 0; e < E; ++e) {
        EXPECT_EQ(pr.offsets[size_t(e + 1)] - pr.offsets[size_t(e)], count[size_t(e)]);
        EXPECT_EQ(covered[size_t(e)], count[size_t(e)]) << "expert " << e;
        auto r = ranges[size_t(e)];
        std::sort(r.begin(), r.end());
        for (size_t i = 1; i < r.size(); ++i) EXPECT_EQ(r[i - 1].second, r[i].first) << "expert " << e;
      }
      // each expert's tiles at consecutive positions
      std::vector<int64_t> first_pos(static_cast<size_t>(E), -1), last_pos(static_cast<size_t>(E), -1);
      for (size_t t = 0; t < valid; ++t) {
        const int e = pr.tiles[t][0];
        if (first_pos[size_t(e)] < 0) first_pos[size_t(e)] = int64_t(t);
        last_pos[size_t(e)] = int64_t(t);
      }
      for (int64_t e = 0; e < E; ++e)
        if (first_pos[size_t(e)] >= 0)
          EXPECT_EQ(last_pos[size_t(e)] - first_pos[size_t(e)] + 1, int64_t(ranges[size_t(e)].size())) << "expert " << e;
      if (!paired) {
        tiles_plain = valid;
        for (size_t t = 1; t < valid; ++t) EXPECT_LE(pr.tiles[t - 1][0], pr.tiles[t][0]) << "plain order: expert by expert";
      } else {
        EXPECT_EQ(valid, tiles_plain);
        int64_t odd_experts = 0;
        for (int64_t e = 0; e < E; ++e) odd_experts += ((count[size_t(e)] + tile_m - 1) / tile_m) & 1;
        int64_t mixed = 0;
        for (size_t t = 0; t + 1 < valid; t += 2) {
          const auto &u = pr.tiles[t], &v = pr.tiles[t + 1];
          if (u[0] == v[0]) continue;
          ++mixed;
          EXPECT_EQ(u[2], pr.offsets[size_t(u[0] + 1)]) << "a mixed pair holds its experts' last tiles (pair " << t / 2 << ")";
          EXPECT_EQ(v[2], pr.offsets[size_t(v[0] + 1)]) << "a mixed pair holds its experts' last tiles (pair " << t / 2 << ")";
          EXPECT_EQ(++singles[size_t(u[0])], 1);
          EXPECT_EQ(++singles[size_t(v[0])], 1);
        }
        EXPECT_EQ(mixed, odd_experts / 2);
      }
    }
  }
}

// The one-block plan (the default up to 4096 pairs; set explicitly here) through the backends that
// build a plan: grouped_mm (bf16, and FP8 on its TMA kernels above the decode path's T), deepgemm's
// contiguous layout (on Hopper), against the f64 reference; skewed, dropped and empty-expert
// routing, 1-4096 pairs. (The equivalence harness runs the three plan kernels above 4096 pairs.)
TEST(CudaRoutingPlan, FusedPlanThroughTheBackends) {
  SKIP_WITHOUT_CUDA();
  ScopedEnv fused("MOEX_CUDA_PLAN_FUSED", "1");
  const bool hopper = cuda_devices()[0].compute_capability() == 90;
  std::vector<check::Case> cases;
  cases.push_back(make_case(301, DType::bf16, 8, 256, 128, 1, 2));
  { auto c = make_case(302, DType::bf16, 16, 256, 192, 300, 4); c.routing = check::Routing::skewed; cases.push_back(c); }
  { auto c = make_case(303, DType::bf16, 32, 128, 128, 200, 3); c.routing = check::Routing::dropped; cases.push_back(c); }
  { auto c = make_case(304, DType::bf16, 64, 256, 128, 100, 4); c.routing = check::Routing::empty_experts; cases.push_back(c); }
  cases.push_back(make_case(305, DType::f32, 8, 128, 64, 2048, 2));  // 4096 pairs: the largest one-block plan
  { auto c = make_case(306, DType::bf16, 8, 256, 128, 120, 2); c.spec.quant = QuantSpec::fp8_block(); cases.push_back(c); }
  for (const auto& c : cases) {
    for (const std::string name : {"grouped_mm", "deepgemm"}) {
      if (name == "deepgemm" && (!hopper || c.spec.dtype == DType::f32)) continue;
      const auto r = check::run_case(name, c, Device::cuda());
      if (name == "deepgemm" && r.status == check::Result::Status::skipped) continue;  // a shape it refuses (SPEC §2)
      // deepgemm FP8 (QGMMA) is held to its documented bar (kQgmmaFp8Bar), the rest to SPEC §8
      const bool ok = name == "deepgemm" ? test::deepgemm_accepts(c, r) : r.status == check::Result::Status::passed;
      EXPECT_TRUE(ok) << name << " " << c.describe() << ": " << check::status_name(r.status) << ": " << r.message;
    }
  }
}

// (backend, dtype, quantization: "none", "fp8" (128x128, f32 scales) or "fp4" (1x32 groups))
class CudaGraph : public ::testing::TestWithParam<std::tuple<std::string, DType, std::string>> {};

TEST_P(CudaGraph, ReplayWithNewRoutingEqualsDirectCall) {
  SKIP_WITHOUT_CUDA();
  const auto [name, dt, quant] = GetParam();
  auto backend = ExpertsInterface::global().get(name);
  ASSERT_TRUE(backend->graph_capturable());
  check::Case c = make_case(77, dt, 8, 256, 128, 96, 2);
  c.spec.has_bias = true;
  if (quant == "fp8") c.spec.quant = QuantSpec::fp8_block();
  if (quant == "fp4") c.spec.quant = QuantSpec::fp4_group(32);
  // the FP8 decode path (T <= 64 by default): one token, and 64 tokens with UE8M0 scales, H and I
  // not multiples of 128
  if (quant == "fp8_t1") {
    c = make_case(78, dt, 16, 256, 128, 1, 4);
    c.spec.quant = QuantSpec::fp8_block();
  }
  // one token, unquantized, top-8 with biases (the model's batch-1 decode step)
  if (quant == "t1") {
    c = make_case(80, dt, 16, 512, 256, 1, 8);
    c.spec.has_bias = true;
  }
  if (quant == "fp8_t64") {
    c = make_case(79, dt, 8, 272, 208, 64, 2);
    c.spec.has_bias = true;
    c.spec.quant = QuantSpec::fp8_block(128, 128, ScaleFormat::ue8m0);
  }
  const check::Instance host = check::make_instance(c);
  const check::Instance dev = host.to(Device::cuda());
  const int64_t T = c.tokens, H = c.spec.hidden;
  Tensor out_graph = Tensor::empty(dt, {T, H}, Device::cuda());
  Tensor out_direct = Tensor::empty(dt, {T, H}, Device::cuda());

  cudaStream_t stream = nullptr;
  cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  Workspace ws(Device::cuda());
  const Problem p = Problem::from(dev.experts(), dev.call(out_graph));
  ws.reserve(backend->workspace_bytes(p));
  ws.set_frozen(true);
  RunOptions opts;
  opts.stream = stream;
  opts.workspace = &ws;
  // warm-up outside the capture (module loading, kernel attributes)
  experts_forward(name, dev.experts(), dev.call(out_graph), opts);
  cuda_ok(cudaStreamSynchronize(stream));

  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cuda_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  try {
    experts_forward(name, dev.experts(), dev.call(out_graph), opts);
  } catch (const std::exception& e) {
    cudaStreamEndCapture(stream, &graph);
    FAIL() << "forward threw during capture: " << e.what();
  }
  cuda_ok(cudaStreamEndCapture(stream, &graph));
  cuda_ok(cudaGraphInstantiate(&exec, graph, 0));

  for (uint64_t round = 0; round < 3; ++round) {
    std::vector<char> idx, w;
    random_routing(c, 1000 + round, idx, w);
    copy_bytes(dev.top_k_index.data(), Device::cuda(), idx.data(), Device::cpu(), idx.size());
    copy_bytes(dev.top_k_weights.data(), Device::cuda(), w.data(), Device::cpu(), w.size());
    cuda_ok(cudaMemset(out_graph.data(), 0xff, out_graph.nbytes()));
    cuda_ok(cudaMemset(out_direct.data(), 0x7f, out_direct.nbytes()));
    cuda_ok(cudaGraphLaunch(exec, stream));
    cuda_ok(cudaStreamSynchronize(stream));
    experts_forward(name, dev.experts(), dev.call(out_direct), opts);
    cuda_ok(cudaStreamSynchronize(stream));
    const auto a = to_host(out_graph), b = to_host(out_direct);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size()), 0) << name << " round " << round << ": graph replay differs";
    // and both are right: the harness' reference on the same routing
    check::Instance h2 = host;
    std::memcpy(h2.top_k_index.data(), idx.data(), idx.size());
    std::memcpy(h2.top_k_weights.data(), w.data(), w.size());
    const std::vector<double> ref = check::reference_forward(h2.experts(), h2.call(TensorView(nullptr, dt, {T, H})));
    double err2 = 0, ref2 = 0;
    for (int64_t i = 0; i < T * H; ++i) {
      const double v = dt == DType::f32 ? double(reinterpret_cast<const float*>(a.data())[i])
                       : dt == DType::bf16 ? double(bf16_to_float(reinterpret_cast<const uint16_t*>(a.data())[i]))
                                           : double(f16_to_float(reinterpret_cast<const uint16_t*>(a.data())[i]));
      err2 += (v - ref[size_t(i)]) * (v - ref[size_t(i)]);
      ref2 += ref[size_t(i)] * ref[size_t(i)];
    }
    EXPECT_LE(std::sqrt(err2 / std::max(ref2, 1e-300)), check::tolerance_for(c).rel_l2) << name << " round " << round;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

INSTANTIATE_TEST_SUITE_P(Capturable, CudaGraph,
                         ::testing::Combine(::testing::Values(std::string("batched_mm"), std::string("grouped_mm")),
                                            ::testing::Values(DType::f32, DType::bf16),
                                            ::testing::Values(std::string("none"), std::string("fp8"), std::string("fp4"),
                                                              std::string("t1"), std::string("fp8_t1"), std::string("fp8_t64"))),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::string(dtype_name(std::get<1>(info.param))) + "_" +
                                  std::get<2>(info.param);
                         });

TEST(CudaBackends, NoAllocationAfterWarmUp) {
  SKIP_WITHOUT_CUDA();
  check::Case c = make_case(91, DType::bf16, 16, 512, 256, 200, 4);
  const check::Instance dev = check::make_instance(c).to(Device::cuda());
  Tensor out = Tensor::empty(DType::bf16, {c.tokens, c.spec.hidden}, Device::cuda());
  for (const std::string name : {"batched_mm", "grouped_mm", "eager"}) {
    auto backend = ExpertsInterface::global().get(name);
    Workspace ws(Device::cuda());
    ws.reserve(backend->workspace_bytes(Problem::from(dev.experts(), dev.call(out))));
    ws.set_frozen(true);  // growing it would throw
    RunOptions opts;
    opts.workspace = &ws;
    experts_forward(name, dev.experts(), dev.call(out), opts);  // warm-up
    cuda_ok(cudaDeviceSynchronize());
    size_t free0 = 0, free1 = 0, total = 0;
    cuda_ok(cudaMemGetInfo(&free0, &total));
    for (int i = 0; i < 5; ++i) EXPECT_NO_THROW(experts_forward(name, dev.experts(), dev.call(out), opts)) << name;
    cuda_ok(cudaDeviceSynchronize());
    cuda_ok(cudaMemGetInfo(&free1, &total));
    EXPECT_EQ(free0, free1) << name << " allocated device memory in a forward after warm-up";
  }
}

TEST(CudaBackends, OutOfMemoryIsAClearError) {
  SKIP_WITHOUT_CUDA();
  Workspace ws(Device::cuda());
  try {
    ws.reserve(size_t(1) << 50);  // 1 PiB
    FAIL() << "reserving 1 PiB succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::out_of_memory) << e.what();
  }
  // the device is still usable afterwards
  check::Case c = make_case(5, DType::bf16, 4, 64, 32, 8, 2);
  EXPECT_EQ(check::run_case("grouped_mm", c, Device::cuda()).status, check::Result::Status::passed);
}

// ---- timings (MOEX_CUDA_PERF=1) ----------------------------------------------------------------

struct Shape {
  const char* name;
  int64_t H, I, E, K;
};

__attribute__((unused)) void fill_random_bf16(void* dst, size_t n, std::mt19937_64& rng, float scale) {
  // 32 MiB of random bf16 uploaded once, then tiled over the buffer with device copies
  const size_t chunk = std::min<size_t>(n, size_t(16) << 20);
  std::vector<uint16_t> h(chunk);
  std::normal_distribution<float> nd(0.0f, scale);
  for (auto& v : h) v = float_to_bf16(nd(rng));
  char* d = static_cast<char*>(dst);
  cudaMemcpy(d, h.data(), chunk * 2, cudaMemcpyHostToDevice);
  for (size_t done = chunk; done < n;) {
    const size_t m = std::min(done, n - done);
    cudaMemcpy(d + done * 2, d, m * 2, cudaMemcpyDeviceToDevice);
    done += m;
  }
}

// Random FP8 e4m3 codes (never the NaN codes 0x7f / 0xff), tiled like fill_random_bf16.
__attribute__((unused)) void fill_random_fp8(void* dst, size_t n, std::mt19937_64& rng) {
  const size_t chunk = std::min<size_t>(n, size_t(32) << 20);
  std::vector<uint8_t> h(chunk);
  for (auto& v : h) {
    v = uint8_t(rng());
    if ((v & 0x7f) == 0x7f) v ^= 1;
  }
  char* d = static_cast<char*>(dst);
  cudaMemcpy(d, h.data(), chunk, cudaMemcpyHostToDevice);
  for (size_t done = chunk; done < n;) {
    const size_t m = std::min(done, n - done);
    cudaMemcpy(d + done, d, m, cudaMemcpyDeviceToDevice);
    done += m;
  }
}

// FP8 128x128 block scales [E, ceil(out/128), ceil(in/128)] f32: codes · scale ~ N(0, 0.02)-sized.
__attribute__((unused)) Tensor random_fp8_scales(int64_t E, int64_t out, int64_t in, std::mt19937_64& rng) {
  const int64_t sr = (out + 127) / 128, sc = (in + 127) / 128;
  std::vector<float> h(size_t(E * sr * sc));
  std::uniform_real_distribution<float> ud(0.5f, 1.5f);
  for (auto& v : h) v = 0.02f / 64.0f * ud(rng);
  Tensor t = Tensor::empty(DType::f32, {E, sr, sc}, Device::cuda());
  copy_bytes(t.data(), Device::cuda(), h.data(), Device::cpu(), t.nbytes());
  return t;
}

TEST(CudaPerf, Shapes) {
  SKIP_WITHOUT_CUDA();
  if (!std::getenv("MOEX_CUDA_PERF")) GTEST_SKIP() << "set MOEX_CUDA_PERF=1 to time the SPEC §9 shapes";
  const Shape all_shapes[] = {{"qwen3_30b_a3b", 2048, 768, 128, 8},
                              {"qwen15_moe_a2_7b", 2048, 1408, 60, 4},
                              {"mixtral_8x7b", 4096, 14336, 8, 2},
                              {"deepseek_v3", 7168, 2048, 256, 8}};
  // Timed only where MOEX_CUDA_PERF_SHAPES names it: qwen3's H, E and K with I = 16, so that a forward
  // moves ~1 MB of weights (FP8) — what is left is the chain's own latency (launches, dependencies, plan).
  const Shape latency_probe{"latency_probe", 2048, 16, 128, 8};
  // MOEX_CUDA_PERF_SHAPES / MOEX_CUDA_PERF_BACKENDS: comma-separated subsets (default: all but deepgemm,
  // which is timed only where MOEX_CUDA_PERF_BACKENDS names it)
  std::vector<Shape> shapes;
  const char* only_shapes = std::getenv("MOEX_CUDA_PERF_SHAPES");
  for (const Shape& sh : all_shapes)
    if (!only_shapes || std::string(only_shapes).find(sh.name) != std::string::npos) shapes.push_back(sh);
  if (only_shapes && std::string(only_shapes).find(latency_probe.name) != std::string::npos) shapes.push_back(latency_probe);
  std::vector<int64_t> tokens = {1, 8, 64, 512, 4096, 16384};
  if (const char* s = std::getenv("MOEX_CUDA_PERF_TOKENS")) {
    tokens.clear();
    for (const char* q = s; *q;) {
      tokens.push_back(std::strtoll(q, const_cast<char**>(&q), 10));
      if (*q == ',') ++q;
    }
  }
  std::mt19937_64 rng(123);
  cudaStream_t stream;
  cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::printf("PERF shape T backend ms TFLOPs GBps floor_ms\n");
  for (const Shape& sh : shapes) {
    ExpertsSpec spec;
    spec.num_experts = sh.E;
    spec.hidden = sh.H;
    spec.intermediate = sh.I;
    spec.dtype = DType::bf16;
    // MOEX_CUDA_PERF_QUANT: "none" (bf16 experts, default), "fp8" (128x128 blocks, f32 scales) or both
    // ("none,fp8": bf16 and FP8 timed side by side in one run, same routing)
    const std::string quant_list = std::getenv("MOEX_CUDA_PERF_QUANT") ? std::getenv("MOEX_CUDA_PERF_QUANT") : "none";
    const bool want_bf16 = quant_list.find("none") != std::string::npos;
    const bool want_fp8 = quant_list.find("fp8") != std::string::npos;
    Tensor gu, dn, gu8, dn8, gus, dns;
    if (want_bf16) {
      gu = Tensor::empty(DType::bf16, {sh.E, 2 * sh.I, sh.H}, Device::cuda());
      dn = Tensor::empty(DType::bf16, {sh.E, sh.H, sh.I}, Device::cuda());
      fill_random_bf16(gu.data(), size_t(gu.numel()), rng, 0.02f);
      fill_random_bf16(dn.data(), size_t(dn.numel()), rng, 0.02f);
    }
    if (want_fp8) {
      gu8 = Tensor::empty(DType::fp8_e4m3, {sh.E, 2 * sh.I, sh.H}, Device::cuda());
      dn8 = Tensor::empty(DType::fp8_e4m3, {sh.E, sh.H, sh.I}, Device::cuda());
      fill_random_fp8(gu8.data(), size_t(gu8.numel()), rng);
      fill_random_fp8(dn8.data(), size_t(dn8.numel()), rng);
      gus = random_fp8_scales(sh.E, 2 * sh.I, sh.H, rng);
      dns = random_fp8_scales(sh.E, sh.H, sh.I, rng);
    }
    struct Variant {
      const char* suffix;
      Experts ex;
      double wbytes;  // bytes per weight element
    };
    std::vector<Variant> variants;
    if (want_bf16) variants.push_back({"", Experts{spec, gu, dn, {}, {}, {}, {}}, 2.0});
    if (want_fp8) {
      ExpertsSpec s8 = spec;
      s8.quant = QuantSpec::fp8_block();
      variants.push_back({"/fp8", Experts{s8, gu8, dn8, {}, {}, gus, dns}, 1.0});
    }
    for (int64_t T : tokens) {
      Tensor x = Tensor::empty(DType::bf16, {T, sh.H}, Device::cuda());
      fill_random_bf16(x.data(), size_t(x.numel()), rng, 1.0f);
      std::vector<int32_t> idx(size_t(T * sh.K));
      std::vector<float> w(size_t(T * sh.K));
      std::vector<int64_t> perm(size_t(sh.E));
      std::vector<char> hit(size_t(sh.E), 0);
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t e = 0; e < sh.E; ++e) perm[size_t(e)] = e;
        for (int64_t j = 0; j < sh.K; ++j) {
          std::swap(perm[size_t(j)], perm[size_t(j + int64_t(rng() % uint64_t(sh.E - j)))]);
          idx[size_t(t * sh.K + j)] = int32_t(perm[size_t(j)]);
          w[size_t(t * sh.K + j)] = 1.0f / float(sh.K);
          hit[size_t(perm[size_t(j)])] = 1;
        }
      }
      int64_t distinct = 0;
      for (char hh : hit) distinct += hh;
      Tensor ti = Tensor::empty(DType::i32, {T, sh.K}, Device::cuda());
      Tensor tw = Tensor::empty(DType::f32, {T, sh.K}, Device::cuda());
      copy_bytes(ti.data(), Device::cuda(), idx.data(), Device::cpu(), ti.nbytes());
      copy_bytes(tw.data(), Device::cuda(), w.data(), Device::cpu(), tw.nbytes());
      Tensor out = Tensor::empty(DType::bf16, {T, sh.H}, Device::cuda());
      ExpertsCall call{x, ti, tw, out};
      const double flops = 2.0 * double(T * sh.K) * double(sh.H) * double(3 * sh.I);
      for (const Variant& v : variants)
      for (const std::string name : {"batched_mm", "grouped_mm", "eager", "deepgemm"}) {
        const Experts& ex = v.ex;
        const std::string label = name + v.suffix;
        const double bytes = double(distinct) * 3.0 * double(sh.H * sh.I) * v.wbytes + 2.0 * double(T * sh.H) * 2.0;
        const double floor_ms = std::max(bytes / 4.3e12, flops / 790e12) * 1e3;
        if (const char* only = std::getenv("MOEX_CUDA_PERF_BACKENDS"); only && std::string(only).find(name) == std::string::npos)
          continue;
        if (name == "batched_mm" && T > 512) continue;
        // deepgemm only when MOEX_CUDA_PERF_BACKENDS names it, and where it runs (Hopper)
        if (name == "deepgemm" && (!std::getenv("MOEX_CUDA_PERF_BACKENDS") ||
                                   !ExpertsInterface::global().supports(name, Problem::from(ex, call)).ok))
          continue;
        if (name == "eager" && ((T < 4096 && sh.E > 8) || ex.spec.quant.quantized())) continue;
        auto backend = ExpertsInterface::global().get(name);
        Workspace ws(Device::cuda());
        ws.reserve(backend->workspace_bytes(Problem::from(ex, call)));
        RunOptions opts;
        opts.stream = stream;
        opts.workspace = &ws;
        double ms = -1;
        try {
          for (int i = 0; i < 3; ++i) experts_forward(name, ex, call, opts);
          // MOEX_CUDA_PERF_REPS: timed replays per case (default 30, 10 at T >= 4096; small under ncu)
          const char* reps_env = std::getenv("MOEX_CUDA_PERF_REPS");
          const int reps = reps_env ? std::max(1, std::atoi(reps_env)) : T >= 4096 ? 10 : 30;
          std::vector<float> times;
          // MOEX_CUDA_PERF_BATCH=n: n forwards back to back between the two events, the time per
          // forward reported (the host's launch latency hidden, as in a decode loop that enqueues
          // ahead); default 1. MOEX_CUDA_PERF_FLUSH=1: 256 MiB written before each timed forward,
          // so that no weight is left in L2 by the previous replay (a model's next layer never finds
          // its experts there). Both are for A/B measurement; the default is neither.
          const char* batch_env = std::getenv("MOEX_CUDA_PERF_BATCH");
          const int batch = batch_env ? std::max(1, std::atoi(batch_env)) : 1;
          const bool flush = std::getenv("MOEX_CUDA_PERF_FLUSH") && std::atoi(std::getenv("MOEX_CUDA_PERF_FLUSH")) != 0;
          Tensor scrub = flush ? Tensor::empty(DType::u8, {int64_t(256) << 20}, Device::cuda()) : Tensor();
          // graph replay for the capturable backends (launch overhead out of the decode numbers)
          cudaGraphExec_t exec = nullptr;
          if (backend->graph_capturable()) {
            cudaGraph_t g;
            cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal);
            experts_forward(name, ex, call, opts);
            cudaStreamEndCapture(stream, &g);
            cudaGraphInstantiate(&exec, g, 0);
            cudaGraphDestroy(g);
          }
          for (int i = 0; i < reps; ++i) {
            if (flush) cuda_ok(cudaMemsetAsync(scrub.data(), i & 0xff, size_t(scrub.nbytes()), stream));
            cudaEventRecord(e0, stream);
            for (int b = 0; b < batch; ++b) {
              if (exec) cudaGraphLaunch(exec, stream);
              else experts_forward(name, ex, call, opts);
            }
            cudaEventRecord(e1, stream);
            cudaEventSynchronize(e1);
            float t = 0;
            cudaEventElapsedTime(&t, e0, e1);
            times.push_back(t / float(batch));
          }
          if (exec) cudaGraphExecDestroy(exec);
          std::sort(times.begin(), times.end());
          ms = times[times.size() / 2];
        } catch (const std::exception& e) {
          std::printf("PERF %s %lld %s error: %s\n", sh.name, (long long)T, label.c_str(), e.what());
          continue;
        }
        cuda_ok(cudaGetLastError());
        std::printf("PERF %s %lld %s %.4f %.1f %.0f %.4f\n", sh.name, (long long)T, label.c_str(), ms, flops / ms / 1e9,
                    bytes / ms / 1e6, floor_ms);
        std::fflush(stdout);
      }
    }
  }
  cudaStreamDestroy(stream);
}

#endif  // MOEX_WITH_CUDA

}  // namespace
