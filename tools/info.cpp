// tools/info.cpp — `moex info`: the build, the devices, and every backend: available or why not.
#include <fmt/format.h>

#include "moex/model.hpp"
#include "moex/moex.hpp"
#include "tools/commands.hpp"

namespace moex::cli {

namespace {

// The problem `info` asks each backend about: the qwen3_30b_a3b experts in bf16, 16 tokens.
Problem probe_problem(Device dev) {
  Problem p;
  p.spec.num_experts = 128;
  p.spec.hidden = 2048;
  p.spec.intermediate = 768;
  p.spec.dtype = DType::bf16;
  p.tokens = 16;
  p.top_k = 8;
  p.device = dev;
  return p;
}

int run_info(const std::string& model_dir, const std::string& experts) {
  const CpuInfo cpu = cpu_info();
  fmt::print("moex {}\n", "0.1.0");
  fmt::print("build: C++20, CUDA {}\n", built_with_cuda() ? "yes" : "no");
  const char* quant_on_amx = !cpu.amx         ? ""
                             : cpu.amx_quant ? "; FP8 / FP4 experts on the tiles from 8 rows per call, every call with MOEX_CPU_AMX_QUANT=1"
                                             : "; FP8 / FP4 experts on vdpbf16ps (MOEX_CPU_AMX_QUANT=0)";
  fmt::print("cpu: {} hardware threads, kernels {} (AVX512_BF16 {}{})\n", cpu.hardware_threads, cpu.isa, cpu.avx512_bf16 ? "yes" : "no",
             quant_on_amx);
  std::vector<Device> devices{Device::cpu()};
  const auto gpus = cuda_devices();
  if (gpus.empty()) {
    fmt::print("cuda: none ({})\n", cuda_unavailable_reason());
  }
  for (const auto& g : gpus) {
    fmt::print("cuda:{}: {}, compute capability {}.{}, {:.1f} GiB, {} SMs\n", g.index, g.name, g.cc_major, g.cc_minor,
               double(g.total_memory) / (1 << 30), g.multiprocessors);
    devices.push_back(Device::cuda(g.index));
  }
  fmt::print("\nbackends (asked about the qwen3_30b_a3b experts in bf16, T=16, K=8):\n");
  auto& reg = ExpertsInterface::global();
  for (const auto& name : reg.names()) {
    auto b = reg.get(name);
    fmt::print("  {:<18} {}{}\n", name, b->summary(), b->graph_capturable() ? " [graph-capturable]" : "");
    std::vector<Device> ask = devices;
    if (gpus.empty()) ask.push_back(Device::cuda(0));  // say why CUDA does not run
    for (Device d : ask) {
      const Support s = b->supports(probe_problem(d));
      fmt::print("      {:<7} {}\n", to_string(d), s.ok ? "available" : "no: " + s.reason);
    }
  }
  if (!model_dir.empty()) {  // the experts backend of every sub-config of a checkpoint
    LoadOptions lo;
    if (!experts.empty()) lo.experts_implementation = ExpertsImplementation(experts);
    const Model m = Model::from_pretrained(model_dir, lo);
    fmt::print("\nmodel {} ({}, {} layers):\n", model_dir, m.config().model_type, m.config().text.num_hidden_layers);
    for (const auto& [key, backend] : m.get_experts_implementation())
      fmt::print("  {:<14} {}\n", key.empty() ? "\"\" (top)" : key, backend);
  }
  return 0;
}

}  // namespace

void add_info(CLI::App& app, std::function<int()>& run) {
  auto* cmd = app.add_subcommand("info", "Show the build, the devices and which backends run on them (and why not)");
  auto model = std::make_shared<std::string>(), experts = std::make_shared<std::string>();
  cmd->add_option("--model", *model, "also load this checkpoint and show the experts backend of each sub-config");
  cmd->add_option("--experts-implementation", *experts, "the backend to load it with (default grouped_mm)");
  cmd->callback([&run, model, experts] { run = [model, experts] { return run_info(*model, *experts); }; });
}

}  // namespace moex::cli
