// tools/model_cmds.cpp — `moex forward` and `moex generate` (SPEC §5):
//   moex forward  --model DIR --ids "1,2,3;4,5,6" --out FILE [--dtype f32|bf16|f16] [--device cpu|cuda]
//                 [--experts-implementation NAME | "text_config=eager,=grouped_mm"]
//   moex generate --model DIR --ids "…" --max-new-tokens N [--do-sample --temperature T --top-k K
//                 --top-p P --seed S] [--no-decode-switching]   → prints [[ids…], …]
#include <fmt/format.h>

#include "moex/model.hpp"
#include "moex/moex.hpp"
#include "tools/commands.hpp"

namespace moex::cli {

namespace {

struct ModelOptions {
  std::string model, ids, out, dtype = "f32", device = "cpu", experts;
};

// "NAME", or "key=name,key=name" with "" (written "=name") for the top level.
ExpertsImplementation parse_experts(const std::string& s) {
  if (s.empty()) return {};
  if (s.find('=') == std::string::npos) return ExpertsImplementation(s);
  std::map<std::string, std::string> m;
  for (const auto& part : split_list(s)) {
    const auto eq = part.find('=');
    if (eq == std::string::npos)
      throw Error(ErrorCode::invalid_argument, "--experts-implementation: '" + part + "' is not key=name (use =name for the top level)");
    m[part.substr(0, eq)] = part.substr(eq + 1);
  }
  return ExpertsImplementation(m);
}

Model load(const ModelOptions& o) {
  if (o.model.empty()) throw Error(ErrorCode::invalid_argument, "--model DIR is required");
  LoadOptions lo;
  lo.dtype = parse_dtype(o.dtype);
  lo.device = parse_device(o.device);
  lo.experts_implementation = parse_experts(o.experts);
  if (progress_enabled())
    lo.progress = [](size_t done, size_t total) {
      fmt::print(stderr, "\rloading weights {}/{}", done, total);
      if (done == total) fmt::print(stderr, "\r{:40}\r", "");
    };
  return Model::from_pretrained(o.model, lo);
}

void add_common(CLI::App* cmd, ModelOptions& o) {
  cmd->add_option("--model", o.model, "checkpoint directory (config.json + safetensors)")->required();
  cmd->add_option("--ids", o.ids, "token ids: \"1,2,3;4,5,6\" (sequences separated by ';')")->required();
  cmd->add_option("--dtype", o.dtype, "f32, bf16 or f16 (weights converted at load)")->capture_default_str();
  cmd->add_option("--device", o.device, "cpu or cuda")->capture_default_str();
  cmd->add_option("--experts-implementation", o.experts, "a backend name, or key=name pairs per sub-config (=name: top level)");
}

}  // namespace

void add_model_commands(CLI::App& app, std::function<int()>& run) {
  auto fo = std::make_shared<ModelOptions>();
  auto* fwd = app.add_subcommand("forward", "Logits [B, L, V] (F32) of token ids, written to a safetensors file");
  add_common(fwd, *fo);
  fwd->add_option("--out", fo->out, "output safetensors file (tensor 'logits')")->required();
  fwd->callback([&run, fo] {
    run = [fo] {
      const auto ids = parse_token_ids(fo->ids);
      Model m = load(*fo);
      write_logits(fo->out, m.forward(ids));
      return 0;
    };
  });

  struct GenOptions {
    ModelOptions m;
    int64_t max_new_tokens = 16;
    bool do_sample = false, no_switch = false;
    double temperature = 1.0, top_p = 1.0;
    int64_t top_k = 0;
    uint64_t seed = 0;
  };
  auto go = std::make_shared<GenOptions>();
  auto* gen = app.add_subcommand("generate", "Generate from token ids; prints the full sequences as JSON [[ids...], ...]");
  add_common(gen, go->m);
  gen->add_option("--max-new-tokens", go->max_new_tokens, "new tokens per sequence")->capture_default_str()->check(CLI::Range(0, 1 << 20));
  gen->add_flag("--do-sample", go->do_sample, "sample instead of greedy decoding");
  gen->add_option("--temperature", go->temperature, "sampling temperature")->capture_default_str();
  gen->add_option("--top-k", go->top_k, "keep the k most likely tokens (0 = off)")->capture_default_str();
  gen->add_option("--top-p", go->top_p, "nucleus sampling mass (1 = off)")->capture_default_str();
  gen->add_option("--seed", go->seed, "sampling seed")->capture_default_str();
  gen->add_flag("--no-decode-switching", go->no_switch, "keep grouped_mm for decode steps on the GPU (SPEC §4)");
  gen->callback([&run, go] {
    run = [go] {
      const auto ids = parse_token_ids(go->m.ids);
      Model m = load(go->m);
      GenerateOptions g;
      g.max_new_tokens = go->max_new_tokens;
      g.do_sample = go->do_sample;
      if (go->do_sample) {
        g.temperature = go->temperature;
        g.top_k = go->top_k;
        g.top_p = go->top_p;
      }
      g.seed = go->seed;
      g.decode_stage_switching = !go->no_switch;
      fmt::print("{}\n", sequences_to_json(m.generate(ids, g)));
      return 0;
    };
  });
}

}  // namespace moex::cli
