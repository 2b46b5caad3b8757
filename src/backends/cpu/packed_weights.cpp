// backends/cpu/packed_weights.cpp — packing f32 expert weights into kernel panels, and the cache
// of packed copies (see packed_weights.hpp).
#include "backends/cpu/packed_weights.hpp"

#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include <unistd.h>

#include "core/check.hpp"
#include "core/memory.hpp"
#include "backends/cpu/quant_math.hpp"
#include "moex/quant.hpp"

namespace moex::cpu {
namespace {

bool packing_enabled() {
  static const bool on = [] {
    const char* env = std::getenv("MOEX_CPU_PACK");
    return !(env && std::string(env) == "0");
  }();
  return on;
}

int64_t padded_rows(int64_t n) { return (n + kPanelCols - 1) / kPanelCols * kPanelCols; }

// The dtype the panels keep: e4m3 for FP8 experts, e2m1 pairs for FP4 ones, else the experts' dtype.
DType weights_dtype(const ExpertsSpec& s) {
  return s.quant.kind == QuantKind::fp8_block ? DType::fp8_e4m3 : s.quant.kind == QuantKind::fp4_group ? DType::fp4_e2m1x2 : s.dtype;
}

size_t round64(size_t b) { return (b + 63) / 64 * 64; }

// The three parts of an FP8 packed matrix, each starting on 64 bytes: codes, block scales, flags.
struct Fp8Sizes {
  size_t codes, scales, flags;
};
Fp8Sizes fp8_sizes(int64_t n, int64_t k) {
  const size_t panels = size_t(padded_rows(n) / kPanelCols), blocks = size_t((k + 127) / 128);
  return {round64(panels * size_t(fp8_panel_bytes(k, kernels().packed_fp8_pairs))),
          round64(panels * blocks * kPanelCols * sizeof(float)), round64(panels * blocks)};
}

// The two parts of an FP4 packed matrix, each starting on 64 bytes: codes, group scales.
struct Fp4Sizes {
  size_t codes, scales;
};
Fp4Sizes fp4_sizes(int64_t n, int64_t k, int64_t group) {
  const size_t panels = size_t(padded_rows(n) / kPanelCols), groups = size_t((k + group - 1) / group);
  return {round64(panels * size_t(fp4_panel_bytes(k, kernels().packed_fp4_pairs))), round64(panels * groups * kPanelCols * sizeof(float))};
}

// Bytes of n rows × k of one matrix packed in dtype dt (f32 [k, 32], bf16 [ceil(k / 2), 32, 2], FP8
// panels with their block scales and flags, or FP4 panels with their group scales: group).
size_t packed_matrix_bytes(DType dt, int64_t n, int64_t k, int64_t group = 0) {
  if (dt == DType::fp8_e4m3) {
    const Fp8Sizes z = fp8_sizes(n, k);
    return z.codes + z.scales + z.flags;
  }
  if (dt == DType::fp4_e2m1x2) {
    const Fp4Sizes z = fp4_sizes(n, k, group);
    return z.codes + z.scales;
  }
  const int64_t panels = padded_rows(n) / kPanelCols;
  return size_t(panels * (dt == DType::bf16 ? packed_bf16_panel_elems(k) : k * kPanelCols)) * dtype_size(dt);
}

// The bytes all packed copies together may take: MOEX_CPU_PACK_MAX_MB, else a quarter of the
// physical memory (read at every new experts object, so that tests and users can change it).
size_t pack_budget_bytes() {
  if (const char* env = std::getenv("MOEX_CPU_PACK_MAX_MB"); env && *env) return size_t(std::strtoull(env, nullptr, 10)) << 20;
  static const size_t quarter = [] {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? size_t(pages) * size_t(page) / 4 : size_t(4) << 30;
  }();
  return quarter;
}

}  // namespace

// (packed_weights.hpp) Rows [r0, r0 + n) of the logical [N, K] matrix W of one expert into panels at dst
// ([ceil(n / 32), K, 32]). nt: W is stored [N, K]; transposed: stored [K, N].
void pack_rows(const float* w, bool transposed, int64_t N, int64_t K, int64_t r0, int64_t n, float* dst) {
  const int64_t panels = padded_rows(n) / kPanelCols;
  for (int64_t p = 0; p < panels; ++p) {
    float* panel = dst + p * K * kPanelCols;
    const int64_t c_end = std::min<int64_t>(kPanelCols, n - p * kPanelCols);
    const int64_t row = r0 + p * kPanelCols;
    if (transposed) {  // W[k, row + c]: contiguous in c
      for (int64_t k = 0; k < K; ++k) {
        float* out = panel + k * kPanelCols;
        std::memcpy(out, w + k * N + row, size_t(c_end) * sizeof(float));
        std::fill(out + c_end, out + kPanelCols, 0.0f);
      }
    } else {  // W[row + c, k]: a 32 × K transpose, in blocks of 32 k so both sides stay in cache
      for (int64_t k0 = 0; k0 < K; k0 += 32) {
        const int64_t k1 = std::min<int64_t>(K, k0 + 32);
        for (int64_t k = k0; k < k1; ++k) {
          float* out = panel + k * kPanelCols;
          for (int64_t c = 0; c < c_end; ++c) out[c] = w[(row + c) * K + k];
          for (int64_t c = c_end; c < kPanelCols; ++c) out[c] = 0.0f;
        }
      }
    }
  }
}

// (packed_weights.hpp) The same for bf16 weights: panels [ceil(K / 2), 32, 2], element (j, c, h) = W[row + c, 2j + h].
void pack_rows_bf16(const uint16_t* w, int64_t K, int64_t r0, int64_t n, uint16_t* dst) {
  const int64_t panels = padded_rows(n) / kPanelCols, pairs = (K + 1) / 2;
  for (int64_t p = 0; p < panels; ++p) {
    uint16_t* panel = dst + p * packed_bf16_panel_elems(K);
    const int64_t c_end = std::min<int64_t>(kPanelCols, n - p * kPanelCols);
    const int64_t row = r0 + p * kPanelCols;
    for (int64_t j0 = 0; j0 < pairs; j0 += 32) {  // blocks of 64 k, so that both sides stay in cache
      const int64_t j1 = std::min(pairs, j0 + 32);
      for (int64_t c = 0; c < kPanelCols; ++c)
        for (int64_t j = j0; j < j1; ++j)
          for (int64_t h = 0; h < 2; ++h) {
            const int64_t k = 2 * j + h;
            panel[(j * kPanelCols + c) * 2 + h] = c < c_end && k < K ? w[(row + c) * K + k] : uint16_t(0);
          }
    }
  }
}

namespace {

// A cheap fingerprint of one expert's weights: the 64 bytes from each of 16 places spread over each
// matrix (checked on every call: about 32 cache misses per routed expert). Whole 64-byte runs, not
// one element per place: sparse weights (the harness' exact cases, ±1 in a sea of zeros) gave equal
// single-element samples for different matrices, so weights of a new experts object at a freed
// one's address and of its shape were taken for the old ones and their stale copy was used.
uint64_t fingerprint(const void* gate_up, int64_t gate_up_n, const void* down, int64_t down_n, size_t esz) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the sampled 64-bit words
  auto mix = [&](const void* w, int64_t n) {
    const size_t bytes = size_t(n) * esz, span = std::min<size_t>(64, bytes);
    for (int64_t s = 0; s < 16; ++s) {
      const size_t at = std::min(size_t((n - 1) * s / 15) * esz, bytes - span);
      uint64_t words[8] = {};
      std::memcpy(words, static_cast<const char*>(w) + at, span);
      for (uint64_t v : words) h = (h ^ v) * 1099511628211ull;
    }
  };
  mix(gate_up, gate_up_n);
  mix(down, down_n);
  return h;
}

const void* expert_matrix(const TensorView& t, int64_t e) {
  return static_cast<const char*>(t.data) + size_t(e * t.strides[0]) * dtype_size(t.dtype);
}

}  // namespace

// (packed_weights.hpp) Rows [r0, r0 + n) of one expert's FP8 matrix: codes w [N, K] e4m3 (row-major), scales [ceil(N /
// block_n), ceil(K / 128)] (f32 or UE8M0) → e4m3 panels [ceil(n / 32), K, 32], or [ceil(n / 32), ceil(K /
// 2), 32, 2] with `pairs` (padding columns, and an odd K's last pair partner, 1.0), each 128-k block's
// 32 column scales as f32, and its Fp8BlockKind (of the real columns' codes), at the three
// destinations.
void pack_rows_fp8(const uint8_t* w, const void* scales, const QuantSpec& q, int64_t K, int64_t r0, int64_t n, bool pairs,
                   uint8_t* codes, float* block_scales, uint8_t* flags) {
  constexpr uint8_t kOne = 0x38;  // e4m3 1.0: a normal code for the padding
  const int64_t panels = padded_rows(n) / kPanelCols, blocks = (K + 127) / 128;
  const QuantMatrix wq{q, w, scales, r0 + n, K, false};  // (rows past r0 + n are not read)
  // where code (k, c) of a panel lives
  const auto at = [pairs](int64_t k, int64_t c) { return pairs ? (k / 2) * 2 * kPanelCols + c * 2 + k % 2 : k * kPanelCols + c; };
  for (int64_t p = 0; p < panels; ++p) {
    uint8_t* panel = codes + p * fp8_panel_bytes(K, pairs);
    if (pairs && K % 2)
      for (int64_t c = 0; c < kPanelCols; ++c) panel[at(K, c)] = kOne;
    const int64_t c_end = std::min<int64_t>(kPanelCols, n - p * kPanelCols);
    const int64_t row = r0 + p * kPanelCols;
    for (int64_t kb = 0; kb < blocks; ++kb) {
      const int64_t k0 = kb * 128, k1 = std::min(K, k0 + 128);
      bool small = false, nan = false;
      for (int64_t c = 0; c < kPanelCols; ++c) {
        for (int64_t k = k0; k < k1; ++k) {
          const uint8_t code = c < c_end ? w[(row + c) * K + k] : kOne;
          const int em = code & 0x7f;
          small = small || em < 8;
          nan = nan || em == 0x7f;
          panel[at(k, c)] = code;
        }
        block_scales[(p * blocks + kb) * kPanelCols + c] = c < c_end ? weight_block_scale(wq, row + c, kb) : 0.0f;
      }
      flags[p * blocks + kb] = nan ? kFp8BlockAny : small ? kFp8BlockSmall : kFp8BlockNormal;
    }
  }
}

// (packed_weights.hpp) Rows [r0, r0 + n) of one expert's FP4 matrix: e2m1 codes w [N, ceil(K / 2)] (two per
// byte, low nibble first), UE8M0 scales [N, ceil(K / group)] → the panels of PackedFp4MatmulArgs (in k
// pairs with `pairs`, else [K, 16]) and the group scales as f32 (padding: codes and scales 0).
void pack_rows_fp4(const uint8_t* w, const uint8_t* scales, int64_t group, int64_t K, int64_t r0, int64_t n, bool pairs,
                   uint8_t* codes, float* group_scales) {
  const int64_t panels = padded_rows(n) / kPanelCols, groups = (K + group - 1) / group;
  const int64_t row_bytes = (K + 1) / 2;
  for (int64_t p = 0; p < panels; ++p) {
    uint8_t* panel = codes + p * fp4_panel_bytes(K, pairs);
    const int64_t c_end = std::min<int64_t>(kPanelCols, n - p * kPanelCols);
    const int64_t row = r0 + p * kPanelCols;
    auto code = [&](int64_t c, int64_t k) -> uint8_t { return c < c_end && k < K ? fp4_nibble(w + (row + c) * row_bytes, k) : 0; };
    if (pairs) {
      for (int64_t j = 0; j < (K + 1) / 2; ++j)
        for (int64_t i = 0; i < 32; ++i) {
          const int64_t k = 2 * j + i % 2;
          panel[j * 32 + i] = uint8_t(code(i / 2, k) | (code(16 + i / 2, k) << 4));
        }
    } else {
      for (int64_t k = 0; k < K; ++k)
        for (int64_t i = 0; i < 16; ++i) panel[k * 16 + i] = uint8_t(code(i, k) | (code(16 + i, k) << 4));
    }
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t c = 0; c < kPanelCols; ++c)
        group_scales[(p * groups + g) * kPanelCols + c] = c < c_end ? ue8m0_to_float(scales[(row + c) * groups + g]) : 0.0f;
  }
}

// ---- the cache: one entry per experts object, keyed by its weight buffers ------------------

struct PackedCache {
  struct Key {
    const void* gate_up;
    const void* down;
    int64_t gate_up_stride, down_stride;
    ExpertsSpec spec;
    DType weight_dtype;                    // the tensors' (e4m3 for FP8 experts, else spec.dtype)
    const void* gate_up_scale = nullptr;   // FP8: the scale tensors
    const void* down_scale = nullptr;
    bool same(const Experts& ex) const {
      const ExpertsSpec& s = ex.spec;
      const QuantSpec &q = spec.quant, &r = s.quant;
      return gate_up == ex.gate_up.data && down == ex.down.data && gate_up_stride == ex.gate_up.strides[0] &&
             down_stride == ex.down.strides[0] && spec.num_experts == s.num_experts && spec.hidden == s.hidden &&
             spec.intermediate == s.intermediate && spec.has_gate == s.has_gate && spec.transposed == s.transposed &&
             spec.interleaved == s.interleaved && spec.dtype == s.dtype && weight_dtype == ex.gate_up.dtype &&
             q.kind == r.kind && q.block_n == r.block_n && q.block_k == r.block_k && q.scale_format == r.scale_format &&
             gate_up_scale == (r.quantized() ? ex.gate_up_scale.data : nullptr) &&
             down_scale == (r.quantized() ? ex.down_scale.data : nullptr);
    }
    // Byte range [lo, hi) of one weight tensor.
    static std::pair<uintptr_t, uintptr_t> range(const void* p, int64_t stride, int64_t E, DType dt) {
      const auto lo = reinterpret_cast<uintptr_t>(p);
      return {lo, lo + uintptr_t(stride * E) * dtype_size(dt)};
    }
    bool overlaps(const Experts& ex) const {
      const int64_t E = spec.num_experts;
      auto hit = [](std::pair<uintptr_t, uintptr_t> a, std::pair<uintptr_t, uintptr_t> b) { return a.first < b.second && b.first < a.second; };
      const auto mine = {range(gate_up, gate_up_stride, E, weight_dtype), range(down, down_stride, E, weight_dtype)};
      const auto theirs = {range(ex.gate_up.data, ex.gate_up.strides[0], ex.spec.num_experts, ex.gate_up.dtype),
                           range(ex.down.data, ex.down.strides[0], ex.spec.num_experts, ex.down.dtype)};
      for (auto a : mine)
        for (auto b : theirs)
          if (hit(a, b)) return true;
      return false;
    }
  };
  struct Entry {
    Key key;
    std::shared_ptr<PackedWeights> packed;
    uint64_t last_use;
  };
  // A bound on the experts objects kept (the least recently used go first): weights freed without
  // their memory being reused by other experts would otherwise keep their packed copies forever.
  static constexpr size_t kMaxEntries = 512;
  std::mutex mutex;
  std::vector<Entry> entries;
  uint64_t clock = 0;

  static PackedCache& get() {
    static PackedCache cache;
    return cache;
  }
};

std::shared_ptr<PackedWeights> PackedWeights::of(const Experts& ex) {
  const ExpertsSpec& s = ex.spec;
  const bool f32 = s.dtype == DType::f32 && ex.gate_up.dtype == DType::f32 && ex.down.dtype == DType::f32;
  const bool bf16 = s.dtype == DType::bf16 && ex.gate_up.dtype == DType::bf16 && ex.down.dtype == DType::bf16 &&
                    !s.transposed && packs_bf16(kernels());
  const bool fp8 = s.quant.kind == QuantKind::fp8_block && s.quant.block_k == 128 && s.quant.block_n >= 1 && !s.transposed &&
                   ex.gate_up.dtype == DType::fp8_e4m3 && ex.down.dtype == DType::fp8_e4m3 && kernels().packed_matmul_fp8 != nullptr;
  const int64_t group = s.quant.block_k;
  const bool fp4 = s.quant.kind == QuantKind::fp4_group && group >= 2 && group % 2 == 0 && 128 % group == 0 && !s.transposed &&
                   ex.gate_up.dtype == DType::u8 && ex.down.dtype == DType::u8 && kernels().packed_matmul_fp4 != nullptr;
  if (!packing_enabled() || s.num_experts <= 0) return nullptr;
  if (s.quant.quantized() ? !(fp8 || fp4) : !(f32 || bf16)) return nullptr;
  PackedCache& cache = PackedCache::get();
  std::lock_guard<std::mutex> lock(cache.mutex);
  ++cache.clock;
  for (auto& entry : cache.entries)
    if (entry.key.same(ex)) {
      entry.last_use = cache.clock;
      return entry.packed;
    }
  // new weights: drop the entries of weights that lived in the same memory before (freed since)
  std::erase_if(cache.entries, [&](const PackedCache::Entry& entry) { return entry.key.overlaps(ex); });
  if (cache.entries.size() >= PackedCache::kMaxEntries)
    cache.entries.erase(std::min_element(cache.entries.begin(), cache.entries.end(),
                                         [](const auto& a, const auto& b) { return a.last_use < b.last_use; }));
  // A copy that would take the packed copies past the budget is not made: these experts are read in
  // place (the dot-product kernels), so that packing never doubles a large model's memory on a
  // machine that cannot hold two copies.
  size_t held = 0;
  for (const auto& entry : cache.entries) held += size_t(entry.key.spec.num_experts) * expert_bytes(entry.key.spec);
  if (held + size_t(s.num_experts) * expert_bytes(s) > pack_budget_bytes()) return nullptr;
  PackedCache::Key key{ex.gate_up.data, ex.down.data, ex.gate_up.strides[0], ex.down.strides[0], s, ex.gate_up.dtype,
                       s.quant.quantized() ? ex.gate_up_scale.data : nullptr, s.quant.quantized() ? ex.down_scale.data : nullptr};
  auto packed = std::make_shared<PackedWeights>(ex);
  cache.entries.push_back({key, packed, cache.clock});
  return packed;
}

namespace {

bool intel_cpu() {
#if defined(__x86_64__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0), "c"(0));
  return b == 0x756e6547u && d == 0x49656e69u && c == 0x6c65746eu;  // "GenuineIntel"
#else
  return false;
#endif
}

}  // namespace

int64_t stream_prefetch_ahead(size_t bytes, DType packed_dtype) {
  if (const char* e = std::getenv("MOEX_CPU_PREFETCH_AHEAD"); e && *e) return std::max<int64_t>(-1, std::atoll(e));
  static const bool intel = intel_cpu();
  if (!intel) {
    const KernelTable& kt = kernels();
    const bool wide_bf16 = packed_dtype == DType::bf16 && kt.packed_matmul_bf16_wide && !kt.packed_matmul_bf16;
    return wide_bf16 ? kWideBf16PrefetchAhead : -1;
  }
  const long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);  // 0 or -1 where unknown: taken as smaller
  return llc > 0 && bytes <= size_t(llc) ? 0 : 2048;
}

namespace {

// PackedMatrix::min_rows for experts of this spec.
int64_t packed_min_rows(const ExpertsSpec& s) {
  if (const char* e = std::getenv("MOEX_CPU_PACKED_MIN_ROWS"); e && *e) return std::max<int64_t>(0, std::atoll(e));
  static const bool intel = intel_cpu();
  return intel && s.dtype == DType::f32 && !s.transposed && !s.quant.quantized() ? 4 : 0;
}

}  // namespace

PackedWeights::PackedWeights(const Experts& ex)
    : dtype_(weights_dtype(ex.spec)),
      prefetch_ahead_(stream_prefetch_ahead(size_t(ex.spec.num_experts) * expert_bytes(ex.spec), weights_dtype(ex.spec))),
      min_rows_(packed_min_rows(ex.spec)),
      experts_(size_t(ex.spec.num_experts)) {}
PackedWeights::~PackedWeights() = default;

// Bytes of one expert's packed copy (the gate and up halves padded separately when split).
size_t PackedWeights::expert_bytes(const ExpertsSpec& s) {
  const int64_t H = s.hidden, I = s.intermediate;
  const DType dt = weights_dtype(s);
  const int64_t group = s.quant.block_k;
  const size_t gate_up = s.has_gate && !s.interleaved ? 2 * packed_matrix_bytes(dt, I, H, group)
                                                      : packed_matrix_bytes(dt, s.gate_up_rows(), H, group);
  return gate_up + packed_matrix_bytes(dt, H, I, group);
}

uint64_t PackedWeights::expert_fingerprint(const Experts& ex, int64_t e) const {
  const ExpertsSpec& s = ex.spec;
  const int64_t H = s.hidden, I = s.intermediate, R = s.gate_up_rows();
  // FP4 rows are ceil(K / 2) bytes
  const bool fp4 = dtype_ == DType::fp4_e2m1x2;
  const int64_t h_row = fp4 ? (H + 1) / 2 : H, i_row = fp4 ? (I + 1) / 2 : I;
  uint64_t h = fingerprint(expert_matrix(ex.gate_up, e), R * h_row, expert_matrix(ex.down, e), H * i_row, dtype_size(dtype_));
  if (s.quant.quantized()) {  // the scales too ([ceil(N / block_n), ceil(K / block_k)] each)
    const int64_t bn = s.quant.block_n, bk = s.quant.block_k;
    const int64_t gu_scales = (R + bn - 1) / bn * ((H + bk - 1) / bk);
    const int64_t dn_scales = (H + bn - 1) / bn * ((I + bk - 1) / bk);
    h ^= fingerprint(expert_matrix(ex.gate_up_scale, e), gu_scales, expert_matrix(ex.down_scale, e), dn_scales,
                     dtype_size(ex.gate_up_scale.dtype)) * 0x9E3779B97F4A7C15ull;
  }
  return h;
}

void PackedWeights::pack_expert(const Experts& ex, int64_t e) {
  const ExpertsSpec& s = ex.spec;
  const int64_t H = s.hidden, I = s.intermediate, R = s.gate_up_rows();
  const void* gu = expert_matrix(ex.gate_up, e);
  const void* dn = expert_matrix(ex.down, e);
  Slot& slot = experts_[size_t(e)];
  PackedExpert& pe = slot.packed;
  const bool bf16 = dtype_ == DType::bf16, fp8 = dtype_ == DType::fp8_e4m3, fp4 = dtype_ == DType::fp4_e2m1x2;
  const int64_t group = s.quant.block_k;
  char* dst = reinterpret_cast<char*>(slot.storage.get());
  // rows [r0, r0 + n) of the [N, K] matrix w into dst; advances dst past them
  auto pack = [&](PackedMatrix& m, const void* w, const void* scales, int64_t N, int64_t K, int64_t r0, int64_t n) {
    m = PackedMatrix{};
    m.row0 = r0;
    m.n = n;
    m.k = K;
    m.prefetch_ahead = prefetch_ahead_;
    m.min_rows = min_rows_;
    if (fp8) {
      const Fp8Sizes z = fp8_sizes(n, K);
      auto* codes = reinterpret_cast<uint8_t*>(dst);
      auto* block_scales = reinterpret_cast<float*>(dst + z.codes);
      auto* flags = reinterpret_cast<uint8_t*>(dst + z.codes + z.scales);
      m.fp8_pairs = kernels().packed_fp8_pairs;
      pack_rows_fp8(static_cast<const uint8_t*>(w), scales, s.quant, K, r0, n, m.fp8_pairs, codes, block_scales, flags);
      m.panels_e4m3 = codes;
      m.block_scales = block_scales;
      m.block_kind = flags;
    } else if (fp4) {
      const Fp4Sizes z = fp4_sizes(n, K, group);
      auto* codes = reinterpret_cast<uint8_t*>(dst);
      auto* group_scales = reinterpret_cast<float*>(dst + z.codes);
      m.fp4_pairs = kernels().packed_fp4_pairs;
      pack_rows_fp4(static_cast<const uint8_t*>(w), static_cast<const uint8_t*>(scales), group, K, r0, n, m.fp4_pairs, codes,
                    group_scales);
      m.panels_fp4 = codes;
      m.group_scales = group_scales;
      m.group = group;
    } else if (bf16) {
      m.panels_bf16 = reinterpret_cast<const uint16_t*>(dst);
      pack_rows_bf16(static_cast<const uint16_t*>(w), K, r0, n, reinterpret_cast<uint16_t*>(dst));
    } else {
      m.panels = reinterpret_cast<const float*>(dst);
      pack_rows(static_cast<const float*>(w), s.transposed, N, K, r0, n, reinterpret_cast<float*>(dst));
    }
    dst += packed_matrix_bytes(dtype_, n, K, group);
  };
  const void* gus = fp8 || fp4 ? expert_matrix(ex.gate_up_scale, e) : nullptr;
  const void* dns = fp8 || fp4 ? expert_matrix(ex.down_scale, e) : nullptr;
  if (s.has_gate && !s.interleaved) {  // [gate; up] → two matrices of I rows
    pack(pe.gate_up[0], gu, gus, R, H, 0, I);
    pack(pe.gate_up[1], gu, gus, R, H, I, I);
    pe.gate_up_parts = 2;
  } else {
    pack(pe.gate_up[0], gu, gus, R, H, 0, R);
    pe.gate_up_parts = 1;
  }
  pack(pe.down, dn, dns, H, I, 0, H);
  slot.fingerprint = expert_fingerprint(ex, e);
  slot.ready = true;
}

void PackedWeights::prepare(const Experts& ex, const std::vector<int64_t>& experts, int threads) {
  const ExpertsSpec& s = ex.spec;
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<int64_t> to_pack;
  if (!primed_) {  // the first call packs every expert (the "load" step), so later calls never pay for it
    for (int64_t e = 0; e < s.num_experts; ++e) to_pack.push_back(e);
    primed_ = true;
  } else {
    for (int64_t e : experts) {
      const Slot& slot = experts_[size_t(e)];
      if (!slot.ready || slot.fingerprint != expert_fingerprint(ex, e))
        to_pack.push_back(e);
    }
  }
  if (to_pack.empty()) return;
  const size_t bytes = expert_bytes(s);
  for (int64_t e : to_pack) {  // allocate here: errors must not be thrown inside the parallel region
    Slot& slot = experts_[size_t(e)];
    slot.ready = false;
    if (slot.storage) continue;
    // 64-byte aligned, so each 128-byte k step of a panel is two whole cache lines; on huge pages
    // where they fit (host_alloc), so the stream of panels does not miss the TLB every 4 KiB
    void* mem = detail::host_alloc(bytes);
    if (!mem)
      detail::fail(ErrorCode::out_of_memory, "packing expert {} of {} for the CPU kernels: cannot allocate {} bytes (MOEX_CPU_PACK=0 "
                   "runs without packed copies)", e, s.describe(), bytes);
    slot.storage = std::unique_ptr<float[], void (*)(void*)>(static_cast<float*>(mem), &std::free);
    slot.bytes = bytes;
  }
  // one expert per thread: a thread packs (and first-touches) whole experts
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
  for (size_t i = 0; i < to_pack.size(); ++i) pack_expert(ex, to_pack[i]);
}

size_t PackedWeights::total_bytes() {
  PackedCache& cache = PackedCache::get();
  std::lock_guard<std::mutex> lock(cache.mutex);
  size_t total = 0;
  for (auto& entry : cache.entries) {
    std::lock_guard<std::mutex> inner(entry.packed->mutex_);
    for (const Slot& slot : entry.packed->experts_) total += slot.ready ? slot.bytes : 0;
  }
  return total;
}

void release_packed_weights() {
  PackedCache& cache = PackedCache::get();
  std::lock_guard<std::mutex> lock(cache.mutex);
  cache.entries.clear();
}

}  // namespace moex::cpu
