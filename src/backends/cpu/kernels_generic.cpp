// backends/cpu/kernels_generic.cpp — portable kernels (8-lane arrays the compiler vectorises
// for the baseline ISA), and the run-time choice of the best kernel table.
#include <cstdlib>
#include <string>

#include "backends/cpu/kernels_impl.hpp"
#include "core/check.hpp"

#include <algorithm>
#include <string_view>

namespace moex::cpu {
namespace {

struct Generic {
  static constexpr int W = 8;
  static constexpr bool kBf16Dot = false;
  static void matmul_nt_bf16_dot(const MatmulArgs&) {}
  struct V {
    float v[W];
  };
  static constexpr bool kVectorE4m3 = false;
  static V load_e4m3(const uint8_t*) { return V{}; }
  static V zero() { return V{}; }
  static V set1(float x) {
    V r;
    for (int i = 0; i < W; ++i) r.v[i] = x;
    return r;
  }
  static V load(const float* p) {
    V r;
    std::memcpy(r.v, p, sizeof(r.v));
    return r;
  }
  static V load_bf16(const uint16_t* p) {
    V r;
    for (int i = 0; i < W; ++i) r.v[i] = bf16_to_float(p[i]);
    return r;
  }
  static V load_f16(const uint16_t* p) {
    V r;
    for (int i = 0; i < W; ++i) r.v[i] = f16_to_float(p[i]);
    return r;
  }
  static V fma(V a, V b, V c) {
    for (int i = 0; i < W; ++i) c.v[i] += a.v[i] * b.v[i];
    return c;
  }
  static float reduce(V a) {
    float s = 0;
    for (int i = 0; i < W; ++i) s += a.v[i];
    return s;
  }
  static void store(float* p, V a) { std::memcpy(p, a.v, sizeof(a.v)); }
  static void store_as_bf16(const float* src, uint16_t* dst, int64_t n) { impl::store_as_bf16_scalar(src, dst, n); }
  static void store_as_f16(const float* src, uint16_t* dst, int64_t n) { impl::store_as_f16_scalar(src, dst, n); }
};

const KernelTable& choose() {
  std::string forced;
  if (const char* env = std::getenv("MOEX_CPU_ISA")) forced = env;
#if defined(MOEX_X86)
  __builtin_cpu_init();
  const bool has512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  const bool has2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  const bool has_bf16 = has512 && __builtin_cpu_supports("avx512bf16");
  const bool has_amx = has_bf16 && __builtin_cpu_supports("amx-bf16") && __builtin_cpu_supports("amx-tile") && amx_available();
  if (forced == "avx512_amx" && has_amx) return avx512_amx_kernels();
  if (forced == "avx512_amx_model" && has_bf16) return avx512_amx_model_kernels();  // tests: AMX paths without AMX
  if (forced == "avx512_bf16" && has_bf16) return avx512_bf16_kernels();
  if (forced == "avx512" && has512) return avx512_kernels();
  if (forced == "avx2" && has2) return avx2_kernels();
  if (forced == "generic") return generic_kernels();
  if (forced.empty() || forced == "auto") {
    if (has_amx) return avx512_amx_kernels();
    if (has_bf16) return avx512_bf16_kernels();
    if (has512) return avx512_kernels();
    if (has2) return avx2_kernels();
  }
#else
  if (forced.empty() || forced == "auto" || forced == "generic") return generic_kernels();
#endif
  if (!forced.empty() && forced != "auto")
    detail::fail(ErrorCode::invalid_argument, "MOEX_CPU_ISA={} is not supported by this CPU (valid: auto, avx512_amx, avx512_bf16, avx512, avx2, generic; "
                 "avx512_amx_model for tests)",
                 forced);
  return generic_kernels();
}

}  // namespace

int64_t vnni_elems(int64_t m, int64_t k) { return (m + 15) / 16 * ((k + 31) / 32) * 512; }

void pack_x_vnni(const uint16_t* x, int64_t ldx, int64_t m, int64_t k, uint16_t* out) {
  const int64_t chunks = (k + 31) / 32;
  std::fill(out, out + vnni_elems(m, k), uint16_t(0));
  // as 32-bit (k, k+1) pairs: pair kp of row r lands at [r / 16][kp][r % 16], i.e. 16·kp past its row
  uint32_t* pairs = reinterpret_cast<uint32_t*>(out);
  const int64_t kp_full = k / 2;
  for (int64_t r = 0; r < m; ++r) {
    const uint16_t* xr = x + r * ldx;
    uint32_t* dst = pairs + (r / 16) * chunks * 256 + (r % 16);
    for (int64_t kp = 0; kp < kp_full; ++kp) dst[16 * kp] = uint32_t(xr[2 * kp]) | (uint32_t(xr[2 * kp + 1]) << 16);
    if (k % 2) dst[16 * kp_full] = xr[k - 1];  // the last k alone, its pair partner zero
  }
}

bool uses_amx(const KernelTable& kt) { return std::string_view(kt.isa).starts_with("avx512_amx"); }

const KernelTable& generic_kernels() {
  static const KernelTable table = impl::make_table<Generic>("generic");
  return table;
}

const KernelTable& kernels() {
  static const KernelTable& table = choose();
  return table;
}

}  // namespace moex::cpu
