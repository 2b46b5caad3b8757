// model/quantize.cpp — `moex quantize`: a bf16/f16/f32 checkpoint → an FP8 block-scaled checkpoint in
// the reference library's format (see quantize_checkpoint in moex/model.hpp and SPEC §6).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "core/check.hpp"
#include "core/files.hpp"
#include "moex/config.hpp"
#include "moex/model.hpp"
#include "moex/quant.hpp"
#include "moex/safetensors.hpp"

namespace moex {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
std::string last_component(const std::string& module) {
  const auto dot = module.rfind('.');
  return dot == std::string::npos ? module : module.substr(dot + 1);
}

// Files beside the weights that a model directory carries over unchanged.
const char* const kCopiedFiles[] = {"generation_config.json", "tokenizer.json", "tokenizer_config.json",
                                    "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt",
                                    "tokenizer.model", "chat_template.jinja", "chat_template.json",
                                    "preprocessor_config.json", "processor_config.json", "video_preprocessor_config.json"};

// The decoder linears the reference's FineGrainedFP8 quantizer converts (its nn.Linear modules inside the
// decoder layers); routers are custom modules there and are left alone, as are embeddings and norms.
const std::set<std::string> kLinearModules = {"q_proj",    "k_proj",    "v_proj",    "o_proj",
                                              "q_a_proj",  "q_b_proj",  "kv_a_proj_with_mqa", "kv_b_proj",
                                              "gate_proj", "up_proj",   "down_proj"};
const std::set<std::string> kExpertMatrices = {"gate_proj", "up_proj", "down_proj", "w1", "w2", "w3"};

// transformers' should_convert_module: a pattern matches a module name from its start up to a module
// boundary, or as a suffix.
bool matches_pattern(const std::string& module, const std::string& p) {
  if (module == p || ends_with(module, p)) return true;
  return module.size() > p.size() && module.compare(0, p.size(), p) == 0 && module[p.size()] == '.';
}

// FP8 quantization of E stacked [rows, cols] matrices: codes [E, rows, cols], scales [E, gr, gc] where
// the grid is per block of (bn, bk), or per half of the rows (`halves`: gate and up each get their own
// ceil(rows/2 / bn) block rows; what the reference allocates for a fused gate_up with 2I <= bn).
std::pair<Tensor, Tensor> quantize_stack(const float* w, int64_t E, int64_t rows, int64_t cols, const QuantizeOptions& o,
                                         bool halves) {
  const ScaleFormat fmt = o.ue8m0_scales ? ScaleFormat::ue8m0 : ScaleFormat::f32;
  const size_t ss = o.ue8m0_scales ? 1 : 4;
  const int64_t part_rows = halves ? rows / 2 : rows, parts = halves ? 2 : 1;
  const int64_t gr = ceil_div(part_rows, o.block_n), gc = ceil_div(cols, o.block_k);
  Tensor q = Tensor::empty(DType::fp8_e4m3, {E, rows, cols});
  Tensor s = Tensor::empty(o.ue8m0_scales ? DType::ue8m0 : DType::f32, {E, parts * gr, gc});
  for (int64_t e = 0; e < E; ++e)
    for (int64_t p = 0; p < parts; ++p) {
      const int64_t r0 = e * rows + p * part_rows;
      quantize_fp8_blocks(w + r0 * cols, part_rows, cols, int(o.block_n), int(o.block_k), fmt, q.ptr<uint8_t>() + r0 * cols,
                          static_cast<uint8_t*>(s.data()) + size_t((e * parts + p) * gr * gc) * ss);
    }
  return {std::move(q), std::move(s)};
}

// [E, A, B] f32 → [E, B, A]
std::vector<float> transpose_last2(const std::vector<float>& in, int64_t E, int64_t A, int64_t B) {
  std::vector<float> out(in.size());
  for (int64_t e = 0; e < E; ++e)
    for (int64_t a = 0; a < A; ++a)
      for (int64_t b = 0; b < B; ++b) out[size_t((e * B + b) * A + a)] = in[size_t((e * A + a) * B + b)];
  return out;
}

std::vector<float> as_f32(const Checkpoint& ck, const std::string& name) {
  const TensorView v = ck.get(name);
  if (!(is_float_activation(v.dtype) || v.dtype == DType::f64))
    detail::fail(ErrorCode::unsupported, "tensor '{}' in checkpoint {} is {}; moex quantize reads bf16, f16 or f32 weights", name,
                 ck.dir(), ck.info(name).st_dtype);
  std::vector<float> out(static_cast<size_t>(v.numel()));
  convert_elements(out.data(), DType::f32, v.data, v.dtype, v.numel());
  return out;
}

}  // namespace

void quantize_checkpoint(const std::string& in_dir, const std::string& out_dir, const QuantizeOptions& o) {
  MOEX_CHECK(o.block_n >= 1 && o.block_k >= 1 && o.block_n <= 65536 && o.block_k <= 65536,
             "quantize: block {}x{} must be two positive sizes", o.block_n, o.block_k);
  const ModelConfig cfg = load_model_config(in_dir);
  if (cfg.fp8 || !cfg.quantization_config.empty())
    detail::fail(ErrorCode::invalid_argument, "quantize: checkpoint {} is already quantized (quantization_config {})", in_dir,
                 cfg.quantization_config);
  const TextConfig& t = cfg.text;
  const Checkpoint ck = Checkpoint::open(in_dir);

  std::error_code ec;
  const fs::path out(out_dir);
  if (fs::exists(out, ec)) {
    MOEX_CHECK(fs::is_directory(out, ec) && fs::is_empty(out, ec),
               "quantize: output {} exists and is not an empty directory (nothing is overwritten)", out_dir);
    MOEX_CHECK(!fs::equivalent(out, fs::path(in_dir), ec), "quantize: --out must differ from --in");
  }

  const int64_t E = t.num_experts, H = t.hidden_size, I = t.moe_intermediate_size;
  const bool gpt_oss = t.family == ModelFamily::gpt_oss;
  Fp8QuantConfig q;
  q.block_n = o.block_n;
  q.block_k = o.block_k;
  q.ue8m0_scales = o.ue8m0_scales;
  // What stays unquantized, in the reference's pattern syntax (so that it builds the same modules at load).
  q.modules_to_not_convert = {"lm_head", "mlp.gate", "block_sparse_moe.gate", "shared_expert_gate"};
  if (gpt_oss) q.modules_to_not_convert.insert(q.modules_to_not_convert.end(), {"mlp.router", "mlp.experts"});
  for (const auto& sc : cfg.sub_configs)
    if (sc.key == "vision_config") q.modules_to_not_convert.push_back("model.visual");

  auto skipped = [&](const std::string& module) {
    for (const auto& p : q.modules_to_not_convert)
      if (matches_pattern(module, p)) return true;
    return false;
  };

  // Shards keep their file names (one output file per input file).
  std::map<std::string, std::vector<std::string>> by_file;
  for (const auto& name : ck.names()) by_file[fs::path(ck.file_of(name).path()).filename().string()].push_back(name);
  const bool sharded = ck.files().size() > 1 || fs::exists(fs::path(in_dir) / "model.safetensors.index.json", ec);

  std::string tmp_name = out.filename().string();
  tmp_name.insert(0, 1, '.');
  tmp_name += ".tmp-" + std::to_string(std::random_device{}());
  const fs::path tmp = out.parent_path() / tmp_name;
  fs::create_directories(tmp, ec);
  if (ec) detail::fail(ErrorCode::io, "quantize: cannot create {}: {}", tmp.string(), ec.message());
  try {
    json weight_map = json::object();
    uint64_t total_size = 0;
    size_t done = 0;
    const size_t total = ck.size();
    for (const auto& [file, names] : by_file) {
      // New tensors of this shard (owned here); `views` lists every tensor in write order (their storage
      // is on the heap, so the views stay valid while `owned` grows).
      std::vector<Tensor> owned;
      std::vector<SafetensorsRawTensor> views;
      auto emit = [&](const std::string& name, Tensor tensor, std::vector<int64_t> shape) {
        owned.push_back(std::move(tensor));
        const Tensor& t = owned.back();
        if (shape.empty()) shape.assign(t.view().shape.begin(), t.view().shape.begin() + t.view().rank);
        views.push_back({name, std::string(safetensors_dtype_name(t.dtype())), shape, t.data(), t.nbytes()});
      };
      for (const auto& name : names) {
        const SafetensorsTensorInfo& info = ck.info(name);
        const std::string module = ends_with(name, ".weight") ? name.substr(0, name.size() - 7) : name;
        const bool in_decoder = name.find("layers.") != std::string::npos && !skipped(module);
        const bool fused_gu = ends_with(name, "experts.gate_up_proj"), fused_d = ends_with(name, "experts.down_proj");
        if (in_decoder && !gpt_oss && (fused_gu || fused_d) && info.shape.size() == 3) {
          // Fused experts: stored [E, 2I, H] / [E, H, I] (or transposed: the hub's Qwen3-VL layout) →
          // written [E, 2I, H] / [E, H, I] as the reference's FP8 experts hold them.
          const int64_t R = fused_gu ? 2 * I : H, C = fused_gu ? H : I;
          std::vector<float> w = as_f32(ck, name);
          if (info.shape == std::vector<int64_t>{E, C, R} && R != C) w = transpose_last2(w, E, C, R);
          else ck.check_shape(name, {E, R, C});
          // gate_up: one grid per half when the fused grid would be a single block row (the reference
          // allocates two there) or when the halves align with blocks anyway; else the fused grid.
          const bool halves = fused_gu && (I % o.block_n == 0 || 2 * I <= o.block_n);
          auto [qw, sc] = quantize_stack(w.data(), E, R, C, o, halves);
          emit(name, std::move(qw), {});
          emit(name + "_scale_inv", std::move(sc), {});
        } else if (in_decoder && ends_with(name, ".weight") && info.shape.size() == 2 &&
                   ((!gpt_oss && module.find(".experts.") != std::string::npos && kExpertMatrices.count(last_component(module))) ||
                    (module.find(".experts.") == std::string::npos && kLinearModules.count(last_component(module))))) {
          const std::vector<float> w = as_f32(ck, name);
          auto [qw, sc] = quantize_stack(w.data(), 1, info.shape[0], info.shape[1], o, false);
          const int64_t gr = sc.size(1), gc = sc.size(2);
          emit(name, std::move(qw), {info.shape[0], info.shape[1]});
          emit(module + ".weight_scale_inv", std::move(sc), {gr, gc});
        } else {  // copied as stored (any dtype and rank)
          const auto [data, nbytes] = ck.file_of(name).bytes(name);
          views.push_back({name, info.st_dtype, info.shape, data, nbytes});
        }
        if (o.progress) o.progress(++done, total);
      }
      for (const auto& v : views) {
        weight_map[v.name] = file;
        total_size += uint64_t(v.nbytes);
      }
      write_safetensors_raw((tmp / file).string(), views, {{"format", "pt"}});
    }
    if (sharded) {
      json index = {{"metadata", {{"total_size", total_size}}}, {"weight_map", weight_map}};
      std::ofstream(tmp / "model.safetensors.index.json") << index.dump(2) << "\n";
    }
    // config.json: the input's, plus quantization_config.
    json config = json::parse(detail::read_text_file((fs::path(in_dir) / "config.json").string()));
    config["quantization_config"] = json::parse(fp8_quant_config_json(q));
    std::ofstream(tmp / "config.json") << config.dump(2) << "\n";
    for (const char* f : kCopiedFiles) {
      const fs::path src = fs::path(in_dir) / f;
      if (fs::exists(src, ec)) fs::copy_file(src, tmp / f, fs::copy_options::overwrite_existing);
    }
    (void)load_model_config(tmp.string());  // the written config parses
    if (fs::exists(out, ec)) fs::remove(out);  // an empty directory (checked above)
    fs::rename(tmp, out);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
}

}  // namespace moex
