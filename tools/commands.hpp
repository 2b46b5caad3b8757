// tools/commands.hpp — the subcommands of the `moex` CLI.
#pragma once
#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace moex::cli {

// Each add_* registers a subcommand and sets `run` to the function that executes it (returns the exit status).
void add_info(CLI::App& app, std::function<int()>& run);
void add_check(CLI::App& app, std::function<int()>& run);
void add_bench(CLI::App& app, std::function<int()>& run);
void add_model_commands(CLI::App& app, std::function<int()>& run);  // forward, generate
void add_bench_model(CLI::App& app, std::function<int()>& run);
void add_quantize(CLI::App& app, std::function<int()>& run);

// "a,b,c" → {"a","b","c"} (empty items dropped)
std::vector<std::string> split_list(const std::string& s, char sep = ',');
// True when stderr is a terminal (progress lines are shown only then).
bool progress_enabled();

}  // namespace moex::cli
