// backends/backend_impls.hpp — the per-device implementations behind the built-in backend names.
// Each built-in name (eager, batched_mm, grouped_mm) is one ExpertsBackend in the registry that
// dispatches on the device of the call to the functions declared here.
#pragma once
#include "moex/backend.hpp"

namespace moex::detail {

// ---- CPU (src/backends/cpu/) -------------------------------------------------------------
Support cpu_supports(const Problem& p, std::string_view backend);
size_t cpu_eager_workspace(const Problem& p);
size_t cpu_batched_workspace(const Problem& p);
size_t cpu_grouped_workspace(const Problem& p);
void cpu_eager(const Experts& ex, const ExpertsCall& call, const RunContext& ctx);
void cpu_batched(const Experts& ex, const ExpertsCall& call, const RunContext& ctx);
void cpu_grouped(const Experts& ex, const ExpertsCall& call, const RunContext& ctx);

// ---- CUDA (src/backends/cuda/, compiled only when MOEX_WITH_CUDA) --------------------------
// Without CUDA these are defined to report "built without CUDA" / throw.
Support cuda_supports(const Problem& p, std::string_view backend);
size_t cuda_eager_workspace(const Problem& p);
size_t cuda_batched_workspace(const Problem& p);
size_t cuda_grouped_workspace(const Problem& p);
void cuda_eager(const Experts& ex, const ExpertsCall& call, const RunContext& ctx);
void cuda_batched(const Experts& ex, const ExpertsCall& call, const RunContext& ctx);
void cuda_grouped(const Experts& ex, const ExpertsCall& call, const RunContext& ctx);
// deepgemm (backends/cuda/deepgemm.cu): the limits of this build's kernels, checked after the
// SPEC §2 requirements in builtin_backends.cpp.
Support cuda_deepgemm_supports(const Problem& p);
size_t cuda_deepgemm_workspace(const Problem& p);
void cuda_deepgemm(const Experts& ex, const ExpertsCall& call, const RunContext& ctx);
// grouped_mm's FP8 (128x128 blocks) route on Hopper: deepgemm's TMA kernels in the contiguous
// layout. Per GEMM, the exact variant (f16 codes, HGMMA; SPEC §8's 2e-3) or QGMMA (Hopper's FP8
// MMA accumulation). p.compute_capability must hold the device's (no device query here).
struct Fp8TmaKernels {
  bool up_exact = true;    // the up GEMM, whose h is quantized again: exact
  bool down_exact = true;  // the down GEMM, whose y is the output
};
bool cuda_fp8_tma_route(const Problem& p);
size_t cuda_fp8_tma_workspace(const Problem& p, Fp8TmaKernels k);
void cuda_fp8_tma_grouped(const Experts& ex, const ExpertsCall& call, const RunContext& ctx, Fp8TmaKernels k);

}  // namespace moex::detail
