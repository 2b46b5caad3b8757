// Safetensors reader/writer and sharded checkpoints: round trips, every kind of corruption gives a
// clear moex::Error naming the file and the tensor, sharded index lookups, missing / mis-shaped tensors;
// loading the model weights of the fixtures (stacking, layouts, dtype conversion, errors).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <random>
#include <string>
#include <unistd.h>
#include <vector>

#include "model/reference_forward.hpp"
#include "model/weights.hpp"
#include "test_util.hpp"
#include <nlohmann/json.hpp>
#include "moex/config.hpp"
#include "moex/error.hpp"
#include "moex/model.hpp"
#include "moex/safetensors.hpp"

using namespace moex;
namespace fs = std::filesystem;

namespace {

using test::source_dir;
using test::TempDir;

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
}

// A raw safetensors image: 8-byte length + header + data.
std::string raw_file(const std::string& header, const std::string& data, int64_t len_override = -1) {
  const uint64_t n = len_override >= 0 ? uint64_t(len_override) : header.size();
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[size_t(i)] = char((n >> (8 * i)) & 0xff);
  return s + header + data;
}

// Expects open() to throw a moex::Error of `code` whose message contains every fragment.
void expect_error(const std::string& path, ErrorCode code, std::vector<std::string> fragments) {
  try {
    SafetensorsFile::open(path);
    FAIL() << "expected an error for " << path;
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.code(), code) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "multi-line message: " << msg;
    for (const auto& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << "'" << f << "' not in: " << msg;
  }
}


// True when `msg` prints as one line: no control bytes (C0, DEL, C1) and only valid UTF-8.
bool printable_one_line(const std::string& msg) {
  return moex::one_line(msg) == msg;
}

}  // namespace

TEST(Safetensors, RoundTripAllDTypes) {
  TempDir tmp;
  std::vector<float> f32 = {1.5f, -2.f, 3.25f, 0.f, 1e-3f, 7.f};
  std::vector<uint16_t> bf16 = {0x3f80, 0xc000, 0x4049, 0x0000};
  std::vector<uint16_t> f16 = {0x3c00, 0xc000};
  std::vector<int32_t> i32 = {1, -2, 3};
  std::vector<int64_t> i64 = {int64_t(1) << 40, -5};
  std::vector<uint8_t> u8 = {0, 1, 255, 7, 9};
  std::vector<uint8_t> fp8 = {0x38, 0x40, 0xb8, 0x7e};
  std::vector<double> f64 = {3.141592653589793};
  std::vector<std::pair<std::string, TensorView>> ts = {
      {"w.f32", TensorView(f32.data(), DType::f32, {2, 3})},
      {"a.bf16", TensorView(bf16.data(), DType::bf16, {2, 1, 2})},
      {"f16", TensorView(f16.data(), DType::f16, {2})},
      {"idx", TensorView(i32.data(), DType::i32, {3})},
      {"big", TensorView(i64.data(), DType::i64, {1, 2})},
      {"bytes", TensorView(u8.data(), DType::u8, {5})},
      {"fp8", TensorView(fp8.data(), DType::fp8_e4m3, {2, 2})},
      {"empty", TensorView(f32.data(), DType::f32, {0, 4})},
      {"dbl", TensorView(f64.data(), DType::f64, {1, 1, 1, 1})},
  };
  const std::string path = tmp / "rt.safetensors";
  write_safetensors(path, ts, {{"format", "pt"}});
  auto f = SafetensorsFile::open(path);
  EXPECT_EQ(f.size(), ts.size());
  EXPECT_EQ(f.metadata().at("format"), "pt");
  for (const auto& [name, v] : ts) {
    ASSERT_TRUE(f.has(name)) << name;
    TensorView r = f.get(name);
    EXPECT_EQ(r.dtype, v.dtype) << name;
    EXPECT_EQ(r.rank, v.rank) << name;
    for (int d = 0; d < v.rank; ++d) EXPECT_EQ(r.shape[size_t(d)], v.shape[size_t(d)]) << name;
    EXPECT_TRUE(r.is_contiguous());
    EXPECT_TRUE(r.device.is_cpu());
    ASSERT_EQ(r.nbytes(), v.nbytes()) << name;
    if (v.nbytes()) EXPECT_EQ(std::memcmp(r.data, v.data, v.nbytes()), 0) << name;
  }
  EXPECT_EQ(f.info("fp8").st_dtype, "F8_E4M3");
  EXPECT_EQ(f.info("a.bf16").st_dtype, "BF16");
  // names() follows the data order, which is the order written.
  auto names = f.names();
  ASSERT_EQ(names.size(), ts.size());
  EXPECT_EQ(names[0], "w.f32");
  // The map overload writes sorted by name.
  write_safetensors_map(tmp / "m.safetensors", std::map<std::string, TensorView>{{"b", ts[0].second}, {"a", ts[3].second}});
  auto m = SafetensorsFile::open(tmp / "m.safetensors");
  EXPECT_EQ(m.names(), (std::vector<std::string>{"a", "b"}));
}

TEST(Safetensors, ViewsOutliveTheOpenCall) {
  TempDir tmp;
  std::vector<float> x(1000);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(i) * 0.5f;
  write_safetensors(tmp / "x.safetensors", {{"x", TensorView(x.data(), DType::f32, {10, 100})}});
  TensorView v;
  {
    SafetensorsFile copy;
    {
      auto f = SafetensorsFile::open(tmp / "x.safetensors");
      copy = f;
    }
    v = copy.get("x");
    EXPECT_EQ(v.ptr<float>()[999], 499.5f);
  }
}

TEST(Safetensors, ReadsFilesWrittenByOtherWriters) {
  // Hand-made: scalar tensor, BOOL, a dtype moex has no type for (U16), and extra header padding.
  TempDir tmp;
  std::string data;
  const float one = 1.f;
  data.append(reinterpret_cast<const char*>(&one), 4);     // scalar [0, 4)
  data += std::string("\x01\x00", 2);                       // bool  [4, 6)
  data += std::string("\x05\x00\x06\x00", 4);               // u16   [6, 10)
  const std::string header =
      R"({"__metadata__":{"k":"v","n":3},"s":{"dtype":"F32","shape":[],"data_offsets":[0,4]},)"
      R"("flags":{"dtype":"BOOL","shape":[2],"data_offsets":[4,6]},"u":{"dtype":"U16","shape":[2],"data_offsets":[6,10]}}   )";
  write_bytes(tmp / "h.safetensors", raw_file(header, data));
  auto f = SafetensorsFile::open(tmp / "h.safetensors");
  EXPECT_EQ(f.metadata().size(), 1u);  // non-string metadata values are ignored
  TensorView s = f.get("s");
  EXPECT_EQ(s.rank, 1);
  EXPECT_EQ(s.numel(), 1);
  // The header is not padded to 8 bytes: the reader realigns the data (views are always aligned).
  EXPECT_EQ(reinterpret_cast<uintptr_t>(s.data) % 4, 0u);
  float one_back;
  std::memcpy(&one_back, s.data, 4);
  EXPECT_EQ(one_back, 1.f);
  EXPECT_EQ(f.get("flags").dtype, DType::u8);
  EXPECT_EQ(f.info("u").st_dtype, "U16");
  EXPECT_EQ(f.bytes("u").second, 4u);
  try {
    f.get("u");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::unsupported);
    EXPECT_NE(std::string(e.what()).find("U16"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("'u'"), std::string::npos);
  }
  try {
    f.get("nope");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::not_found);
    EXPECT_NE(std::string(e.what()).find("'nope'"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("h.safetensors"), std::string::npos);
  }
}

TEST(Safetensors, MisalignedTensorsAreRealigned) {
  // A u8 at [0, 1) puts the f32 tensor at an odd offset; views stay aligned and values intact.
  TempDir tmp;
  std::string data = "\x07";
  const float v[2] = {2.5f, -1.f};
  data.append(reinterpret_cast<const char*>(v), 8);
  const std::string header =
      R"({"b":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"f":{"dtype":"F32","shape":[2],"data_offsets":[1,9]}})";
  write_bytes(tmp / "odd.safetensors", raw_file(header, data));
  auto f = SafetensorsFile::open(tmp / "odd.safetensors");
  const TensorView t = f.get("f");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % 4, 0u);
  EXPECT_EQ(t.ptr<float>()[0], 2.5f);
  EXPECT_EQ(t.ptr<float>()[1], -1.f);
  EXPECT_EQ(*f.get("b").ptr<uint8_t>(), 7);
}

TEST(Safetensors, CorruptFilesGiveClearErrors) {
  TempDir tmp;
  const std::string data(32, '\0');
  auto make = [&](const std::string& name, const std::string& bytes) {
    write_bytes(tmp / name, bytes);
    return tmp / name;
  };
  const std::string good = R"({"t":{"dtype":"F32","shape":[2,4],"data_offsets":[0,32]}})";
  ASSERT_NO_THROW(SafetensorsFile::open(make("good.safetensors", raw_file(good, data))));

  expect_error(make("empty.safetensors", ""), ErrorCode::parse, {"empty.safetensors", "shorter than the 8-byte"});
  expect_error(make("short.safetensors", "abc"), ErrorCode::parse, {"short.safetensors", "3 bytes"});
  expect_error(make("hlen.safetensors", raw_file(good, data, 1000)), ErrorCode::parse,
               {"hlen.safetensors", "header length 1000 is past the end"});
  expect_error(make("hlen_huge.safetensors", raw_file(good, data, int64_t(1) << 62)), ErrorCode::parse,
               {"past the end"});
  expect_error(make("truncated.safetensors", raw_file(good, data.substr(0, 20))), ErrorCode::parse,
               {"truncated.safetensors", "'t'", "outside the data region"});
  expect_error(make("json.safetensors", raw_file(R"({"t":{"dtype":"F32",)", data)), ErrorCode::parse,
               {"json.safetensors", "malformed JSON"});
  expect_error(make("notobj.safetensors", raw_file("[1,2,3]", data)), ErrorCode::parse, {"not a JSON object"});
  expect_error(make("deep.safetensors", raw_file("{\"a\":" + std::string(5000, '[') + std::string(5000, ']') + "}", data)),
               ErrorCode::parse, {"nested deeper"});
  expect_error(make("range.safetensors", raw_file(R"({"t":{"dtype":"F32","shape":[2,4],"data_offsets":[8,40]}})", data)),
               ErrorCode::parse, {"range.safetensors", "'t'", "outside the data region"});
  expect_error(make("order.safetensors", raw_file(R"({"t":{"dtype":"F32","shape":[0],"data_offsets":[16,8]}})", data)),
               ErrorCode::parse, {"'t'", "begin > end"});
  expect_error(make("size.safetensors", raw_file(R"({"t":{"dtype":"F32","shape":[2,3],"data_offsets":[0,32]}})", data)),
               ErrorCode::parse, {"size.safetensors", "'t'", "does not match shape [2, 3]"});
  expect_error(make("overlap.safetensors",
                    raw_file(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],"data_offsets":[12,28]}})",
                             data)),
               ErrorCode::parse, {"overlap.safetensors", "'a'", "'b'", "overlap"});
  expect_error(make("dtype.safetensors", raw_file(R"({"t":{"dtype":"F33","shape":[8],"data_offsets":[0,32]}})", data)),
               ErrorCode::parse, {"dtype.safetensors", "'t'", "unknown dtype 'F33'"});
  expect_error(make("negshape.safetensors", raw_file(R"({"t":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}})", data)),
               ErrorCode::parse, {"'t'", "non-negative"});
  expect_error(make("bigshape.safetensors",
                    raw_file(R"({"t":{"dtype":"F64","shape":[4294967296,4294967296,16],"data_offsets":[0,32]}})", data)),
               ErrorCode::parse, {"'t'", "too large"});
  expect_error(make("noofs.safetensors", raw_file(R"({"t":{"dtype":"F32","shape":[8]}})", data)), ErrorCode::parse,
               {"'t'", "data_offsets"});
  expect_error(make("floatofs.safetensors", raw_file(R"({"t":{"dtype":"F32","shape":[8],"data_offsets":[0.0,32]}})", data)),
               ErrorCode::parse, {"'t'", "data_offsets"});
  expect_error(make("entry.safetensors", raw_file(R"({"t":5})", data)), ErrorCode::parse, {"'t'", "not an object"});
  expect_error(make("nodtype.safetensors", raw_file(R"({"t":{"shape":[8],"data_offsets":[0,32]}})", data)),
               ErrorCode::parse, {"'t'", "dtype"});
  expect_error(make("shapetype.safetensors", raw_file(R"({"t":{"dtype":"F32","shape":"8","data_offsets":[0,32]}})", data)),
               ErrorCode::parse, {"'t'", "shape"});
  expect_error(tmp / "does_not_exist.safetensors", ErrorCode::io, {"does_not_exist.safetensors"});
  expect_error(tmp.path.string(), ErrorCode::io, {"not a regular file"});
}

TEST(Safetensors, RandomCorruptionNeverCrashes) {
  // Flip, truncate and splice bytes of a valid file; every outcome is success or a moex::Error.
  std::vector<float> x(64, 1.f);
  std::vector<uint16_t> y(16, 0x3f80);
  TempDir tmp;
  write_safetensors(tmp / "v.safetensors",
                    {{"x", TensorView(x.data(), DType::f32, {8, 8})}, {"y", TensorView(y.data(), DType::bf16, {4, 4})}});
  std::ifstream in(tmp / "v.safetensors", std::ios::binary);
  const std::string valid((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::mt19937 rng(1234);
  int errors = 0;
  for (int it = 0; it < 3000; ++it) {
    std::string s = valid;
    const int kind = int(rng() % 3);
    if (kind == 0) {
      for (int k = 0, n = 1 + int(rng() % 4); k < n; ++k) s[rng() % s.size()] = char(rng());
    } else if (kind == 1) {
      s.resize(rng() % s.size());
    } else {
      const size_t pos = 8 + rng() % 120;
      s[pos] = "{}[]\":,0123456789-"[rng() % 18];
    }
    try {
      auto f = SafetensorsFile::from_bytes(s.data(), s.size(), "fuzz");
      for (const auto& n : f.names()) {
        auto [p, nb] = f.bytes(n);
        volatile uint8_t sum = 0;
        for (size_t i = 0; i < nb; ++i) sum = uint8_t(sum + p[i]);
        (void)sum;
      }
    } catch (const Error& e) {
      ++errors;
      EXPECT_TRUE(printable_one_line(e.what())) << e.what();  // random bytes of the file never reach the terminal raw
    }
  }
  EXPECT_GT(errors, 100);
}

TEST(Safetensors, NamesAndBytesFromTheFileAreEscapedInMessages) {
  // A hostile header: a tensor name with a newline, a BEL and a terminal colour sequence (ESC [31m),
  // then a byte that is not UTF-8 inside the JSON. The errors quote them escaped, on one line; valid
  // UTF-8 in a name (é) is kept as it is.
  TempDir tmp;
  const std::string data(4, '\0');
  const std::string hostile = R"({"a\nb\u0007\u001b[31mé":{"dtype":"zz","shape":[1],"data_offsets":[0,4]}})";
  write_bytes(tmp / "names.safetensors", raw_file(hostile, data));
  expect_error(tmp / "names.safetensors", ErrorCode::parse, {"'a\\nb\\x07\\x1b[31mé'", "unknown dtype 'zz'"});
  std::string bad_utf8 = R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"x)";
  bad_utf8 += char(0x88);
  bad_utf8 += R"(":1})";
  write_bytes(tmp / "bytes.safetensors", raw_file(bad_utf8, data));
  try {
    SafetensorsFile::open(tmp / "bytes.safetensors");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("malformed JSON"), std::string::npos) << msg;
    EXPECT_NE(msg.find("\\x88"), std::string::npos) << msg;
    EXPECT_TRUE(printable_one_line(msg)) << msg;
  }
}

TEST(Safetensors, WriterRejectsBadInput) {
  TempDir tmp;
  std::vector<float> x(4);
  TensorView v(x.data(), DType::f32, {2, 2});
  TensorView nc = v;
  nc.strides = {1, 2};
  EXPECT_THROW(write_safetensors(tmp / "a.safetensors", {{"a", v}, {"a", v}}), Error);
  EXPECT_THROW(write_safetensors(tmp / "a.safetensors", {{"a", nc}}), Error);
  EXPECT_THROW(write_safetensors(tmp / "a.safetensors", {{"a", TensorView()}}), Error);
  EXPECT_THROW(write_safetensors(tmp / "a.safetensors", {{"a", TensorView(x.data(), DType::fp4_e2m1x2, {4})}}), Error);
  EXPECT_FALSE(fs::exists(tmp / "a.safetensors"));
  try {
    write_safetensors(tmp / "no_such_dir/a.safetensors", {{"a", v}});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::io);
    EXPECT_NE(std::string(e.what()).find("no_such_dir"), std::string::npos);
  }
}

TEST(Checkpoint, SingleFileAndMissingTensor) {
  TempDir tmp;
  std::vector<float> w(6, 2.f);
  write_safetensors(tmp / "model.safetensors", {{"model.embed_tokens.weight", TensorView(w.data(), DType::f32, {3, 2})}});
  auto c = Checkpoint::open(tmp.path.string());
  EXPECT_TRUE(c.has("model.embed_tokens.weight"));
  EXPECT_FALSE(c.has("lm_head.weight"));
  EXPECT_EQ(c.get("model.embed_tokens.weight", {3, 2}).ptr<float>()[5], 2.f);
  try {
    c.get("lm_head.weight");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::not_found);
    EXPECT_NE(std::string(e.what()).find("'lm_head.weight'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(tmp.path.string()), std::string::npos) << e.what();
  }
  try {
    c.get("model.embed_tokens.weight", {128, 2});
    FAIL();
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("has shape [3, 2] but the config implies [128, 2]"), std::string::npos) << m;
    EXPECT_NE(m.find("model.embed_tokens.weight"), std::string::npos) << m;
  }
  // A single file path works too.
  EXPECT_TRUE(Checkpoint::open(tmp / "model.safetensors").has("model.embed_tokens.weight"));
  // An empty directory is an io error naming both file names.
  TempDir empty;
  try {
    Checkpoint::open(empty.path.string());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::io);
    EXPECT_NE(std::string(e.what()).find("model.safetensors.index.json"), std::string::npos);
  }
}

TEST(Checkpoint, ShardedIndex) {
  TempDir tmp;
  std::vector<float> a(4, 1.f), b(8, 2.f), c(2, 3.f);
  write_safetensors(tmp / "model-00001-of-00002.safetensors",
                    {{"a", TensorView(a.data(), DType::f32, {4})}, {"b", TensorView(b.data(), DType::f32, {2, 4})}});
  write_safetensors(tmp / "model-00002-of-00002.safetensors",
                    {{"c", TensorView(c.data(), DType::f32, {2})}, {"unlisted", TensorView(c.data(), DType::f32, {2})}});
  write_bytes(tmp / "model.safetensors.index.json",
              R"({"metadata":{"total_size":56},"weight_map":{"a":"model-00001-of-00002.safetensors",)"
              R"("b":"model-00001-of-00002.safetensors","c":"model-00002-of-00002.safetensors"}})");
  auto ck = Checkpoint::open(tmp.path.string());
  EXPECT_EQ(ck.size(), 3u);
  EXPECT_EQ(ck.files().size(), 2u);
  EXPECT_EQ(ck.names(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(ck.get("b").ptr<float>()[7], 2.f);
  EXPECT_EQ(ck.get("c").ptr<float>()[1], 3.f);
  EXPECT_FALSE(ck.has("unlisted"));
  EXPECT_NE(ck.file_of("c").path().find("00002"), std::string::npos);

  // Index errors: a tensor the shard lacks, a missing shard, a shard outside the directory, bad JSON.
  auto index_error = [&](const std::string& text, const std::vector<std::string>& frags) {
    write_bytes(tmp / "model.safetensors.index.json", text);
    try {
      Checkpoint::open(tmp.path.string());
      FAIL() << text;
    } catch (const Error& e) {
      for (const auto& f : frags) EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what();
    }
  };
  index_error(R"({"weight_map":{"z":"model-00001-of-00002.safetensors"}})", {"'z'", "does not contain it"});
  index_error(R"({"weight_map":{"a":"model-00009.safetensors"}})", {"model-00009.safetensors"});
  index_error(R"({"weight_map":{"a":"../x.safetensors"}})", {"'a'", "not a file inside"});
  index_error(R"({"weight_map":{"a":"/etc/passwd"}})", {"not a file inside"});
  index_error(R"({"weight_map":{"a":3}})", {"'a'"});
  index_error(R"({"weight_map":)", {"malformed JSON"});
  index_error(R"({"metadata":{}})", {"weight_map"});
}

TEST(Checkpoint, LoadConvertAndStackExperts) {
  TempDir tmp;
  const int E = 3, I = 2, H = 4;
  std::vector<std::vector<float>> gate(E, std::vector<float>(I * H));
  for (int e = 0; e < E; ++e)
    for (int k = 0; k < I * H; ++k) gate[size_t(e)][size_t(k)] = 1.f + float(e) + float(k) / 1024.f + 1.f / 65536.f;
  std::vector<uint16_t> bf(H);
  for (int k = 0; k < H; ++k) bf[size_t(k)] = float_to_bf16(0.5f * float(k));
  std::vector<int32_t> idx = {1, 2};
  std::vector<std::pair<std::string, TensorView>> ts;
  std::vector<std::string> names;
  for (int e = 0; e < E; ++e) {
    names.push_back("layers.0.mlp.experts." + std::to_string(e) + ".gate_proj.weight");
    ts.push_back({names.back(), TensorView(gate[size_t(e)].data(), DType::f32, {I, H})});
  }
  ts.push_back({"norm", TensorView(bf.data(), DType::bf16, {H})});
  ts.push_back({"idx", TensorView(idx.data(), DType::i32, {2})});
  ts.push_back({"bad_shape", TensorView(gate[0].data(), DType::f32, {H, I})});
  write_safetensors(tmp / "model.safetensors", ts);
  auto ck = Checkpoint::open(tmp.path.string());

  Tensor st = ck.load_stacked(names, DType::f32, {I, H});
  ASSERT_EQ(st.view().rank, 3);
  EXPECT_EQ(st.size(0), E);
  EXPECT_EQ(st.size(1), I);
  EXPECT_EQ(st.size(2), H);
  for (int e = 0; e < E; ++e)
    for (int k = 0; k < I * H; ++k) ASSERT_EQ(st.ptr<float>()[e * I * H + k], gate[size_t(e)][size_t(k)]);
  Tensor sb = ck.load_stacked(names, DType::bf16, {I, H});
  for (int e = 0; e < E; ++e)
    for (int k = 0; k < I * H; ++k)
      ASSERT_EQ(sb.ptr<uint16_t>()[e * I * H + k], float_to_bf16(gate[size_t(e)][size_t(k)]));
  Tensor n32 = ck.load("norm", DType::f32, std::vector<int64_t>{H});
  for (int k = 0; k < H; ++k) EXPECT_EQ(n32.ptr<float>()[k], 0.5f * float(k));
  Tensor n16 = ck.load("norm", DType::f16);
  EXPECT_EQ(f16_to_float(n16.ptr<uint16_t>()[3]), 1.5f);
  EXPECT_EQ(ck.load("idx", DType::i32).ptr<int32_t>()[1], 2);
  try {
    ck.load("idx", DType::bf16);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'idx'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("i32"), std::string::npos) << e.what();
  }
  names[1] = "bad_shape";
  try {
    ck.load_stacked(names, DType::f32, {I, H});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'bad_shape'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[4, 2] but the config implies [2, 4]"), std::string::npos) << e.what();
  }
  names[1] = "layers.0.mlp.experts.7.gate_proj.weight";
  try {
    ck.load_stacked(names, DType::f32, {I, H});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::not_found);
    EXPECT_NE(std::string(e.what()).find("experts.7.gate_proj"), std::string::npos) << e.what();
  }
}

TEST(Checkpoint, FixturesOpenIfPresent) {
  // Every committed fixture checkpoint opens and every tensor is readable.
  const fs::path dir = fs::path(source_dir()) / "tests" / "fixtures";
  if (!fs::exists(dir)) GTEST_SKIP() << "no fixtures under " << dir;
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!e.is_directory()) continue;
    if (!fs::exists(e.path() / "model.safetensors") && !fs::exists(e.path() / "model.safetensors.index.json")) continue;
    auto ck = Checkpoint::open(e.path().string());
    EXPECT_GT(ck.size(), 0u) << e.path();
    for (const auto& name : ck.names()) EXPECT_NO_THROW(ck.file_of(name).bytes(name)) << name;
    if (e.path().filename() == "qwen3_vl_moe") {
      // Saved in shards by the reference: the index joins them into one lookup.
      EXPECT_EQ(ck.files().size(), 3u);
      EXPECT_EQ(ck.info("model.language_model.layers.0.mlp.experts.gate_up_proj").shape, (std::vector<int64_t>{8, 48, 64}));
      EXPECT_TRUE(ck.has("model.visual.patch_embed.proj.weight"));
      EXPECT_TRUE(ck.has("lm_head.weight"));
    }
    // The reference logits: logits.<i> [1, L_i, V] F32 and input_ids.<i> [1, L_i] I64, finite.
    for (const char* lf : {"logits_f32.safetensors", "logits_bf16.safetensors"}) {
      if (!fs::exists(e.path() / lf)) continue;
      auto f = SafetensorsFile::open((e.path() / lf).string());
      for (int i = 0; f.has("logits." + std::to_string(i)); ++i) {
        TensorView l = f.get("logits." + std::to_string(i));
        TensorView ids = f.get("input_ids." + std::to_string(i));
        ASSERT_EQ(l.dtype, DType::f32);
        ASSERT_EQ(ids.dtype, DType::i64);
        ASSERT_EQ(l.rank, 3);
        ASSERT_EQ(ids.rank, 2);
        EXPECT_EQ(l.size(1), ids.size(1));
        for (int64_t k = 0; k < l.numel(); ++k) ASSERT_TRUE(std::isfinite(l.ptr<float>()[k])) << lf;
        for (int64_t k = 0; k < ids.numel(); ++k) ASSERT_LT(ids.ptr<int64_t>()[k], l.size(2));
      }
    }
    ++n;
  }
  if (n == 0) GTEST_SKIP() << "no fixture checkpoints yet";
}

// ---- model weights (src/model/weights.hpp) ------------------------------------------------------

namespace {

fs::path fixture(const std::string& name) { return test::fixture_path(name); }

// Copies the checkpoint's tensors (rank <= 4) into DIR/model.safetensors, letting `edit` drop
// (return false) or replace tensors, and copies config.json.
void copy_checkpoint(const fs::path& from, const fs::path& to,
                     const std::function<bool(const std::string&, TensorView&, std::vector<std::vector<uint8_t>>&)>& edit) {
  auto ck = Checkpoint::open(from.string());
  std::vector<std::pair<std::string, TensorView>> ts;
  std::vector<std::vector<uint8_t>> keep;
  keep.reserve(64);
  for (const auto& n : ck.names()) {
    if (ck.info(n).shape.size() > size_t(kMaxRank)) continue;
    TensorView v = ck.get(n);
    if (edit(n, v, keep)) ts.push_back({n, v});
  }
  write_safetensors((to / "model.safetensors").string(), ts);
  fs::copy_file(from / "config.json", to / "config.json");
}

}  // namespace

TEST(ModelWeights, AllFixturesLoad) {
  if (!fs::exists(fixture("qwen3_moe"))) GTEST_SKIP() << "no fixtures";
  for (const char* name : {"qwen2_moe", "qwen3_moe", "olmoe", "mixtral", "deepseek_v3", "gpt_oss", "qwen3_vl_moe"}) {
    SCOPED_TRACE(name);
    const auto cfg = load_model_config(fixture(name).string());
    const auto ck = Checkpoint::open(fixture(name).string());
    for (DType dt : {DType::f32, DType::bf16}) {
      size_t calls = 0, last = 0;
      auto w = model::load_weights(ck, cfg, dt, [&](size_t done, size_t total) {
        EXPECT_GE(done, last);
        EXPECT_LE(done, total);
        last = done;
        ++calls;
      });
      EXPECT_GT(calls, 10u);
      const auto& t = cfg.text;
      ASSERT_EQ(w.layers.size(), size_t(t.num_hidden_layers));
      EXPECT_EQ(w.embed.size(0), 128);
      EXPECT_EQ(w.embed.dtype(), dt);
      EXPECT_FALSE(w.tied);
      EXPECT_NE(w.lm_head.data(), w.embed.data());
      int moe = 0;
      for (int64_t l = 0; l < t.num_hidden_layers; ++l) {
        const auto& lw = w.layers[size_t(l)];
        EXPECT_EQ(lw.is_moe, t.is_moe_layer(l));
        if (!lw.is_moe) {
          EXPECT_TRUE(lw.mlp.defined());
          continue;
        }
        ++moe;
        const Experts& ex = lw.moe.experts;
        EXPECT_EQ(ex.spec.num_experts, 8);
        EXPECT_EQ(ex.spec.hidden, 64);
        EXPECT_EQ(ex.spec.intermediate, 24);
        EXPECT_EQ(ex.spec.dtype, dt);
        EXPECT_EQ(ex.gate_up.dtype, dt);
        const bool gpt = t.family == ModelFamily::gpt_oss;
        EXPECT_EQ(ex.spec.transposed, gpt);
        EXPECT_EQ(ex.spec.interleaved, gpt);
        EXPECT_EQ(ex.spec.has_bias, gpt);
        EXPECT_EQ(shape_to_string(ex.gate_up), gpt ? "[8, 64, 48]" : "[8, 48, 64]");
        EXPECT_EQ(shape_to_string(ex.down), gpt ? "[8, 24, 64]" : "[8, 64, 24]");
        EXPECT_EQ(lw.moe.router.weight.size(0), 8);
        EXPECT_EQ(lw.moe.router.has_bias(), gpt);
        EXPECT_EQ(lw.moe.e_score_correction_bias.numel() > 0, t.family == ModelFamily::deepseek_v3);
        EXPECT_EQ(lw.moe.shared.defined(), t.family == ModelFamily::qwen2_moe || t.family == ModelFamily::deepseek_v3);
        EXPECT_EQ(lw.moe.shared_gate.defined(), t.family == ModelFamily::qwen2_moe);
      }
      EXPECT_EQ(moe, t.num_moe_layers());
      const auto& a = w.layers[0].attn;
      if (t.family == ModelFamily::deepseek_v3) {
        EXPECT_TRUE(a.q_a.defined());
        EXPECT_TRUE(a.kv_b.defined());
        EXPECT_EQ(a.kv_a.weight.size(0), 16 + 8);
      } else {
        EXPECT_EQ(a.q.has_bias(), t.qkv_bias);
        EXPECT_EQ(a.o.has_bias(), t.o_bias);
        EXPECT_EQ(a.q_norm.numel() > 0, t.qk_norm);
        EXPECT_EQ(a.sinks.numel() > 0, t.family == ModelFamily::gpt_oss);
      }
    }
  }
}

TEST(ModelWeights, ExpertsAreStackedGateThenUp) {
  if (!fs::exists(fixture("mixtral"))) GTEST_SKIP() << "no fixtures";
  for (const char* name : {"qwen3_moe", "mixtral"}) {
    SCOPED_TRACE(name);
    const auto cfg = load_model_config(fixture(name).string());
    const auto ck = Checkpoint::open(fixture(name).string());
    const auto w = model::load_weights(ck, cfg, DType::f32);
    const bool mix = std::string(name) == "mixtral";
    const std::string base = mix ? "model.layers.1.block_sparse_moe.experts.5." : "model.layers.1.mlp.experts.5.";
    const float* gu = w.layers[1].moe.gate_up.ptr<float>() + 5 * 48 * 64;
    const float* dn = w.layers[1].moe.down.ptr<float>() + 5 * 64 * 24;
    const float* g = ck.get(base + (mix ? "w1.weight" : "gate_proj.weight")).ptr<float>();
    const float* u = ck.get(base + (mix ? "w3.weight" : "up_proj.weight")).ptr<float>();
    const float* d = ck.get(base + (mix ? "w2.weight" : "down_proj.weight")).ptr<float>();
    for (int k = 0; k < 24 * 64; ++k) {
      ASSERT_EQ(gu[k], g[k]);
      ASSERT_EQ(gu[24 * 64 + k], u[k]);
      ASSERT_EQ(dn[k], d[k]);
    }
    // bf16 loading rounds each element to nearest even.
    const auto wb = model::load_weights(ck, cfg, DType::bf16);
    const uint16_t* gub = wb.layers[1].moe.gate_up.ptr<uint16_t>() + 5 * 48 * 64;
    for (int k = 0; k < 24 * 64; ++k) ASSERT_EQ(gub[24 * 64 + k], float_to_bf16(u[k]));
  }
}

TEST(ModelWeights, HubTransposedFusedExpertsAreNormalised) {
  // Qwen3-VL-MoE hub checkpoints store gate_up_proj [E, H, 2I] and down_proj [E, I, H].
  if (!fs::exists(fixture("qwen3_vl_moe"))) GTEST_SKIP() << "no fixtures";
  TempDir tmp;
  std::vector<Tensor> owned;
  copy_checkpoint(fixture("qwen3_vl_moe"), tmp.path, [&](const std::string& n, TensorView& v, auto&) {
    if (n.find("experts.gate_up_proj") != std::string::npos || n.find("experts.down_proj") != std::string::npos) {
      const int64_t E = v.size(0), A = v.size(1), B = v.size(2);
      Tensor t = Tensor::empty(DType::f32, {E, B, A});
      for (int64_t e = 0; e < E; ++e)
        for (int64_t a = 0; a < A; ++a)
          for (int64_t b = 0; b < B; ++b) t.ptr<float>()[(e * B + b) * A + a] = v.ptr<float>()[(e * A + a) * B + b];
      owned.push_back(t);
      v = t.view();
    }
    return true;
  });
  const auto cfg = load_model_config(fixture("qwen3_vl_moe").string());
  const auto ref = model::load_weights(Checkpoint::open(fixture("qwen3_vl_moe").string()), cfg, DType::f32);
  const auto hub = model::load_weights(Checkpoint::open(tmp.path.string()), cfg, DType::f32);
  EXPECT_EQ(hub.prefix, "model.language_model.");
  for (size_t l = 0; l < ref.layers.size(); ++l) {
    const auto& a = ref.layers[l].moe;
    const auto& b = hub.layers[l].moe;
    ASSERT_EQ(shape_to_string(b.experts.gate_up), "[8, 48, 64]");
    ASSERT_EQ(shape_to_string(b.experts.down), "[8, 64, 24]");
    EXPECT_EQ(std::memcmp(a.gate_up.data(), b.gate_up.data(), a.gate_up.nbytes()), 0);
    EXPECT_EQ(std::memcmp(a.down.data(), b.down.data(), a.down.nbytes()), 0);
  }
}

TEST(ModelWeights, MissingAndMisshapedTensorsAreClearErrors) {
  if (!fs::exists(fixture("qwen3_moe"))) GTEST_SKIP() << "no fixtures";
  const auto cfg = load_model_config(fixture("qwen3_moe").string());
  {
    TempDir tmp;
    copy_checkpoint(fixture("qwen3_moe"), tmp.path, [](const std::string& n, TensorView&, auto&) {
      return n != "model.layers.1.mlp.experts.5.up_proj.weight";
    });
    try {
      model::load_weights(Checkpoint::open(tmp.path.string()), cfg, DType::bf16);
      FAIL();
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::not_found);
      EXPECT_NE(std::string(e.what()).find("'model.layers.1.mlp.experts.5.up_proj.weight'"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(tmp.path.string()), std::string::npos) << e.what();
    }
  }
  {
    TempDir tmp;
    std::vector<float> small(32 * 64, 0.f);
    copy_checkpoint(fixture("qwen3_moe"), tmp.path, [&](const std::string& n, TensorView& v, auto&) {
      if (n == "model.layers.2.self_attn.q_proj.weight") v = TensorView(small.data(), DType::f32, {32, 64});
      return true;
    });
    try {
      model::load_weights(Checkpoint::open(tmp.path.string()), cfg, DType::f32);
      FAIL();
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("'model.layers.2.self_attn.q_proj.weight'"), std::string::npos) << m;
      EXPECT_NE(m.find("has shape [32, 64] but the config implies [64, 64]"), std::string::npos) << m;
    }
  }
  {
    // Tied embeddings: no lm_head needed, and it shares the embedding's storage.
    TempDir tmp;
    copy_checkpoint(fixture("qwen3_moe"), tmp.path, [](const std::string& n, TensorView&, auto&) { return n != "lm_head.weight"; });
    EXPECT_THROW(model::load_weights(Checkpoint::open(tmp.path.string()), cfg, DType::f32), Error);
    auto tied = cfg;
    tied.text.tie_word_embeddings = true;
    auto w = model::load_weights(Checkpoint::open(tmp.path.string()), tied, DType::f32);
    EXPECT_TRUE(w.tied);
    EXPECT_EQ(w.lm_head.data(), w.embed.data());
  }
  EXPECT_THROW(model::load_weights(Checkpoint::open(fixture("qwen3_moe").string()), cfg, DType::i32), Error);
}

// ---- end-to-end parity of the f32 reference forward with the reference library's fixtures ----------

using test::rel_l2;

class ReferenceParity : public ::testing::TestWithParam<std::string> {};

TEST_P(ReferenceParity, F32LogitsAndGreedy) {
  const std::string name = GetParam();
  if (!fs::exists(fixture(name))) GTEST_SKIP() << "no fixture " << name;
  const auto cfg = load_model_config(fixture(name).string());
  const auto w = model::load_weights(Checkpoint::open(fixture(name).string()), cfg, DType::f32);
  const auto ref = SafetensorsFile::open((fixture(name) / "logits_f32.safetensors").string());
  std::ifstream gin(fixture(name) / "greedy.json");
  const nlohmann::json greedy = nlohmann::json::parse(gin);
  const auto prompts = greedy["prompts"].get<std::vector<std::vector<int64_t>>>();
  const auto sequences = greedy["sequences"].get<std::vector<std::vector<int64_t>>>();
  for (size_t p = 0; p < prompts.size(); ++p) {
    const TensorView r = ref.get("logits." + std::to_string(p));
    for (const char* backend : {"grouped_mm", "eager", "batched_mm"}) {
      const auto logits = model::reference_logits(w, cfg.text, prompts[p], backend);
      ASSERT_EQ(int64_t(logits.size()), r.numel());
      const double err = rel_l2(logits.data(), r.ptr<float>(), r.numel());
      EXPECT_LE(err, 1e-4) << name << " prompt " << p << " backend " << backend;
      if (std::string(backend) == "grouped_mm") std::printf("  %s prompt %zu: f32 logits rel L2 %.2e\n", name.c_str(), p, err);
    }
    const auto seq = model::reference_greedy(w, cfg.text, prompts[p], greedy["max_new_tokens"].get<int64_t>(),
                                             cfg.generation.eos_token_id);
    EXPECT_EQ(seq, sequences[p]) << name << " prompt " << p;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ReferenceParity,
                         ::testing::Values("qwen2_moe", "qwen3_moe", "olmoe", "mixtral", "deepseek_v3", "gpt_oss",
                                           "qwen3_vl_moe"));

TEST_P(ReferenceParity, Bf16WeightsWithinTheSpecBound) {
  // SPEC §8: bf16 logits against the reference's f32 logits within max(3e-2, 1.5 × the reference's
  // own bf16 error).
  const std::string name = GetParam();
  if (!fs::exists(fixture(name))) GTEST_SKIP() << "no fixture " << name;
  const auto cfg = load_model_config(fixture(name).string());
  const auto w = model::load_weights(Checkpoint::open(fixture(name).string()), cfg, DType::bf16);
  auto packed = w;  // the dense linears on the packed kernel too, as Model loads them (where the CPU has it)
  model::pack_linears_for_cpu(packed, 2);
  const auto ref = SafetensorsFile::open((fixture(name) / "logits_f32.safetensors").string());
  std::ifstream gin(fixture(name) / "greedy.json");
  const nlohmann::json greedy = nlohmann::json::parse(gin);
  const auto prompts = greedy["prompts"].get<std::vector<std::vector<int64_t>>>();
  const auto ref_err = greedy["reference"]["bf16_vs_f32_rel_l2"].get<std::vector<double>>();
  for (size_t p = 0; p < prompts.size(); ++p) {
    const TensorView r = ref.get("logits." + std::to_string(p));
    const double bound = std::max(3e-2, 1.5 * ref_err[p]);
    for (const model::ModelWeights* weights : {&w, static_cast<const model::ModelWeights*>(&packed)})
      for (const char* backend : {"grouped_mm", "eager", "batched_mm"}) {
        const auto logits = model::reference_logits(*weights, cfg.text, prompts[p], backend);
        const double err = rel_l2(logits.data(), r.ptr<float>(), r.numel());
        const char* how = weights == &w ? "in place" : "packed";
        EXPECT_LE(err, bound) << name << " prompt " << p << " backend " << backend << " linears " << how;
        if (std::string(backend) == "grouped_mm")
          std::printf("  %s prompt %zu, linears %s: bf16 rel L2 %.2e (reference's own %.2e, bound %.2e)\n", name.c_str(), p, how,
                      err, ref_err[p], bound);
      }
  }
}

// ---- moex::Model (include/moex/model.hpp) -------------------------------------------------------

namespace {

nlohmann::json read_greedy(const std::string& name) {
  std::ifstream gin(fixture(name) / "greedy.json");
  return nlohmann::json::parse(gin);
}

}  // namespace

TEST_P(ReferenceParity, ModelForwardAndKvCacheGeneration) {
  const std::string name = GetParam();
  if (!fs::exists(fixture(name))) GTEST_SKIP() << "no fixture " << name;
  const Model m = Model::from_pretrained(fixture(name).string());
  const auto greedy = read_greedy(name);
  const auto prompts = greedy["prompts"].get<std::vector<std::vector<int64_t>>>();
  const auto sequences = greedy["sequences"].get<std::vector<std::vector<int64_t>>>();
  const auto ref = SafetensorsFile::open((fixture(name) / "logits_f32.safetensors").string());
  // forward: [1, L, V]
  const Tensor logits = m.forward({prompts[0]});
  ASSERT_EQ(logits.size(0), 1);
  ASSERT_EQ(logits.size(1), int64_t(prompts[0].size()));
  const TensorView r = ref.get("logits.0");
  EXPECT_LE(rel_l2(logits.ptr<float>(), r.ptr<float>(), r.numel()), 1e-4);
  // generate: a batch of prompts of different lengths, greedy with the KV cache, EOS from the
  // generation config; identical to the reference's continuations.
  const auto out = m.generate(prompts, {.max_new_tokens = greedy["max_new_tokens"].get<int64_t>()});
  EXPECT_EQ(out, sequences);
}

TEST(Model, ExpertsImplementationMap) {
  if (!fs::exists(fixture("qwen3_vl_moe"))) GTEST_SKIP() << "no fixtures";
  // Plain model: one entry.
  Model q = Model::from_pretrained(fixture("qwen3_moe").string());
  EXPECT_EQ(q.get_experts_implementation(), (std::map<std::string, std::string>{{"", "grouped_mm"}}));
  q.set_experts_implementation("eager");
  EXPECT_EQ(q.decoder_experts_backend(), "eager");
  try {
    q.set_experts_implementation("no_such_backend");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::not_found);
    EXPECT_NE(std::string(e.what()).find("grouped_mm"), std::string::npos) << e.what();  // lists the valid names
  }
  EXPECT_EQ(q.decoder_experts_backend(), "eager");  // unchanged after the error
  try {
    q.set_experts_implementation({{"text_config", "eager"}});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown sub-config 'text_config'"), std::string::npos) << e.what();
  }
  // deepgemm_megamoe is a load-time choice.
  try {
    q.set_experts_implementation("deepgemm_megamoe");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::unsupported);
    EXPECT_NE(std::string(e.what()).find("load-time"), std::string::npos) << e.what();
  }

  // Composite: one entry per sub-config; "" applies to every sub-config not named.
  Model c = Model::from_pretrained(fixture("qwen3_vl_moe").string(),
                                   {.experts_implementation = ExpertsImplementation{{"", "batched_mm"}, {"text_config", "eager"}}});
  EXPECT_EQ(c.get_experts_implementation(),
            (std::map<std::string, std::string>{{"", "batched_mm"}, {"text_config", "eager"}, {"vision_config", "eager"}}));
  EXPECT_EQ(c.decoder_experts_backend(), "eager");
  c.set_experts_implementation({{"text_config", "grouped_mm"}});
  EXPECT_EQ(c.get_experts_implementation().at("text_config"), "grouped_mm");
  EXPECT_EQ(c.get_experts_implementation().at(""), "batched_mm");
  EXPECT_EQ(c.get_experts_implementation().at("vision_config"), "eager");  // no MoE layers
  EXPECT_EQ(Model::from_pretrained(fixture("qwen3_vl_moe").string()).get_experts_implementation(),
            (std::map<std::string, std::string>{{"", "grouped_mm"}, {"text_config", "grouped_mm"}, {"vision_config", "eager"}}));
  c.set_experts_implementation("eager");
  for (const auto& [k, v] : c.get_experts_implementation()) EXPECT_EQ(v, "eager") << k;
  // Unknown keys and names fail at load, before the weights are read.
  EXPECT_THROW(Model::from_pretrained(fixture("qwen3_vl_moe").string(), {.experts_implementation = ExpertsImplementation{{"audio_config", "eager"}}}),
               Error);
  EXPECT_THROW(Model::from_pretrained(fixture("qwen3_moe").string(), {.experts_implementation = "nope"}), Error);
  // A backend whose requirements are unmet fails on the first forward, with its reason.
  Model mm = Model::from_pretrained(fixture("qwen3_moe").string(), {.experts_implementation = "deepgemm_megamoe"});
  try {
    mm.forward({{1, 2, 3}});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::unsupported) << e.what();
    EXPECT_NE(std::string(e.what()).find("deepgemm_megamoe"), std::string::npos) << e.what();
  }
  // Every CPU backend gives the same greedy continuation.
  const auto base = q.generate({{1, 5, 9}}, {.max_new_tokens = 6});
  for (const char* b : {"eager", "batched_mm", "grouped_mm"}) {
    q.set_experts_implementation(b);
    EXPECT_EQ(q.generate({{1, 5, 9}}, {.max_new_tokens = 6}), base) << b;
  }
}

TEST(ModelAttention, MatchesAnF64LoopAndOneQueryAtATime) {
  // The CPU forward's attention on random q / k / v: against an f64 loop (causal, GQA, sliding
  // window, sinks), and 40 queries at once (scores over transposed key tiles; value sums of 4 heads ×
  // 64 values together where the group and the value width allow) bit for bit against each query
  // alone (scores one key at a time).
  struct Case {
    int64_t nh, nkv, dq, dv, window;
    bool sinks;
  };
  const Case cases[] = {{8, 2, 64, 64, 0, false}, {16, 4, 64, 64, 0, true}, {8, 1, 72, 40, 5, false},
                        {4, 4, 24, 16, 0, false}, {12, 3, 128, 128, 7, true}, {8, 2, 20, 136, 0, false}};
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (const Case& c : cases) {
    const int64_t n = 40, pos0 = 9, Tk = pos0 + n;
    std::vector<float> q(size_t(n * c.nh * c.dq)), k(size_t(Tk * c.nkv * c.dq)), v(size_t(Tk * c.nkv * c.dv)), sinks(size_t(c.nh));
    for (auto* buf : {&q, &k, &v, &sinks})
      for (float& x : *buf) x = nd(rng);
    const double scaling = 1.0 / std::sqrt(double(c.dq));
    const float* sk = c.sinks ? sinks.data() : nullptr;
    const auto all = model::causal_attention(q.data(), k.data(), v.data(), n, Tk, pos0, c.nh, c.nkv, c.dq, c.dv, scaling, c.window, sk);
    ASSERT_EQ(all.size(), size_t(n * c.nh * c.dv));
    std::vector<double> ref(all.size());
    const int64_t group = c.nh / c.nkv;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t h = 0; h < c.nh; ++h) {
        const int64_t p = pos0 + i, kh = h / group, j0 = c.window > 0 ? std::max<int64_t>(0, p - c.window + 1) : 0;
        std::vector<double> sc;
        double mx = c.sinks ? double(sinks[size_t(h)]) : -1e300;
        for (int64_t j = j0; j <= p; ++j) {
          double d = 0;
          for (int64_t e = 0; e < c.dq; ++e) d += double(q[size_t((i * c.nh + h) * c.dq + e)]) * k[size_t((j * c.nkv + kh) * c.dq + e)];
          sc.push_back(d * scaling);
          mx = std::max(mx, sc.back());
        }
        double den = c.sinks ? std::exp(double(sinks[size_t(h)]) - mx) : 0.0;
        for (double& x : sc) den += (x = std::exp(x - mx));
        for (int64_t e = 0; e < c.dv; ++e) {
          double acc = 0;
          for (int64_t j = j0; j <= p; ++j) acc += sc[size_t(j - j0)] / den * v[size_t((j * c.nkv + kh) * c.dv + e)];
          ref[size_t((i * c.nh + h) * c.dv + e)] = acc;
        }
      }
    double num = 0, den = 0;
    for (size_t e = 0; e < all.size(); ++e) {
      num += (all[e] - ref[e]) * (all[e] - ref[e]);
      den += ref[e] * ref[e];
    }
    EXPECT_LE(std::sqrt(num / den), 1e-5) << c.nh << "/" << c.nkv << " dq " << c.dq << " dv " << c.dv;
    for (int64_t i = 0; i < n; ++i) {
      const auto one = model::causal_attention(q.data() + i * c.nh * c.dq, k.data(), v.data(), 1, Tk, pos0 + i, c.nh, c.nkv, c.dq,
                                               c.dv, scaling, c.window, sk);
      ASSERT_EQ(std::memcmp(one.data(), all.data() + i * c.nh * c.dv, one.size() * sizeof(float)), 0)
          << c.nh << "/" << c.nkv << " dq " << c.dq << " dv " << c.dv << " query " << i;
    }
  }
}

TEST(Model, LongPromptAtOnceMatchesTokenByToken) {
  // A 40-token prompt in one forward (attention of >= 16 queries: keys in transposed tiles; packed
  // bf16 linears with bf16 inputs) against the same tokens one at a time through the KV cache (one query: the plain
  // loop; f32 inputs to the linears): every position's logits agree. Fixtures with GQA, MLA and
  // sliding windows + sinks.
  for (const char* name : {"qwen3_moe", "deepseek_v3", "gpt_oss"}) {
    if (!fs::exists(fixture(name))) GTEST_SKIP() << "no fixtures";
    const auto cfg = load_model_config(fixture(name).string());
    for (DType dt : {DType::f32, DType::bf16}) {
      const auto w = model::load_weights(Checkpoint::open(fixture(name).string()), cfg, dt);
      auto packed = w;
      model::pack_linears_for_cpu(packed, 2);
      std::vector<int64_t> ids(40);
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = int64_t((i * 37) % 120 + 1);
      const int64_t V = cfg.text.vocab_size, L = int64_t(ids.size());
      model::KvCache all_cache;
      const auto all = model::forward_tokens(packed, cfg.text, ids.data(), L, all_cache);
      model::KvCache step_cache;
      for (int64_t i = 0; i < L; ++i) {
        const auto one = model::forward_tokens(w, cfg.text, ids.data() + i, 1, step_cache);
        const double err = rel_l2(all.data() + i * V, one.data(), V);
        // f32: both ways f32 math (different summation orders only). bf16: the linears' inputs
        // rounded to bf16 (MOEX_CPU_LINEAR_TERMS=1, the default; two terms: ~16 bits) against exact
        // f32 inputs, and the bf16 roundings of the experts' inputs and outputs that such differences
        // move: measured up to 1.0e-2 (deepseek_v3) with one term, 2.5e-3 with two, against SPEC
        // §8's 3e-2 for bf16 model logits
        EXPECT_LE(err, dt == DType::f32 ? 1e-5 : 3e-2) << name << " " << dtype_name(dt) << " position " << i;
      }
    }
  }
}

TEST(Model, SamplingAndOptions) {
  if (!fs::exists(fixture("mixtral"))) GTEST_SKIP() << "no fixtures";
  const Model m = Model::from_pretrained(fixture("mixtral").string(), {.dtype = DType::bf16});
  EXPECT_EQ(m.dtype(), DType::bf16);
  const std::vector<std::vector<int64_t>> p = {{1, 5, 9, 13}, {3, 4}};
  const auto greedy = m.generate(p, {.max_new_tokens = 8, .eos_token_id = std::vector<int64_t>{}});
  ASSERT_EQ(greedy.size(), 2u);
  EXPECT_EQ(greedy[0].size(), 12u);
  EXPECT_EQ(greedy[1].size(), 10u);
  // top_k = 1 and temperature 0 are greedy.
  EXPECT_EQ(m.generate(p, {.max_new_tokens = 8, .do_sample = true, .top_k = 1, .eos_token_id = std::vector<int64_t>{}}), greedy);
  EXPECT_EQ(m.generate(p, {.max_new_tokens = 8, .do_sample = true, .temperature = 0.0, .eos_token_id = std::vector<int64_t>{}}),
            greedy);
  // Same seed, same samples; another seed differs (with high probability at temperature 2).
  GenerateOptions s{.max_new_tokens = 8, .do_sample = true, .temperature = 2.0, .top_k = 0, .top_p = 0.95, .seed = 7,
                    .eos_token_id = std::vector<int64_t>{}};
  const auto a = m.generate(p, s);
  EXPECT_EQ(m.generate(p, s), a);
  s.seed = 8;
  EXPECT_NE(m.generate(p, s), a);
  for (const auto& seq : a)
    for (int64_t id : seq) EXPECT_TRUE(id >= 0 && id < 128);
  // EOS stops a sequence right after it.
  const int64_t first = greedy[0][4];
  const auto stopped = m.generate(p, {.max_new_tokens = 8, .eos_token_id = std::vector<int64_t>{first}});
  EXPECT_EQ(stopped[0].size(), 5u);
  // max_new_tokens 0 returns the prompts.
  EXPECT_EQ(m.generate(p, {.max_new_tokens = 0}), p);
  // Bad input.
  EXPECT_THROW(m.forward({{1, 2}, {3}}), Error);
  EXPECT_THROW(m.forward({{1, 500}}), Error);
  EXPECT_THROW(m.generate({{}}), Error);
  EXPECT_THROW(m.generate(p, {.top_p = 0.0}), Error);
  EXPECT_THROW(Model::from_pretrained(fixture("mixtral").string(), {.dtype = DType::i32}), Error);
  if (cuda_devices().empty())  // with a GPU this loads (tests/test_model_cuda.cpp)
    EXPECT_THROW(Model::from_pretrained(fixture("mixtral").string(), {.device = Device::cuda(0)}), Error);
  EXPECT_THROW(Model::from_pretrained((fixture("mixtral") / "nope").string()), Error);
}

TEST(Model, CliHelpers) {
  EXPECT_EQ(parse_token_ids("1,2,3;4,5,6"), (std::vector<std::vector<int64_t>>{{1, 2, 3}, {4, 5, 6}}));
  EXPECT_EQ(parse_token_ids(" 7 , 8 ; 9"), (std::vector<std::vector<int64_t>>{{7, 8}, {9}}));
  EXPECT_EQ(parse_token_ids("5"), (std::vector<std::vector<int64_t>>{{5}}));
  for (const char* bad : {"", ";", "1,,2", "1;", "a,b", "-1", "1.5", "1;2;;3", "99999999999999999999"}) {
    try {
      parse_token_ids(bad);
      FAIL() << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::invalid_argument) << bad;
      EXPECT_NE(std::string(e.what()).find("--ids"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(sequences_to_json({{1, 2}, {3}}), "[[1, 2], [3]]");
  EXPECT_EQ(sequences_to_json({}), "[]");
  if (!fs::exists(fixture("olmoe"))) GTEST_SKIP() << "no fixtures";
  TempDir tmp;
  const Model m = Model::from_pretrained(fixture("olmoe").string());
  const Tensor l = m.forward(parse_token_ids("1,5,9,13,2,7;1,5,9,13,2,7"));
  write_logits(tmp / "out.safetensors", l);
  const auto f = SafetensorsFile::open(tmp / "out.safetensors");
  const TensorView v = f.get("logits");
  EXPECT_EQ(shape_to_string(v), "[2, 6, 128]");
  const auto ref = SafetensorsFile::open((fixture("olmoe") / "logits_f32.safetensors").string());
  EXPECT_LE(rel_l2(v.ptr<float>(), ref.get("logits.0").ptr<float>(), 6 * 128), 1e-4);
  EXPECT_LE(rel_l2(v.ptr<float>() + 6 * 128, ref.get("logits.0").ptr<float>(), 6 * 128), 1e-4);
}

TEST(Model, ConfigMutationsGiveErrorsNotCrashes) {
  // Every integer field of the fixtures' configs set to other values: loading and a forward either
  // work or throw moex::Error (never a crash or an out-of-bounds read).
  if (!fs::exists(fixture("qwen3_moe"))) GTEST_SKIP() << "no fixtures";
  int runs = 0, errors = 0;
  for (const char* name : {"qwen2_moe", "deepseek_v3", "gpt_oss", "qwen3_vl_moe"}) {
    std::ifstream in(fixture(name) / "config.json");
    const nlohmann::json base = nlohmann::json::parse(in);
    std::vector<std::vector<std::string>> paths;
    for (auto it = base.begin(); it != base.end(); ++it) {
      if (it.value().is_number_integer()) paths.push_back({it.key()});
      if (it.key() == "text_config")
        for (auto jt = it.value().begin(); jt != it.value().end(); ++jt)
          if (jt.value().is_number_integer()) paths.push_back({it.key(), jt.key()});
    }
    for (const auto& path : paths) {
      for (int64_t delta : {int64_t(-1), int64_t(1), int64_t(1) << 40}) {
        nlohmann::json cfg = base;
        nlohmann::json* v = &cfg;
        for (const auto& k : path) v = &(*v)[k];
        *v = delta == (int64_t(1) << 40) ? delta : v->get<int64_t>() + delta;
        TempDir tmp;
        std::ofstream(tmp / "config.json") << cfg.dump();
        for (const auto& e : fs::directory_iterator(fixture(name)))
          if (e.path().filename().string().rfind("model", 0) == 0) fs::create_symlink(e.path(), tmp.path / e.path().filename());
        ++runs;
        try {
          const Model m = Model::from_pretrained(tmp.path.string());
          m.forward({{1, 5, 9}});
          m.generate({{3, 4}}, {.max_new_tokens = 2});
        } catch (const Error&) {
          ++errors;
        }
      }
    }
  }
  EXPECT_GT(runs, 100);
  EXPECT_GT(errors, 50);
  std::printf("  %d mutated configs, %d clean errors\n", runs, errors);
}
