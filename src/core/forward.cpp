// core/forward.cpp — validation of an experts call and the forward entry point.
#include <omp.h>

#include <map>
#include <memory>

#include "core/check.hpp"
#include "moex/backend.hpp"

namespace moex {

namespace {

void check_matrix(const char* what, const TensorView& t, int rank, std::initializer_list<int64_t> shape, Device dev) {
  MOEX_CHECK(t.defined(), "{} is missing", what);
  MOEX_CHECK(t.rank == rank, "{} must have rank {} but has shape {}", what, rank, t.describe());
  int d = 0;
  for (int64_t want : shape) {
    MOEX_CHECK(t.shape[size_t(d)] == want, "{} has shape {} but dimension {} must be {}", what, t.describe(), d, want);
    ++d;
  }
  MOEX_CHECK(t.is_contiguous(), "{} {} must be contiguous (row-major)", what, t.describe());
  MOEX_CHECK(t.device == dev, "{} is on {} but hidden is on {}", what, to_string(t.device), to_string(dev));
  MOEX_CHECK(t.numel() == 0 || t.data != nullptr, "{} {} has a null data pointer", what, t.describe());
  size_t align = std::min<size_t>(dtype_size(t.dtype), 16);
  MOEX_CHECK(reinterpret_cast<uintptr_t>(t.data) % align == 0, "{} data pointer is misaligned for {} (needs {}-byte alignment)",
             what, dtype_name(t.dtype), align);
}

bool overlaps(const TensorView& a, const TensorView& b) {
  if (!a.defined() || !b.defined() || a.numel() == 0 || b.numel() == 0 || !(a.device == b.device)) return false;
  auto a0 = reinterpret_cast<uintptr_t>(a.data), b0 = reinterpret_cast<uintptr_t>(b.data);
  return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

Workspace& default_workspace(Device dev) {
  thread_local std::map<std::pair<int, int>, std::unique_ptr<Workspace>> per_device;
  auto& ws = per_device[{int(dev.type), dev.index}];
  if (!ws) ws = std::make_unique<Workspace>(dev);
  return *ws;
}

template <class Index>
void check_indices_strict(const Index* idx, int64_t n, int64_t K, int64_t E) {
  for (int64_t i = 0; i < n; ++i)
    MOEX_CHECK(idx[i] >= 0 && idx[i] < E, "strict mode: top_k_index[{}][{}] = {} is outside [0, {})", i / K, i % K,
               int64_t(idx[i]), E);
}

}  // namespace

void validate_call(const Experts& ex, const ExpertsCall& call) {
  const ExpertsSpec& s = ex.spec;
  MOEX_CHECK(s.num_experts >= 1, "experts: num_experts must be >= 1 (got {})", s.num_experts);
  MOEX_CHECK(s.hidden >= 1, "experts: hidden size must be >= 1 (got {})", s.hidden);
  MOEX_CHECK(s.intermediate >= 1, "experts: intermediate size must be >= 1 (got {})", s.intermediate);
  MOEX_CHECK(is_float_activation(s.dtype), "experts: activation dtype must be f32, f16 or bf16 (got {})", dtype_name(s.dtype));
  if (s.activation.kind == Activation::swiglu_clamped)
    MOEX_CHECK(s.has_gate, "experts: the clamped SwiGLU activation needs has_gate = true");
  MOEX_CHECK(!s.interleaved || s.has_gate, "experts: interleaved gate/up needs has_gate = true");

  const TensorView& x = call.hidden;
  MOEX_CHECK(x.defined() && x.rank == 2, "hidden must be [T, H] but has shape {}", x.describe());
  const Device dev = x.device;
  const int64_t T = x.shape[0], H = s.hidden, I = s.intermediate, E = s.num_experts, R = s.gate_up_rows();
  check_matrix("hidden", x, 2, {T, H}, dev);
  MOEX_CHECK(x.dtype == s.dtype, "hidden is {} but the experts' activation dtype is {}", dtype_name(x.dtype), dtype_name(s.dtype));

  const TensorView& idx = call.top_k_index;
  MOEX_CHECK(idx.defined() && idx.rank == 2, "top_k_index must be [T, K] but has shape {}", idx.describe());
  const int64_t K = idx.shape[1];
  check_matrix("top_k_index", idx, 2, {T, K}, dev);
  MOEX_CHECK(is_index(idx.dtype), "top_k_index must be i32 or i64 (got {})", dtype_name(idx.dtype));
  MOEX_CHECK(K >= 1, "top_k_index has K = 0 experts per token; K must be >= 1");
  MOEX_CHECK(K <= E, "K = {} experts per token is more than the {} experts", K, E);

  check_matrix("top_k_weights", call.top_k_weights, 2, {T, K}, dev);
  MOEX_CHECK(call.top_k_weights.dtype == DType::f32 || call.top_k_weights.dtype == s.dtype,
             "top_k_weights must be f32 or {} (got {})", dtype_name(s.dtype), dtype_name(call.top_k_weights.dtype));

  check_matrix("out", call.out, 2, {T, H}, dev);
  MOEX_CHECK(call.out.dtype == s.dtype, "out is {} but the experts' activation dtype is {}", dtype_name(call.out.dtype),
             dtype_name(s.dtype));

  const QuantSpec& q = s.quant;
  if (q.kind == QuantKind::fp4_group) {
    // FP4: e2m1 pairs packed in bytes along the input dimension, default layout only
    MOEX_CHECK(!s.transposed, "FP4 experts must use the default [E, out, in] layout (transposed FP4 is not supported)");
    check_matrix("gate_up weights (FP4 packed)", ex.gate_up, 3, {E, R, (H + 1) / 2}, dev);
    check_matrix("down weights (FP4 packed)", ex.down, 3, {E, H, (I + 1) / 2}, dev);
  } else if (s.transposed) {
    check_matrix("gate_up weights (transposed)", ex.gate_up, 3, {E, H, R}, dev);
    check_matrix("down weights (transposed)", ex.down, 3, {E, I, H}, dev);
  } else {
    check_matrix("gate_up weights", ex.gate_up, 3, {E, R, H}, dev);
    check_matrix("down weights", ex.down, 3, {E, H, I}, dev);
  }
  if (!q.quantized()) {
    MOEX_CHECK(ex.gate_up.dtype == s.dtype && ex.down.dtype == s.dtype, "expert weights are {}/{} but the activation dtype is {}",
               dtype_name(ex.gate_up.dtype), dtype_name(ex.down.dtype), dtype_name(s.dtype));
  } else {
    MOEX_CHECK(q.block_n >= 1 && q.block_k >= 1, "quantization block {}x{} must be positive", q.block_n, q.block_k);
    const DType wdt = q.kind == QuantKind::fp8_block ? DType::fp8_e4m3 : DType::u8;
    MOEX_CHECK(ex.gate_up.dtype == wdt && ex.down.dtype == wdt, "{} experts need {} weights (got {}/{})",
               q.kind == QuantKind::fp8_block ? "FP8" : "FP4", dtype_name(wdt), dtype_name(ex.gate_up.dtype), dtype_name(ex.down.dtype));
    const DType sdt = q.scale_format == ScaleFormat::ue8m0 ? DType::u8 : DType::f32;
    auto blocks = [](int64_t n, int64_t b) { return (n + b - 1) / b; };
    if (q.kind == QuantKind::fp8_block) {  // [E, ceil(out / bn), ceil(in / bk)], logical (out, in) whatever the storage
      check_matrix("gate_up_scale", ex.gate_up_scale, 3, {E, blocks(R, q.block_n), blocks(H, q.block_k)}, dev);
      check_matrix("down_scale", ex.down_scale, 3, {E, blocks(H, q.block_n), blocks(I, q.block_k)}, dev);
    } else {  // one UE8M0 scale per row and group
      MOEX_CHECK(q.scale_format == ScaleFormat::ue8m0, "FP4 experts need UE8M0 scales");
      check_matrix("gate_up_scale", ex.gate_up_scale, 3, {E, R, blocks(H, q.block_k)}, dev);
      check_matrix("down_scale", ex.down_scale, 3, {E, H, blocks(I, q.block_k)}, dev);
    }
    MOEX_CHECK((ex.gate_up_scale.dtype == sdt || (sdt == DType::u8 && ex.gate_up_scale.dtype == DType::ue8m0)) &&
                   (ex.down_scale.dtype == sdt || (sdt == DType::u8 && ex.down_scale.dtype == DType::ue8m0)),
               "weight scales must be {} for scale format {} (got {}/{})", dtype_name(sdt),
               q.scale_format == ScaleFormat::ue8m0 ? "ue8m0" : "float", dtype_name(ex.gate_up_scale.dtype), dtype_name(ex.down_scale.dtype));
  }
  if (s.has_bias) {
    check_matrix("gate_up_bias", ex.gate_up_bias, 2, {E, R}, dev);
    check_matrix("down_bias", ex.down_bias, 2, {E, H}, dev);
    MOEX_CHECK(ex.gate_up_bias.dtype == s.dtype && ex.down_bias.dtype == s.dtype, "biases must be {} (got {}/{})",
               dtype_name(s.dtype), dtype_name(ex.gate_up_bias.dtype), dtype_name(ex.down_bias.dtype));
  }
  for (const TensorView* in : {&call.hidden, &call.top_k_index, &call.top_k_weights, &ex.gate_up, &ex.down})
    MOEX_CHECK(!overlaps(call.out, *in), "out overlaps an input buffer; give the output its own memory");
}

Problem Problem::from(const Experts& ex, const ExpertsCall& call) {
  Problem p;
  p.spec = ex.spec;
  p.tokens = call.hidden.defined() ? call.hidden.shape[0] : 0;
  p.top_k = call.top_k_index.defined() && call.top_k_index.rank == 2 ? call.top_k_index.shape[1] : 1;
  p.index_dtype = call.top_k_index.dtype;
  p.weights_dtype = call.top_k_weights.dtype;
  p.device = call.hidden.device;
  return p;
}

int Problem::effective_compute_capability() const {
  if (compute_capability >= 0) return compute_capability;
  if (!device.is_cuda()) return 0;
  // Read once: a device's properties do not change while the process runs, and
  // cudaGetDeviceProperties (behind cuda_devices) is slow enough to show in a decode step's time
  // when called per forward (deepgemm's checks ask twice per call).
  static const std::vector<CudaDeviceInfo> devices = cuda_devices();
  for (const auto& d : devices)
    if (d.index == device.index) return d.compute_capability();
  return 0;
}

void experts_forward(std::string_view backend_name, const Experts& ex, const ExpertsCall& call, const RunOptions& opts) {
  auto backend = ExpertsInterface::global().get(backend_name);
  validate_call(ex, call);
  Problem p = Problem::from(ex, call);
  p.cpu_threads = opts.num_threads;
  Support s = backend->supports(p);
  if (!s.ok) detail::fail(ErrorCode::unsupported, "experts backend '{}' cannot run this problem: {}", backend_name, s.reason);
  if (p.tokens == 0) return;  // valid: empty output
  MOEX_CHECK(opts.num_threads >= 0, "num_threads must be >= 0 (got {})", opts.num_threads);
  if (opts.strict_indices) {
    MOEX_CHECK(p.device.is_cpu(), "strict_indices is checked on the CPU only; validate indices before a CUDA call");
    const int64_t n = call.top_k_index.numel();
    if (call.top_k_index.dtype == DType::i32)
      check_indices_strict(call.top_k_index.ptr<int32_t>(), n, p.top_k, ex.spec.num_experts);
    else
      check_indices_strict(call.top_k_index.ptr<int64_t>(), n, p.top_k, ex.spec.num_experts);
  }
  Workspace& ws = opts.workspace ? *opts.workspace : default_workspace(p.device);
  MOEX_CHECK(ws.device() == p.device, "the workspace is on {} but the call is on {}", to_string(ws.device()), to_string(p.device));
  ws.reserve(backend->workspace_bytes(p));
  const int threads = opts.num_threads > 0 ? opts.num_threads : omp_get_max_threads();
  backend->run(ex, call, RunContext{opts, ws, threads});
}

}  // namespace moex
