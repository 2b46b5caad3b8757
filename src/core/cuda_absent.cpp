// core/cuda_absent.cpp — what the CUDA hooks do in a build without CUDA: explain, never crash.
#ifndef MOEX_WITH_CUDA
#include "backends/backend_impls.hpp"
#include "core/check.hpp"
#include "core/memory.hpp"

namespace moex {

bool built_with_cuda() { return false; }
std::vector<CudaDeviceInfo> cuda_devices() { return {}; }
std::string cuda_unavailable_reason() { return "moex was built without CUDA (no nvcc at configure time)"; }

namespace detail {
namespace {
[[noreturn]] void no_cuda() { fail(ErrorCode::unsupported, "CUDA device requested but moex was built without CUDA"); }
}  // namespace

void* cuda_alloc(int, size_t) { no_cuda(); }
void cuda_free(int, void*) noexcept {}
void cuda_copy(void*, const void*, size_t) { no_cuda(); }

Support cuda_supports(const Problem&, std::string_view backend) {
  return Support::no(std::string(backend) + " on CUDA needs a build of moex with CUDA (this one has none); use device cpu");
}
size_t cuda_eager_workspace(const Problem&) { return 0; }
size_t cuda_batched_workspace(const Problem&) { return 0; }
size_t cuda_grouped_workspace(const Problem&) { return 0; }
void cuda_eager(const Experts&, const ExpertsCall&, const RunContext&) { no_cuda(); }
void cuda_batched(const Experts&, const ExpertsCall&, const RunContext&) { no_cuda(); }
void cuda_grouped(const Experts&, const ExpertsCall&, const RunContext&) { no_cuda(); }
Support cuda_deepgemm_supports(const Problem&) {
  return Support::no("deepgemm needs a build of moex with CUDA (this one has none); use grouped_mm");
}
size_t cuda_deepgemm_workspace(const Problem&) { return 0; }
void cuda_deepgemm(const Experts&, const ExpertsCall&, const RunContext&) { no_cuda(); }

}  // namespace detail
}  // namespace moex
#endif
