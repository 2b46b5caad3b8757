// backends/cuda/trace.cu — the host side of trace.hpp (buffer, start / stop, the SM clock anchors).
#include "backends/cuda/trace.cuh"

#include <cuda_runtime.h>

#include "backends/cuda/cuda_common.cuh"
#include "core/check.hpp"

namespace moex::cuda::trace {

namespace {
__global__ void anchor_kernel(SmAnchor* out) {
  // one lane per block: wait for the global timer to change, then read this SM's clock at once
  const uint64_t g0 = global_ns();
  uint64_t g;
  do {
    g = global_ns();
  } while (g == g0);
  const uint64_t c = clock64();
  out[blockIdx.x] = SmAnchor{sm_id(), g, c};
}

#if defined(MOEX_CUDA_TRACE) && MOEX_CUDA_TRACE
struct State {
  Record* buf = nullptr;
  unsigned* count = nullptr;
  size_t cap = 0;
};
State& state() {
  static State s;
  return s;
}
void set_all(const Target& t) {
  for (Setter f : setters()) check(f(t), "trace: cudaMemcpyToSymbol");
}
#endif
}  // namespace

bool compiled() {
#if defined(MOEX_CUDA_TRACE) && MOEX_CUDA_TRACE
  return true;
#else
  return false;
#endif
}

void start(size_t capacity) {
#if defined(MOEX_CUDA_TRACE) && MOEX_CUDA_TRACE
  MOEX_CHECK(capacity > 0 && capacity < (size_t(1) << 31), "trace capacity {} out of range", capacity);
  State& s = state();
  if (s.buf) stop();
  check(cudaMalloc(&s.buf, capacity * sizeof(Record)), "trace: cudaMalloc");
  check(cudaMalloc(&s.count, sizeof(unsigned)), "trace: cudaMalloc");
  check(cudaMemset(s.count, 0, sizeof(unsigned)), "trace: cudaMemset");
  s.cap = capacity;
  set_all(Target{s.buf, s.count, unsigned(capacity)});
  check(cudaDeviceSynchronize(), "trace: start");
#else
  (void)capacity;
  detail::fail(ErrorCode::unsupported, "this build has no trace hooks: configure with -DMOEX_CUDA_TRACE=ON");
#endif
}

std::vector<Record> stop(size_t* dropped) {
  std::vector<Record> out;
  if (dropped) *dropped = 0;
#if defined(MOEX_CUDA_TRACE) && MOEX_CUDA_TRACE
  State& s = state();
  if (!s.buf) return out;
  check(cudaDeviceSynchronize(), "trace: stop");
  set_all(Target{});
  unsigned n = 0;
  check(cudaMemcpy(&n, s.count, sizeof n, cudaMemcpyDeviceToHost), "trace: cudaMemcpy");
  const size_t kept = std::min<size_t>(n, s.cap);
  if (dropped) *dropped = n - kept;
  out.resize(kept);
  if (kept) check(cudaMemcpy(out.data(), s.buf, kept * sizeof(Record), cudaMemcpyDeviceToHost), "trace: cudaMemcpy");
  cudaFree(s.buf);
  cudaFree(s.count);
  s = State{};
#endif
  return out;
}

std::vector<SmAnchor> anchors() {
  const int blocks = 4 * current_device_sms();  // enough that every SM gets one in practice; the report checks
  SmAnchor* d = nullptr;
  check(cudaMalloc(&d, size_t(blocks) * sizeof(SmAnchor)), "trace: cudaMalloc");
  anchor_kernel<<<blocks, 32>>>(d);
  check_launch("trace anchor_kernel");
  std::vector<SmAnchor> out(static_cast<size_t>(blocks));
  const cudaError_t e = cudaMemcpy(out.data(), d, out.size() * sizeof(SmAnchor), cudaMemcpyDeviceToHost);
  cudaFree(d);
  check(e, "trace: cudaMemcpy");
  return out;
}

}  // namespace moex::cuda::trace
