// backends/cuda/cuda_backends.cu — the CUDA implementations behind the built-in names eager,
// batched_mm and grouped_mm (SPEC §2): requirement checks, workspace sizes and the forwards.
//
//   eager       routing plan on the device, then ONE host synchronisation to learn how many
//               rows each expert got, then per hit expert two cuBLAS GEMMs (cublasGemmEx,
//               CUBLAS_COMPUTE_32F, f32 output; TF32 never used) around an activation kernel,
//               and the shared combine kernel. Not capturable in a CUDA graph (host sync).
//   batched_mm  GEMV kernels reading every pair's expert weights in place (batched_gemv.cu).
//               No plan, no host sync: capturable.
//   grouped_mm  device routing plan (routing_plan.cu), grouped GEMM with the gated activation in
//               its epilogue (sm90_tma_grouped_gemm.cu on Hopper: TMA + wgmma, warp-specialised,
//               persistent; else sm90_bf16_grouped_gemm.cu / sm80_grouped_gemm.cu for bf16/f16,
//               f32_grouped_gemm.cu for f32), grouped down GEMM, combine (combine.cu).
//               Grids sized by static bounds, offsets read on the device: capturable.
//
// Workspace (all sized from T, K, E, H, I before the call; nothing is allocated in a forward):
//   batched_mm  h [S, I] activation dtype
//   grouped_mm  plan (~8·S + 16·(S/128 + E) bytes) + h [S, I] act dtype + y [S, H] f32
//   eager       plan + xs [S, H] act + gu [S, R] f32 + h [S, I] act + y [S, H] f32
#include <cublas_v2.h>

#include <map>
#include <sstream>
#include <mutex>
#include <vector>

#include "backends/backend_impls.hpp"
#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/sm90_tma_grouped_gemm.cuh"

namespace moex::detail {

using namespace moex::cuda;

namespace {

// nvcc cannot compile fmt in C++20 mode (core/check.hpp): the same "{}" formatter as fail().
template <class... Args>
std::string format(std::string_view f, const Args&... args) {
  std::ostringstream os;
  format_into(os, f, args...);
  return os.str();
}

std::string cc_str(int cc) { return format("{}.{}", cc / 10, cc % 10); }

// Compute capability of a CUDA device (0 when it is not usable), cached per device.
int device_cc(int index) {
  static std::mutex mu;
  static std::map<int, int> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(index);
  if (it != cache.end()) return it->second;
  int n = 0, cc = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    n = 0;
  }
  if (index >= 0 && index < n) {
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, index) == cudaSuccess &&
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, index) == cudaSuccess)
      cc = major * 10 + minor;
    else
      cudaGetLastError();
  }
  cache[index] = cc;
  return cc;
}

size_t bytes_of(int64_t n, size_t esz) { return WorkspaceCarver::round_up(size_t(n) * esz); }
int64_t pairs_of(const Problem& p) { return p.tokens * p.top_k; }
int64_t tile_m_of(DType dt) { return dt == DType::f32 ? kF32TileM : kTcTileM; }

cudaStream_t stream_of(const RunContext& ctx) { return static_cast<cudaStream_t>(ctx.options.stream); }

// The weights' rows can be read with 16-byte loads (H, I multiples of 16 bytes, 16-byte bases).
bool vec16_ok(const Experts& ex, const ExpertsCall& call) {
  const int64_t v = 16 / int64_t(dtype_size(ex.spec.dtype));
  return ex.spec.hidden % v == 0 && ex.spec.intermediate % v == 0 && aligned16(call.hidden.data) &&
         aligned16(ex.gate_up.data) && aligned16(ex.down.data);
}

const void* bias_ptr(const Experts& ex, const TensorView& b) { return ex.spec.has_bias ? b.data : nullptr; }

Epi up_epi(const ExpertsSpec& s) {
  if (!s.has_gate) return Epi::up_plain;
  return s.interleaved ? Epi::up_interleaved : Epi::up_concat;
}

// ---- cuBLAS (eager) ------------------------------------------------------------------------
// One handle per (thread, device), created on first use and kept for the life of the process
// (destroying handles at exit can run after the CUDA context is gone).
cublasHandle_t cublas_handle(int device) {
  thread_local std::map<int, cublasHandle_t> handles;
  auto it = handles.find(device);
  if (it != handles.end()) return it->second;
  cublasHandle_t h = nullptr;
  cublasStatus_t st = cublasCreate(&h);
  if (st != CUBLAS_STATUS_SUCCESS) {
    if (st == CUBLAS_STATUS_ALLOC_FAILED)
      fail(ErrorCode::out_of_memory, "out of GPU memory creating a cuBLAS handle on cuda:{}", device);
    fail(ErrorCode::internal, "cublasCreate failed on cuda:{}: {}", device, cublasGetStatusString(st));
  }
  handles[device] = h;
  return h;
}

void cublas_check(cublasStatus_t st, const char* what) {
  if (st == CUBLAS_STATUS_SUCCESS) return;
  if (st == CUBLAS_STATUS_ALLOC_FAILED) fail(ErrorCode::out_of_memory, "out of GPU memory in {}", what);
  fail(ErrorCode::internal, "cuBLAS error in {}: {}", what, cublasGetStatusString(st));
}

cudaDataType cuda_type(DType dt) {
  return dt == DType::f32 ? CUDA_R_32F : dt == DType::f16 ? CUDA_R_16F : CUDA_R_16BF;
}

// C[m, n] (row-major, f32, ldc) = A[m, k] (row-major, act dtype) · Wᵀ with W [n, k] row-major
// (transposed = false) or W [k, n] row-major (transposed = true).
void gemm_rows(cublasHandle_t h, DType dt, bool transposed, int64_t m, int64_t n, int64_t k, const void* A, const void* W,
               float* C) {
  const float alpha = 1.0f, beta = 0.0f;
  // column-major view: Cᵀ [n, m] = op(W) [n, k] · Aᵀ [k, m]
  cublas_check(cublasGemmEx(h, transposed ? CUBLAS_OP_N : CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(m), int(k), &alpha, W,
                            cuda_type(dt), transposed ? int(n) : int(k), A, cuda_type(dt), int(k), &beta, C, CUDA_R_32F,
                            int(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx (eager)");
}

}  // namespace

// ---- requirements ----------------------------------------------------------------------------

Support cuda_supports(const Problem& p, std::string_view backend) {
  if (!p.device.is_cuda())
    return Support::no(format("{} on CUDA needs the call's tensors on a CUDA device (got {})", backend, to_string(p.device)));
  const int cc = p.compute_capability >= 0 ? p.compute_capability : device_cc(p.device.index);
  if (cc == 0) {
    std::string why = cuda_unavailable_reason();
    if (why.empty()) why = format("{} does not exist", to_string(p.device));
    return Support::no(format("{} on {}: {}; use device cpu", backend, to_string(p.device), why));
  }
  if (cc < 80)
    return Support::no(format("{} on CUDA needs compute capability >= 8.0 (tensor-core mma.sync, cp.async) but {} has {}; "
                                   "use device cpu",
                                   backend, to_string(p.device), cc_str(cc)));
  if (p.spec.quant.quantized())
    return Support::no(format("{} on CUDA: FP8/FP4 experts are not yet on CUDA in this build of moex; dequantize at load "
                                   "(bf16 experts run here)",
                                   backend));
  if (!is_float_activation(p.spec.dtype))
    return Support::no(format("{} on CUDA needs f32, f16 or bf16 activations (got {})", backend, dtype_name(p.spec.dtype)));
  const int64_t S = pairs_of(p);
  const int64_t limit = int64_t(1) << 31;
  if (S >= limit - 1024 || p.spec.hidden >= limit || p.spec.gate_up_rows() >= limit)
    return Support::no(format("{} on CUDA: T*K = {} pairs or the sizes H={} I={} exceed 2^31; split the call", backend, S,
                                   p.spec.hidden, p.spec.intermediate));
  if (backend == "grouped_mm" && max_m_tiles(S, p.spec.num_experts, tile_m_of(p.spec.dtype)) > 65535)
    return Support::no(format("grouped_mm on CUDA: T*K = {} pairs need more than 65535 row tiles; split the call into "
                                   "fewer tokens",
                                   S));
  return Support::yes();
}

// ---- workspace -------------------------------------------------------------------------------

size_t cuda_batched_workspace(const Problem& p) {
  return bytes_of(pairs_of(p) * p.spec.intermediate, dtype_size(p.spec.dtype));
}

size_t cuda_grouped_workspace(const Problem& p) {
  const int64_t S = pairs_of(p), E = p.spec.num_experts, H = p.spec.hidden, I = p.spec.intermediate;
  return plan_workspace_bytes(S, E, tile_m_of(p.spec.dtype)) + bytes_of(S * I, dtype_size(p.spec.dtype)) + bytes_of(S * H, 4);
}

size_t cuda_eager_workspace(const Problem& p) {
  const int64_t S = pairs_of(p), E = p.spec.num_experts, H = p.spec.hidden, I = p.spec.intermediate;
  const int64_t R = p.spec.gate_up_rows();
  const size_t esz = dtype_size(p.spec.dtype);
  return plan_workspace_bytes(S, E, kTcTileM) + bytes_of(S * H, esz) + bytes_of(S * R, 4) + bytes_of(S * I, esz) +
         bytes_of(S * H, 4);
}

// ---- batched_mm ------------------------------------------------------------------------------

void cuda_batched(const Experts& ex, const ExpertsCall& call, const RunContext& ctx) {
  const ExpertsSpec& s = ex.spec;
  DeviceGuard guard(call.hidden.device.index);
  const int64_t T = call.hidden.shape[0], K = call.top_k_index.shape[1], S = T * K;
  WorkspaceCarver ws(ctx.workspace.data(), ctx.workspace.capacity());
  BatchedArgs a{};
  a.hidden = call.hidden.data;
  a.idx = call.top_k_index.data;
  a.idx64 = call.top_k_index.dtype == DType::i64;
  a.topw = call.top_k_weights.data;
  a.topw_code = dtype_code(call.top_k_weights.dtype);
  a.gate_up = ex.gate_up.data;
  a.down = ex.down.data;
  a.gate_up_bias = bias_ptr(ex, ex.gate_up_bias);
  a.down_bias = bias_ptr(ex, ex.down_bias);
  a.transposed = s.transposed;
  a.has_gate = s.has_gate;
  a.interleaved = s.interleaved;
  a.act = act_params(s.activation);
  a.T = T;
  a.K = K;
  a.E = s.num_experts;
  a.H = s.hidden;
  a.I = s.intermediate;
  a.h = ws.take_bytes(size_t(S * s.intermediate) * dtype_size(s.dtype));
  a.out = call.out.data;
  launch_batched(a, s.dtype, vec16_ok(ex, call), stream_of(ctx));
}

// ---- grouped_mm ------------------------------------------------------------------------------

void cuda_grouped(const Experts& ex, const ExpertsCall& call, const RunContext& ctx) {
  const ExpertsSpec& s = ex.spec;
  DeviceGuard guard(call.hidden.device.index);
  cudaStream_t stream = stream_of(ctx);
  const int64_t T = call.hidden.shape[0], K = call.top_k_index.shape[1], S = T * K;
  const int64_t E = s.num_experts, H = s.hidden, I = s.intermediate, R = s.gate_up_rows();
  const size_t esz = dtype_size(s.dtype);
  WorkspaceCarver ws(ctx.workspace.data(), ctx.workspace.capacity());
  const DevicePlan plan = carve_plan(ws, S, E, tile_m_of(s.dtype));
  void* h = ws.take_bytes(size_t(S * I) * esz);
  float* y = ws.take<float>(size_t(S * H));
  const bool idx64 = call.top_k_index.dtype == DType::i64;

  build_plan(plan, call.top_k_index.data, idx64, S, E, stream);

  GroupedGemmArgs up{};
  up.A = call.hidden.data;
  up.a_gather = plan.sorted_pairs;
  up.a_div = int(K);
  up.W = ex.gate_up.data;
  up.w_transposed = s.transposed;
  up.w_expert_stride = R * H;
  up.bias = bias_ptr(ex, ex.gate_up_bias);
  up.Kdim = int(H);
  up.N = int(R);
  up.I = int(I);
  up.epi = up_epi(s);
  up.act = act_params(s.activation);
  up.out = h;
  up.ldo = int(I);
  up.plan = plan;

  GroupedGemmArgs down = up;
  down.A = h;
  down.a_gather = nullptr;
  down.a_div = 1;
  down.W = ex.down.data;
  down.w_expert_stride = H * I;
  down.bias = bias_ptr(ex, ex.down_bias);
  down.Kdim = int(I);
  down.N = int(H);
  down.epi = Epi::down;
  down.out = y;
  down.ldo = int(H);

  if (s.dtype == DType::f32) {
    launch_grouped_gemm_f32(up, stream);
    launch_grouped_gemm_f32(down, stream);
  } else {
    const bool vec = vec16_ok(ex, call);
    for (const GroupedGemmArgs* g : {&up, &down}) {
      // sm_90a: the warp-specialised TMA kernel first (MOEX_CUDA_NO_TMA=1 turns it off), then
      // the cp.async wgmma kernel, then mma.sync.
      if (tma_usable(*g, vec)) launch_grouped_gemm_tma(*g, s.dtype, S, E, stream);
      else if (wgmma_usable(*g, vec)) launch_grouped_gemm_wgmma(*g, s.dtype, stream);
      else launch_grouped_gemm_tc(*g, s.dtype, vec, stream);
    }
  }

  CombineArgs c{};
  c.y = y;
  c.pair_to_row = plan.pair_to_row;
  c.idx = call.top_k_index.data;
  c.idx64 = idx64;
  c.topw = call.top_k_weights.data;
  c.topw_code = dtype_code(call.top_k_weights.dtype);
  c.down_bias = nullptr;  // added in the down GEMM's epilogue
  c.T = T;
  c.K = K;
  c.H = H;
  c.out = call.out.data;
  launch_combine(c, s.dtype, stream);
}

// ---- eager -----------------------------------------------------------------------------------

void cuda_eager(const Experts& ex, const ExpertsCall& call, const RunContext& ctx) {
  const ExpertsSpec& s = ex.spec;
  const int device = call.hidden.device.index;
  DeviceGuard guard(device);
  cudaStream_t stream = stream_of(ctx);
  const int64_t T = call.hidden.shape[0], K = call.top_k_index.shape[1], S = T * K;
  const int64_t E = s.num_experts, H = s.hidden, I = s.intermediate, R = s.gate_up_rows();
  const size_t esz = dtype_size(s.dtype);
  WorkspaceCarver ws(ctx.workspace.data(), ctx.workspace.capacity());
  const DevicePlan plan = carve_plan(ws, S, E, kTcTileM);
  char* xs = static_cast<char*>(ws.take_bytes(size_t(S * H) * esz));
  float* gu = ws.take<float>(size_t(S * R));
  char* h = static_cast<char*>(ws.take_bytes(size_t(S * I) * esz));
  float* y = ws.take<float>(size_t(S * H));
  const bool idx64 = call.top_k_index.dtype == DType::i64;

  build_plan(plan, call.top_k_index.data, idx64, S, E, stream);
  // The data-dependent part: learn on the host which experts received tokens.
  std::vector<int> offsets(size_t(E + 1));
  check(cudaMemcpyAsync(offsets.data(), plan.offsets, offsets.size() * sizeof(int), cudaMemcpyDeviceToHost, stream),
        "cudaMemcpyAsync (eager offsets)");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (eager)");
  const int64_t rows = offsets[size_t(E)];

  if (rows > 0) {
    launch_gather_rows(call.hidden.data, plan.sorted_pairs, plan.offsets, E, rows, K, H, s.dtype, xs, stream);
    cublasHandle_t handle = cublas_handle(device);
    cublas_check(cublasSetStream(handle, stream), "cublasSetStream");
    // f32: pedantic math so that nothing (TF32, reduced-precision reductions) replaces true f32.
    cublas_check(cublasSetMathMode(handle, s.dtype == DType::f32 ? CUBLAS_PEDANTIC_MATH : CUBLAS_DEFAULT_MATH),
                 "cublasSetMathMode");
    const char* gw = static_cast<const char*>(ex.gate_up.data);
    const char* dw = static_cast<const char*>(ex.down.data);
    for (int64_t e = 0; e < E; ++e) {
      const int64_t off = offsets[size_t(e)], m = offsets[size_t(e + 1)] - off;
      if (m == 0) continue;
      gemm_rows(handle, s.dtype, s.transposed, m, R, H, xs + size_t(off * H) * esz, gw + size_t(e * R * H) * esz, gu + off * R);
    }
    ActRowsArgs ar{};
    ar.gu = gu;
    ar.gate_up_bias = bias_ptr(ex, ex.gate_up_bias);
    ar.sorted_pairs = plan.sorted_pairs;
    ar.idx = call.top_k_index.data;
    ar.idx64 = idx64;
    ar.rows_bound = rows;
    ar.E = E;
    ar.I = I;
    ar.R = R;
    ar.has_gate = s.has_gate;
    ar.interleaved = s.interleaved;
    ar.act = act_params(s.activation);
    ar.h = h;
    ar.offsets = plan.offsets;
    launch_act_rows(ar, s.dtype, stream);
    for (int64_t e = 0; e < E; ++e) {
      const int64_t off = offsets[size_t(e)], m = offsets[size_t(e + 1)] - off;
      if (m == 0) continue;
      gemm_rows(handle, s.dtype, s.transposed, m, H, I, h + size_t(off * I) * esz, dw + size_t(e * H * I) * esz, y + off * H);
    }
  }

  CombineArgs c{};
  c.y = y;
  c.pair_to_row = plan.pair_to_row;
  c.idx = call.top_k_index.data;
  c.idx64 = idx64;
  c.topw = call.top_k_weights.data;
  c.topw_code = dtype_code(call.top_k_weights.dtype);
  c.down_bias = bias_ptr(ex, ex.down_bias);
  c.T = T;
  c.K = K;
  c.H = H;
  c.out = call.out.data;
  launch_combine(c, s.dtype, stream);
}

}  // namespace moex::detail
