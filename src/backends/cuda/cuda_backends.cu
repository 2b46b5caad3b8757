// backends/cuda/cuda_backends.cu — the CUDA implementations behind the built-in names eager,
// batched_mm and grouped_mm (SPEC §2): requirement checks, workspace sizes and the forwards.
//
//   eager       routing plan on the device, then ONE host synchronisation to learn how many
//               rows each expert got, then per hit expert two cuBLAS GEMMs (cublasGemmEx,
//               CUBLAS_COMPUTE_32F, f32 output; TF32 never used) around an activation kernel,
//               and the shared combine kernel. Not capturable in a CUDA graph (host sync).
//   batched_mm  GEMV kernels reading every pair's expert weights in place (batched_gemv.cu);
//               where the pairs are at least as many as the experts, a routing plan first so that each
//               expert's weights are read once for all its pairs (same per-pair arithmetic), and
//               combine.cu's slot-order sum. No host sync: capturable.
//   grouped_mm  device routing plan (routing_plan.cu), grouped GEMM with the gated activation in
//               its epilogue (sm90_tma_grouped_gemm.cu on Hopper: TMA + wgmma, warp-specialised,
//               persistent; else sm90_bf16_grouped_gemm.cu / sm80_grouped_gemm.cu for bf16/f16,
//               f32_grouped_gemm.cu for f32), grouped down GEMM, combine (combine.cu).
//               Grids sized by static bounds, offsets read on the device: capturable.
//
// FP8 block-scaled / FP4 experts (SPEC §6; quant_common.cuh): the tokens and h are quantized on
// the device per token and 128 channels. At small T (T <= kDecodeMaxTokens = 64; the env
// MOEX_CUDA_FP8_DECODE=0/1 turns it off / on for any T) FP8 [E, out, in] experts on sm_89+ take
// quant_decode.cu in both batched_mm and grouped_mm: each routed expert's weights read once for
// all its rows, four kernels per forward (grouped_mm on Hopper only up to 6 pairs per expert, its
// TMA kernels above: kDecodeMaxPairsPerExpert). Otherwise batched_mm runs quant_gemv.cu, grouped_mm the tensor-
// core kernel of quant_grouped_gemm.cu (its own plan, 64-row tiles), except FP8 128x128 experts on
// Hopper: deepgemm.cu's TMA kernels, the exact variant for the up GEMM and QGMMA for the down GEMM
// (see fp8_tma_mode below); eager dequantizes one
// expert at a time to f32 [N, K] and runs cuBLAS in f32 (pedantic) on the dequantized activations
// codes·scale: Σ_k (cx·sx)(cw·sw) equals the CPU's Σ_kb sx·sw·Σ cx·cw up to f32 rounding
// (~1e-6 relative), far inside the 2e-3 bar of the harness's quantized cases.
//
// Workspace (all sized from T, K, E, H, I before the call; nothing is allocated in a forward):
//   batched_mm  h [S, I] activation dtype (+ expert-shared form: plan of 8-row tiles + y [S, H] f32)
//               (+ quantized: xq [T, H] u8 + xs [T, H/128] f32 + hq [S, I] u8 + hs [S, I/128] f32)
//   grouped_mm  plan (~8·S + 16·(S/128 + E) bytes) + h [S, I] act dtype + y [S, H] f32
//               (+ quantized: the batched_mm codes and scales)
//   FP8 decode  (either backend, at most) xq, xs, h, hq, hs as above + y [S, H] f32 + a plan of
//               ~S + 2·min(S, E) ints and counters (quant_decode_workspace)
//   eager       plan + xs [S, H] act + gu [S, R] f32 + h [S, I] act + y [S, H] f32
//               (+ quantized: the codes and scales of S rows, their values xf [S, H] and
//                hf [S, I] f32, one dequantized expert max(R·H, H·I) f32)
#include <cublas_v2.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>
#include <mutex>
#include <vector>

#include "backends/backend_impls.hpp"
#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/quant_common.cuh"
#include "backends/cuda/sm90_tma_grouped_gemm.cuh"

namespace moex::detail {

using namespace moex::cuda;

namespace {


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

int64_t pairs_of(const Problem& p) { return p.tokens * p.top_k; }
// Rows per M tile of grouped_mm's GEMM (the routing plan's tile table is built for it).
int64_t tile_m_of(const ExpertsSpec& s) {
  if (s.quant.quantized()) return kQuantTileM;
  return s.dtype == DType::f32 ? kF32TileM : kTcTileM;
}

cudaStream_t stream_of(const RunContext& ctx) { return static_cast<cudaStream_t>(ctx.options.stream); }

// The weights' rows can be read with 16-byte loads (H, I multiples of 16 bytes, 16-byte bases).
bool vec16_ok(const Experts& ex, const ExpertsCall& call) {
  const int64_t v = 16 / int64_t(dtype_size(ex.spec.dtype));
  return ex.spec.hidden % v == 0 && ex.spec.intermediate % v == 0 && aligned16(call.hidden.data) &&
         aligned16(ex.gate_up.data) && aligned16(ex.down.data);
}

const void* bias_ptr(const Experts& ex, const TensorView& b) { return ex.spec.has_bias ? b.data : nullptr; }

// ---- quantized experts --------------------------------------------------------------------
int64_t groups_of(int64_t width) { return ceil_div(width, kQuantGroup); }

// One projection's codes and scales: w [E, N, K] e4m3 (or [E, K, N]) / [E, N, ceil(K/2)] FP4;
// per-expert strides from the tensors themselves.
QuantWeights quant_weights(const ExpertsSpec& s, const TensorView& w, const TensorView& scales, int64_t N, int64_t K) {
  QuantWeights q{};
  q.data = static_cast<const uint8_t*>(w.data);
  q.scales = scales.data;
  q.data_stride = w.strides[0] * int64_t(dtype_size(w.dtype));
  q.scale_stride = scales.strides[0];
  q.fp4 = s.quant.kind == QuantKind::fp4_group;
  q.ue8m0 = q.fp4 || s.quant.scale_format == ScaleFormat::ue8m0;
  q.transposed = s.transposed;
  q.block_n = s.quant.block_n;
  q.group = s.quant.block_k;
  q.N = N;
  q.K = K;
  return q;
}
QuantWeights up_weights(const Experts& ex) {
  return quant_weights(ex.spec, ex.gate_up, ex.gate_up_scale, ex.spec.gate_up_rows(), ex.spec.hidden);
}
QuantWeights down_weights(const Experts& ex) {
  return quant_weights(ex.spec, ex.down, ex.down_scale, ex.spec.hidden, ex.spec.intermediate);
}

// The codes and scales of `rows` quantized x rows and S quantized h rows.
struct QuantActs {
  uint8_t* xq;
  float* xs;
  uint8_t* hq;
  float* hs;
  static size_t bytes(int64_t x_rows, int64_t S, int64_t H, int64_t I) {
    return bytes_of(x_rows * H, 1) + bytes_of(x_rows * groups_of(H), 4) + bytes_of(S * I, 1) + bytes_of(S * groups_of(I), 4);
  }
  static QuantActs take(WorkspaceCarver& ws, int64_t x_rows, int64_t S, int64_t H, int64_t I) {
    QuantActs q;
    q.xq = static_cast<uint8_t*>(ws.take_bytes(size_t(x_rows * H)));
    q.xs = ws.take<float>(size_t(x_rows * groups_of(H)));
    q.hq = static_cast<uint8_t*>(ws.take_bytes(size_t(S * I)));
    q.hs = ws.take<float>(size_t(S * groups_of(I)));
    return q;
  }
};

Epi up_epi(const ExpertsSpec& s) {
  if (!s.has_gate) return Epi::up_plain;
  return s.interleaved ? Epi::up_interleaved : Epi::up_concat;
}

// FP8 experts at small T (quant_decode.cu): true and the path's arguments filled when the shape,
// the buffers and the workspace allow it. tensor_core_alternative: the caller runs many pairs per
// expert faster on its TMA kernels (grouped_mm on Hopper; see kDecodeMaxPairsPerExpert).
bool decode_route(const Experts& ex, const ExpertsCall& call, const RunContext& ctx, QuantDecodeArgs& d,
                  bool tensor_core_alternative = false) {
  const ExpertsSpec& s = ex.spec;
  const int64_t T = call.hidden.shape[0];
  if (!quant_decode_shape_ok(s, T, call.top_k_index.shape[1], tensor_core_alternative)) return false;
  d = QuantDecodeArgs{};
  d.hidden = call.hidden.data;
  d.idx = call.top_k_index.data;
  d.idx64 = call.top_k_index.dtype == DType::i64;
  d.topw = call.top_k_weights.data;
  d.topw_code = dtype_code(call.top_k_weights.dtype);
  d.up = up_weights(ex);
  d.down = down_weights(ex);
  d.up_bias = bias_ptr(ex, ex.gate_up_bias);
  d.down_bias = bias_ptr(ex, ex.down_bias);
  d.up_epi = up_epi(s);
  d.act = act_params(s.activation);
  d.T = T;
  d.K = call.top_k_index.shape[1];
  d.E = s.num_experts;
  d.H = s.hidden;
  d.I = s.intermediate;
  d.dtype = s.dtype;
  d.ws = ctx.workspace.data();
  d.ws_bytes = ctx.workspace.capacity();
  d.out = call.out.data;
  return quant_decode_usable(d);
}

// Workspace of the decode path when a call of this problem may take it.
size_t decode_workspace(const Problem& p) {
  if (!quant_decode_shape_ok(p.spec, p.tokens, p.top_k)) return 0;  // without the alternative: the larger set
  return quant_decode_workspace(p.tokens, p.top_k, p.spec.num_experts, p.spec.hidden, p.spec.intermediate,
                                dtype_size(p.spec.dtype));
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
// (transposed = false) or W [k, n] row-major (transposed = true). The up GEMM writing gate/up in
// bf16 instead (half the bytes of eager's largest intermediate, as the reference's eager) was timed
// against f32 in one call on the H200 (2026-11-29, fifth session, two interleaved runs, mixtral /
// deepseek_v3 at T = 4096 / 16384): within ±3 % of each other, no direction — f32 stays.
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
  const QuantSpec& q = p.spec.quant;
  if (q.quantized()) {
    if (q.activation_scheme == ActivationScheme::static_)
      return Support::no(format("{} on CUDA runs FP8/FP4 experts with dynamic per-token activation scales (1x128) only; a "
                                "static activation scheme (one scale per tensor) is rejected: requantize with "
                                "activation_scheme \"dynamic\" or load with dequantize",
                                backend));
    if (q.kind == QuantKind::fp8_block && (q.block_k != kQuantGroup || q.block_n < 1))
      return Support::no(format("{} on CUDA needs FP8 weight blocks 128 wide along the input (got {}x{}), aligned with the "
                                "1x128 activation scales; load with dequantize",
                                backend, q.block_n, q.block_k));
    if (q.kind == QuantKind::fp4_group && (q.block_k < 1 || kQuantGroup % q.block_k != 0 || p.spec.transposed))
      return Support::no(format("{} on CUDA needs FP4 groups that divide 128 (got {}) and the default [E, out, in] layout; "
                                "load with dequantize",
                                backend, q.block_k));
  }
  if (!is_float_activation(p.spec.dtype))
    return Support::no(format("{} on CUDA needs f32, f16 or bf16 activations (got {})", backend, dtype_name(p.spec.dtype)));
  const int64_t S = pairs_of(p);
  const int64_t limit = int64_t(1) << 31;
  if (S >= limit - 1024 || p.spec.hidden >= limit || p.spec.gate_up_rows() >= limit)
    return Support::no(format("{} on CUDA: T*K = {} pairs or the sizes H={} I={} exceed 2^31; split the call", backend, S,
                                   p.spec.hidden, p.spec.intermediate));
  if (backend == "grouped_mm" && max_m_tiles(S, p.spec.num_experts, tile_m_of(p.spec)) > 65535)
    return Support::no(format("grouped_mm on CUDA: T*K = {} pairs need more than 65535 row tiles; split the call into "
                                   "fewer tokens",
                                   S));
  return Support::yes();
}

// ---- workspace -------------------------------------------------------------------------------

// grouped_mm with FP8 128x128 experts on Hopper above the decode path's T: deepgemm.cu's TMA kernels
// in the contiguous layout (sm90_tma_grouped_gemm.cu). By default (MOEX_CUDA_FP8_TMA unset or
// `hybrid`) the up GEMM runs the exact variant (f16 codes of both operands, HGMMA, the two-level
// accumulation in f32: the CPU's sums) and the down GEMM the QGMMA kernel: the up GEMM's h is
// quantized to e4m3 again, where QGMMA's reduced-precision accumulation moves elements across code
// boundaries (both GEMMs on QGMMA: 3.9e-3..8.7e-3 against the same-quantization reference where
// SPEC §8 asks 2e-3), while the down GEMM's error reaches y directly (hybrid: 1.9e-4 / 2.8e-4 /
// 1.7e-3 on f32 / f16 / bf16 activations, 10-18 % faster than both GEMMs exact; H200, 2026-12-01,
// docs/PERF.md, fifteenth session). `exact`: both GEMMs exact; `qgmma` (or 1): both QGMMA; `0`
// (or off): the portable mma.sync path of quant_grouped_gemm.cu (5-14x slower than bf16 at
// T = 512 / 4096, thirteenth session).
enum class Fp8TmaMode { off, exact, qgmma, hybrid };
// Read at every call (the tests switch it; a getenv per forward costs nothing next to the GEMMs).
static Fp8TmaMode fp8_tma_mode() {
  const char* e = std::getenv("MOEX_CUDA_FP8_TMA");
  if (!e || !*e) return Fp8TmaMode::hybrid;
  if (std::strcmp(e, "0") == 0 || std::strcmp(e, "off") == 0) return Fp8TmaMode::off;
  if (std::strcmp(e, "1") == 0 || std::strcmp(e, "qgmma") == 0) return Fp8TmaMode::qgmma;
  if (std::strcmp(e, "exact") == 0) return Fp8TmaMode::exact;
  return Fp8TmaMode::hybrid;
}
static Fp8TmaKernels fp8_tma_kernels() {
  const Fp8TmaMode m = fp8_tma_mode();
  Fp8TmaKernels k;
  k.up_exact = m == Fp8TmaMode::exact || m == Fp8TmaMode::hybrid;
  k.down_exact = m == Fp8TmaMode::exact;
  return k;
}
static bool fp8_on_tma(const Problem& p) {
  if (fp8_tma_mode() == Fp8TmaMode::off) return false;
  Problem q = p;
  if (q.compute_capability < 0) q.compute_capability = device_cc(p.device.index);
  return cuda_fp8_tma_route(q);
}

size_t cuda_batched_workspace(const Problem& p) {
  const int64_t S = pairs_of(p), H = p.spec.hidden, I = p.spec.intermediate;
  const bool quantized = p.spec.quant.quantized();
  const size_t quant = quantized ? QuantActs::bytes(p.tokens, S, H, I) : 0;
  // the expert-shared form: its routing plan and y [S, H] f32 after h
  const size_t shared = !quantized && batched_shares_experts(S, p.spec.num_experts, p.spec.transposed)
                            ? plan_workspace_bytes(S, p.spec.num_experts, kSharedRows) + bytes_of(S * H, 4)
                            : 0;
  return std::max(bytes_of(S * I, dtype_size(p.spec.dtype)) + quant + shared, decode_workspace(p));
}

size_t cuda_grouped_workspace(const Problem& p) {
  const int64_t S = pairs_of(p), E = p.spec.num_experts, H = p.spec.hidden, I = p.spec.intermediate;
  const size_t quant = p.spec.quant.quantized() ? QuantActs::bytes(p.tokens, S, H, I) : 0;
  const size_t own = plan_workspace_bytes(S, E, tile_m_of(p.spec)) + bytes_of(S * I, dtype_size(p.spec.dtype)) +
                     bytes_of(S * H, 4) + quant;
  // FP8 on Hopper runs deepgemm.cu's QGMMA kernel (or this file's path when the buffers' alignment
  // rules it out at run time): room for either
  const size_t with_decode = std::max(own, decode_workspace(p));
  return fp8_on_tma(p) ? std::max(with_decode, cuda_fp8_tma_workspace(p, fp8_tma_kernels())) : with_decode;
}

size_t cuda_eager_workspace(const Problem& p) {
  const int64_t S = pairs_of(p), E = p.spec.num_experts, H = p.spec.hidden, I = p.spec.intermediate;
  const int64_t R = p.spec.gate_up_rows();
  const size_t esz = dtype_size(p.spec.dtype);
  size_t quant = 0;
  if (p.spec.quant.quantized())
    quant = QuantActs::bytes(S, S, H, I) + bytes_of(S * H, 4) + bytes_of(S * I, 4) + bytes_of(std::max(R * H, H * I), 4);
  return plan_workspace_bytes(S, E, kTcTileM) + bytes_of(S * H, esz) + bytes_of(S * R, 4) + bytes_of(S * I, esz) +
         bytes_of(S * H, 4) + quant;
}

// ---- batched_mm ------------------------------------------------------------------------------

void cuda_batched(const Experts& ex, const ExpertsCall& call, const RunContext& ctx) {
  const ExpertsSpec& s = ex.spec;
  DeviceGuard guard(call.hidden.device.index);
  if (s.quant.quantized()) {
    QuantDecodeArgs d;
    if (decode_route(ex, call, ctx, d)) {  // small T: each expert's weights read once (quant_decode.cu)
      launch_quant_decode(d, stream_of(ctx));
      return;
    }
  }
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
  if (s.quant.quantized()) {
    QuantBatchedArgs q{};
    q.b = a;
    q.up = up_weights(ex);
    q.down = down_weights(ex);
    const QuantActs acts = QuantActs::take(ws, T, S, s.hidden, s.intermediate);
    q.xq = acts.xq;
    q.xs = acts.xs;
    q.hq = acts.hq;
    q.hs = acts.hs;
    launch_quant_batched(q, s.dtype, stream_of(ctx));
    return;
  }
  // Each expert's weights read once for all its pairs where the pairs are many (cuda_common.cuh)
  if (batched_shares_experts(S, s.num_experts, s.transposed)) {
    a.share_experts = true;
    a.plan = carve_plan(ws, S, s.num_experts, kSharedRows);
    a.y = ws.take<float>(size_t(S * s.hidden));
  }
  launch_batched(a, s.dtype, vec16_ok(ex, call), stream_of(ctx));
}

// ---- grouped_mm ------------------------------------------------------------------------------


void cuda_grouped(const Experts& ex, const ExpertsCall& call, const RunContext& ctx) {
  const ExpertsSpec& s = ex.spec;
  // FP8 on the TMA kernels (Hopper): a Problem and deepgemm's support test, so asked only where it
  // decides something — not on the decode path's usual calls (few pairs per expert)
  auto fp8_tma = [&] {
    return s.quant.quantized() && aligned16(ex.gate_up.data) && aligned16(ex.down.data) && fp8_on_tma(Problem::from(ex, call));
  };
  const bool many_pairs = decode_many_pairs(call.hidden.shape[0], call.top_k_index.shape[1], s.num_experts);
  const bool tma_for_many = many_pairs && fp8_tma();
  if (s.quant.quantized()) {
    QuantDecodeArgs d;
    DeviceGuard guard(call.hidden.device.index);
    if (decode_route(ex, call, ctx, d, tma_for_many)) {  // small T: four kernels, no separate plan (quant_decode.cu)
      launch_quant_decode(d, stream_of(ctx));
      return;
    }
  }
  if (many_pairs ? tma_for_many : fp8_tma()) {
    cuda_fp8_tma_grouped(ex, call, ctx, fp8_tma_kernels());  // TMA kernels, contiguous layout (deepgemm.cu)
    return;
  }
  DeviceGuard guard(call.hidden.device.index);
  cudaStream_t stream = stream_of(ctx);
  const int64_t T = call.hidden.shape[0], K = call.top_k_index.shape[1], S = T * K;
  const int64_t E = s.num_experts, H = s.hidden, I = s.intermediate, R = s.gate_up_rows();
  const size_t esz = dtype_size(s.dtype);
  WorkspaceCarver ws(ctx.workspace.data(), ctx.workspace.capacity());
  DevicePlan plan = carve_plan(ws, S, E, tile_m_of(s));
  // The paired tile order (routing_plan.cu), so that the 2-CTA cluster GEMMs share every weight
  // tile they can; MOEX_CUDA_PLAN_PAIRED=0: expert by expert (A/B runs)
  static const bool paired_order = [] {
    const char* e = std::getenv("MOEX_CUDA_PLAN_PAIRED");
    return !(e && *e == '0');
  }();
  plan.pair_aligned = paired_order;
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

  if (s.quant.quantized()) {
    // tokens quantized once ([T, H], gathered by the GEMM through the plan), h after the up GEMM
    const QuantActs acts = QuantActs::take(ws, T, S, H, I);
    launch_quantize_activations(call.hidden.data, s.dtype, T, H, nullptr, acts.xq, acts.xs, nullptr, stream);
    QuantGemmArgs qup{up, up_weights(ex), acts.xq, acts.xs};
    launch_quant_grouped_gemm(qup, s.dtype, stream);
    launch_quantize_activations(h, s.dtype, S, I, plan.offsets + E, acts.hq, acts.hs, nullptr, stream);
    QuantGemmArgs qdown{down, down_weights(ex), acts.hq, acts.hs};
    launch_quant_grouped_gemm(qdown, s.dtype, stream);
  } else if (s.dtype == DType::f32) {
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

  launch_combine_call(call, y, plan.pair_to_row, H, nullptr, s.dtype, stream);  // bias added in the down GEMM
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
  // quantized experts: codes/scales, the dequantized operands xf [S, H] / hf [S, I] and one
  // dequantized expert matrix [N, K] (f32)
  const bool quant = s.quant.quantized();
  QuantActs acts{};
  float *xf = nullptr, *hf = nullptr, *wf = nullptr;
  if (quant) {
    acts = QuantActs::take(ws, S, S, H, I);
    xf = ws.take<float>(size_t(S * H));
    hf = ws.take<float>(size_t(S * I));
    wf = ws.take<float>(size_t(std::max(R * H, H * I)));
  }

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
    cublas_check(cublasSetMathMode(handle, s.dtype == DType::f32 || quant ? CUBLAS_PEDANTIC_MATH : CUBLAS_DEFAULT_MATH),
                 "cublasSetMathMode");
    const char* gw = static_cast<const char*>(ex.gate_up.data);
    const char* dw = static_cast<const char*>(ex.down.data);
    if (quant) launch_quantize_activations(xs, s.dtype, rows, H, nullptr, acts.xq, acts.xs, xf, stream);
    const QuantWeights up_q = quant ? up_weights(ex) : QuantWeights{}, down_q = quant ? down_weights(ex) : QuantWeights{};
    for (int64_t e = 0; e < E; ++e) {
      const int64_t off = offsets[size_t(e)], m = offsets[size_t(e + 1)] - off;
      if (m == 0) continue;
      if (quant) {  // stream order keeps wf alive until this GEMM has read it
        launch_dequantize_expert(up_q, e, wf, stream);
        gemm_rows(handle, DType::f32, false, m, R, H, xf + off * H, wf, gu + off * R);
      } else {
        gemm_rows(handle, s.dtype, s.transposed, m, R, H, xs + size_t(off * H) * esz, gw + size_t(e * R * H) * esz, gu + off * R);
      }
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
    if (quant) launch_quantize_activations(h, s.dtype, rows, I, nullptr, acts.hq, acts.hs, hf, stream);
    for (int64_t e = 0; e < E; ++e) {
      const int64_t off = offsets[size_t(e)], m = offsets[size_t(e + 1)] - off;
      if (m == 0) continue;
      if (quant) {
        launch_dequantize_expert(down_q, e, wf, stream);
        gemm_rows(handle, DType::f32, false, m, H, I, hf + off * I, wf, y + off * H);
      } else {
        gemm_rows(handle, s.dtype, s.transposed, m, H, I, h + size_t(off * I) * esz, dw + size_t(e * H * I) * esz, y + off * H);
      }
    }
  }

  launch_combine_call(call, y, plan.pair_to_row, H, bias_ptr(ex, ex.down_bias), s.dtype, stream);
}

}  // namespace moex::detail
