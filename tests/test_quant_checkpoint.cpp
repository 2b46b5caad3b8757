// FP8 checkpoints in the reference library's format (SPEC §6): `quantize_checkpoint` (moex quantize)
// → load → forward, for per-expert, fused, sharded and UE8M0 checkpoints, partial and multiple blocks,
// the flattened 1-D scale the reference writes for single-row grids, the dequantize option, and
// clear errors for bad quantization configs and inconsistent tensors. The reference for the logits
// is an independent dequantization: every e4m3 tensor × its block scales, written as an f32
// checkpoint and run by the unquantized loader.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <unistd.h>
#include <vector>

#include "model/weights.hpp"
#include "test_util.hpp"
#include "moex/config.hpp"
#include "moex/error.hpp"
#include "moex/model.hpp"
#include "moex/quant.hpp"
#include "moex/safetensors.hpp"

using namespace moex;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

using test::rel_l2;
using test::TempDir;

fs::path fixture(const std::string& name) { return test::fixture_path(name); }

const std::vector<std::vector<int64_t>> kPrompt = {{1, 5, 9, 13, 2, 7}, {3, 4, 8, 100, 12, 0}};

json read_json(const fs::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}
void write_json(const fs::path& p, const json& j) { std::ofstream(p) << j.dump(2); }

// Edits DIR/config.json's quantization_config (or removes it when `edit` returns false).
void edit_quant_config(const fs::path& dir, const std::function<bool(json&)>& edit) {
  json c = read_json(dir / "config.json");
  if (!edit(c["quantization_config"])) c.erase("quantization_config");
  write_json(dir / "config.json", c);
}

// Rewrites every shard of DIR through `edit(name, tensor)` (return false to drop the tensor).
void edit_tensors(const fs::path& dir, const std::function<bool(const std::string&, SafetensorsRawTensor&)>& edit) {
  const Checkpoint ck = Checkpoint::open(dir.string());
  for (const auto& file : ck.files()) {
    std::vector<SafetensorsRawTensor> out;
    for (const auto& name : file.names()) {
      const auto& info = file.info(name);
      const auto [data, nbytes] = file.bytes(name);
      SafetensorsRawTensor t{name, info.st_dtype, info.shape, data, nbytes};
      if (edit(name, t)) out.push_back(t);
    }
    const std::string tmp = file.path() + ".new";
    write_safetensors_raw(tmp, out);
    fs::rename(tmp, file.path());
  }
}

// The independent reference: every e4m3 tensor W [.., rows, cols] with W_scale_inv becomes f32
// W · scale, the scale block of row r being r / bn, or — for a fused gate_up whose grid has one set of
// block rows per half (2·ceil(I/bn) rows where ceil(2I/bn) would differ) — per half.
void write_dequantized_copy(const fs::path& fp8_dir, const fs::path& out_dir) {
  fs::create_directories(out_dir);
  const ModelConfig cfg = load_model_config(fp8_dir.string());
  ASSERT_TRUE(cfg.fp8.has_value());
  const int64_t bn = cfg.fp8->block_n, bk = cfg.fp8->block_k, I = cfg.text.moe_intermediate_size;
  const Checkpoint ck = Checkpoint::open(fp8_dir.string());
  std::vector<Tensor> keep;
  std::vector<std::pair<std::string, TensorView>> out;
  for (const auto& name : ck.names()) {
    const auto& info = ck.info(name);
    if (name.size() > 10 && name.compare(name.size() - 10, 10, "_scale_inv") == 0) continue;
    if (info.shape.size() > size_t(kMaxRank)) continue;  // vision patch embedding (not used by the decoder)
    if (info.dtype != DType::fp8_e4m3) {
      out.emplace_back(name, ck.get(name));
      continue;
    }
    const auto& sinfo = ck.info(name + "_scale_inv");
    const TensorView sv = ck.get(name + "_scale_inv");
    std::vector<float> s(static_cast<size_t>(sv.numel()));
    for (int64_t i = 0; i < sv.numel(); ++i)
      s[size_t(i)] = sv.dtype == DType::f32 ? sv.ptr<float>()[i] : ue8m0_to_float(static_cast<const uint8_t*>(sv.data)[i]);
    const int64_t rows = info.shape[info.shape.size() - 2], cols = info.shape.back();
    const int64_t mats = info.numel() / (rows * cols), gc = (cols + bk - 1) / bk;
    const int64_t gr = int64_t(s.size()) / (mats * gc);
    const bool per_half = info.shape.size() == 3 && rows == 2 * I && gr != (rows + bn - 1) / bn;
    Tensor t = Tensor::empty(DType::f32, info.shape.data(), int(info.shape.size()));
    const uint8_t* q = static_cast<const uint8_t*>(ck.get(name).data);
    for (int64_t m = 0; m < mats; ++m)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) {
          const int64_t br = per_half ? (r < I ? r / bn : (I + bn - 1) / bn + (r - I) / bn) : r / bn;
          const int64_t i = (m * rows + r) * cols + c;
          t.ptr<float>()[i] = e4m3_to_float(q[i]) * s[size_t((m * gr + br) * gc + c / bk)];
        }
    keep.push_back(t);
    out.emplace_back(name, t.view());
  }
  write_safetensors((out_dir / "model.safetensors").string(), out);
  json c = read_json(fp8_dir / "config.json");
  c.erase("quantization_config");
  write_json(out_dir / "config.json", c);
}

Tensor forward(const fs::path& dir, const std::string& backend, bool dequantize = false) {
  LoadOptions o;
  o.experts_implementation = backend;
  o.dequantize = dequantize;
  return Model::from_pretrained(dir.string(), o).forward(kPrompt);
}

template <class F>
void expect_error(F&& f, const std::vector<std::string>& words) {
  try {
    f();
    ADD_FAILURE() << "no error (expected one mentioning " << words[0] << ")";
  } catch (const Error& e) {
    for (const auto& w : words) EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << e.what();
  }
}

// quantize → load (kept FP8, dequantized) → forward, against the independent dequantized copy.
void round_trip(const std::string& name, const QuantizeOptions& q, int64_t expect_block_n, bool runnable = true) {
  SCOPED_TRACE(name + " block " + std::to_string(q.block_n) + "x" + std::to_string(q.block_k) + (q.ue8m0_scales ? " ue8m0" : ""));
  TempDir tmp;
  const fs::path fp8 = tmp.path / "fp8", ref = tmp.path / "ref";
  quantize_checkpoint(fixture(name).string(), fp8.string(), q);
  write_dequantized_copy(fp8, ref);

  // The experts stay FP8 with the descriptor the checkpoint implies.
  const ModelConfig cfg = load_model_config(fp8.string());
  const auto w = model::load_weights(Checkpoint::open(fp8.string()), cfg, DType::f32);
  int moe = 0;
  for (const auto& l : w.layers) {
    if (!l.is_moe) continue;
    ++moe;
    const QuantSpec& s = l.moe.experts.spec.quant;
    EXPECT_EQ(s.kind, QuantKind::fp8_block);
    EXPECT_EQ(s.block_n, expect_block_n);
    EXPECT_EQ(s.block_k, q.block_k);
    EXPECT_EQ(s.scale_format, q.ue8m0_scales ? ScaleFormat::ue8m0 : ScaleFormat::f32);
    EXPECT_EQ(l.moe.experts.gate_up.dtype, DType::fp8_e4m3);
    EXPECT_EQ(l.attn.o.weight.dtype(), DType::f32);  // other FP8 linears are dequantized at load
  }
  EXPECT_GT(moe, 0);

  const Tensor reference = forward(ref, "eager");
  // Dequantized at load: the same numbers as the independent dequantization.
  EXPECT_LT(rel_l2(forward(fp8, "grouped_mm", true), reference), 1e-6);
  if (!runnable) {
    expect_error([&] { forward(fp8, "grouped_mm"); }, {"grouped_mm", "128"});
    return;
  }
  // Run quantized: activation quantization on top of the same weights (SPEC §8 bars).
  const Tensor g = forward(fp8, "grouped_mm"), b = forward(fp8, "batched_mm"), e = forward(fp8, "eager");
  EXPECT_LT(rel_l2(g, reference), 8e-2);
  EXPECT_LT(rel_l2(b, g), 2e-3);
  EXPECT_LT(rel_l2(e, g), 2e-3);
}

}  // namespace

// Per-expert keys (gate_proj/up_proj/down_proj; Mixtral w1/w3/w2), H = 64 and I = 24: every block is
// partial, and with separate gate/up grids and I % bn != 0 the experts are re-blocked to gcd(I, bn) rows.
TEST(QuantCheckpoint, PerExpertRoundTrip) {
  if (!fs::exists(fixture("qwen3_moe"))) GTEST_SKIP() << "no fixtures";
  QuantizeOptions q;
  for (const char* name : {"qwen3_moe", "mixtral", "deepseek_v3", "qwen2_moe"}) round_trip(name, q, 8);
  q.block_n = 16;  // two block rows per gate/up half, four for down
  round_trip("olmoe", q, 8);
  q.block_n = 8;  // I % bn == 0: no re-blocking
  round_trip("qwen3_moe", q, 8);
}

TEST(QuantCheckpoint, Ue8m0Scales) {
  if (!fs::exists(fixture("qwen3_moe"))) GTEST_SKIP() << "no fixtures";
  QuantizeOptions q;
  q.ue8m0_scales = true;
  round_trip("qwen3_moe", q, 8);
  TempDir tmp;
  quantize_checkpoint(fixture("qwen3_moe").string(), tmp / "q", q);
  const Checkpoint ck = Checkpoint::open(tmp / "q");
  EXPECT_EQ(ck.info("model.layers.0.mlp.experts.3.up_proj.weight_scale_inv").st_dtype, "F8_E8M0");
  EXPECT_EQ(load_model_config(tmp / "q").fp8->ue8m0_scales, true);
}

// Fused experts (Qwen3-VL-MoE, 3 shards): gate_up_proj [E, 2I, H] with one scale grid per half
// (2I <= bn: the two rows the reference allocates) or the fused grid over all 2I rows.
TEST(QuantCheckpoint, FusedRoundTrip) {
  if (!fs::exists(fixture("qwen3_vl_moe"))) GTEST_SKIP() << "no fixtures";
  QuantizeOptions q;
  round_trip("qwen3_vl_moe", q, 8);  // per-half grid [E, 2, 1], re-blocked to gcd(24, 128)
  q.block_n = 32;                     // fused grid [E, 2, 1] over 48 rows: a block straddles gate and up
  round_trip("qwen3_vl_moe", q, 32);
  TempDir tmp;
  quantize_checkpoint(fixture("qwen3_vl_moe").string(), tmp / "q", q);
  const json index = read_json(tmp.path / "q" / "model.safetensors.index.json");
  EXPECT_EQ(index["weight_map"]["model.language_model.layers.1.mlp.experts.gate_up_proj_scale_inv"].get<std::string>(),
            index["weight_map"]["model.language_model.layers.1.mlp.experts.gate_up_proj"].get<std::string>());
  const Checkpoint ck = Checkpoint::open(tmp / "q");
  EXPECT_EQ(ck.info("model.language_model.layers.1.mlp.experts.gate_up_proj").st_dtype, "F8_E4M3");
  EXPECT_EQ(ck.info("model.language_model.layers.1.mlp.experts.gate_up_proj_scale_inv").shape, (std::vector<int64_t>{8, 2, 1}));
  EXPECT_EQ(ck.info("model.visual.patch_embed.proj.weight").st_dtype, "F32");  // vision tower as stored (rank 5)
}

// What the reference's save_pretrained writes for MoE experts: per-expert e4m3 weights beside the
// fused scales `experts.gate_up_proj_scale_inv` [E, 2·ceil(I/bn) or ceil(2I/bn), ·] and
// `experts.down_proj_scale_inv` [E, ceil(H/bn), ·]. Made here from a per-expert checkpoint.
TEST(QuantCheckpoint, PerExpertWeightsWithFusedScales) {
  if (!fs::exists(fixture("qwen3_moe"))) GTEST_SKIP() << "no fixtures";
  for (int64_t bn : {128, 8}) {
    SCOPED_TRACE(bn);
    TempDir tmp;
    const fs::path dir = tmp.path / "q";
    QuantizeOptions q;
    q.block_n = bn;
    quantize_checkpoint(fixture("qwen3_moe").string(), dir.string(), q);
    const Tensor before = forward(dir, "grouped_mm");
    const ModelConfig cfg = load_model_config(dir.string());
    const int64_t E = cfg.text.num_experts;
    std::vector<std::vector<uint8_t>> fused;  // per (layer, proj): [E, rows, cols] f32 bytes
    fused.reserve(size_t(2 * cfg.text.num_hidden_layers));
    const Checkpoint ck = Checkpoint::open(dir.string());
    std::vector<SafetensorsRawTensor> out;
    for (const auto& name : ck.names()) {
      if (name.find(".experts.") != std::string::npos && name.find("_scale_inv") != std::string::npos) continue;
      const auto [data, nbytes] = ck.file_of(name).bytes(name);
      out.push_back({name, ck.info(name).st_dtype, ck.info(name).shape, data, nbytes});
    }
    for (int64_t l = 0; l < cfg.text.num_hidden_layers; ++l) {
      const std::string base = "model.layers." + std::to_string(l) + ".mlp.experts.";
      for (const char* proj : {"gate_up_proj", "down_proj"}) {
        const bool gu = std::string(proj) == "gate_up_proj";
        std::vector<uint8_t> bytes;
        int64_t rows = 0, cols = 0;
        for (int64_t e = 0; e < E; ++e)
          for (const char* part : gu ? std::vector<const char*>{"gate_proj", "up_proj"} : std::vector<const char*>{"down_proj"}) {
            const std::string sn = base + std::to_string(e) + "." + part + ".weight_scale_inv";
            const auto [data, nbytes] = ck.file_of(sn).bytes(sn);
            bytes.insert(bytes.end(), data, data + nbytes);
            if (e == 0) rows += ck.info(sn).shape[0];
            cols = ck.info(sn).shape[1];
          }
        fused.push_back(std::move(bytes));
        out.push_back({base + proj + "_scale_inv", "F32", {E, rows, cols}, fused.back().data(), fused.back().size()});
      }
    }
    write_safetensors_raw((tmp.path / "model.safetensors.new").string(), out);
    fs::rename(tmp.path / "model.safetensors.new", dir / "model.safetensors");
    EXPECT_FALSE(Checkpoint::open(dir.string()).has("model.layers.0.mlp.experts.0.gate_proj.weight_scale_inv"));
    EXPECT_EQ(rel_l2(forward(dir, "grouped_mm"), before), 0.0);
  }
}

// Blocks narrower than 128 along the input: loads (dequantize) with several blocks in both
// directions; the CPU backends refuse to run them quantized, with the reason.
TEST(QuantCheckpoint, MultipleBlocksBothDirections) {
  if (!fs::exists(fixture("qwen3_moe"))) GTEST_SKIP() << "no fixtures";
  QuantizeOptions q;
  q.block_n = 16;
  q.block_k = 32;
  round_trip("qwen3_moe", q, 8, /*runnable=*/false);
}

// The reference writes the scale of a matrix whose grid has a single block row flattened to 1-D.
TEST(QuantCheckpoint, FlattenedScales) {
  if (!fs::exists(fixture("qwen3_moe"))) GTEST_SKIP() << "no fixtures";
  TempDir tmp;
  QuantizeOptions q;
  q.block_k = 32;  // gate/up scales [1, 2], q_proj [1, 2], ...
  const fs::path dir = tmp.path / "q";
  quantize_checkpoint(fixture("qwen3_moe").string(), dir.string(), q);
  const Tensor before = forward(dir, "eager", true);
  int flattened = 0;
  edit_tensors(dir, [&](const std::string& name, SafetensorsRawTensor& t) {
    if (name.find("_scale_inv") != std::string::npos && t.shape.size() == 2 && t.shape[0] == 1) {
      t.shape = {t.shape[1]};
      ++flattened;
    }
    return true;
  });
  EXPECT_GT(flattened, 20);
  EXPECT_EQ(rel_l2(forward(dir, "eager", true), before), 0.0);
}

TEST(QuantCheckpoint, BadQuantizationConfigs) {
  if (!fs::exists(fixture("qwen3_moe"))) GTEST_SKIP() << "no fixtures";
  TempDir tmp;
  const fs::path good = tmp.path / "good";
  quantize_checkpoint(fixture("qwen3_moe").string(), good.string());
  int n = 0;
  // A fresh copy of the quantized checkpoint, edited.
  auto variant = [&](const std::function<bool(json&)>& edit_cfg,
                     const std::function<bool(const std::string&, SafetensorsRawTensor&)>& edit_ts = {}) {
    const fs::path d = tmp.path / ("v" + std::to_string(n++));
    fs::copy(good, d, fs::copy_options::recursive);
    edit_quant_config(d, edit_cfg);
    if (edit_ts) edit_tensors(d, edit_ts);
    return d.string();
  };
  auto load = [](const std::string& d) { return Model::from_pretrained(d); };
  expect_error([&] { load(variant([](json& q) { q["quant_method"] = "awq"; return true; })); }, {"quant_method", "awq"});
  expect_error([&] { load(variant([](json& q) { q["weight_block_size"] = {128}; return true; })); }, {"weight_block_size"});
  expect_error([&] { load(variant([](json& q) { q["weight_block_size"] = {128, 0}; return true; })); }, {"weight_block_size"});
  expect_error([&] { load(variant([](json& q) { q["weight_block_size"] = {{128, 128}}; return true; })); }, {"weight_block_size"});
  expect_error([&] { load(variant([](json& q) { q.erase("weight_block_size"); return true; })); }, {"weight_block_size"});
  expect_error([&] { load(variant([](json& q) { q["scale_fmt"] = "e5m2"; return true; })); }, {"scale_fmt"});
  expect_error([&] { load(variant([](json& q) { q["activation_scheme"] = "per_tensor"; return true; })); }, {"activation_scheme"});
  expect_error([&] { load(variant([](json& q) { q["expert_dtype"] = "fp4"; return true; })); }, {"expert_dtype"});
  // e4m3 tensors without a quantization_config
  expect_error([&] { load(variant([](json&) { return false; })); }, {"F8_E4M3", "quantization_config"});
  // a block size the scales do not fit
  expect_error([&] { load(variant([](json& q) { q["weight_block_size"] = {16, 128}; return true; })); },
               {"scale tensor", "q_proj.weight_scale_inv", "[1, 1]", "[4, 1]"});
  // a missing scale tensor
  const std::string dropped = "model.layers.1.mlp.experts.5.down_proj.weight_scale_inv";
  expect_error([&] { load(variant([](json&) { return true; }, [&](const std::string& nm, SafetensorsRawTensor&) { return nm != dropped; })); },
               {dropped});
  const std::string dropped_attn = "model.layers.2.self_attn.k_proj.weight_scale_inv";
  expect_error([&] { load(variant([](json&) { return true; }, [&](const std::string& nm, SafetensorsRawTensor&) { return nm != dropped_attn; })); },
               {dropped_attn});
  // a scale of the wrong shape
  expect_error([&] {
    load(variant([](json&) { return true; }, [](const std::string& nm, SafetensorsRawTensor& t) {
      if (nm == "model.layers.0.mlp.experts.0.gate_proj.weight_scale_inv") t.shape = {1, 1, 1};
      return true;
    }));
  }, {"gate_proj.weight_scale_inv", "[1, 1, 1]"});
  // float scales that are not powers of two under scale_fmt "ue8m0"
  expect_error([&] { load(variant([](json& q) { q["scale_fmt"] = "ue8m0"; return true; })); }, {"power of two"});
  // static activation scheme: loads; the CPU backends refuse to run it; dequantized it runs
  const std::string st = variant([](json& q) { q["activation_scheme"] = "static"; return true; });
  Model m = load(st);
  expect_error([&] { m.forward(kPrompt); }, {"static"});
  LoadOptions deq;
  deq.dequantize = true;
  EXPECT_EQ(Model::from_pretrained(st, deq).forward(kPrompt).numel(), int64_t(2 * 6 * 128));
}

TEST(QuantCheckpoint, QuantizerRefusesBadInput) {
  if (!fs::exists(fixture("qwen3_moe"))) GTEST_SKIP() << "no fixtures";
  TempDir tmp;
  const std::string q = tmp / "q";
  quantize_checkpoint(fixture("qwen3_moe").string(), q);
  expect_error([&] { quantize_checkpoint(q, tmp / "qq"); }, {"already quantized"});
  expect_error([&] { quantize_checkpoint(fixture("mixtral").string(), q); }, {"not an empty directory"});
  QuantizeOptions bad;
  bad.block_n = 0;
  expect_error([&] { quantize_checkpoint(fixture("mixtral").string(), tmp / "m", bad); }, {"block"});
  expect_error([&] { quantize_checkpoint((tmp.path / "missing").string(), tmp / "m"); }, {"config.json"});
  EXPECT_FALSE(fs::exists(tmp.path / "m"));
  // nothing half-written is left beside the output
  for (const auto& e : fs::directory_iterator(tmp.path)) EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos);
  // what stays unquantized, as the reference's FineGrainedFP8 quantizer leaves it
  const Checkpoint ck = Checkpoint::open(q);
  EXPECT_EQ(ck.info("lm_head.weight").st_dtype, "F32");
  EXPECT_EQ(ck.info("model.embed_tokens.weight").st_dtype, "F32");
  EXPECT_EQ(ck.info("model.layers.0.mlp.gate.weight").st_dtype, "F32");
  EXPECT_EQ(ck.info("model.layers.0.self_attn.q_proj.weight").st_dtype, "F8_E4M3");
  EXPECT_EQ(ck.info("model.layers.0.self_attn.q_proj.weight_scale_inv").shape, (std::vector<int64_t>{1, 1}));
  EXPECT_TRUE(fs::exists(tmp.path / "q" / "generation_config.json"));
  const auto cfg = load_model_config(q);
  ASSERT_TRUE(cfg.fp8);
  EXPECT_EQ(cfg.fp8->block_n, 128);
  EXPECT_NE(std::find(cfg.fp8->modules_to_not_convert.begin(), cfg.fp8->modules_to_not_convert.end(), "lm_head"),
            cfg.fp8->modules_to_not_convert.end());
}

// GPT-OSS: the reference's FP8 experts have no biases, so the experts stay as stored and only the
// attention projections are quantized; the model still matches the dequantized copy.
TEST(QuantCheckpoint, GptOssKeepsExperts) {
  if (!fs::exists(fixture("gpt_oss"))) GTEST_SKIP() << "no fixtures";
  TempDir tmp;
  quantize_checkpoint(fixture("gpt_oss").string(), tmp / "q");
  const Checkpoint ck = Checkpoint::open(tmp / "q");
  EXPECT_EQ(ck.info("model.layers.0.mlp.experts.gate_up_proj").st_dtype, "F32");
  EXPECT_EQ(ck.info("model.layers.0.self_attn.q_proj.weight").st_dtype, "F8_E4M3");
  write_dequantized_copy(tmp.path / "q", tmp.path / "ref");
  EXPECT_LT(rel_l2(forward(tmp.path / "q", "grouped_mm"), forward(tmp.path / "ref", "grouped_mm")), 1e-6);
}

// The FP8 checkpoint made by the reference library (bench/fp8_reference_check.py on the GPU machine,
// committed as tests/fixtures/qwen3_moe_fp8): `moex forward` matches the reference's logits computed
// from its dequantized weights.
TEST(QuantCheckpoint, ReferenceLibraryFp8Fixture) {
  const fs::path dir = fixture("qwen3_moe_fp8");
  if (!fs::exists(dir / "logits_dequantized.safetensors"))
    GTEST_SKIP() << dir << " is absent: it is made by bench/gpu_fp8_ckpt.sh on the GPU machine (see tests/fixtures/README.md)";
  const auto ref = SafetensorsFile::open((dir / "logits_dequantized.safetensors").string());
  LoadOptions deq;
  deq.dequantize = true;
  const Model fp8 = Model::from_pretrained(dir.string()), dequantized = Model::from_pretrained(dir.string(), deq);
  EXPECT_EQ(fp8.config().fp8.has_value(), true);
  int checked = 0;
  for (int i = 0; ref.has("logits." + std::to_string(i)); ++i, ++checked) {
    const TensorView ids = ref.get("input_ids." + std::to_string(i));
    std::vector<int64_t> prompt(ids.ptr<int64_t>(), ids.ptr<int64_t>() + ids.numel());
    const Tensor want = convert_tensor(ref.get("logits." + std::to_string(i)), DType::f32);
    EXPECT_LT(rel_l2(dequantized.forward({prompt}), want), 1e-4) << "prompt " << i;
    EXPECT_LT(rel_l2(fp8.forward({prompt}), want), 8e-2) << "prompt " << i;
  }
  EXPECT_GT(checked, 0);
}
