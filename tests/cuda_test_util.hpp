// tests/cuda_test_util.hpp — small helpers shared by the CUDA tests (only with MOEX_WITH_CUDA).
#pragma once
#ifdef MOEX_WITH_CUDA
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <vector>

#include "moex/moex.hpp"

namespace moex::test {

inline void cuda_ok(cudaError_t e) { ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e); }

// The bytes of a tensor on the host, wherever it lives.
inline std::vector<char> to_host(const Tensor& t) {
  std::vector<char> h(t.nbytes());
  copy_bytes(h.data(), Device::cpu(), t.data(), t.view().device, h.size());
  return h;
}

}  // namespace moex::test
#endif
