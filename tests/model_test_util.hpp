// tests/model_test_util.hpp — helpers shared by the model-runtime tests on CUDA
// (test_model_cuda.cpp, test_model_cuda_attention.cpp): skip without a device, fixture paths.
#pragma once
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "moex/moex.hpp"

// Skips the test (with the reason) when no CUDA device is usable: these tests run on the GPU machine.
#define SKIP_WITHOUT_CUDA()                                                                                  \
  do {                                                                                                       \
    if (moex::cuda_devices().empty()) GTEST_SKIP() << "no CUDA device: " << moex::cuda_unavailable_reason(); \
  } while (0)

namespace moex::test {

// tests/fixtures/<name> under MOEX_SOURCE_DIR (set by ctest), else under the working directory.
inline std::filesystem::path model_fixture(const std::string& name) {
  const char* root = std::getenv("MOEX_SOURCE_DIR");
  return std::filesystem::path(root ? root : ".") / "tests" / "fixtures" / name;
}

}  // namespace moex::test
