// backends/cuda/cuda_backends.cu — CUDA entry points of eager / batched_mm / grouped_mm.
// This version of moex has no CUDA experts kernels yet: every entry answers why.
#include "backends/backend_impls.hpp"
#include "core/check.hpp"

namespace moex::detail {

Support cuda_supports(const Problem&, std::string_view backend) {
  return Support::no(std::string(backend) + " has no CUDA implementation in this build of moex yet; use device cpu");
}
size_t cuda_eager_workspace(const Problem&) { return 0; }
size_t cuda_batched_workspace(const Problem&) { return 0; }
size_t cuda_grouped_workspace(const Problem&) { return 0; }
void cuda_eager(const Experts&, const ExpertsCall&, const RunContext&) { fail(ErrorCode::unsupported, "no CUDA eager yet"); }
void cuda_batched(const Experts&, const ExpertsCall&, const RunContext&) { fail(ErrorCode::unsupported, "no CUDA batched_mm yet"); }
void cuda_grouped(const Experts&, const ExpertsCall&, const RunContext&) { fail(ErrorCode::unsupported, "no CUDA grouped_mm yet"); }

}  // namespace moex::detail
