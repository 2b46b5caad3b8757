// tests/test_util.hpp — helpers shared by the test suites: the source tree and its fixtures,
// temporary directories, relative L2 error, skipping without a CUDA device, and environment
// variables set for a scope.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

#include "moex/check.hpp"
#include "moex/moex.hpp"

// Skips the test (with the reason) when no CUDA device is usable: such tests run on the GPU machine.
#define SKIP_WITHOUT_CUDA()                                                                                  \
  do {                                                                                                       \
    if (moex::cuda_devices().empty()) GTEST_SKIP() << "no CUDA device: " << moex::cuda_unavailable_reason(); \
  } while (0)

namespace moex::test {

// The repository root: MOEX_SOURCE_DIR (set by ctest), else the working directory.
inline std::string source_dir() {
  const char* s = std::getenv("MOEX_SOURCE_DIR");
  return s ? s : ".";
}

// tests/fixtures/<name> of the source tree.
inline std::filesystem::path fixture_path(const std::string& name) {
  return std::filesystem::path(source_dir()) / "tests" / "fixtures" / name;
}

// A fresh temporary directory, removed with everything in it at the end of its scope.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const char* prefix = "moex_test") {
    std::string tmpl = (std::filesystem::temp_directory_path() / (std::string(prefix) + "_XXXXXX")).string();
    path = ::mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

// ‖a − b‖ / ‖b‖ over n floats, in f64 (0 when both are zero).
inline double rel_l2(const float* a, const float* b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double x = a[i], y = b[i];
    num += (x - y) * (x - y);
    den += y * y;
  }
  return std::sqrt(num / std::max(den, 1e-300));
}
// The same over two f32 tensors of equal size on the host.
inline double rel_l2(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.numel(), b.numel());
  return rel_l2(a.ptr<float>(), b.ptr<float>(), std::min(a.numel(), b.numel()));
}

// An equivalence-harness case: E experts of hidden H and intermediate I in dtype dt (quantized by
// q), T tokens routed to K experts each; routing and the other options at the harness' defaults.
inline check::Case make_case(uint64_t seed, DType dt, int64_t E, int64_t H, int64_t I, int64_t T, int64_t K,
                             QuantSpec q = {}) {
  check::Case c;
  c.seed = seed;
  c.spec.num_experts = E;
  c.spec.hidden = H;
  c.spec.intermediate = I;
  c.spec.dtype = dt;
  c.spec.quant = q;
  c.tokens = T;
  c.top_k = K;
  return c;
}

// Sets an environment variable for a scope and restores its previous value.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* prev = std::getenv(name);
    had_ = prev != nullptr;
    if (had_) saved_ = prev;
    if (value) setenv(name, value, 1);
    else unsetenv(name);  // nullptr: unset for the scope
  }
  ~ScopedEnv() {
    if (had_) setenv(name_, saved_.c_str(), 1);
    else unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::string saved_;
  bool had_ = false;
};

}  // namespace moex::test
