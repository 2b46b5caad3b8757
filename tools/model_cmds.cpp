// tools/model_cmds.cpp — `moex forward` and `moex generate` (SPEC §5):
//   moex forward  --model DIR --ids "1,2,3;4,5,6" --out FILE [--dtype f32|bf16|f16] [--device cpu|cuda]
//                 [--experts-implementation NAME | "text_config=eager,=grouped_mm"] [--dequantize] [--threads N]
//   moex generate --model DIR --ids "…" --max-new-tokens N [--do-sample --temperature T --top-k K
//                 --top-p P --seed S] [--no-decode-switching]   → prints [[ids…], …]
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <chrono>

#include "moex/model.hpp"
#include "moex/moex.hpp"
#include "tools/commands.hpp"

namespace moex::cli {

namespace {

struct ModelOptions {
  std::string model, ids, out, dtype = "f32", device = "cpu", experts;
  bool dequantize = false;  // FP8 checkpoints: experts back to the model dtype at load
  int threads = 0;          // CPU threads of the model's OpenMP loops and experts calls; 0 = the OpenMP default
};

void add_threads_option(CLI::App* cmd, ModelOptions& o) {
  cmd->add_option("--threads", o.threads, "CPU threads (0 = the OpenMP default: OMP_NUM_THREADS, else all)")
      ->capture_default_str()
      ->check(CLI::Range(0, 4096));
}

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
  // the runtime's parallel loops and its experts calls (RunOptions::num_threads 0) take OpenMP's
  // default team size, set here once for the whole command (packing at load included)
  if (o.threads > 0) omp_set_num_threads(o.threads);
  LoadOptions lo;
  lo.dtype = parse_dtype(o.dtype);
  lo.device = parse_device(o.device);
  lo.experts_implementation = parse_experts(o.experts);
  lo.dequantize = o.dequantize;
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
  cmd->add_flag("--dequantize", o.dequantize, "FP8 checkpoints: turn the quantized experts into the model dtype at load");
  add_threads_option(cmd, o);
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

namespace moex::cli {

namespace {

// `moex bench-model`: prefill and decode tokens/s of a checkpoint with each experts backend (CPU or
// --device cuda; on CUDA, generate() decodes with the SPEC §4 switching and CUDA graphs).
//   prefill: forward() of B random prompts of L tokens (all L rows' logits, as the reference's forward);
//   decode:  (generate(N new tokens) − generate(1 new token)) / (N − 1), per new token: the prompt's
//            prefill and the first pick cancel (generate(N) − forward() with N = 1). A round where
//            generate(N) was not slower than generate(1) (N − 1 steps within the prefill's noise: a long
//            prompt, few new tokens) measures nothing and is left out; with no such round left, decode is
//            reported as n/a (JSON null) and a note asks for more new tokens.
// Each is timed `repeat` times after a warm-up; the median is reported (the JSON also has the best).
int run_bench_model(const ModelOptions& o, int64_t batch, int64_t len, int64_t new_tokens, const std::string& backends,
                    const std::string& format, int repeat) {
  Model m = load(o);
  const int64_t vocab = m.config().text.vocab_size;
  std::vector<std::vector<int64_t>> prompts(static_cast<size_t>(batch), std::vector<int64_t>(static_cast<size_t>(len)));
  uint64_t state = 12345;
  for (auto& p : prompts)
    for (auto& t : p) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      t = int64_t((state >> 33) % uint64_t(vocab));
    }
  GenerateOptions g;
  g.do_sample = false;
  g.eos_token_id = std::vector<int64_t>{-1};  // never stop early: every step is timed
  const auto timed = [](auto&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  const auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  };
  if (format == "table")
    fmt::print("# {} ({}, {}), batch {} × {} prompt tokens, {} new tokens, median of {}\n{:<12} {:>14} {:>14}\n", o.model, o.dtype,
               o.device, batch, len, new_tokens, repeat, "backend", "prefill tok/s", "decode tok/s");
  for (const auto& b : split_list(backends)) {
    m.set_experts_implementation(b);
    m.forward(prompts);  // warm-up
    std::vector<double> prefill_tps, decode_tps;
    for (int r = 0; r < repeat; ++r) {
      const double fwd_s = timed([&] { m.forward(prompts); });
      g.max_new_tokens = 1;
      const double first_s = new_tokens > 1 ? timed([&] { m.generate(prompts, g); }) : fwd_s;
      g.max_new_tokens = new_tokens;
      const double gen_s = timed([&] { m.generate(prompts, g); });
      const int64_t steps = new_tokens > 1 ? new_tokens - 1 : new_tokens;
      prefill_tps.push_back(double(batch * len) / fwd_s);
      if (gen_s > first_s) decode_tps.push_back(double(batch * steps) / (gen_s - first_s));
    }
    const double prefill = median(prefill_tps);
    const bool decoded = !decode_tps.empty();
    if (!decoded)
      fmt::print(stderr,
                 "moex bench-model: {}: decode not measurable: generate({}) was never slower than generate(1) (the {} "
                 "steps are within the noise of the {}-token prefill); use more --new-tokens\n",
                 b, new_tokens, new_tokens - 1, len);
    const std::string decode = decoded ? fmt::format("{:.1f}", median(decode_tps)) : "null";
    const std::string best_decode =
        decoded ? fmt::format("{:.1f}", *std::max_element(decode_tps.begin(), decode_tps.end())) : "null";
    if (format == "json")
      fmt::print("{{\"model\": \"{}\", \"dtype\": \"{}\", \"device\": \"{}\", \"backend\": \"{}\", \"batch\": {}, \"prompt\": {}, "
                 "\"new_tokens\": {}, \"repeat\": {}, \"prefill_tok_s\": {:.1f}, \"decode_tok_s\": {}, \"best_prefill_tok_s\": {:.1f}, "
                 "\"best_decode_tok_s\": {}}}\n",
                 o.model, o.dtype, o.device, b, batch, len, new_tokens, repeat, prefill, decode,
                 *std::max_element(prefill_tps.begin(), prefill_tps.end()), best_decode);
    else
      fmt::print("{:<12} {:>14.1f} {:>14}\n", b, prefill, decoded ? decode : "n/a");
  }
  return 0;
}

}  // namespace

void add_bench_model(CLI::App& app, std::function<int()>& run) {
  struct Opts {
    ModelOptions m;
    int64_t batch = 1, len = 128, new_tokens = 32;
    int repeat = 3;
    std::string backends = "grouped_mm,batched_mm,eager", format = "table";
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("bench-model", "Prefill and decode tokens/s of a checkpoint, per experts backend");
  cmd->add_option("--model", o->m.model, "checkpoint directory")->required();
  cmd->add_option("--dtype", o->m.dtype, "f32, bf16 or f16")->capture_default_str();
  cmd->add_option("--device", o->m.device, "cpu or cuda")->capture_default_str();
  cmd->add_option("--batch", o->batch, "prompts")->capture_default_str()->check(CLI::Range(1, 4096));
  cmd->add_option("--prompt-len", o->len, "tokens per prompt")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--new-tokens", o->new_tokens, "decode steps")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--backends", o->backends, "comma-separated experts backends")->capture_default_str();
  cmd->add_option("--format", o->format, "table or json")->capture_default_str();
  cmd->add_option("--repeat", o->repeat, "timed rounds per backend (the median is reported)")->capture_default_str()->check(CLI::Range(1, 1000));
  cmd->add_flag("--dequantize", o->m.dequantize, "FP8 checkpoints: turn the quantized experts into the model dtype at load");
  add_threads_option(cmd, o->m);
  cmd->callback([&run, o] {
    run = [o] { return run_bench_model(o->m, o->batch, o->len, o->new_tokens, o->backends, o->format, o->repeat); };
  });
}

}  // namespace moex::cli
