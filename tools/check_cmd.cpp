// tools/check_cmd.cpp — `moex check`: every backend against the f64 reference on seeded random
// problems (the equivalence harness of the tests, from the command line).
#include <fmt/format.h>

#include <map>

#include "moex/check.hpp"
#include "moex/moex.hpp"
#include "tools/commands.hpp"

namespace moex::cli {

namespace {

struct CheckOptions {
  std::string backends;
  std::string dtypes = "f32,f16,bf16";
  int count = 200;
  uint64_t seed = 1234;
  std::string device = "cpu";
  int threads = 0;
  bool verbose = false;
};

int run_check(const CheckOptions& o) {
  const Device dev = parse_device(o.device);
  std::vector<std::string> backends = o.backends.empty() ? ExpertsInterface::global().names() : split_list(o.backends);
  for (const auto& b : backends) ExpertsInterface::global().get(b);  // unknown names fail here, listing the valid ones
  RunOptions ro;
  ro.num_threads = o.threads;
  fmt::print("moex check: {} random problems per dtype, seed {}, device {}\n", o.count, o.seed, to_string(dev));
  struct Tally {
    int passed = 0, failed = 0, skipped = 0;
    double worst = 0;
    std::string skip_reason;
  };
  std::map<std::pair<std::string, std::string>, Tally> tally;
  int total_passed = 0, total_failed = 0, total_skipped = 0;
  const bool progress = progress_enabled();
  for (const auto& dts : split_list(o.dtypes)) {
    const DType dt = parse_dtype(dts);
    const auto cases = check::generate_cases(o.seed + uint64_t(dt), o.count, dt);
    for (size_t i = 0; i < cases.size(); ++i) {
      if (progress) fmt::print(stderr, "\r  {} case {}/{} ", dtype_name(dt), i + 1, cases.size());
      const auto results = check::run_case(backends, cases[i], dev, ro);
      for (size_t b = 0; b < backends.size(); ++b) {
        const auto& r = results[b];
        Tally& t = tally[{backends[b], std::string(dtype_name(dt))}];
        switch (r.status) {
          case check::Result::Status::passed:
            ++t.passed, ++total_passed;
            t.worst = std::max(t.worst, r.rel_l2);
            break;
          case check::Result::Status::failed:
            ++t.failed, ++total_failed;
            fmt::print("{}FAIL {} {}: {}\n", progress ? "\r" : "", backends[b], cases[i].describe(), r.message);
            break;
          case check::Result::Status::skipped:
            ++t.skipped, ++total_skipped;
            if (t.skip_reason.empty()) t.skip_reason = r.message;
            if (o.verbose) fmt::print("skip {} {}: {}\n", backends[b], cases[i].describe(), r.message);
            break;
        }
        if (o.verbose && r.status == check::Result::Status::passed)
          fmt::print("ok   {} {}: rel_l2 {:.2e}\n", backends[b], cases[i].describe(), r.rel_l2);
      }
    }
    if (progress) fmt::print(stderr, "\r{:40}\r", "");
  }
  fmt::print("\n{:<18} {:<5} {:>7} {:>7} {:>8} {:>12}  {}\n", "backend", "dtype", "passed", "failed", "skipped", "worst rel_l2",
             "skip reason");
  for (const auto& [key, t] : tally)
    fmt::print("{:<18} {:<5} {:>7} {:>7} {:>8} {:>12.2e}  {}\n", key.first, key.second, t.passed, t.failed, t.skipped, t.worst,
               t.skip_reason);
  fmt::print("\n{} passed, {} failed, {} skipped\n", total_passed, total_failed, total_skipped);
  return total_failed == 0 ? 0 : 1;
}

}  // namespace

void add_check(CLI::App& app, std::function<int()>& run) {
  auto o = std::make_shared<CheckOptions>();
  auto* cmd = app.add_subcommand("check", "Run every backend against the f64 reference on seeded random problems");
  cmd->add_option("--backends", o->backends, "comma-separated backends (default: all registered)");
  cmd->add_option("--dtypes", o->dtypes, "comma-separated activation dtypes")->capture_default_str();
  cmd->add_option("--count", o->count, "problems per dtype (the fixed edge cases come first)")->capture_default_str()->check(CLI::Range(1, 1000000));
  cmd->add_option("--seed", o->seed, "seed of the problem generator")->capture_default_str();
  cmd->add_option("--device", o->device, "cpu, cuda or cuda:N")->capture_default_str();
  cmd->add_option("--threads", o->threads, "CPU threads (0 = all)")->capture_default_str()->check(CLI::Range(0, 4096));
  cmd->add_flag("--verbose", o->verbose, "print every case");
  cmd->callback([&run, o] { run = [o] { return run_check(*o); }; });
}

}  // namespace moex::cli
