// bench/decode_probe.cu — how much a persistent decode layer could save, measured before building one
// (src/model/README.md, "The persistent decode layer, as planned").
//
// A batch-1 decode layer's four weight-streaming GEMVs with Qwen3-30B-A3B's sizes (bf16 weights, f32
// vectors): qkv [5120, 2048], o [2048, 4096], experts up [12288, 2048] (8 experts' gate/up rows) and
// down [2048, 6144] (8 experts' [2048, 768] side by side: the same bytes and sums), plus
// --latency-phases small dependent steps per layer (stand-ins for the norms, qkv_post, attention and
// the router: one block copies a 2048-vector), over --layers layers of distinct weights, run as
//   graph       one kernel per phase (a warp per row, 8 sixteen-byte loads per lane in flight, the
//               runtime's GEMV scheme), all layers captured in one CUDA graph and replayed
//   persistent  one kernel for all layers, --blocks-per-sm blocks per SM, a grid barrier after each
//               phase; before computing its rows of a phase a block asks L2 for its rows of the
//               next weight phase (cp.async.bulk.prefetch.L2), so DRAM keeps streaming through the
//               barriers and the latency phases
// Prints µs per layer for both, the DRAM floor (weight bytes / --bw or a measured copy rate) and the
// relative difference of the two final vectors (the same sums in the same order: expected 0).
//
//   moex_decode_probe [--layers 48] [--latency-phases 5] [--blocks-per-sm 1] [--threads 1024] [--reps 20]
//                     [--bw GB/s] [--no-prefetch] [--no-weights]
// --no-weights times the latency steps alone: a graph node against a grid barrier.
// Exit status 0 when the two modes agree (rel L2 <= 1e-5), 1 otherwise or on a CUDA error.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <algorithm>
#include <vector>

#include "model/cuda_forward.hpp"  // measure_copy_bandwidth
#include "model/cuda_kernels.cuh"  // launch_fill_random
#include "cuda_check.hpp"  // CHECK

namespace {

constexpr int kWarpsGraph = 4;  // warps per block of the per-phase kernels

// One weight phase: y [rows] = W [rows, in] · x [in].
struct Phase {
  const __nv_bfloat16* w;
  int rows, in;
  const float* x;
  float* y;
};
// A latency phase: dst [n] = src [n] by one block.
struct Copy {
  const float* src;
  float* dst;
  int n;
};

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Row `row` of phase p by one warp: lane l reads columns 8l, 8l + 256, ... eight loads at a time.
// COHERENT: x was written by other blocks of the same kernel (persistent mode): read through L2.
template <bool COHERENT>
__device__ __forceinline__ float4 load_x(const float* p) {
  if constexpr (COHERENT) return __ldcg(reinterpret_cast<const float4*>(p));
  else return __ldg(reinterpret_cast<const float4*>(p));
}
template <bool COHERENT>
__device__ __forceinline__ void gemv_row(const Phase& p, int row, int lane) {
  const __nv_bfloat16* wr = p.w + size_t(row) * p.in;
  float sum = 0.0f;
  for (int c = lane * 8; c < p.in; c += 8 * 256) {
    uint4 raw[8];
#pragma unroll
    for (int u = 0; u < 8; ++u)
      if (c + u * 256 < p.in) raw[u] = __ldcs(reinterpret_cast<const uint4*>(wr + c + u * 256));
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      if (c + u * 256 >= p.in) break;
      const __nv_bfloat16* wv = reinterpret_cast<const __nv_bfloat16*>(&raw[u]);
      const float4 a = load_x<COHERENT>(p.x + c + u * 256);
      const float4 b = load_x<COHERENT>(p.x + c + u * 256 + 4);
      sum = fmaf(__bfloat162float(wv[0]), a.x, sum);
      sum = fmaf(__bfloat162float(wv[1]), a.y, sum);
      sum = fmaf(__bfloat162float(wv[2]), a.z, sum);
      sum = fmaf(__bfloat162float(wv[3]), a.w, sum);
      sum = fmaf(__bfloat162float(wv[4]), b.x, sum);
      sum = fmaf(__bfloat162float(wv[5]), b.y, sum);
      sum = fmaf(__bfloat162float(wv[6]), b.z, sum);
      sum = fmaf(__bfloat162float(wv[7]), b.w, sum);
    }
  }
  sum = warp_sum(sum);
  if (lane == 0) p.y[row] = sum;
}

__global__ void __launch_bounds__(kWarpsGraph * 32) gemv_phase_kernel(Phase p) {
  const int row = blockIdx.x * kWarpsGraph + (threadIdx.x >> 5);
  if (row < p.rows) gemv_row<false>(p, row, threadIdx.x & 31);
}
__global__ void copy_kernel(Copy c) {
  for (int i = threadIdx.x; i < c.n; i += blockDim.x) c.dst[i] = c.src[i];
}

// ---- persistent ----

// All blocks resident (the launch is sized from the occupancy calculator). `gen` counts completed
// barriers; a block reads it before arriving, the last to arrive resets the counter and advances it.
__device__ void grid_barrier(unsigned* count, unsigned* gen) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned g = atomicAdd(gen, 0u);
    __threadfence();
    if (atomicAdd(count, 1u) == gridDim.x - 1) {
      atomicExch(count, 0u);
      __threadfence();
      atomicAdd(gen, 1u);
    } else {
      while (atomicAdd(gen, 0u) == g) __nanosleep(20);
    }
    __threadfence();
  }
  __syncthreads();
}

// The block's contiguous share [r0, r1) of a phase's rows.
__device__ __forceinline__ void share(int rows, int& r0, int& r1) {
  r0 = int(int64_t(rows) * blockIdx.x / gridDim.x);
  r1 = int(int64_t(rows) * (blockIdx.x + 1) / gridDim.x);
}

__device__ void prefetch_rows(const Phase& p) {
  int r0, r1;
  share(p.rows, r0, r1);
  const char* base = reinterpret_cast<const char*>(p.w + size_t(r0) * p.in);
  const uint64_t bytes = uint64_t(r1 - r0) * p.in * 2;
  constexpr uint64_t kPiece = 32 << 10;
  for (uint64_t off = uint64_t(threadIdx.x) * kPiece; off < bytes; off += uint64_t(blockDim.x) * kPiece) {
    const uint32_t n = uint32_t(bytes - off < kPiece ? bytes - off : kPiece) & ~15u;
    if (n)
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(reinterpret_cast<uint64_t>(base + off)), "r"(n)
                   : "memory");
  }
}

// steps: the layers' phases in order; kind[i] 0 = weight phase phases[wi++], 1 = copy copies[ci++].
struct Program {
  const Phase* phases;
  const Copy* copies;
  const int* kind;
  int steps, nphases;
  bool prefetch;
  unsigned* barrier;  // [count, gen]
};

__global__ void __launch_bounds__(1024) persistent_kernel(Program prog) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  int wi = 0, ci = 0;
  for (int s = 0; s < prog.steps; ++s) {
    if (prog.kind[s] == 0) {
      const Phase p = prog.phases[wi++];
      // the next weight phase's rows of this block, requested before this phase's work
      if (prog.prefetch && wi < prog.nphases) prefetch_rows(prog.phases[wi]);
      int r0, r1;
      share(p.rows, r0, r1);
      for (int row = r0 + warp; row < r1; row += warps) gemv_row<true>(p, row, lane);
    } else {
      const Copy c = prog.copies[ci++];
      if (blockIdx.x == 0)
        for (int i = threadIdx.x; i < c.n; i += blockDim.x) c.dst[i] = c.src[i];
    }
    grid_barrier(prog.barrier, prog.barrier + 1);
  }
}

}  // namespace

int run(int argc, char** argv) {
  int layers = 48, latency = 5, per_sm = 1, reps = 20, threads = 1024;
  bool prefetch = true, weights = true;
  double bw_gbs = 0.0;
  for (int i = 1; i < argc; ++i) {
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "error: %s needs a value\n", argv[i]);
        std::exit(2);
      }
      return argv[++i];
    };
    if (!std::strcmp(argv[i], "--layers")) layers = std::atoi(next());
    else if (!std::strcmp(argv[i], "--latency-phases")) latency = std::atoi(next());
    else if (!std::strcmp(argv[i], "--blocks-per-sm")) per_sm = std::atoi(next());
    else if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(next());
    else if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(next());
    else if (!std::strcmp(argv[i], "--bw")) bw_gbs = std::atof(next());
    else if (!std::strcmp(argv[i], "--no-prefetch")) prefetch = false;
    else if (!std::strcmp(argv[i], "--no-weights")) weights = false;
    else {
      std::fprintf(stderr,
                   "usage: %s [--layers 48] [--latency-phases 5] [--blocks-per-sm 1] [--threads 1024] [--reps 20] "
                   "[--bw GB/s] [--no-prefetch] [--no-weights]\n",
                   argv[0]);
      return 2;
    }
  }
  if (layers < 1 || latency < 0 || per_sm < 1 || reps < 1 || threads < 32 || threads > 1024 || threads % 32 ||
      (!weights && latency < 1)) {
    std::fprintf(stderr, "error: sizes must be positive, --threads a multiple of 32 up to 1024 (--no-weights: at least one latency phase)\n");
    return 2;
  }
  const int H = 2048;
  struct Shape {
    int rows, in;
  };
  const Shape shapes[4] = {{5120, 2048}, {2048, 4096}, {12288, 2048}, {2048, 6144}};
  size_t per_layer = 0;
  for (const Shape& s : shapes) per_layer += size_t(s.rows) * s.in;
  __nv_bfloat16* w = nullptr;
  CHECK(cudaMalloc(&w, per_layer * layers * 2));
  {  // uniform ±sqrt(3 / in): each GEMV keeps the vector's scale through all the layers
    size_t off = 0;
    for (int l = 0; l < layers; ++l)
      for (const Shape& sh : shapes) {
        const size_t n = size_t(sh.rows) * sh.in;
        moex::model::cuda::launch_fill_random(w + off, 2, int64_t(n), 7 + off, std::sqrt(3.0f / float(sh.in)), 0.0f,
                                              nullptr);
        off += n;
      }
  }
  // vectors: x (H), y0 (5120), y1 (H), y2 (12288), y3 (H) per layer chained; latency copies on a scratch
  float *v = nullptr, *scratch = nullptr;
  const size_t vec = size_t(layers) * (5120 + H + 12288 + H) + H;
  CHECK(cudaMalloc(&v, vec * 4));
  CHECK(cudaMalloc(&scratch, 2 * H * 4));
  std::vector<float> x0(H);
  for (int i = 0; i < H; ++i) x0[i] = std::sin(0.37f * float(i));
  CHECK(cudaMemcpy(v, x0.data(), H * 4, cudaMemcpyHostToDevice));

  std::vector<Phase> phases;
  std::vector<Copy> copies;
  std::vector<int> kind;
  const __nv_bfloat16* wl = w;
  float* cur = v;  // input vector of the next phase
  float* free_v = v + H;
  for (int l = 0; l < layers; ++l) {
    for (int s = 0; s < 4; ++s) {
      if (weights) {
        Phase p{wl, shapes[s].rows, shapes[s].in, cur, free_v};
        phases.push_back(p);
        kind.push_back(0);
        cur = free_v;
        free_v += shapes[s].rows;
      }
      wl += size_t(shapes[s].rows) * shapes[s].in;
      // latency stand-ins after the weight phases: qkv_post + attention after qkv, norm + router
      // after o, the next layer's input norm after down
      const int after_qkv = std::min(latency, 2), after_o = std::min(latency - after_qkv, 2);
      const int here = s == 0 ? after_qkv : s == 1 ? after_o : s == 3 ? latency - after_qkv - after_o : 0;
      for (int k = 0; k < here; ++k) {
        copies.push_back({scratch + (k & 1) * H, scratch + ((k + 1) & 1) * H, H});
        kind.push_back(1);
      }
    }
  }
  // the graph
  cudaStream_t st;
  CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  {
    size_t wi = 0, ci = 0;
    for (int k : kind) {
      if (k == 0) {
        const Phase& p = phases[wi++];
        gemv_phase_kernel<<<(p.rows + kWarpsGraph - 1) / kWarpsGraph, kWarpsGraph * 32, 0, st>>>(p);
      } else {
        copy_kernel<<<1, 256, 0, st>>>(copies[ci++]);
      }
    }
  }
  CHECK(cudaStreamEndCapture(st, &graph));
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  // the persistent program
  Phase* dph;
  Copy* dcp;
  int* dk;
  unsigned* bar;
  CHECK(cudaMalloc(&dph, (phases.size() + 1) * sizeof(Phase)));
  CHECK(cudaMalloc(&dcp, (copies.size() + 1) * sizeof(Copy)));
  CHECK(cudaMalloc(&dk, kind.size() * sizeof(int)));
  CHECK(cudaMalloc(&bar, 2 * sizeof(unsigned)));
  CHECK(cudaMemset(bar, 0, 2 * sizeof(unsigned)));
  if (!phases.empty()) CHECK(cudaMemcpy(dph, phases.data(), phases.size() * sizeof(Phase), cudaMemcpyHostToDevice));
  if (!copies.empty()) CHECK(cudaMemcpy(dcp, copies.data(), copies.size() * sizeof(Copy), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dk, kind.data(), kind.size() * sizeof(int), cudaMemcpyHostToDevice));
  int dev = 0, sms = 0, resident = 0;
  CHECK(cudaGetDevice(&dev));
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, persistent_kernel, threads, 0));
  if (resident < per_sm) {
    std::fprintf(stderr, "error: only %d blocks of %d threads fit on an SM (asked %d)\n", resident, threads, per_sm);
    return 1;
  }
  Program prog{dph, dcp, dk, int(kind.size()), int(phases.size()), prefetch, bar};
  const unsigned grid = unsigned(sms * per_sm);

  auto time_it = [&](auto launch) {
    launch();
    CHECK(cudaStreamSynchronize(st));
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    CHECK(cudaEventRecord(a, st));
    for (int r = 0; r < reps; ++r) launch();
    CHECK(cudaEventRecord(b, st));
    CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    return double(ms) * 1e3 / reps / layers;  // µs per layer
  };
  std::vector<float> out_graph(H), out_pers(H);
  const double us_graph = time_it([&] { CHECK(cudaGraphLaunch(exec, st)); });
  if (weights) {
    CHECK(cudaMemcpy(out_graph.data(), phases.back().y, H * 4, cudaMemcpyDeviceToHost));
    CHECK(cudaMemset(phases.back().y, 0, H * 4));
  }
  const double us_pers = time_it([&] {
    persistent_kernel<<<grid, threads, 0, st>>>(prog);
    CHECK(cudaGetLastError());
  });
  if (!weights) {  // the cost of one dependent step: a graph node against a grid barrier
    std::printf("# decode probe without weights: %d layers x %d latency steps\n", layers, latency);
    std::printf("graph       %6.2f us per step (a one-block kernel node)\n", us_graph / latency);
    std::printf("persistent  %6.2f us per step (%u blocks of %d threads, a grid barrier)\n", us_pers / latency, grid,
                threads);
    return 0;
  }
  CHECK(cudaMemcpy(out_pers.data(), phases.back().y, H * 4, cudaMemcpyDeviceToHost));
  double num = 0, den = 0;
  for (int i = 0; i < H; ++i) {
    num += double(out_pers[i] - out_graph[i]) * (out_pers[i] - out_graph[i]);
    den += double(out_graph[i]) * out_graph[i];
  }
  const double rel = std::sqrt(num / (den > 0 ? den : 1));
  bool finite = true;
  for (int i = 0; i < H; ++i) finite = finite && std::isfinite(out_graph[i]) && std::isfinite(out_pers[i]);
  if (!finite) {
    std::fprintf(stderr, "error: non-finite final vector\n");
    return 1;
  }
  if (bw_gbs <= 0) bw_gbs = moex::model::measure_copy_bandwidth(moex::Device::cuda(dev)) / 1e9;
  const double floor_us = double(per_layer) * 2 / (bw_gbs * 1e9) * 1e6;
  std::printf("# decode layer probe: %d layers, %.1f MB of weights per layer, %d latency phases per layer, "
              "copy rate %.0f GB/s -> floor %.1f us per layer\n",
              layers, per_layer * 2 / 1e6, latency, bw_gbs, floor_us);
  std::printf("graph (a kernel per phase)        %7.1f us per layer  %.2fx floor\n", us_graph, us_graph / floor_us);
  std::printf("persistent (%3u blocks, prefetch %s) %7.1f us per layer  %.2fx floor\n", grid, prefetch ? "on " : "off",
              us_pers, us_pers / floor_us);
  std::printf("final vectors: rel L2 %.2e\n", rel);
  return rel <= 1e-5 ? 0 : 1;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {  // moex's launch checks and the copy-rate measurement throw
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
