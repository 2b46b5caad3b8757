// bench/bench_support.hpp — what the benchmark needs from the machine: the copy bandwidth and
// the peak arithmetic rate (the two ceilings of a floor), and a device timer.
#pragma once
#include <memory>
#include <string>

#include "moex/device.hpp"
#include "moex/dtype.hpp"

namespace moex::bench {

// Bytes moved per second (read + written) by a large copy with `threads` CPU threads, or by a
// device-to-device copy on a CUDA device.
double copy_bandwidth(Device dev, int threads);
// Bytes per second of a streaming read of a buffer far beyond the caches (CPU; 0 on CUDA devices):
// the ceiling of a decode step, which only reads its weights (reported beside the copy rate).
double read_bandwidth(Device dev, int threads);
// Peak rate in flop/s: on the CPU the FMA rate of this CPU's kernel ISA in f32 with `threads`
// threads — for bf16 the larger of that and the vdpbf16ps rate where the kernels use it (AMX tiles
// are not probed); on CUDA a large dense GEMM of `dtype` through cuBLAS (bf16/f16 tensor cores, f32
// no TF32).
double peak_flops(Device dev, DType dtype, int threads);
// What peak_flops measures, in words (the benchmark's header).
std::string peak_what(Device dev, DType dtype);

void synchronize(Device dev);

// Times a region: CUDA events on the default stream of a CUDA device, a steady clock on the CPU.
class Timer {
 public:
  explicit Timer(Device dev);
  ~Timer();
  void start();
  double stop_ms();  // waits for the region to finish

 private:
  struct Impl;
  Device dev_;
  std::unique_ptr<Impl> impl_;
};

// CUDA halves (bench_cuda.cu, or stand-ins without CUDA).
double cuda_copy_bandwidth(int device);
double cuda_peak_flops(int device, DType dtype);
// Milliseconds of two dense cuBLAS GEMMs on random data, C1 [M, N1] = A1 [M, K1] · B1ᵀ then
// C2 [M, N2] = A2 [M, K2] · B2ᵀ (median of 7): the dense GEMMs of the same FLOPs as an experts
// forward (M = the routed pairs, as if one expert held them all), the bench's "dense" column.
double cuda_dense_pair_ms(int device, DType dtype, int64_t M, int64_t N1, int64_t K1, int64_t N2, int64_t K2);
void cuda_synchronize(int device);
void* cuda_event_create();
void cuda_event_destroy(void* e);
void cuda_event_record(void* e);
float cuda_event_elapsed_ms(void* start, void* stop);  // synchronises on stop

}  // namespace moex::bench
