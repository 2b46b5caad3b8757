// bench/bench_cuda.cu — GPU probes for the benchmark: device copy bandwidth and cuBLAS GEMM rate.
#include <cublas_v2.h>
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

__global__ void fill_kernel(uint16_t* p, size_t n, uint16_t v) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) p[i] = v;
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
  // random-ish non-zero data (zeros run faster than real data)
  if (esz == 2) {
    fill_kernel<<<1024, 256>>>(static_cast<uint16_t*>(a), size_t(n) * n, dtype == DType::bf16 ? 0x3c01 : 0x2e01);
    fill_kernel<<<1024, 256>>>(static_cast<uint16_t*>(b), size_t(n) * n, dtype == DType::bf16 ? 0xbc03 : 0xae03);
  } else {
    cudaMemset(a, 0x3c, size_t(n) * n * esz);
    cudaMemset(b, 0x3c, size_t(n) * n * esz);
  }
  cublasHandle_t h;
  ck(cublasCreate(&h), "cublasCreate");
  const float alpha = 1.0f, beta = 0.0f;
  const cudaDataType_t t = dtype == DType::bf16 ? CUDA_R_16BF : dtype == DType::f16 ? CUDA_R_16F : CUDA_R_32F;
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
