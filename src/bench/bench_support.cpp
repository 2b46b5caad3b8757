// bench/bench_support.cpp — CPU probes and the timer.
#include "bench/bench_support.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "backends/cpu/kernels.hpp"
#include "core/check.hpp"
#include "core/memory.hpp"

namespace moex::bench {

namespace {

// Median wall time of `reps` calls of f after one untimed call.
template <class F>
double median_seconds(F&& f, int reps = 5) {
  f();
  std::vector<double> secs;
  for (int rep = 0; rep < reps; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    secs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(secs.begin(), secs.end());
  return secs[secs.size() / 2];
}

double cpu_copy_bandwidth(int threads) {
  // 512 MiB source, far beyond any cache; each thread copies its own slice
  const size_t bytes = size_t(512) << 20;
  char* src = static_cast<char*>(detail::device_alloc(Device::cpu(), bytes));
  char* dst = static_cast<char*>(detail::device_alloc(Device::cpu(), bytes));
  auto copy = [&] {
#pragma omp parallel num_threads(threads)
    {
      const int n = omp_get_num_threads(), t = omp_get_thread_num();
      const size_t chunk = (bytes / size_t(n) + 4095) & ~size_t(4095);
      const size_t b0 = std::min(bytes, chunk * size_t(t)), b1 = std::min(bytes, b0 + chunk);
      std::memcpy(dst + b0, src + b0, b1 - b0);
    }
  };
#pragma omp parallel for num_threads(threads)
  for (int64_t i = 0; i < int64_t(bytes / 4096); ++i) {  // touch pages (first-touch placement)
    std::memset(src + i * 4096, 1, 4096);
    std::memset(dst + i * 4096, 0, 4096);
  }
  const double secs = median_seconds(copy);
  detail::device_free(Device::cpu(), src);
  detail::device_free(Device::cpu(), dst);
  return 2.0 * double(bytes) / secs;  // read + written
}

double cpu_read_bandwidth(int threads) {
  // 512 MiB read once per repetition, each thread summing its own slice with the kernels' widest
  // vector loads (kernels().read_probe, picked at run time like every CPU kernel; 16-byte loads
  // topped out at ~16 GB/s with 2 threads on the development machine, 64-byte ones near the copy
  // rate): load-bound, as a decode step's weight stream; bytes read / median time. Filled with
  // 1.0f: no denormal operands to slow the adds.
  const size_t bytes = size_t(512) << 20, words = bytes / 4;
  auto* src = static_cast<float*>(detail::device_alloc(Device::cpu(), bytes));
#pragma omp parallel for num_threads(threads)
  for (int64_t i = 0; i < int64_t(words); ++i) src[i] = 1.0f;
  const auto& kt = cpu::kernels();
  volatile double sink = 0;
  auto read = [&] {
    double total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
    {
      const int n = omp_get_num_threads(), t = omp_get_thread_num();
      const size_t chunk = (words / size_t(n) + 1023) & ~size_t(1023);
      const size_t w0 = std::min(words, chunk * size_t(t)), w1 = std::min(words, w0 + chunk);
      total += kt.read_probe(src + w0, int64_t(w1 - w0));
    }
    sink = sink + total;
  };
  const double secs = median_seconds(read);
  detail::device_free(Device::cpu(), src);
  return double(bytes) / secs;
}

// flop/s of `probe` (iters rounds per thread) on `threads` threads, after a short warm-up
double cpu_probe_rate(double (*probe)(int64_t), int threads) {
  const int64_t iters = 20'000'000;
  probe(iters / 10);
  double flops = 0;
  auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : flops)
  flops += probe(iters);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return flops / s;
}

// bf16 on a CPU whose kernels use vdpbf16ps (the table has its probe exactly then): its rate counts
bool cpu_bf16_dot_peak(DType dtype) { return dtype == DType::bf16 && cpu::kernels().bf16_dot_probe != nullptr; }

}  // namespace

std::string peak_what(Device dev, DType dtype) {
  if (!dev.is_cpu()) return fmt::format("cuBLAS dense {} GEMM", dtype_name(dtype));
  if (!cpu_bf16_dot_peak(dtype)) return "f32 FMA rate";
  return std::string_view(cpu::kernels().isa) == "avx512_amx" ? "max of the f32 FMA and vdpbf16ps rates; AMX tiles not probed"
                                                              : "max of the f32 FMA and vdpbf16ps rates";
}

double copy_bandwidth(Device dev, int threads) {
  return dev.is_cpu() ? cpu_copy_bandwidth(threads) : cuda_copy_bandwidth(dev.index);
}

double read_bandwidth(Device dev, int threads) { return dev.is_cpu() ? cpu_read_bandwidth(threads) : 0.0; }

double peak_flops(Device dev, DType dtype, int threads) {
  if (!dev.is_cpu()) return cuda_peak_flops(dev.index, dtype);
  const double fma = cpu_probe_rate(cpu::kernels().fma_probe, threads);
  return cpu_bf16_dot_peak(dtype) ? std::max(fma, cpu_probe_rate(cpu::kernels().bf16_dot_probe, threads)) : fma;
}

void synchronize(Device dev) {
  if (dev.is_cuda()) cuda_synchronize(dev.index);
}

struct Timer::Impl {
  std::chrono::steady_clock::time_point t0;
  void* ev0 = nullptr;
  void* ev1 = nullptr;
};

Timer::Timer(Device dev) : dev_(dev), impl_(std::make_unique<Impl>()) {
  if (dev.is_cuda()) {
    impl_->ev0 = cuda_event_create();
    impl_->ev1 = cuda_event_create();
  }
}

Timer::~Timer() {
  if (dev_.is_cuda()) {
    cuda_event_destroy(impl_->ev0);
    cuda_event_destroy(impl_->ev1);
  }
}

void Timer::start() {
  if (dev_.is_cuda())
    cuda_event_record(impl_->ev0);
  else
    impl_->t0 = std::chrono::steady_clock::now();
}

double Timer::stop_ms() {
  if (dev_.is_cuda()) {
    cuda_event_record(impl_->ev1);
    return cuda_event_elapsed_ms(impl_->ev0, impl_->ev1);
  }
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - impl_->t0).count();
}

#ifndef MOEX_WITH_CUDA
namespace {
[[noreturn]] void no_cuda() { detail::fail(ErrorCode::unsupported, "CUDA benchmark requested but moex was built without CUDA"); }
}  // namespace
double cuda_copy_bandwidth(int) { no_cuda(); }
double cuda_peak_flops(int, DType) { no_cuda(); }
double cuda_dense_pair_ms(int, DType, int64_t, int64_t, int64_t, int64_t, int64_t) { no_cuda(); }
void cuda_synchronize(int) { no_cuda(); }
void* cuda_event_create() { no_cuda(); }
void cuda_event_destroy(void*) {}
void cuda_event_record(void*) { no_cuda(); }
float cuda_event_elapsed_ms(void*, void*) { no_cuda(); }
#endif

}  // namespace moex::bench
