// bench/cuda_check.hpp — CHECK(call) for the standalone CUDA bench programs (decode_probe.cu, stream_probe.cu):
// a failed CUDA runtime call prints the call, the error and where, and exits with status 1.
#pragma once
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CHECK(x)                                                                                    \
  do {                                                                                              \
    const cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                        \
      std::fprintf(stderr, "error: %s: %s (%s:%d)\n", #x, cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                                 \
    }                                                                                               \
  } while (0)
