// backends/cpu/packed_weights.hpp — f32, bf16, FP8 and FP4 expert weights repacked once into the
// panels of the packed micro-kernels (kernels.hpp: PackedMatmulArgs, PackedBf16MatmulArgs,
// PackedFp8MatmulArgs, PackedFp4MatmulArgs), cached per experts object.
//
// The CPU backends read expert weights where they are; for f32 and bf16 weights that means a
// dot-product kernel over [out, in] rows. Packed, each projection streams contiguous panels of 32
// output columns through a register-blocked kernel instead: f32 [in, 32] panels on FMA; bf16
// [in / 2, 32, 2] panels on vdpbf16ps, where the kernel table has the bf16 packed kernel (AVX512_BF16
// without AMX; bf16 weights in the default [out, in] layout); FP8 block-scaled weights (128-k blocks,
// default layout) as e4m3 [in, 32] panels (AVX-512) or [in / 2, 32, 2] panels (AVX512_BF16, whose
// kernel runs on vdpbf16ps) with each block's 32 column scales in f32 and the kind of codes it holds,
// where the table has a packed FP8 kernel; FP4 weights (UE8M0 scales per group of 2..128 channels
// dividing 128, default layout) as e2m1 panels (in k pairs for AVX512_BF16, else [in, 16] for f32 FMAs
// on AVX-512) with the group scales in f32, where the table has a packed FP4 kernel. The first call on an experts object packs all its experts
// (in parallel: about 2.4 GB written for qwen3_30b_a3b in f32, 1.2 GB in bf16); later calls reuse
// the copies.
//
// Memory: one copy of the weights in their own dtype (+ padding of each matrix to a multiple of 32
// rows, and of bf16 and FP4 rows to an even length; FP8: + 129 bytes per 4 KiB block of codes for its
// scales and flag; FP4: each group scale as 4 bytes of f32, a quarter more than a group of 32 codes); all copies
// together at most MOEX_CPU_PACK_MAX_MB (default: a quarter of the physical memory; experts whose
// copy would not fit are read in place), each held until the weights' address range is reused by
// other experts, the copies of 512 experts objects used more recently exist, or
// release_packed_weights() is called. MOEX_CPU_PACK=0 turns packing off (the kernels then read the
// weights in place).
//
// The cache is keyed by the weight pointers, shapes, strides and dtype (FP8 / FP4: also the scale
// pointers and the quantization spec); a sampled fingerprint of each expert's weights (64 bytes at 16
// places per matrix; FP8 / FP4: of its scales too) is checked on every call, so new weights
// loaded at the same address are repacked. Weights changed in place only away from those places are
// not noticed: release first.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "backends/cpu/kernels.hpp"
#include "moex/experts.hpp"

namespace moex::cpu {

// Rows [row0, row0 + n) of one logical [N, k] weight matrix (out × in), packed as ceil(n / 32)
// panels (zero-padded): f32 [k, 32] (panels), or bf16 [ceil(k / 2), 32, 2] (panels_bf16).
struct PackedMatrix {
  const float* panels = nullptr;
  int64_t row0 = 0, n = 0, k = 0;
  const uint16_t* panels_bf16 = nullptr;
  // FP8 block-scaled experts (128-k weight blocks): e4m3 panels [ceil(n / 32), k, 32], or in k pairs
  // [ceil(n / 32), ceil(k / 2), 32, 2] (fp8_pairs: the tables with KernelTable::packed_fp8_pairs), each
  // 128-k block's 32 column scales as f32 [ceil(n / 32), ceil(k / 128), 32] and whether its codes are
  // normal numbers only, also zeros / subnormals, or a NaN (Fp8BlockKind) [ceil(n / 32), ceil(k / 128)]
  // (PackedFp8MatmulArgs). Padding holds 1.0.
  const uint8_t* panels_e4m3 = nullptr;
  const float* block_scales = nullptr;
  const uint8_t* block_kind = nullptr;
  bool fp8_pairs = false;
  // FP4 experts (e2m1, UE8M0 scales per `group` channels): the panels of PackedFp4MatmulArgs and the
  // group scales as f32 [ceil(n / 32), ceil(k / group), 32]. Padding holds code 0, scale 0.
  const uint8_t* panels_fp4 = nullptr;
  const float* group_scales = nullptr;
  int64_t group = 0;
  bool fp4_pairs = false;  // k-pair panels (KernelTable::packed_fp4_pairs), else [k, 16]
  // The kernels' prefetch distance where one row block streams the panels (PackedMatmulArgs::
  // prefetch_ahead): on Intel CPUs 2 KiB when the experts' packed weights exceed the last-level
  // cache (they stream from DRAM), else 0 (one k chunk ahead); on other CPUs −1 (none).
  // - Intel Xeon (AMX) development VM, 2 threads, 2026-12-02, grouped_mm, ms, one chunk / 2 KiB
  //   ahead: qwen3_30b_a3b f32 (2.4 GB) T = 1 5.80-5.91 / 4.92-5.11, T = 16 62.9-66.5 / 54.5-56.7;
  //   but small_moe f32 (100 MB, in its 480 MB L3) T = 16 1.78-2.09 / 2.15-2.67: from the cache the
  //   short distance is too short.
  // - AMD EPYC (Zen 4) development VM, 2 threads, 2026-12-04, grouped_mm, ms, one chunk / none,
  //   three interleaved rounds: qwen3_30b_a3b bf16 T = 1 1.68-1.75 / 1.22-1.23, T = 16 19.0-19.4 /
  //   12.9-13.0; f32 T = 1 3.53-3.61 / 2.41, T = 16 37.6-38.3 / 25.6-25.8; small_moe bf16 T = 1
  //   0.078-0.079 / 0.068-0.069, f32 T = 16 1.54-1.66 / 1.28-1.33. There the hardware prefetchers
  //   stream at the read probe's rate (~63 GB/s) on their own, and the chunk-ahead software
  //   prefetches held them to ~45 GB/s (docs/PERF.md, thirty-sixth session).
  // MOEX_CPU_PREFETCH_AHEAD=bytes sets it for every matrix (0: one chunk; −1: none; A/B runs).
  int64_t prefetch_ahead = 0;
  // Calls with fewer rows read the weights in place (the dot-product kernels) instead of the panels.
  // On Intel CPUs, f32 weights in the default [out, in] layout: 4 — there the in-place dot kernel
  // streams a row or two per expert faster than the packed kernel, which wins from ~4 rows on.
  // Measured on the Intel Xeon (AMX) development VM, 2 threads, 2026-12-03, grouped_mm f32, ms,
  // packed / in place, four interleaved rounds: qwen3_30b_a3b T = 1 7.8-9.3 / 6.1-7.7, T = 16
  // 86.6-100.0 / 70.1-79.7, T = 32 105-119 / 93-103, T = 64 119-136 / 137-148, T = 256 168-183 /
  // 243-281; small_moe T = 16 4.6-5.1 / 3.4-4.2, T = 32 equal, T = 64 5.6-6.3 / 7.4-7.9 (docs/PERF.md,
  // twenty-seventh session). Elsewhere 0 (the AMD EPYC VM of earlier sessions is not measured here).
  // MOEX_CPU_PACKED_MIN_ROWS=n sets it for every matrix (A/B runs).
  int64_t min_rows = 0;
};

// One expert's packed projections. gate_up is split at I into its gate and up halves when they are
// concatenated ([gate; up]), so a range of h columns starts on a panel in both halves.
struct PackedExpert {
  PackedMatrix gate_up[2];
  int gate_up_parts = 0;
  PackedMatrix down;
};

class PackedWeights {
 public:
  // The packed weights of `ex` (an empty cache entry the first time), or nullptr when packing does
  // not apply: weights neither f32, bf16 nor FP8 (bf16: only where the kernel table has the bf16 packed
  // kernel, and not transposed; FP8: e4m3 with 128-k weight blocks, not transposed, where the table
  // has the packed FP8 kernel), FP4, MOEX_CPU_PACK=0, or the copy would exceed the budget.
  static std::shared_ptr<PackedWeights> of(const Experts& ex);

  // The first time: packs every expert. Later: repacks the experts in `experts` whose weights
  // changed (fingerprint). `threads` threads. Call before reading expert(e) for those experts.
  void prepare(const Experts& ex, const std::vector<int64_t>& experts, int threads);
  const PackedExpert& expert(int64_t e) const { return experts_[size_t(e)].packed; }

  // Bytes of packed weights held by all experts objects together.
  static size_t total_bytes();

  explicit PackedWeights(const Experts& ex);
  DType dtype() const { return dtype_; }
  ~PackedWeights();

 private:
  struct Slot {
    PackedExpert packed;
    std::unique_ptr<float[], void (*)(void*)> storage{nullptr, nullptr};
    size_t bytes = 0;
    uint64_t fingerprint = 0;
    bool ready = false;
  };
  static size_t expert_bytes(const ExpertsSpec& s);
  void pack_expert(const Experts& ex, int64_t e);  // into its slot's storage, allocated by prepare
  uint64_t expert_fingerprint(const Experts& ex, int64_t e) const;  // weights (and FP8 scales) sampled

  std::mutex mutex_;
  DType dtype_;  // f32, bf16 or fp8_e4m3: the weights' dtype, kept by the panels
  int64_t prefetch_ahead_;  // PackedMatrix::prefetch_ahead of every matrix
  int64_t min_rows_;        // PackedMatrix::min_rows of every matrix
  std::vector<Slot> experts_;
  bool primed_ = false;  // every expert packed once
  friend struct PackedCache;
};

// Rows [r0, r0 + n) of a row-major bf16 [N, K] matrix → ceil(n / 32) panels [ceil(K / 2), 32, 2]
// (PackedBf16MatmulArgs; zero padding) at dst: packed_bf16_panel_elems(K) elements per panel.
void pack_rows_bf16(const uint16_t* w, int64_t K, int64_t r0, int64_t n, uint16_t* dst);
// Rows [r0, r0 + n) of a logical [N, K] f32 matrix (stored [N, K], or [K, N] when transposed) →
// ceil(n / 32) panels [K, 32] (PackedMatmulArgs; zero padding) at dst.
void pack_rows(const float* w, bool transposed, int64_t N, int64_t K, int64_t r0, int64_t n, float* dst);

// Rows [r0, r0 + n) of one expert's FP8 matrix (e4m3 codes w [N, K], scales per q.block_n × 128 block,
// f32 or UE8M0) packed for PackedFp8MatmulArgs: codes [ceil(n / 32), fp8_panel_bytes(K, pairs)] (k-pair
// panels with `pairs`), block_scales [ceil(n / 32), ceil(K / 128), 32], flags [ceil(n / 32), ceil(K /
// 128)]. PackedWeights packs with it; declared here for the kernel tests.
void pack_rows_fp8(const uint8_t* w, const void* scales, const QuantSpec& q, int64_t K, int64_t r0, int64_t n, bool pairs,
                   uint8_t* codes, float* block_scales, uint8_t* flags);
// Rows [r0, r0 + n) of one expert's FP4 matrix (e2m1 codes w [N, ceil(K / 2)], two per byte, low nibble
// first; UE8M0 scales [N, ceil(K / group)]) packed for PackedFp4MatmulArgs: codes [ceil(n / 32),
// fp4_panel_bytes(K, pairs)] (k-pair panels with `pairs`), group_scales [ceil(n / 32), ceil(K / group), 32].
// For the kernel tests too.
void pack_rows_fp4(const uint8_t* w, const uint8_t* scales, int64_t group, int64_t K, int64_t r0, int64_t n, bool pairs,
                   uint8_t* codes, float* group_scales);
// Bytes of one FP8 panel of k codes per column: [k, 32], or [ceil(k / 2), 32, 2] in k pairs.
inline int64_t fp8_panel_bytes(int64_t k, bool pairs) { return (pairs ? (k + 1) / 2 * 2 : k) * kPanelCols; }

// The packed kernels' prefetch_ahead (PackedMatrix::prefetch_ahead) for weights of `bytes` in all,
// packed as `packed_dtype`, that are streamed one row block at a time: on Intel CPUs 0 (one k chunk
// ahead) when they fit the last-level cache, else 2 KiB; on other CPUs −1 (no software prefetch: the
// hardware prefetchers stream faster alone), except bf16 panels read by the wide kernel (AVX2's f32
// FMAs on bf16 pairs): 1 KiB, kWideBf16PrefetchAhead. MOEX_CPU_PREFETCH_AHEAD=bytes overrides it.
// The experts' copies and the model runtime's packed dense linears (model/reference_forward.cpp)
// both take it.
int64_t stream_prefetch_ahead(size_t bytes, DType packed_dtype);

// Why the wide bf16 kernel prefetches where the f32 one does not: per 32 bytes of weights it issues
// a load, a shift, a mask and two FMAs (the f32 kernel: a load and an FMA), so the core's
// out-of-order window covers ~2.5× fewer bytes ahead of the stream. On the AVX2 AMD EPYC (Zen 3)
// development VM, 2 threads, qwen3_30b_a3b bf16 decode (T = 1), paired runs one after the other
// (2026-12-08, docs/PERF.md, sixty-first session): 1 KiB ahead faster than none in 16 of 19 pairs,
// by 4–14 % in the first 8 (a median of 7.5 %); f32 decode, same pairs: none faster in 4 of 5.
constexpr int64_t kWideBf16PrefetchAhead = 1024;

// Frees every packed copy (they are rebuilt on the next call that needs them). Not to be called
// while an experts call runs.
void release_packed_weights();

}  // namespace moex::cpu
