// backends/builtin_backends.cpp — the six built-in backend names and their requirement checks.
// eager / batched_mm / grouped_mm dispatch on the call's device to the CPU or CUDA implementation;
// deepgemm, deepgemm_megamoe and sonicmoe state their real requirements.
#include <fmt/format.h>

#include "backends/backend_impls.hpp"
#include "core/check.hpp"
#include "moex/backend.hpp"

namespace moex::detail {

namespace {

std::string cc_string(int cc) { return fmt::format("{}.{}", cc / 10, cc % 10); }

using SupportFn = Support (*)(const Problem&, std::string_view);
using WorkspaceSizeFn = size_t (*)(const Problem&);
using RunImpl = void (*)(const Experts&, const ExpertsCall&, const RunContext&);

// A backend with a CPU and a CUDA implementation.
class DeviceDispatchBackend final : public ExpertsBackend {
 public:
  struct Impl {
    WorkspaceSizeFn workspace;
    RunImpl run;
  };
  DeviceDispatchBackend(std::string name, std::string summary, bool capturable, Impl cpu, Impl cuda)
      : name_(std::move(name)), summary_(std::move(summary)), capturable_(capturable), cpu_(cpu), cuda_(cuda) {}
  std::string name() const override { return name_; }
  std::string summary() const override { return summary_; }
  bool graph_capturable() const override { return capturable_; }
  Support supports(const Problem& p) const override {
    return p.device.is_cpu() ? cpu_supports(p, name_) : cuda_supports(p, name_);
  }
  size_t workspace_bytes(const Problem& p) const override {
    return p.device.is_cpu() ? cpu_.workspace(p) : cuda_.workspace(p);
  }
  void run(const Experts& ex, const ExpertsCall& call, const RunContext& ctx) const override {
    (call.hidden.device.is_cpu() ? cpu_.run : cuda_.run)(ex, call, ctx);
  }

 private:
  std::string name_, summary_;
  bool capturable_;
  Impl cpu_, cuda_;
};

// Common requirements of the Hopper-class CUDA backends.
Support needs_cuda(const Problem& p, std::string_view name, int min_cc) {
  if (!p.device.is_cuda())
    return Support::no(fmt::format("{} runs on CUDA devices only (compute capability >= {}); on the CPU use grouped_mm", name,
                                   cc_string(min_cc)));
  if (!built_with_cuda() && p.compute_capability < 0)
    return Support::no(fmt::format("{} needs a build of moex with CUDA (this one has none); use grouped_mm on the CPU", name));
  const int cc = p.effective_compute_capability();
  if (cc < min_cc)
    return Support::no(fmt::format("{} needs compute capability >= {} but {} has {}; use grouped_mm", name, cc_string(min_cc),
                                   to_string(p.device), cc ? cc_string(cc) : std::string("no usable device")));
  return Support::yes();
}

// deepgemm: Hopper+ TMA/wgmma grouped GEMM, bf16 or FP8 block-quantized experts (SPEC §2); the
// kernels and layouts are in backends/cuda/deepgemm.cu.
class DeepGemmBackend final : public ExpertsBackend {
 public:
  std::string name() const override { return "deepgemm"; }
  std::string summary() const override { return "TMA-aligned contiguous / masked grouped GEMM on Hopper+ (bf16, FP8)"; }
  bool graph_capturable() const override { return true; }
  Support supports(const Problem& p) const override {
    if (auto s = needs_cuda(p, "deepgemm", 90); !s) return s;
    const int cc = p.effective_compute_capability();
    const QuantSpec& q = p.spec.quant;
    if (q.kind == QuantKind::fp4_group && cc < 100)
      return Support::no(fmt::format("deepgemm runs FP4 experts only on compute capability >= 10.0 ({} has {}); "
                                     "quantize the experts to FP8 (128x128 blocks) or use grouped_mm",
                                     to_string(p.device), cc_string(cc)));
    if (q.quantized() && q.activation_scheme == ActivationScheme::static_)
      return Support::no("deepgemm needs dynamic per-token activation scales (activation_scheme \"dynamic\"); "
                         "a static activation scheme is rejected; use grouped_mm");
    if (q.kind == QuantKind::fp8_block && !((q.block_n == 128 && q.block_k == 128) || (q.block_n == 1 && q.block_k == 128)))
      return Support::no(fmt::format("deepgemm needs 128x128 (or 1x128) FP8 weight blocks, got {}x{}; use grouped_mm", q.block_n,
                                     q.block_k));
    if (q.quantized() && cc >= 100 && q.scale_format == ScaleFormat::f32)
      return Support::no("deepgemm on compute capability >= 10.0 needs UE8M0 (power-of-two) weight scales, not float32; "
                         "requantize with scale_fmt ue8m0 or use grouped_mm / batched_mm");
    if (!q.quantized() && p.spec.dtype != DType::bf16)
      return Support::no(fmt::format("deepgemm needs bf16 or FP8 block-quantized experts (got {}); use grouped_mm",
                                     dtype_name(p.spec.dtype)));
    return cuda_deepgemm_supports(p);  // the kernels' own limits (sm_90a build, layout, alignment)
  }
  size_t workspace_bytes(const Problem& p) const override { return cuda_deepgemm_workspace(p); }
  void run(const Experts& ex, const ExpertsCall& call, const RunContext& ctx) const override { cuda_deepgemm(ex, call, ctx); }
};

// deepgemm_megamoe: fused EP dispatch + gated MLP + EP combine (Blackwell, FP4, expert parallel).
class MegaMoeBackend final : public ExpertsBackend {
 public:
  std::string name() const override { return "deepgemm_megamoe"; }
  std::string summary() const override { return "fused expert-parallel dispatch + MLP + combine (Blackwell, FP4)"; }
  Support supports(const Problem& p) const override {
    if (auto s = needs_cuda(p, "deepgemm_megamoe", 100); !s) return s;
    const QuantSpec& q = p.spec.quant;
    if (q.kind != QuantKind::fp4_group || q.scale_format != ScaleFormat::ue8m0)
      return Support::no("deepgemm_megamoe needs FP4-packed experts with UE8M0 scales; use deepgemm or grouped_mm");
    return Support::no("deepgemm_megamoe needs an expert-parallel process group, which moex does not provide; "
                       "use deepgemm or grouped_mm");
  }
  void run(const Experts&, const ExpertsCall&, const RunContext&) const override {
    fail(ErrorCode::unsupported, "deepgemm_megamoe is not available in this build of moex; use deepgemm or grouped_mm");
  }
};

// sonicmoe: fused gather-GEMM / activation epilogue / scatter-sum epilogue, bf16 gated experts.
class SonicMoeBackend final : public ExpertsBackend {
 public:
  std::string name() const override { return "sonicmoe"; }
  std::string summary() const override { return "fused routed forward, gather and scatter inside the GEMMs (Hopper+, bf16)"; }
  bool graph_capturable() const override { return true; }
  Support supports(const Problem& p) const override {
    if (auto s = needs_cuda(p, "sonicmoe", 90); !s) return s;
    if (p.spec.quant.quantized() || p.spec.dtype != DType::bf16)
      return Support::no(fmt::format("sonicmoe runs bf16 experts only (got {}{}); use grouped_mm", dtype_name(p.spec.dtype),
                                     p.spec.quant.quantized() ? ", quantized" : ""));
    const Activation a = p.spec.activation.kind;
    if (!p.spec.has_gate || !(a == Activation::silu || a == Activation::gelu || a == Activation::relu))
      return Support::no("sonicmoe needs a gated activation (silu, gelu or relu: SwiGLU/GeGLU/ReGLU); use grouped_mm");
    return Support::no("the sonicmoe kernels are not part of this build of moex yet; use grouped_mm");
  }
  void run(const Experts&, const ExpertsCall&, const RunContext&) const override {
    fail(ErrorCode::unsupported, "sonicmoe is not available in this build of moex; use grouped_mm");
  }
};

}  // namespace

void register_builtin_backends(ExpertsInterface& r) {
  r.register_backend(std::make_shared<DeviceDispatchBackend>(
      "eager", "reference loop over the experts that received tokens (host-side scan; not graph-capturable)", false,
      DeviceDispatchBackend::Impl{cpu_eager_workspace, cpu_eager}, DeviceDispatchBackend::Impl{cuda_eager_workspace, cuda_eager}));
  r.register_backend(std::make_shared<DeviceDispatchBackend>(
      "batched_mm", "one batched GEMM over the token-expert pairs, expert weights read in place (best for decode)", true,
      DeviceDispatchBackend::Impl{cpu_batched_workspace, cpu_batched},
      DeviceDispatchBackend::Impl{cuda_batched_workspace, cuda_batched}));
  r.register_backend(std::make_shared<DeviceDispatchBackend>(
      "grouped_mm", "pairs sorted by expert, one grouped GEMM per projection (default; best for many tokens)", true,
      DeviceDispatchBackend::Impl{cpu_grouped_workspace, cpu_grouped},
      DeviceDispatchBackend::Impl{cuda_grouped_workspace, cuda_grouped}));
  r.register_backend(std::make_shared<DeepGemmBackend>());
  r.register_backend(std::make_shared<MegaMoeBackend>());
  r.register_backend(std::make_shared<SonicMoeBackend>());
}

}  // namespace moex::detail
