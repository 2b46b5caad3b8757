// SPEC §7 for the experts API: every bad input is one clear error, never a crash.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "moex/check.hpp"
#include "moex/moex.hpp"

using namespace moex;

namespace {

struct Fixture {
  check::Instance in;
  Tensor out;
  Fixture() {
    check::Case c;
    c.seed = 1;
    c.spec.num_experts = 4;
    c.spec.hidden = 16;
    c.spec.intermediate = 8;
    c.spec.dtype = DType::bf16;
    c.tokens = 5;
    c.top_k = 2;
    in = check::make_instance(c);
    out = Tensor::empty(DType::bf16, {5, 16});
  }
  Experts ex() const { return in.experts(); }
  ExpertsCall call() const { return in.call(out); }
};

// Expects Error with `code` whose message contains `part`.
void expect_error(const std::function<void()>& f, ErrorCode code, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning '" << part << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << "message: " << e.what();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << "one line: " << e.what();
  }
}

}  // namespace

TEST(BadInput, ShapesRanksDtypes) {
  Fixture f;
  for (const char* b : {"eager", "batched_mm", "grouped_mm"}) {
    auto run = [&](const Experts& ex, const ExpertsCall& call) { return [=] { experts_forward(b, ex, call); }; };
    {  // hidden of the wrong width
      Tensor x = Tensor::empty(DType::bf16, {5, 15});
      auto c = f.call();
      c.hidden = x;
      expect_error(run(f.ex(), c), ErrorCode::invalid_argument, "hidden");
    }
    {  // wrong rank
      Tensor x = Tensor::empty(DType::bf16, {5, 16, 1});
      auto c = f.call();
      c.hidden = x;
      expect_error(run(f.ex(), c), ErrorCode::invalid_argument, "[T, H]");
    }
    {  // activation dtype mismatch
      Tensor x = Tensor::empty(DType::f32, {5, 16});
      auto c = f.call();
      c.hidden = x;
      expect_error(run(f.ex(), c), ErrorCode::invalid_argument, "f32");
    }
    {  // float indices
      Tensor i = Tensor::empty(DType::f32, {5, 2});
      auto c = f.call();
      c.top_k_index = i;
      expect_error(run(f.ex(), c), ErrorCode::invalid_argument, "i32 or i64");
    }
    {  // routing weights of another shape
      Tensor w = Tensor::empty(DType::f32, {5, 3});
      auto c = f.call();
      c.top_k_weights = w;
      expect_error(run(f.ex(), c), ErrorCode::invalid_argument, "top_k_weights");
    }
    {  // K > E
      Tensor i = Tensor::empty(DType::i32, {5, 5}), w = Tensor::empty(DType::f32, {5, 5});
      auto c = f.call();
      c.top_k_index = i;
      c.top_k_weights = w;
      expect_error(run(f.ex(), c), ErrorCode::invalid_argument, "more than the 4 experts");
    }
    {  // weights of the wrong shape
      auto ex = f.ex();
      ex.down = TensorView(f.in.down.data(), DType::bf16, {4, 8, 16});
      expect_error(run(ex, f.call()), ErrorCode::invalid_argument, "down");
    }
    {  // output of the wrong dtype
      Tensor o = Tensor::empty(DType::f16, {5, 16});
      auto c = f.call();
      c.out = o;
      expect_error(run(f.ex(), c), ErrorCode::invalid_argument, "out");
    }
    {  // missing bias when has_bias
      auto ex = f.ex();
      ex.spec.has_bias = true;
      expect_error(run(ex, f.call()), ErrorCode::invalid_argument, "gate_up_bias");
    }
    {  // bad descriptor
      auto ex = f.ex();
      ex.spec.num_experts = 0;
      expect_error(run(ex, f.call()), ErrorCode::invalid_argument, "num_experts");
    }
  }
}

TEST(BadInput, NonContiguousMisalignedNullOverlapping) {
  Fixture f;
  {
    auto c = f.call();
    c.hidden.strides[0] = 32;  // a strided view of a wider buffer
    expect_error([&] { experts_forward("grouped_mm", f.ex(), c); }, ErrorCode::invalid_argument, "contiguous");
  }
  {
    std::vector<uint8_t> raw(5 * 16 * 2 + 2);
    auto c = f.call();
    c.hidden = TensorView(raw.data() + 1, DType::bf16, {5, 16});
    expect_error([&] { experts_forward("grouped_mm", f.ex(), c); }, ErrorCode::invalid_argument, "misaligned");
  }
  {
    auto c = f.call();
    c.hidden = TensorView(nullptr, DType::bf16, {5, 16});
    expect_error([&] { experts_forward("grouped_mm", f.ex(), c); }, ErrorCode::invalid_argument, "null");
  }
  {
    auto c = f.call();
    c.out = TensorView(f.in.hidden.data(), DType::bf16, {5, 16});
    expect_error([&] { experts_forward("grouped_mm", f.ex(), c); }, ErrorCode::invalid_argument, "overlaps");
  }
}

TEST(BadInput, UnknownAndUnsupportedBackends) {
  Fixture f;
  expect_error([&] { experts_forward("warp_speed_mm", f.ex(), f.call()); }, ErrorCode::not_found, "valid: eager");
  expect_error([&] { experts_forward("deepgemm", f.ex(), f.call()); }, ErrorCode::unsupported, "use grouped_mm");
  expect_error([&] { experts_forward("sonicmoe", f.ex(), f.call()); }, ErrorCode::unsupported, "sonicmoe");
  // buffers claiming to live on a CUDA device: validated, then refused with a reason (no CUDA device here)
  if (cuda_devices().empty()) {
    auto ex = f.ex();
    auto c = f.call();
    for (TensorView* t : {&ex.gate_up, &ex.down, &c.hidden, &c.top_k_index, &c.top_k_weights, &c.out}) t->device = Device::cuda(0);
    try {
      experts_forward("grouped_mm", ex, c);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::unsupported) << e.what();
    }
  }
  // mixed devices
  auto c = f.call();
  c.out.device = Device::cuda(0);
  expect_error([&] { experts_forward("grouped_mm", f.ex(), c); }, ErrorCode::invalid_argument, "cuda:0");
}

TEST(BadInput, EmptyBatchIsValid) {
  Fixture f;
  Tensor x = Tensor::empty(DType::bf16, {0, 16}), i = Tensor::empty(DType::i32, {0, 2}), w = Tensor::empty(DType::f32, {0, 2}),
         o = Tensor::empty(DType::bf16, {0, 16});
  for (const char* b : {"eager", "batched_mm", "grouped_mm"}) EXPECT_NO_THROW(experts_forward(b, f.ex(), ExpertsCall{x, i, w, o}));
}

TEST(BadInput, StrictModeRejectsDroppedSlots) {
  Fixture f;
  f.in.top_k_index.ptr<int32_t>()[3] = 9;
  RunOptions strict;
  strict.strict_indices = true;
  expect_error([&] { experts_forward("grouped_mm", f.ex(), f.call(), strict); }, ErrorCode::invalid_argument, "top_k_index[1][1] = 9");
  EXPECT_NO_THROW(experts_forward("grouped_mm", f.ex(), f.call()));  // default: dropped, contributes zero
}

TEST(BadInput, NaNAndInfPropagateWithoutCrashing) {
  Fixture f;
  f.in.hidden.ptr<uint16_t>()[0] = float_to_bf16(NAN);
  f.in.hidden.ptr<uint16_t>()[16] = float_to_bf16(INFINITY);
  for (const char* b : {"eager", "batched_mm", "grouped_mm"}) {
    ASSERT_NO_THROW(experts_forward(b, f.ex(), f.call()));
    EXPECT_TRUE(std::isnan(bf16_to_float(f.out.ptr<uint16_t>()[0]))) << b;  // token 0 saw a NaN
    for (int h = 0; h < 16; ++h) EXPECT_TRUE(std::isfinite(bf16_to_float(f.out.ptr<uint16_t>()[2 * 16 + h]))) << b;  // token 2 clean
  }
}

TEST(BadInput, MessagesAreOneSafeLine) {
  // Controls and bytes that are not UTF-8 become escapes; printable ASCII and valid UTF-8 stay.
  EXPECT_EQ(one_line("plain 'text' [1, 2]"), "plain 'text' [1, 2]");
  EXPECT_EQ(one_line("a\nb\tc\rd"), "a\\nb\\tc\\rd");
  EXPECT_EQ(one_line(std::string("nul\0bel\a", 8)), "nul\\x00bel\\x07");
  EXPECT_EQ(one_line("\x1b[2J\x7f"), "\\x1b[2J\\x7f");
  EXPECT_EQ(one_line("caf\xc3\xa9 \xe2\x89\xa5 \xf0\x9f\x98\x80"), "caf\xc3\xa9 \xe2\x89\xa5 \xf0\x9f\x98\x80");  // é ≥ 😀
  EXPECT_EQ(one_line("\xc2\x9b" "31m"), "\\xc2\\x9b31m");                        // C1 CSI
  EXPECT_EQ(one_line("\x88\xc3"), "\\x88\\xc3");                                  // stray / cut sequences
  EXPECT_EQ(one_line("\xc0\xaf \xed\xa0\x80 \xf4\x90\x80\x80"), "\\xc0\\xaf \\xed\\xa0\\x80 \\xf4\\x90\\x80\\x80");  // overlong, surrogate, > U+10FFFF
  // Every moex::Error carries the escaped form, whoever builds it.
  const Error e(ErrorCode::parse, "tensor 'x\ny'");
  EXPECT_STREQ(e.what(), "tensor 'x\\ny'");
}

TEST(BadInput, ParsersGiveClearErrors) {
  expect_error([] { parse_device("tpu"); }, ErrorCode::invalid_argument, "tpu");
  expect_error([] { parse_activation("swishy"); }, ErrorCode::invalid_argument, "swishy");
  expect_error([] { Tensor::empty(DType::f32, {2, -1}); }, ErrorCode::invalid_argument, "negative");
}
