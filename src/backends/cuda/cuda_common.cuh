// backends/cuda/cuda_common.cuh — what every CUDA experts kernel and launcher shares: error
// checks that become moex::Error, a device guard, element types (f32/f16/bf16) with their f32
// conversions, the activations (same formulas as backends/cpu/expert_math.hpp) and the launch
// parameter structs of the kernels in this folder.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>

#include "core/check.hpp"
#include "moex/experts.hpp"
#include "moex/backend.hpp"

namespace moex::cuda {

// ---- errors -------------------------------------------------------------------------------
[[noreturn]] inline void throw_cuda(cudaError_t e, const char* what) {
  cudaGetLastError();  // clear a non-sticky error so that the next call starts clean
  if (e == cudaErrorMemoryAllocation)
    detail::fail(ErrorCode::out_of_memory, "out of GPU memory in {}: {}", what, cudaGetErrorString(e));
  detail::fail(ErrorCode::internal, "CUDA error in {}: {} ({})", what, cudaGetErrorString(e), cudaGetErrorName(e));
}
inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw_cuda(e, what);
}
// After a kernel launch: launch-configuration errors surface here (asynchronous faults surface
// at the next synchronising call, as everywhere in CUDA).
inline void check_launch(const char* kernel) { check(cudaGetLastError(), kernel); }

// Makes `device` current for the scope and restores the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    check(cudaGetDevice(&prev_), "cudaGetDevice");
    if (prev_ != device) check(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceGuard() {
    int cur = prev_;
    cudaGetDevice(&cur);
    if (cur != prev_) cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = 0;
};

// Compute capability (major*10+minor) of the current device, cached per device.
inline int current_device_cc() {
  static int cache[64] = {};
  int dev = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  if (dev < 0 || dev >= 64) dev = 63;
  if (cache[dev] == 0) {
    int major = 0, minor = 0;
    check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), "cudaDeviceGetAttribute");
    check(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev), "cudaDeviceGetAttribute");
    cache[dev] = major * 10 + minor;
  }
  return cache[dev];
}

// Multiprocessors of the current device, cached per device.
inline int current_device_sms() {
  static int cache[64] = {};
  int dev = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  if (dev < 0 || dev >= 64) dev = 63;
  if (cache[dev] == 0) check(cudaDeviceGetAttribute(&cache[dev], cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute");
  return cache[dev];
}

// nvcc cannot compile fmt in C++20 mode (core/check.hpp): the same "{}" formatter as fail(), for
// the host code of the .cu files (requirement messages).
template <class... Args>
std::string format(std::string_view f, const Args&... args) {
  std::ostringstream os;
  detail::format_into(os, f, args...);
  return os.str();
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }
// Workspace bytes of n elements of esz bytes, rounded as WorkspaceCarver carves them.
inline size_t bytes_of(int64_t n, size_t esz) { return WorkspaceCarver::round_up(size_t(n) * esz); }
inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---- element types ------------------------------------------------------------------------
__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
template <class T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// An f32 value of a buffer whose dtype is only known at run time (f32, f16 or bf16).
__device__ __forceinline__ float load_any(const void* p, int dtype_code, int64_t i) {
  if (dtype_code == 0) return static_cast<const float*>(p)[i];
  if (dtype_code == 1) return __half2float(static_cast<const __half*>(p)[i]);
  return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
}
// 0 = f32, 1 = f16, 2 = bf16 (for load_any)
inline int dtype_code(DType dt) { return dt == DType::f32 ? 0 : dt == DType::f16 ? 1 : 2; }

// ---- thread-block clusters (compute capability >= 9.0) ----
__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
// Every thread of the cluster's CTAs that has not exited (non-aligned form: warps may arrive
// diverged); release / acquire: shared-memory writes into other CTAs before it are visible after it.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
// The two halves of a cluster barrier phase, for a CTA that writes into another CTA's shared memory:
// every CTA arrives when it starts and waits before its first remote write, so that no write targets
// a CTA that has not started yet (CUDA programming guide, distributed shared memory).
__device__ __forceinline__ void cluster_arrive_relaxed() { asm volatile("barrier.cluster.arrive.relaxed;\n" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait;\n" ::: "memory"); }
// v into the f32 at this CTA's shared-memory address `local` in CTA `cta` of the cluster.
__device__ __forceinline__ void store_cluster_f32(uint32_t local, uint32_t cta, float v) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local), "r"(cta));
  asm volatile("st.shared::cluster.f32 [%0], %1;\n" ::"r"(remote), "f"(v) : "memory");
}

__device__ __forceinline__ int64_t load_index(const void* idx, bool idx64, int64_t p) {
  return idx64 ? static_cast<const int64_t*>(idx)[p] : int64_t(static_cast<const int32_t*>(idx)[p]);
}

// ---- activations (f32; the formulas of SPEC §1 and backends/cpu/expert_math.hpp) ------------
struct ActParams {
  int kind;  // moex::Activation as int
  float alpha, limit;
};
// SiLU with the hardware exponential and division (__expf: 2 + 1.16·|x| ulp; __fdividef: 2 ulp, 0
// once 1 + e^−x passes 2^126, where the true value is below 1e-36 anyway) instead of expf and an
// IEEE division (sm_90a SASS of a one-element kernel: 32 instructions against 152). Used by the
// TMA grouped GEMM's compiled SiLU epilogue (kind kSiluFast), whose h is rounded to bf16 / f16
// right after: its error (≤ 1e-5 relative for |x| < 80) is far below that rounding. Measured on
// the H200 (2026-11-30): no gain in the per-element switch of the other kernels, 0-4 % in the
// compiled epilogue, so ActParams never carries it from the host.
constexpr int kSiluFast = 1000;
inline ActParams act_params(const ActivationSpec& a) { return {int(a.kind), a.alpha, a.limit}; }

__device__ __forceinline__ float silu_fast(float x) { return __fdividef(x, 1.0f + __expf(-x)); }

// The activations with the kind known at compile time (KIND: a moex::Activation as int, or
// kSiluFast); gated_act / plain_act below pick one at run time. A kernel that applies an
// activation to many accumulators in one unrolled epilogue can dispatch once per tile and use
// these, so that the epilogue is one straight run of code instead of a switch with every formula
// inlined at every element (the TMA grouped GEMM: 19-38 k SASS instructions per kernel, and warps
// waiting for instruction fetch, docs/PERF.md).
template <int KIND>
__device__ __forceinline__ float gated_act_k(const ActParams& a, float g, float u) {
  if constexpr (KIND == int(Activation::silu)) {
    return g / (1.0f + expf(-g)) * u;
  } else if constexpr (KIND == kSiluFast) {
    return silu_fast(g) * u;
  } else if constexpr (KIND == int(Activation::gelu)) {
    return 0.5f * g * (1.0f + erff(g * 0.70710678118654752f)) * u;
  } else if constexpr (KIND == int(Activation::gelu_tanh)) {
    const float c = 0.79788456080286536f;
    return 0.5f * g * (1.0f + tanhf(c * (g + 0.044715f * g * g * g))) * u;
  } else if constexpr (KIND == int(Activation::relu)) {
    return (g > 0.0f ? g : (g == g ? 0.0f : g)) * u;
  } else {  // swiglu_clamped
    g = fminf(g, a.limit);
    u = fmaxf(fminf(u, a.limit), -a.limit);
    return (u + 1.0f) * (g / (1.0f + expf(-a.alpha * g)));
  }
}
template <int KIND>
__device__ __forceinline__ float plain_act_k(float x) {
  if constexpr (KIND == int(Activation::silu)) return x / (1.0f + expf(-x));
  else if constexpr (KIND == kSiluFast) return silu_fast(x);
  else if constexpr (KIND == int(Activation::gelu)) return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
  else if constexpr (KIND == int(Activation::gelu_tanh))
    return 0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));
  else if constexpr (KIND == int(Activation::relu)) return x > 0.0f ? x : (x == x ? 0.0f : x);
  else return x;  // swiglu_clamped needs a gate (rejected by validation)
}

__device__ __forceinline__ float gated_act(const ActParams& a, float g, float u) {
  switch (a.kind) {
    case int(Activation::silu): return gated_act_k<int(Activation::silu)>(a, g, u);
    case int(Activation::gelu): return gated_act_k<int(Activation::gelu)>(a, g, u);
    case int(Activation::gelu_tanh): return gated_act_k<int(Activation::gelu_tanh)>(a, g, u);
    case int(Activation::relu): return gated_act_k<int(Activation::relu)>(a, g, u);
    default: return gated_act_k<int(Activation::swiglu_clamped)>(a, g, u);
  }
}
__device__ __forceinline__ float plain_act(const ActParams& a, float x) {
  switch (a.kind) {
    case int(Activation::silu): return plain_act_k<int(Activation::silu)>(x);
    case int(Activation::gelu): return plain_act_k<int(Activation::gelu)>(x);
    case int(Activation::gelu_tanh): return plain_act_k<int(Activation::gelu_tanh)>(x);
    case int(Activation::relu): return plain_act_k<int(Activation::relu)>(x);
    default: return x;
  }
}

// ---- the device routing plan (routing_plan.cu) ----------------------------------------------
// Pairs p = t*K + j sorted by expert; dropped slots (index < 0 or >= E) left out. All arrays
// live in the workspace; sizes are static bounds from T, K, E so that no host decision depends
// on the routing data.
struct DevicePlan {
  int* counts;        // [E]   pairs per expert
  int* offsets;       // [E+1] expert e owns sorted rows [offsets[e], offsets[e+1])
  int* cursor;        // [E]   scatter cursors
  int* sorted_pairs;  // [S]   pair id of each sorted row (first offsets[E] valid)
  int* pair_to_row;   // [S]   sorted row of each pair, -1 when dropped
  int4* tiles;        // [max_tiles] (expert, row_begin, row_end, 0) of each M tile; expert -1 = none
  int max_tiles;      // static bound on the number of M tiles
  int tile_m;         // rows per M tile
  int* sched;         // [2]   the TMA grouped GEMM's dynamic schedule (claims, finished CTAs), zeroed here
  // Tile order: false = expert by expert; true = "paired": tiles (2p, 2p + 1) share their expert but
  // for one mixed pair per two experts with an odd tile count (routing_plan.cu). Set before build_plan.
  bool pair_aligned;
};
// Static bound on the number of M tiles of `tile_m` rows over all experts' row blocks.
inline int64_t max_m_tiles(int64_t S, int64_t E, int64_t tile_m) { return ceil_div(S, tile_m) + (S < E ? S : E); }
size_t plan_workspace_bytes(int64_t S, int64_t E, int64_t tile_m);
DevicePlan carve_plan(WorkspaceCarver& ws, int64_t S, int64_t E, int64_t tile_m);
// Builds the plan on `stream` (histogram, scan, scatter, tile table). No host synchronisation.
void build_plan(const DevicePlan& plan, const void* top_k_index, bool idx64, int64_t S, int64_t E, cudaStream_t stream);

// ---- grouped GEMM over per-expert row blocks (sm80_grouped_gemm.cu, f32_grouped_gemm.cu) -----
// C[r, n] = Σ_k A[arow(r), k] · W_e[n, k] for every sorted row r of expert e, followed by an
// epilogue. How tile columns map to weight rows ("outputs") and what the epilogue does:
enum class Epi : int {
  down = 0,          // y[r, n] = acc + bias[n]  (f32 out, [rows, N])
  up_plain = 1,      // h[r, n] = act(acc + bias[n])  (has_gate = false; act dtype out, [rows, I])
  up_interleaved = 2,// outputs 2i (gate), 2i+1 (up); h[r, i] = act(g, u)
  up_concat = 3,     // outputs i (gate), I+i (up); h[r, i] = act(g, u)
};
struct GroupedGemmArgs {
  const void* A;           // [*, Kdim] activation dtype (hidden or h)
  const int* a_gather;     // nullptr: A row = sorted row; else A row = a_gather[r] / a_div
  int a_div;
  const void* W;           // expert weights base [E, N, Kdim] (nt) or [E, Kdim, N] (transposed)
  bool w_transposed;
  int64_t w_expert_stride; // elements per expert
  const void* bias;        // [E, N] or nullptr
  int Kdim;                // reduction size
  int N;                   // weight outputs (R or H)
  int I;                   // intermediate size (gated epilogues)
  Epi epi;
  ActParams act;
  void* out;               // [rows, ldo] f32 (down) or activation dtype (up)
  int ldo;
  DevicePlan plan;
};
// bf16 / f16 on tensor cores (mma.sync m16n8k16, f32 accumulate). dtype: DType::bf16 or f16.
void launch_grouped_gemm_tc(const GroupedGemmArgs& a, DType dtype, bool vec16, cudaStream_t stream);
constexpr int kTcTileM = 128;
// Hopper (sm_90a, compute capability 9.0 exactly): the same GEMM on wgmma, for K-major weights
// with 16-byte aligned rows (sm90_bf16_grouped_gemm.cu). MOEX_CUDA_NO_WGMMA=1 turns it off.
bool wgmma_usable(const GroupedGemmArgs& a, bool vec16);
void launch_grouped_gemm_wgmma(const GroupedGemmArgs& a, DType dtype, cudaStream_t stream);
// f32 on FFMA (no TF32: SPEC §8 wants f32 rel err <= 1e-5).
void launch_grouped_gemm_f32(const GroupedGemmArgs& a, cudaStream_t stream);
constexpr int kF32TileM = 64;

// ---- batched_mm GEMVs (batched_gemv.cu) -------------------------------------------------------
struct BatchedArgs {
  const void* hidden;       // [T, H]
  const void* idx;          // [T, K]
  bool idx64;
  const void* topw;         // [T, K]
  int topw_code;            // load_any code of top_k_weights
  const void* gate_up;      // [E, R, H] or [E, H, R]
  const void* down;         // [E, H, I] or [E, I, H]
  const void* gate_up_bias; // [E, R] or nullptr
  const void* down_bias;    // [E, H] or nullptr
  bool transposed, has_gate, interleaved;
  ActParams act;
  int64_t T, K, E, H, I;
  void* h;                  // [S, I] activation dtype (workspace)
  void* out;                // [T, H]
  int up_channels = 1;      // intermediate channels per warp in the up kernel (set by launch_batched)
  // The expert-shared form (batched_shares_experts): a routing plan of kSharedRows-row tiles and
  // y [S, H] f32 (pair rows in sorted order), both carved from the workspace by the caller.
  bool share_experts = false;
  DevicePlan plan{};
  float* y = nullptr;
};
// batched_mm's expert-shared form: the pairs sorted by expert (the routing plan, tiles of
// kSharedRows rows), every block serving up to kSharedRows pairs of one expert so that each weight
// row is read once for all of them, then combine.cu's slot-order sum. Each pair's dot products are
// the per-pair kernels' to the bit (the same lanes, chunks and order). Chosen on the host from the
// shapes: where the pairs are at least as many as the experts (T·K >= E) and the weights are [E, out,
// in]; MOEX_CUDA_BATCHED_SHARED=0 / 1 forces it off / on wherever it can run (read per call).
constexpr int kSharedRows = 8;
bool batched_shares_experts(int64_t S, int64_t E, bool transposed);
void launch_batched(const BatchedArgs& a, DType dtype, bool vec16, cudaStream_t stream);

// ---- shared small kernels (combine.cu) --------------------------------------------------------
// out[t] = round(Σ_j w[t,j] · (y[pair_to_row[t*K+j]] (+ down_bias[e]))) in slot order, f32.
struct CombineArgs {
  const float* y;           // [rows, H]
  const int* pair_to_row;   // [S]
  const void* idx;          // [T, K] (only for the bias' expert)
  bool idx64;
  const void* topw;
  int topw_code;
  const void* down_bias;    // [E, H] or nullptr (eager adds the bias here; grouped in the GEMM)
  int64_t T, K, H;
  void* out;
};
// pdl: launched with programmatic dependent launch (pdl.cuh), as a link of a PDL chain.
void launch_combine(const CombineArgs& a, DType dtype, cudaStream_t stream, bool pdl = false);
// The combine of an experts call (its routing, weights and output; T, K from top_k_index):
// y [rows, H] f32 with pair p in row pair_to_row[p]; down_bias [E, H] or nullptr.
void launch_combine_call(const ExpertsCall& call, const float* y, const int* pair_to_row, int64_t H, const void* down_bias,
                         DType dtype, cudaStream_t stream);
// xs[r] = hidden[sorted_pairs[r] / K] for the valid sorted rows r < offsets[E] (eager's gather).
void launch_gather_rows(const void* hidden, const int* sorted_pairs, const int* offsets, int64_t E, int64_t rows_bound,
                        int64_t K, int64_t H, DType dtype, void* xs, cudaStream_t stream);
// h[r, i] = round(act(gu[r, .] + bias)) for the first offsets[E] rows (eager, after cuBLAS).
struct ActRowsArgs {
  const float* gu;          // [rows, R]
  const void* gate_up_bias; // [E, R] or nullptr
  const int* sorted_pairs;
  const void* idx;
  bool idx64;
  int64_t rows_bound, E, I, R;
  bool has_gate, interleaved;
  ActParams act;
  void* h;
  const int* offsets;       // [E+1] (offsets[E] = valid rows)
};
void launch_act_rows(const ActRowsArgs& a, DType dtype, cudaStream_t stream);

}  // namespace moex::cuda
