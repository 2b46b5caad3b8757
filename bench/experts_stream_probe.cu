// bench/experts_stream_probe.cu — does the batch-1 experts' kernel boundary cost DRAM time, and would one
// persistent kernel that hands out up and down work from a queue win it back? Measured before building one
// (docs/PERF.md, "For the next session (fifty-eighth)").
//
// At batch 1 on Qwen3-30B-A3B, batched_mm streams 8 experts' gate/up rows (8 × [1536, 2048] bf16, 50 MB) in
// one kernel and their down rows (8 × [2048, 768], 25 MB) in the next. The H100 timeline (fifty-seventh
// session) gives the pair 32.8 µs per layer against 24.9 at the copy rate: DRAM ramps up and drains twice, and
// the down kernel cannot ask for a byte before the whole up kernel has finished. This probe runs the same
// arithmetic as src/backends/cuda/batched_gemv.cu (warp per channel / output row, 16-byte ld.global.cs weight
// loads, f32 sums, h in bf16) in these forms, each layer reading its own copy of the weights (enough copies
// that L2 never holds the next layer's), all launches with PDL and captured in one CUDA graph:
//   two        the runtime's two kernels: up (grid pairs × I/16, 2 channels per warp), down (grid H/8)
//   two_pre    the same, down loads its first round of weight chunks (8 × 16 B per lane) before its wait
//   persist<N> one persistent kernel (every block resident), blocks taking work items from a queue in order:
//              the up items, then the down items; a down item loads its first N rounds of weight chunks
//              (N = 0, 1, 3: all of them), then spins until every up item is done, then reads h
//   one        up and down work in one grid with no dependency at all (down reads a stale h): the floor of
//              one continuous stream with these work shapes
//   up, down   each kernel alone
// Measured (H100, 2026-12-07, docs/PERF.md, fifty-eighth session): two 31.5, two_pre 28.6, persist0/1/3 32.1 /
// 33.8 / 38.8, one 31.5 µs per layer (floor 24.9). The runtime's down kernel given two_pre's early loads was
// slower in the 48-layer step, not faster (batched_gemv.cu, batched_down_nt's comment): this copy leaves out
// what the real kernel carries (the routing indices, 64-bit addressing, the register bound of its shapes).
// Prints µs per layer, GB/s and % of the copy rate. Exit status 0 when two, two_pre and persist<N> wrote the
// same output bits (the same sums in the same order), 1 otherwise or on a CUDA error.
//
//   moex_experts_stream_probe [--pairs 8] [--hidden 2048] [--inter 768] [--layers 48] [--reps 5]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_check.hpp"  // CHECK

namespace {

using bf16 = __nv_bfloat16;
constexpr int kThreads = 256, kWarps = kThreads / 32;
constexpr int kUpChannels = 2;  // channels per warp in the up kernel (batched_up_nt's MULTI at batch 1)

struct Layer {
  const bf16* up;    // [P, 2I, H]: gate rows 0..I-1, up rows I..2I-1
  const bf16* down;  // [P, H, I]
  const bf16* x;     // [H]
  bf16* h;           // [P, I]
  float* out;        // [H]
  const float* topw; // [P]
};
struct Shape {
  int P, H, I;
  __host__ __device__ int up_items() const { return P * (I / (kWarps * kUpChannels)); }
  __host__ __device__ int down_items() const { return H / kWarps; }
};

__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_release() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

__device__ __forceinline__ float dot8(const uint4& xa, const uint4& wa, float acc) {
  const __nv_bfloat162* x2 = reinterpret_cast<const __nv_bfloat162*>(&xa);
  const __nv_bfloat162* w2 = reinterpret_cast<const __nv_bfloat162*>(&wa);
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const float2 xf = __bfloat1622float2(x2[q]), wf = __bfloat1622float2(w2[q]);
    acc = fmaf(xf.x, wf.x, acc);
    acc = fmaf(xf.y, wf.y, acc);
  }
  return acc;
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Up item (pair, y): the warp's channels i = y·8 + warp + c·(8·per_pair), c < kUpChannels.
__device__ void up_item(const Layer& L, const Shape& S, int pair, int y, int per_pair) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const uint4* x = reinterpret_cast<const uint4*>(L.x);
  const int nv = S.H / 8;
#pragma unroll 1
  for (int c = 0; c < kUpChannels; ++c) {
    const int i = y * kWarps + warp + c * kWarps * per_pair;
    const uint4* g = reinterpret_cast<const uint4*>(L.up + (size_t(pair) * 2 * S.I + i) * S.H);
    const uint4* u = reinterpret_cast<const uint4*>(L.up + (size_t(pair) * 2 * S.I + S.I + i) * S.H);
    float gs = 0.f, us = 0.f;
#pragma unroll 4
    for (int k = lane; k < nv; k += 32) {
      const uint4 xa = __ldg(x + k);
      gs = dot8(xa, __ldcs(g + k), gs);
      us = dot8(xa, __ldcs(u + k), us);
    }
    gs = warp_sum(gs);
    us = warp_sum(us);
    if (lane == 0) L.h[size_t(pair) * S.I + i] = __float2bfloat16(__fdividef(gs, 1.f + __expf(-gs)) * us);
  }
}

// Down item: the warp's output row n = item·8 + warp, summed over the P slots in slot order. kRounds rounds
// of P weight chunks per lane (I = 768: 96 chunks a row, 3 rounds); the first PRE rounds are loaded before
// wait() (which must make h visible), the others after it. h is read with ld.global.cg: in the persistent
// kernel it was written by other blocks of the same grid.
template <int PRE, int P, class Wait>
__device__ void down_item(const Layer& L, const Shape& S, int item, Wait wait) {
  constexpr int kRounds = 3;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int n = item * kWarps + warp;
  const int nv = S.I / 8;
  uint4 w[PRE > 0 ? PRE : 1][P];
#pragma unroll
  for (int r = 0; r < PRE; ++r)
#pragma unroll
    for (int j = 0; j < P; ++j) {
      const int k = lane + 32 * r;
      if (k < nv) w[r][j] = __ldcs(reinterpret_cast<const uint4*>(L.down + (size_t(j) * S.H + n) * S.I) + k);
    }
  wait();
  float part[P];
#pragma unroll
  for (int j = 0; j < P; ++j) part[j] = 0.f;
#pragma unroll
  for (int r = 0; r < kRounds; ++r) {
    const int k = lane + 32 * r;
    if (k >= nv) break;
    uint4 hv[P], wv[P];
#pragma unroll
    for (int j = 0; j < P; ++j) {
      hv[j] = __ldcg(reinterpret_cast<const uint4*>(L.h + size_t(j) * S.I) + k);
      if (r >= PRE) wv[j] = __ldcs(reinterpret_cast<const uint4*>(L.down + (size_t(j) * S.H + n) * S.I) + k);
    }
#pragma unroll
    for (int j = 0; j < P; ++j) {
      if constexpr (PRE > 0) {
        if (r < PRE) {
          part[j] = dot8(hv[j], w[r < PRE ? r : 0][j], part[j]);
          continue;
        }
      }
      part[j] = dot8(hv[j], wv[j], part[j]);
    }
  }
  float acc = 0.f;
#pragma unroll
  for (int j = 0; j < P; ++j) acc += L.topw[j] * warp_sum(part[j]);
  if (lane == 0) L.out[n] = acc;
}

__global__ void __launch_bounds__(kThreads) up_kernel(Layer L, Shape S) {
  pdl_wait();
  pdl_release();
  up_item(L, S, blockIdx.x, blockIdx.y, gridDim.y);
}

template <int PRE>
__global__ void __launch_bounds__(kThreads) down_kernel(Layer L, Shape S) {
  if constexpr (PRE == 0) pdl_wait();
  pdl_release();
  down_item<PRE, 8>(L, S, blockIdx.x, [] {
    if constexpr (PRE > 0) pdl_wait();
  });
}

// Up and down work in one grid, no dependency (down reads whatever h holds).
__global__ void __launch_bounds__(kThreads) one_kernel(Layer L, Shape S) {
  pdl_wait();
  pdl_release();
  const int per_pair = S.I / (kWarps * kUpChannels), U = S.up_items();
  if (int(blockIdx.x) < U) up_item(L, S, blockIdx.x / per_pair, blockIdx.x % per_pair, per_pair);
  else down_item<0, 8>(L, S, blockIdx.x - U, [] {});
}

// The persistent form. ctr[0]: the queue, ctr[1]: up items done, ctr[2]: blocks exited; the last block to
// exit sets all three back to zero (the next launch's pdl_wait sees it).
template <int PRE>
__global__ void __launch_bounds__(kThreads) persistent_kernel(Layer L, Shape S, unsigned* ctr) {
  pdl_wait();
  pdl_release();
  __shared__ int item_s;
  const int per_pair = S.I / (kWarps * kUpChannels), U = S.up_items(), D = S.down_items();
  for (;;) {
    if (threadIdx.x == 0) item_s = int(atomicAdd(&ctr[0], 1u));
    __syncthreads();
    const int item = item_s;
    __syncthreads();
    if (item >= U + D) break;
    if (item < U) {
      up_item(L, S, item / per_pair, item % per_pair, per_pair);
      __syncthreads();
      if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(&ctr[1], 1u);
      }
    } else {
      down_item<PRE, 8>(L, S, item - U, [&] {
        if (threadIdx.x == 0) {
          unsigned done;
          do asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(done) : "l"(ctr + 1) : "memory");
          while (done < unsigned(U));
        }
        __syncthreads();
      });
    }
  }
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(&ctr[2], 1u) == gridDim.x - 1) {
      ctr[0] = 0;
      ctr[1] = 0;
      ctr[2] = 0;
      __threadfence();
    }
  }
}

__global__ void fill_bf16(bf16* p, size_t n, uint32_t seed, float scale) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t v = uint32_t(i) * 2654435761u ^ seed;
    v ^= v >> 13;
    v *= 0x5bd1e995u;
    v ^= v >> 15;
    p[i] = __float2bfloat16(scale * (float(v >> 8) / 8388608.f - 1.f));
  }
}

template <class... Params, class... Args>
void launch(void (*kernel)(Params...), dim3 grid, cudaStream_t s, Args... args) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(kThreads);
  cfg.stream = s;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  CHECK(cudaLaunchKernelEx(&cfg, kernel, args...));
}

// Device-to-device copy rate in bytes/s: read + written bytes over the time of ten 1 GB cudaMemcpys after a
// warm-up — moex::model::measure_copy_bandwidth's measure, repeated here so that the probe links no moex code.
double copy_rate() {
  const size_t n = size_t(1) << 30;
  const int reps = 10;
  void *a, *b;
  CHECK(cudaMalloc(&a, n));
  CHECK(cudaMalloc(&b, n));
  CHECK(cudaMemset(a, 1, n));
  CHECK(cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice));
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  CHECK(cudaEventRecord(e0));
  for (int r = 0; r < reps; ++r) CHECK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice));
  CHECK(cudaEventRecord(e1));
  CHECK(cudaEventSynchronize(e1));
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, e0, e1));
  CHECK(cudaEventDestroy(e0));
  CHECK(cudaEventDestroy(e1));
  CHECK(cudaFree(a));
  CHECK(cudaFree(b));
  return 2.0 * n * reps / (ms * 1e-3);
}

int arg(int argc, char** argv, const char* name, int def) {
  for (int i = 1; i + 1 < argc; ++i)
    if (!std::strcmp(argv[i], name)) return std::atoi(argv[i + 1]);
  return def;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) {
      std::printf("usage: moex_experts_stream_probe [--pairs 8] [--hidden 2048] [--inter 768] [--layers 48] "
                  "[--reps 5]\n");
      return 0;
    }
  Shape S{arg(argc, argv, "--pairs", 8), arg(argc, argv, "--hidden", 2048), arg(argc, argv, "--inter", 768)};
  const int layers = arg(argc, argv, "--layers", 48), reps = arg(argc, argv, "--reps", 5);
  if (S.P != 8 || S.H % (8 * kWarps) || S.I % (kWarps * kUpChannels) || S.I % 8 || S.I > 3 * 32 * 8 ||
      layers < 1 || reps < 1) {
    std::fprintf(stderr, "error: --pairs must be 8, --hidden a multiple of 64, --inter a multiple of 16 and at most "
                         "768; --layers, --reps >= 1\n");
    return 2;
  }
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  if (prop.major < 9) {
    std::fprintf(stderr, "error: needs compute capability 9.0 (PDL), found %d.%d\n", prop.major, prop.minor);
    return 2;
  }
  const size_t up_n = size_t(S.P) * 2 * S.I * S.H, down_n = size_t(S.P) * S.H * S.I;
  const double layer_bytes = double(up_n + down_n) * sizeof(bf16);
  // distinct weight copies: enough that L2 never holds the next layer's (the layers cycle through them)
  const int copies = std::min(layers, int(std::max(4.0, 3.0 * prop.l2CacheSize / layer_bytes + 2)));
  std::vector<bf16*> up(copies), down(copies);
  for (int c = 0; c < copies; ++c) {
    CHECK(cudaMalloc(&up[c], up_n * sizeof(bf16)));
    CHECK(cudaMalloc(&down[c], down_n * sizeof(bf16)));
    fill_bf16<<<1024, 256>>>(up[c], up_n, 0x1234u + c, 0.05f);
    fill_bf16<<<1024, 256>>>(down[c], down_n, 0x9876u + c, 0.05f);
  }
  bf16 *x, *h;
  float *out, *topw;
  unsigned* ctr;
  CHECK(cudaMalloc(&x, S.H * sizeof(bf16)));
  CHECK(cudaMalloc(&h, size_t(S.P) * S.I * sizeof(bf16)));
  CHECK(cudaMalloc(&out, size_t(layers) * S.H * sizeof(float)));
  CHECK(cudaMalloc(&topw, S.P * sizeof(float)));
  CHECK(cudaMalloc(&ctr, 3 * sizeof(unsigned)));
  CHECK(cudaMemset(ctr, 0, 3 * sizeof(unsigned)));
  fill_bf16<<<8, 256>>>(x, S.H, 0x55u, 1.f);
  std::vector<float> topw_h(S.P, 1.f / S.P);
  CHECK(cudaMemcpy(topw, topw_h.data(), S.P * sizeof(float), cudaMemcpyHostToDevice));
  CHECK(cudaDeviceSynchronize());
  auto layer = [&](int l) { return Layer{up[l % copies], down[l % copies], x, h, out + size_t(l) * S.H, topw}; };

  // the persistent grids: every block resident (blocks per SM by each instantiation's registers)
  auto resident = [&](const void* kernel) {
    int per_sm = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0));
    return per_sm * prop.multiProcessorCount;
  };
  const int resident0 = resident(reinterpret_cast<const void*>(persistent_kernel<0>)),
            resident1 = resident(reinterpret_cast<const void*>(persistent_kernel<1>)),
            resident3 = resident(reinterpret_cast<const void*>(persistent_kernel<3>));
  const double copy_bw = copy_rate();
  std::printf("# %s, %d SMs, L2 %d MB; %d pairs, H %d, I %d: %.1f MB per layer, %d layers over %d weight copies; "
              "copy rate %.0f GB/s (floor %.2f us per layer); persistent grids %d / %d / %d blocks (PRE 0 / 1 / 3)\n",
              prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20, S.P, S.H, S.I, layer_bytes / 1e6, layers,
              copies, copy_bw / 1e9, layer_bytes / copy_bw * 1e6, resident0, resident1, resident3);

  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const int per_pair = S.I / (kWarps * kUpChannels);
  const dim3 up_grid(S.P, per_pair), down_grid(S.down_items());
  struct Form {
    const char* name;
    void (*enqueue)(const Layer&, const Shape&, dim3, dim3, int, unsigned*, cudaStream_t);
    bool checked;
    int blocks;  // the persistent forms' grid
  };
  const Form forms[] = {
      {"two", [](const Layer& L, const Shape& S, dim3 ug, dim3 dg, int, unsigned*, cudaStream_t s) {
         launch(up_kernel, ug, s, L, S);
         launch(down_kernel<0>, dg, s, L, S);
       }, true, 0},
      {"two_pre", [](const Layer& L, const Shape& S, dim3 ug, dim3 dg, int, unsigned*, cudaStream_t s) {
         launch(up_kernel, ug, s, L, S);
         launch(down_kernel<1>, dg, s, L, S);
       }, true, 0},
      {"persist0", [](const Layer& L, const Shape& S, dim3, dim3, int pb, unsigned* c, cudaStream_t s) {
         launch(persistent_kernel<0>, dim3(pb), s, L, S, c);
       }, true, resident0},
      {"persist1", [](const Layer& L, const Shape& S, dim3, dim3, int pb, unsigned* c, cudaStream_t s) {
         launch(persistent_kernel<1>, dim3(pb), s, L, S, c);
       }, true, resident1},
      {"persist3", [](const Layer& L, const Shape& S, dim3, dim3, int pb, unsigned* c, cudaStream_t s) {
         launch(persistent_kernel<3>, dim3(pb), s, L, S, c);
       }, true, resident3},
      {"one", [](const Layer& L, const Shape& S, dim3, dim3, int, unsigned*, cudaStream_t s) {
         launch(one_kernel, dim3(S.up_items() + S.down_items()), s, L, S);
       }, false, 0},
      {"up", [](const Layer& L, const Shape& S, dim3 ug, dim3, int, unsigned*, cudaStream_t s) {
         launch(up_kernel, ug, s, L, S);
       }, false, 0},
      {"down", [](const Layer& L, const Shape& S, dim3, dim3 dg, int, unsigned*, cudaStream_t s) {
         launch(down_kernel<0>, dg, s, L, S);
       }, false, 0},
  };

  std::vector<float> first, got(size_t(layers) * S.H);
  int status = 0;
  std::printf("%-9s %10s %9s %8s  %s\n", "form", "us/layer", "GB/s", "% copy", "output");
  for (const Form& f : forms) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int l = 0; l < layers; ++l) f.enqueue(layer(l), S, up_grid, down_grid, f.blocks, ctr, s);
    CHECK(cudaStreamEndCapture(s, &graph));
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CHECK(cudaMemsetAsync(out, 0xff, size_t(layers) * S.H * sizeof(float), s));  // poisoned: NaN
    CHECK(cudaGraphLaunch(exec, s));  // warm-up, and the output checked
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaMemcpy(got.data(), out, got.size() * sizeof(float), cudaMemcpyDeviceToHost));
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    float best = 1e30f;
    for (int r = 0; r < reps; ++r) {
      CHECK(cudaEventRecord(a, s));
      CHECK(cudaGraphLaunch(exec, s));
      CHECK(cudaEventRecord(b, s));
      CHECK(cudaEventSynchronize(b));
      float ms = 0;
      CHECK(cudaEventElapsedTime(&ms, a, b));
      best = std::min(best, ms);
    }
    const double us = best * 1e3 / layers;
    std::string verdict = "-";
    if (f.checked) {
      if (first.empty()) {
        first = got;
        const bool finite = std::all_of(got.begin(), got.end(), [](float v) { return v == v; });
        verdict = finite ? "reference" : "NaN in the output";
        if (!finite) status = 1;
      } else {
        const bool same = std::memcmp(first.data(), got.data(), got.size() * sizeof(float)) == 0;
        verdict = same ? "same bits" : "DIFFERS";
        if (!same) status = 1;
      }
    }
    const double bytes = !std::strcmp(f.name, "up")     ? up_n * sizeof(bf16)
                         : !std::strcmp(f.name, "down") ? down_n * sizeof(bf16)
                                                        : layer_bytes;
    std::printf("%-9s %10.2f %9.0f %7.1f%%  %s\n", f.name, us, bytes / us / 1e3, 100.0 * bytes / us / 1e-6 / copy_bw,
                verdict.c_str());
    CHECK(cudaEventDestroy(a));
    CHECK(cudaEventDestroy(b));
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));
  }
  return status;
}
