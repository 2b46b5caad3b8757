// backends/cuda/decode_probe.hpp — what the FP8 decode path (quant_decode.cu) would choose for a
// shape, for the tests (plain C++: no CUDA headers, so test files compiled by the host compiler
// include it).
#pragma once
#include <cstddef>
#include <cstdint>

namespace moex::cuda {

// The fused form (decode_fused: up, down and combine in one kernel at T·K <= 8 pairs) on the current
// device for T tokens, K slots, E experts, hidden H, intermediate I (gated or not), activations of
// esz bytes, under the current MOEX_CUDA_FP8_DECODE_* environment: whether it runs, its up tiles' k
// slices, its down GEMV's k slices per slot and its ring depth.
struct FusedDecodeProbe {
  bool applies = false;
  int ks_up = 0, ks_down = 0, stages = 0;
};
FusedDecodeProbe probe_fused_decode(int64_t T, int64_t K, int64_t E, int64_t H, int64_t I, bool gated, size_t esz);

}  // namespace moex::cuda
