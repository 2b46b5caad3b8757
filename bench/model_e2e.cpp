// bench/model_e2e.cpp — end-to-end model benchmark on CUDA (issue 5), a program, not a test.
//
// A random-weight model with the shape of Qwen3-30B-A3B (48 layers, hidden 2048, 32 q / 4 kv heads
// of 128, 128 experts of 768, top-8, vocab 151936), built in memory from a config (no checkpoint)
// in bf16 on the GPU. Measured the way bench/model_e2e_reference.py measures the reference:
//   prefill tok/s  = prompt tokens / time of generate(max_new_tokens = 1) on 1 × PROMPT tokens
//   decode tok/s   = B × N / (time of generate(N + 1) − time of generate(1)) on B × DECODE_PROMPT
// for B in --batches, with decode-stage switching (grouped_mm → batched_mm) and CUDA graphs, plus
// the same without switching and without graphs. The batch-1 step is compared with its memory
// floor: bytes of all weights one step reads / measured device copy bandwidth. Every run keeps the
// prefill's KV capacity (PROMPT + N + 1 positions per sequence; keys and values in bf16, the model's
// dtype, unless MOEX_CUDA_KV_CACHE=f32); a batch whose cache does not fit the card is printed as
// "skipped" (and so in the JSON) and the others still run.
//
//   moex_model_bench [--layers 48] [--prompt 2048] [--decode-prompt 128] [--new 64] [--batches 1,8,64]
//                    [--variants switch+graphs,no_switch+graphs,switch_no_graphs] [--out results.json]
//                    [--trace FILE [--trace-steps 8]]
//
// --trace (a build configured with -DMOEX_CUDA_TRACE=ON): after the measurements, one more batch-1
// generate (switching + graphs, the same prompt length) with every traced kernel's blocks recorded
// (src/backends/cuda/trace.hpp); FILE gets the records as CSV and FILE.anchors.csv the SM clock
// anchors taken before and after. bench/trace_report.py reads both.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends/cuda/trace.hpp"
#include "model/cuda_forward.hpp"
#include "moex/moex.hpp"

using namespace moex;

namespace {

std::string qwen3_30b_a3b_config(int64_t layers) {
  return R"({"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "vocab_size": 151936,
    "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": )" +
         std::to_string(layers) + R"(, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
    "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "num_experts": 128,
    "num_experts_per_tok": 8, "moe_intermediate_size": 768, "norm_topk_prob": true, "decoder_sparse_step": 1,
    "mlp_only_layers": [], "tie_word_embeddings": false, "hidden_act": "silu", "attention_bias": false,
    "torch_dtype": "bfloat16", "bos_token_id": 151643, "eos_token_id": 151645})";
}

std::vector<std::vector<int64_t>> random_prompts(int64_t batch, int64_t len, int64_t vocab, uint64_t seed) {
  std::vector<std::vector<int64_t>> p(static_cast<size_t>(batch), std::vector<int64_t>(static_cast<size_t>(len)));
  uint64_t s = seed * 2654435761ull + 1;
  for (auto& row : p)
    for (auto& t : row) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      t = int64_t((s >> 33) % uint64_t(vocab));
    }
  return p;
}

// Median seconds of `reps` runs of f (after one warm-up run).
template <class F>
double time_median(int reps, F&& f) {
  f();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int64_t layers = 48, prompt = 2048, decode_prompt = 128, new_tokens = 64;
  std::vector<int64_t> batches = {1, 8, 64};
  int64_t trace_steps = 8;
  std::string out_path, only, trace_path;  // only: the decode variants to run (names separated by ','), all when empty
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "error: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--layers") layers = std::atoll(next().c_str());
    else if (a == "--prompt") prompt = std::atoll(next().c_str());
    else if (a == "--decode-prompt") decode_prompt = std::atoll(next().c_str());
    else if (a == "--new") new_tokens = std::atoll(next().c_str());
    else if (a == "--out") out_path = next();
    else if (a == "--trace") trace_path = next();
    else if (a == "--trace-steps") trace_steps = std::atoll(next().c_str());
    else if (a == "--variants") only = "," + next() + ",";
    else if (a == "--batches") {
      batches.clear();
      const std::string v = next();
      size_t p = 0;
      while (p <= v.size()) {
        const size_t q = std::min(v.find(',', p), v.size());
        batches.push_back(std::atoll(v.substr(p, q - p).c_str()));
        p = q + 1;
      }
    } else {
      const bool help = a == "--help" || a == "-h";
      std::fprintf(help ? stdout : stderr,
                   "usage: %s [--layers N] [--prompt N] [--decode-prompt N] [--new N] [--batches 1,8,64] "
                   "[--variants switch+graphs,no_switch+graphs,switch_no_graphs] [--out FILE] [--trace FILE [--trace-steps N]]\n",
                   argv[0]);
      return help ? 0 : 2;
    }
  }
  if (layers < 1 || prompt < 1 || decode_prompt < 1 || new_tokens < 2 || batches.empty() || trace_steps < 1) {
    std::fprintf(stderr, "error: sizes must be positive (--new at least 2)\n");
    return 2;
  }
  if (!trace_path.empty() && !cuda::trace::compiled()) {
    std::fprintf(stderr, "error: --trace needs a build configured with -DMOEX_CUDA_TRACE=ON\n");
    return 2;
  }
  try {
    const std::string why = cuda_unavailable_reason();
    if (!why.empty()) {
      std::fprintf(stderr, "moex_model_bench needs a CUDA device: %s\n", why.c_str());
      return 1;
    }
    const ModelConfig cfg = parse_model_config(qwen3_30b_a3b_config(layers), "qwen3_30b_a3b (in memory)");
    const Device dev = Device::cuda(0);
    auto t0 = std::chrono::steady_clock::now();
    std::unique_ptr<model::CudaModel> m;
    {
      const model::ModelWeights w = model::CudaModel::random_weights(cfg.text, DType::bf16, dev, 1);
      m = std::make_unique<model::CudaModel>(w, cfg.text, dev);
    }
    const double build_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // KV capacity of every run: the prefill's length, so that the decode attention splits its keys as
    // it does in the table's earlier runs. The prefill's buffers now; each decode batch grows them
    // below, and one that does not fit the card is reported as skipped (the rest still run).
    const int64_t kv_len = std::max(prompt, decode_prompt) + new_tokens + 1;
    m->reserve(1, kv_len, prompt);
    const double bw = model::measure_copy_bandwidth(dev);
    const double floor_ms = double(m->decode_step_weight_bytes()) / bw * 1e3;
    const char* kv_name = m->kv_cache_dtype() == DType::bf16 ? "bf16" : "f32";
    std::printf("# random Qwen3-30B-A3B shape, %lld layers, bf16, built in %.1f s; copy bandwidth %.0f GB/s; "
                "batch-1 step reads %.2f GB of weights -> floor %.3f ms; KV cache %s (%.1f MB per sequence)\n",
                (long long)layers, build_s, bw / 1e9, m->decode_step_weight_bytes() / 1e9, floor_ms, kv_name,
                double(m->kv_cache_bytes()) / 1e6);
    std::fflush(stdout);

    const int64_t V = cfg.text.vocab_size;
    std::string json = "{\"model\": \"qwen3_30b_a3b_random\", \"layers\": " + std::to_string(layers) +
                       ", \"dtype\": \"bf16\", \"copy_bandwidth_GBs\": " + std::to_string(bw / 1e9) +
                       ", \"decode_step_weight_bytes\": " + std::to_string(m->decode_step_weight_bytes()) +
                       ", \"floor_ms\": " + std::to_string(floor_ms) + ", \"kv_cache_dtype\": \"" + kv_name + "\"";
    // prefill
    {
      const auto p = random_prompts(1, prompt, V, 7);
      model::CudaGenerateOptions o;
      o.max_new_tokens = 1;
      o.prefill_backend = "grouped_mm";
      const double s = time_median(3, [&] { m->generate(p, o); });
      std::printf("prefill 1 x %lld: %.1f ms, %.0f tok/s\n", (long long)prompt, s * 1e3, double(prompt) / s);
      json += ", \"prefill_tokens\": " + std::to_string(prompt) + ", \"prefill_tok_s\": " + std::to_string(double(prompt) / s);
      std::fflush(stdout);
    }
    // decode
    struct Variant {
      const char* name;
      const char* decode_backend;
      bool graphs;
    };
    const Variant variants[] = {{"switch+graphs", "batched_mm", true},
                                {"no_switch+graphs", "grouped_mm", true},
                                {"switch_no_graphs", "batched_mm", false}};
    json += ", \"decode\": [";
    bool first = true;
    for (const Variant& v : variants) {
      if (!only.empty() && only.find(std::string(",") + v.name + ",") == std::string::npos) continue;
      for (int64_t B : batches) {
        if (!v.graphs && B != 1) continue;  // the graph effect is shown at batch 1
        try {
          m->reserve(B, kv_len, B * decode_prompt);
        } catch (const Error& e) {
          if (e.code() != ErrorCode::out_of_memory) throw;
          std::printf("decode %-17s batch %3lld: skipped: %s\n", v.name, (long long)B, e.what());
          std::fflush(stdout);
          json += std::string(first ? "" : ", ") + "{\"variant\": \"" + v.name + "\", \"batch\": " + std::to_string(B) +
                  ", \"skipped\": " + nlohmann::json(e.what()).dump() + "}";
          first = false;
          continue;
        }
        const auto p = random_prompts(B, decode_prompt, V, 11 + uint64_t(B));
        model::CudaGenerateOptions o;
        o.eos = {-1};
        o.prefill_backend = "grouped_mm";
        o.decode_backend = v.decode_backend;
        o.cuda_graphs = v.graphs;
        o.max_new_tokens = 1;
        const double t1 = time_median(3, [&] { m->generate(p, o); });
        o.max_new_tokens = new_tokens + 1;
        const double tn = time_median(3, [&] { m->generate(p, o); });
        const double step_ms = (tn - t1) / double(new_tokens) * 1e3;
        const double tps = double(B * new_tokens) / (tn - t1);
        const auto& st = m->last_stats();
        std::printf("decode %-17s batch %3lld: %.3f ms/step, %.0f tok/s (%.2fx floor at batch 1; graph replays %lld)\n", v.name,
                    (long long)B, step_ms, tps, step_ms / floor_ms, (long long)st.graph_replays);
        std::fflush(stdout);
        json += std::string(first ? "" : ", ") + "{\"variant\": \"" + v.name + "\", \"batch\": " + std::to_string(B) +
                ", \"step_ms\": " + std::to_string(step_ms) + ", \"decode_tok_s\": " + std::to_string(tps) +
                ", \"graph_replays\": " + std::to_string(st.graph_replays) + "}";
        first = false;
      }
    }
    json += "]}";
    if (!out_path.empty()) std::ofstream(out_path) << json << "\n";
    std::printf("%s\n", json.c_str());
    if (!trace_path.empty()) {
      // batch 1, switching + graphs: one untraced run (captures the graphs if no variant did), then
      // the traced one between two sets of SM clock anchors
      const auto p = random_prompts(1, decode_prompt, V, 12);
      model::CudaGenerateOptions o;
      o.eos = {-1};
      o.prefill_backend = "grouped_mm";
      o.decode_backend = "batched_mm";
      o.cuda_graphs = true;
      o.max_new_tokens = trace_steps + 1;
      m->generate(p, o);
      const auto before = cuda::trace::anchors();
      cuda::trace::start(size_t(4) << 20);
      m->generate(p, o);
      size_t dropped = 0;
      const auto recs = cuda::trace::stop(&dropped);
      const auto after = cuda::trace::anchors();
      std::ofstream f(trace_path);
      f << "kernel,block,grid,smid,c_start,c_wait,c_end,g_start,g_end";
      for (int i = 0; i < cuda::trace::kMarks; ++i) f << ",c_mark" << i;
      f << '\n';
      for (const auto& r : recs) {
        f << r.kernel << ',' << r.block << ',' << r.grid << ',' << r.smid << ',' << r.c_start << ',' << r.c_wait << ','
          << r.c_end << ',' << r.g_start << ',' << r.g_end;
        for (int i = 0; i < cuda::trace::kMarks; ++i) f << ',' << r.c_mark[i];
        f << '\n';
      }
      std::ofstream fa(trace_path + ".anchors.csv");
      fa << "when,smid,g,c\n";
      for (const auto& a : before) fa << "before," << a.smid << ',' << a.g << ',' << a.c << '\n';
      for (const auto& a : after) fa << "after," << a.smid << ',' << a.g << ',' << a.c << '\n';
      std::printf("trace: %zu block records (%zu dropped), %lld decode steps after a %lld-token prompt -> %s\n",
                  recs.size(), dropped, (long long)trace_steps, (long long)decode_prompt, trace_path.c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moex_model_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
