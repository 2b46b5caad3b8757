// tools/main.cpp — the `moex` command line: info, check, bench, forward, generate, bench-model, quantize.
#include <cstdio>
#include <cstdlib>
#include <unistd.h>

#include "moex/moex.hpp"
#include "tools/commands.hpp"

namespace moex::cli {

std::vector<std::string> split_list(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char ch : s) {
    if (ch == sep) {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else if (ch != ' ') {
      cur += ch;
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

bool progress_enabled() { return isatty(fileno(stderr)) != 0; }

}  // namespace moex::cli

int main(int argc, char** argv) {
  CLI::App app{"moex — Mixture-of-Experts experts backends (CPU and CUDA)"};
  app.require_subcommand(1);
  std::function<int()> run;
  moex::cli::add_info(app, run);
  moex::cli::add_check(app, run);
  moex::cli::add_bench(app, run);
  moex::cli::add_model_commands(app, run);
  moex::cli::add_bench_model(app, run);
  moex::cli::add_quantize(app, run);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    return run ? run() : 0;
  } catch (const moex::Error& e) {
    std::fprintf(stderr, "moex: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moex: error: %s\n", e.what());
    return 1;
  }
}
