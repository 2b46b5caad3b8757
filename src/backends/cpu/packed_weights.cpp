// backends/cpu/packed_weights.cpp — packing f32 expert weights into kernel panels, and the cache
// of packed copies (see packed_weights.hpp).
#include "backends/cpu/packed_weights.hpp"

#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/check.hpp"

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

// Rows [r0, r0 + n) of the logical [N, K] matrix W of one expert into panels at dst
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

// A cheap fingerprint of one expert's weights: the bits of 16 elements spread over each matrix
// (checked on every call: 32 cache misses per routed expert).
uint64_t fingerprint(const float* gate_up, int64_t gate_up_n, const float* down, int64_t down_n) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the sampled bit patterns
  auto mix = [&](const float* w, int64_t n) {
    for (int64_t s = 0; s < 16; ++s) {
      uint32_t bits;
      std::memcpy(&bits, w + (n - 1) * s / 15, 4);
      h = (h ^ bits) * 1099511628211ull;
    }
  };
  mix(gate_up, gate_up_n);
  mix(down, down_n);
  return h;
}

const float* expert_matrix(const TensorView& t, int64_t e) { return static_cast<const float*>(t.data) + e * t.strides[0]; }

}  // namespace

// ---- the cache: one entry per experts object, keyed by its weight buffers ------------------

struct PackedCache {
  struct Key {
    const void* gate_up;
    const void* down;
    int64_t gate_up_stride, down_stride;
    ExpertsSpec spec;
    bool same(const Experts& ex) const {
      const ExpertsSpec& s = ex.spec;
      return gate_up == ex.gate_up.data && down == ex.down.data && gate_up_stride == ex.gate_up.strides[0] &&
             down_stride == ex.down.strides[0] && spec.num_experts == s.num_experts && spec.hidden == s.hidden &&
             spec.intermediate == s.intermediate && spec.has_gate == s.has_gate && spec.transposed == s.transposed &&
             spec.interleaved == s.interleaved;
    }
    // Byte range [lo, hi) of one weight tensor.
    static std::pair<uintptr_t, uintptr_t> range(const void* p, int64_t stride, int64_t E) {
      const auto lo = reinterpret_cast<uintptr_t>(p);
      return {lo, lo + uintptr_t(stride * E) * sizeof(float)};
    }
    bool overlaps(const Experts& ex) const {
      const int64_t E = spec.num_experts;
      auto hit = [](std::pair<uintptr_t, uintptr_t> a, std::pair<uintptr_t, uintptr_t> b) { return a.first < b.second && b.first < a.second; };
      const auto mine = {range(gate_up, gate_up_stride, E), range(down, down_stride, E)};
      const auto theirs = {range(ex.gate_up.data, ex.gate_up.strides[0], ex.spec.num_experts),
                           range(ex.down.data, ex.down.strides[0], ex.spec.num_experts)};
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
  if (!packing_enabled() || s.dtype != DType::f32 || s.quant.quantized() || ex.gate_up.dtype != DType::f32 ||
      ex.down.dtype != DType::f32 || s.num_experts <= 0)
    return nullptr;
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
  PackedCache::Key key{ex.gate_up.data, ex.down.data, ex.gate_up.strides[0], ex.down.strides[0], s};
  auto packed = std::make_shared<PackedWeights>(ex);
  cache.entries.push_back({key, packed, cache.clock});
  return packed;
}

PackedWeights::PackedWeights(const Experts& ex) : experts_(size_t(ex.spec.num_experts)) {}
PackedWeights::~PackedWeights() = default;

// Bytes of one expert's packed copy (the gate and up halves padded separately when split).
size_t PackedWeights::expert_bytes(const ExpertsSpec& s) {
  const int64_t H = s.hidden, I = s.intermediate;
  const int64_t gate_up = s.has_gate && !s.interleaved ? 2 * padded_rows(I) * H : padded_rows(s.gate_up_rows()) * H;
  return size_t(gate_up + padded_rows(H) * I) * sizeof(float);
}

void PackedWeights::pack_expert(const Experts& ex, int64_t e) {
  const ExpertsSpec& s = ex.spec;
  const int64_t H = s.hidden, I = s.intermediate, R = s.gate_up_rows();
  const float* gu = expert_matrix(ex.gate_up, e);
  const float* dn = expert_matrix(ex.down, e);
  Slot& slot = experts_[size_t(e)];
  PackedExpert& pe = slot.packed;
  float* dst = slot.storage.get();
  if (s.has_gate && !s.interleaved) {  // [gate; up] → two matrices of I rows
    pe.gate_up[0] = {dst, 0, I, H};
    pack_rows(gu, s.transposed, R, H, 0, I, dst);
    dst += padded_rows(I) * H;
    pe.gate_up[1] = {dst, I, I, H};
    pack_rows(gu, s.transposed, R, H, I, I, dst);
    dst += padded_rows(I) * H;
    pe.gate_up_parts = 2;
  } else {
    pe.gate_up[0] = {dst, 0, R, H};
    pack_rows(gu, s.transposed, R, H, 0, R, dst);
    dst += padded_rows(R) * H;
    pe.gate_up_parts = 1;
  }
  pe.down = {dst, 0, H, I};
  pack_rows(dn, s.transposed, H, I, 0, H, dst);
  slot.fingerprint = fingerprint(gu, R * H, dn, H * I);
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
      if (!slot.ready || slot.fingerprint != fingerprint(expert_matrix(ex.gate_up, e), s.gate_up_rows() * s.hidden,
                                                         expert_matrix(ex.down, e), s.hidden * s.intermediate))
        to_pack.push_back(e);
    }
  }
  if (to_pack.empty()) return;
  const size_t bytes = expert_bytes(s);
  for (int64_t e : to_pack) {  // allocate here: errors must not be thrown inside the parallel region
    Slot& slot = experts_[size_t(e)];
    slot.ready = false;
    if (slot.storage) continue;
    // 64-byte aligned, so each 128-byte k step of a panel is two whole cache lines
    void* mem = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
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
