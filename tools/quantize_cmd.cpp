// tools/quantize_cmd.cpp — `moex quantize` (SPEC §6): a bf16/f16/f32 checkpoint → FP8 block-scaled.
//   moex quantize --in DIR --out DIR [--scale-fmt float|ue8m0] [--block 128x128]
#include <fmt/format.h>

#include "moex/model.hpp"
#include "moex/moex.hpp"
#include "tools/commands.hpp"

namespace moex::cli {

namespace {

// "128x128" → {128, 128}
std::pair<int64_t, int64_t> parse_block(const std::string& s) {
  const auto x = s.find('x');
  try {
    if (x != std::string::npos) {
      size_t a = 0, b = 0;
      const int64_t n = std::stoll(s.substr(0, x), &a), k = std::stoll(s.substr(x + 1), &b);
      if (a == x && b == s.size() - x - 1 && n >= 1 && k >= 1 && n <= 65536 && k <= 65536) return {n, k};
    }
  } catch (const std::exception&) {
  }
  throw Error(ErrorCode::invalid_argument, "--block: '" + s + "' is not OUTxIN with positive sizes (e.g. 128x128)");
}

}  // namespace

void add_quantize(CLI::App& app, std::function<int()>& run) {
  struct Opts {
    std::string in, out, scale_fmt = "float", block = "128x128";
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("quantize", "Write an FP8 block-scaled copy of a bf16/f16/f32 checkpoint (reference format)");
  cmd->add_option("--in", o->in, "input checkpoint directory")->required();
  cmd->add_option("--out", o->out, "output directory (must not exist or be empty)")->required();
  cmd->add_option("--scale-fmt", o->scale_fmt, "float (f32 scales) or ue8m0 (power-of-two scales)")->capture_default_str();
  cmd->add_option("--block", o->block, "weight block OUTxIN of one scale")->capture_default_str();
  cmd->callback([&run, o] {
    run = [o] {
      if (o->scale_fmt != "float" && o->scale_fmt != "ue8m0")
        throw Error(ErrorCode::invalid_argument, "--scale-fmt: '" + o->scale_fmt + "' is not float or ue8m0");
      QuantizeOptions q;
      std::tie(q.block_n, q.block_k) = parse_block(o->block);
      q.ue8m0_scales = o->scale_fmt == "ue8m0";
      if (progress_enabled())
        q.progress = [](size_t done, size_t total) {
          fmt::print(stderr, "\rquantizing tensors {}/{}", done, total);
          if (done == total) fmt::print(stderr, "\r{:40}\r", "");
        };
      quantize_checkpoint(o->in, o->out, q);
      fmt::print("wrote {} (FP8 e4m3, block {}x{}, {} scales)\n", o->out, q.block_n, q.block_k, o->scale_fmt);
      return 0;
    };
  });
}

}  // namespace moex::cli
