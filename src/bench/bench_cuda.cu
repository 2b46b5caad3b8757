// bench/bench_cuda.cu — GPU probes for the benchmark: device copy bandwidth, cuBLAS GEMM rates.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "bench/bench_support.hpp"
#include "core/check.hpp"

namespace moex::bench {

namespace {

void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) detail::fail(ErrorCode::internal, "{}: {}", what, cudaGetErrorString(e));
}
void ck(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) detail::fail(ErrorCode::internal, "{}: cuBLAS status {}", what, int(s));
}

// Random data in [-1, 1) (bf16 / f16 / f32 by esz): a GEMM on constant data (or zeros) runs faster
// than on real data — on this machine kind 884 vs 788 TFLOP/s for the same 8192^3 bf16 product
// (KINDS.md; docs/PERF.md, 2026-12-01) — so the ceilings are measured on random operands.
__global__ void fill_random_kernel(void* p, size_t n, int esz, bool bf16, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint64_t z = (seed + i) * 0x9e3779b97f4a7c15ull;  // splitmix64
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    const float u = float((z ^ (z >> 31)) >> 40) / float(1 << 24) * 2.0f - 1.0f;
    if (esz == 4) static_cast<float*>(p)[i] = u;
    else if (bf16) static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16(u);
    else static_cast<__half*>(p)[i] = __float2half(u);
  }
}

void fill_random(void* p, size_t n, DType dtype, uint64_t seed) {
  fill_random_kernel<<<1024, 256>>>(p, n, int(dtype_size(dtype)), dtype == DType::bf16, seed);
  ck(cudaGetLastError(), "fill_random_kernel");
}

cudaDataType_t cublas_type(DType dtype) {
  return dtype == DType::bf16 ? CUDA_R_16BF : dtype == DType::f16 ? CUDA_R_16F : CUDA_R_32F;
}

float time_ms(const std::function<void()>& fn, int reps) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<float> ts;
  fn();
  cudaDeviceSynchronize();
  for (int i = 0; i < reps; ++i) {
    cudaEventRecord(a);
    fn();
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    ts.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}

}  // namespace

double cuda_copy_bandwidth(int device) {
  ck(cudaSetDevice(device), "cudaSetDevice");
  const size_t bytes = size_t(2) << 30;  // 2 GiB each way
  void *src = nullptr, *dst = nullptr;
  ck(cudaMalloc(&src, bytes), "cudaMalloc (bandwidth probe)");
  ck(cudaMalloc(&dst, bytes), "cudaMalloc (bandwidth probe)");
  cudaMemset(src, 1, bytes);
  const float ms = time_ms([&] { cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice); }, 10);
  cudaFree(src);
  cudaFree(dst);
  return 2.0 * double(bytes) / (ms * 1e-3);
}

namespace {

// One dense GEMM on random operands, row-major C [M, N] = A [M, K] · Bᵀ (B [N, K]), in cuBLAS's
// column-major terms Cᵀ = B · Aᵀ; the buffers are freed with it.
class DenseGemm {
 public:
  DenseGemm(DType dtype, int64_t M, int64_t N, int64_t K, uint64_t seed) : t_(cublas_type(dtype)), M_(M), N_(N), K_(K) {
    const size_t esz = dtype_size(dtype);
    try {
      ck(cudaMalloc(&a_, size_t(M) * K * esz), "cudaMalloc (dense GEMM probe)");
      ck(cudaMalloc(&b_, size_t(N) * K * esz), "cudaMalloc (dense GEMM probe)");
      ck(cudaMalloc(&c_, size_t(M) * N * esz), "cudaMalloc (dense GEMM probe)");
      fill_random(a_, size_t(M) * K, dtype, seed);
      fill_random(b_, size_t(N) * K, dtype, seed + 1);
    } catch (...) {
      release();
      throw;
    }
  }
  ~DenseGemm() { release(); }
  DenseGemm(const DenseGemm&) = delete;
  DenseGemm& operator=(const DenseGemm&) = delete;
  double flops() const { return 2.0 * double(M_) * double(N_) * double(K_); }
  void run(cublasHandle_t h) const {
    const float alpha = 1.0f, beta = 0.0f;
    ck(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(N_), int(M_), int(K_), &alpha, b_, t_, int(K_), a_, t_, int(K_), &beta, c_, t_,
                    int(N_), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
       "cublasGemmEx (dense GEMM probe)");
  }

 private:
  void release() {
    for (void* p : {a_, b_, c_}) cudaFree(p);  // cudaFree(nullptr) is a no-op
  }
  cudaDataType_t t_;
  int64_t M_, N_, K_;
  void *a_ = nullptr, *b_ = nullptr, *c_ = nullptr;
};

// Median milliseconds of running `gemms` one after the other (reps timed calls after a warm-up).
float time_gemms(std::initializer_list<const DenseGemm*> gemms, int reps) {
  cublasHandle_t h;
  ck(cublasCreate(&h), "cublasCreate");
  float ms = 0;
  try {
    ms = time_ms([&] { for (const DenseGemm* g : gemms) g->run(h); }, reps);
  } catch (...) {
    cublasDestroy(h);
    throw;
  }
  cublasDestroy(h);
  return ms;
}

}  // namespace

double cuda_peak_flops(int device, DType dtype) {
  ck(cudaSetDevice(device), "cudaSetDevice");
  const DenseGemm g(dtype, 8192, 8192, 8192, 1);
  return g.flops() / (time_gemms({&g}, 10) * 1e-3);
}

double cuda_dense_pair_ms(int device, DType dtype, int64_t M, int64_t N1, int64_t K1, int64_t N2, int64_t K2) {
  ck(cudaSetDevice(device), "cudaSetDevice");
  const DenseGemm up(dtype, M, N1, K1, 11), down(dtype, M, N2, K2, 13);
  return time_gemms({&up, &down}, 7);
}

void cuda_synchronize(int device) {
  cudaSetDevice(device);
  ck(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

void* cuda_event_create() {
  cudaEvent_t e;
  ck(cudaEventCreate(&e), "cudaEventCreate");
  return e;
}
void cuda_event_destroy(void* e) { cudaEventDestroy(static_cast<cudaEvent_t>(e)); }
void cuda_event_record(void* e) { ck(cudaEventRecord(static_cast<cudaEvent_t>(e)), "cudaEventRecord"); }
float cuda_event_elapsed_ms(void* a, void* b) {
  ck(cudaEventSynchronize(static_cast<cudaEvent_t>(b)), "cudaEventSynchronize");
  float ms = 0;
  ck(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(a), static_cast<cudaEvent_t>(b)), "cudaEventElapsedTime");
  return ms;
}

}  // namespace moex::bench
