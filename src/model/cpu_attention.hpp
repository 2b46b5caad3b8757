// model/cpu_attention.hpp — the CPU runtime's causal attention over a KV cache whose keys are in tiles
// of kKeyTile positions (reference_forward.cpp's KvCache), one kernel per ISA (cpu_attention_impl.hpp)
// chosen at run time.
#pragma once
#include <cstdint>

#include "model/reference_forward.hpp"

namespace moex::model {

// Positions per key tile: keys are kept as [tiles, kv heads, k dim, kKeyTile] (zeros past the last key),
// so that one query's dot products run kKeyTile keys at a time.
constexpr int64_t kKeyTile = 16;

// Causal attention of n new query tokens (absolute positions pos0 .. pos0+n-1) over Tk cached keys
// (positions 0 .. Tk-1), nh query heads over nkv key/value heads (GQA), optional sliding window (> 0)
// and sinks [nh] (or null). q [n, nh, dq], kt: the keys in tiles, v [Tk, nkv, dv] → [n, nh · dv].
// The kernel of the CPU's widest ISA among AVX-512, AVX2 + FMA and the baseline, following the CPU
// kernels' table (MOEX_CPU_ISA). Deterministic, and one query at a time gives the bits of many.
Floats cpu_attend(const float* q, const float* kt, const float* v, int64_t n, int64_t Tk, int64_t pos0, int64_t nh, int64_t nkv,
                  int64_t dq, int64_t dv, double scaling, int64_t window, const float* sinks);

namespace attention_kernels {
// The per-ISA kernels (cpu_attention.cpp, cpu_attention_avx2.cpp, cpu_attention_avx512.cpp).
Floats attend_baseline(const float* q, const float* kt, const float* v, int64_t n, int64_t Tk, int64_t pos0, int64_t nh, int64_t nkv,
                       int64_t dq, int64_t dv, double scaling, int64_t window, const float* sinks);
Floats attend_avx2(const float* q, const float* kt, const float* v, int64_t n, int64_t Tk, int64_t pos0, int64_t nh, int64_t nkv,
                   int64_t dq, int64_t dv, double scaling, int64_t window, const float* sinks);
Floats attend_avx512(const float* q, const float* kt, const float* v, int64_t n, int64_t Tk, int64_t pos0, int64_t nh, int64_t nkv,
                     int64_t dq, int64_t dv, double scaling, int64_t window, const float* sinks);
}  // namespace attention_kernels

}  // namespace moex::model
