// bench/bench_cuda.cu — GPU probes for the benchmark: device copy bandwidth and cuBLAS GEMM rate.
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

double cuda_peak_flops(int device, DType dtype) {
  ck(cudaSetDevice(device), "cudaSetDevice");
  const int n = 8192;
  const size_t esz = dtype == DType::f32 ? 4 : 2;
  void *a = nullptr, *b = nullptr, *c = nullptr;
  ck(cudaMalloc(&a, size_t(n) * n * esz), "cudaMalloc (GEMM probe)");
  ck(cudaMalloc(&b, size_t(n) * n * esz), "cudaMalloc (GEMM probe)");
  ck(cudaMalloc(&c, size_t(n) * n * esz), "cudaMalloc (GEMM probe)");
  fill_random(a, size_t(n) * n, dtype, 1);
  fill_random(b, size_t(n) * n, dtype, 2);
  cublasHandle_t h;
  ck(cublasCreate(&h), "cublasCreate");
  const float alpha = 1.0f, beta = 0.0f;
  const cudaDataType_t t = cublas_type(dtype);
  auto gemm = [&] {
    ck(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &alpha, a, t, n, b, t, n, &beta, c, t, n, CUBLAS_COMPUTE_32F,
                    CUBLAS_GEMM_DEFAULT),
       "cublasGemmEx");
  };
  const float ms = time_ms(gemm, 10);
  cublasDestroy(h);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  return 2.0 * double(n) * n * n / (ms * 1e-3);
}

double cuda_dense_pair_ms(int device, DType dtype, int64_t M, int64_t N1, int64_t K1, int64_t N2, int64_t K2) {
  ck(cudaSetDevice(device), "cudaSetDevice");
  const size_t esz = dtype_size(dtype);
  // C1 [M, N1] = A1 [M, K1] · B1ᵀ (B1 [N1, K1]), C2 [M, N2] = A2 [M, K2] · B2ᵀ: row-major operands
  // as cuBLAS column-major transposes (C1ᵀ = B1 · A1ᵀ)
  const size_t n_a1 = size_t(M) * K1, n_b1 = size_t(N1) * K1, n_c1 = size_t(M) * N1;
  const size_t n_a2 = size_t(M) * K2, n_b2 = size_t(N2) * K2, n_c2 = size_t(M) * N2;
  void *a1, *b1, *c1, *a2, *b2, *c2;
  ck(cudaMalloc(&a1, n_a1 * esz), "cudaMalloc (dense probe)");
  ck(cudaMalloc(&b1, n_b1 * esz), "cudaMalloc (dense probe)");
  ck(cudaMalloc(&c1, n_c1 * esz), "cudaMalloc (dense probe)");
  ck(cudaMalloc(&a2, n_a2 * esz), "cudaMalloc (dense probe)");
  ck(cudaMalloc(&b2, n_b2 * esz), "cudaMalloc (dense probe)");
  ck(cudaMalloc(&c2, n_c2 * esz), "cudaMalloc (dense probe)");
  fill_random(a1, n_a1, dtype, 11);
  fill_random(b1, n_b1, dtype, 12);
  fill_random(a2, n_a2, dtype, 13);
  fill_random(b2, n_b2, dtype, 14);
  cublasHandle_t h;
  ck(cublasCreate(&h), "cublasCreate");
  const float alpha = 1.0f, beta = 0.0f;
  const cudaDataType_t t = cublas_type(dtype);
  auto pair = [&] {
    ck(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(N1), int(M), int(K1), &alpha, b1, t, int(K1), a1, t, int(K1), &beta, c1, t,
                    int(N1), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
       "cublasGemmEx (dense probe)");
    ck(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(N2), int(M), int(K2), &alpha, b2, t, int(K2), a2, t, int(K2), &beta, c2, t,
                    int(N2), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
       "cublasGemmEx (dense probe)");
  };
  const float ms = time_ms(pair, 7);
  cublasDestroy(h);
  for (void* p : {a1, b1, c1, a2, b2, c2}) cudaFree(p);
  return ms;
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
