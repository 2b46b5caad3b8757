// bench/stream_probe.cu — how fast can the FP8 decode kernels' weight stream be, by request shape,
// measured before changing the weight layout (docs/PERF.md, "For the next session (fiftieth)").
//
// The FP8 decode path at T = 1 (src/backends/cuda/quant_decode.cu) streams each routed expert's codes
// once: decode_up reads 8 experts × [1536, 2048] e4m3 on qwen3_30b_a3b (25.2 MB), decode_down
// 8 × [2048, 768] (12.6 MB). Each warp owns a 16-row tile × a k slice of 128-code blocks, blocks of 8
// warps, two blocks per SM. Alone, each kernel streams near 1.5 TB/s on an H100 (ncu) — this probe
// times pure readers with exactly that work split and only the request shape changed:
//   tma2d  N    the decode ring today: per stage two TMA boxes of 8 rows × N·128 codes of the row-major
//               [rows, K] matrix (N = 1: the forty-eighth session's boxes, N = 2: today's default; a box
//               holds at most 256 elements per dimension, so N <= 2)
//   bulk   N    the tile-contiguous layout [rows/16][K/128][16][128] (each 16 × 128 tile 2 KB in a row):
//               per stage one 1-D cp.async.bulk of N tiles (N·2 KB contiguous)
//   ldg         the register ring before the TMA ring: each lane loads its 64 bytes of every k block
//               (four 16-byte loads) three k blocks ahead
// Every form reads each byte once into shared memory / registers and folds it into one word per warp
// (written out, so nothing is optimised away). The matrices are rotated over enough copies that every
// launch reads from DRAM (not L2). Prints µs per launch (back-to-back launches, mean), GB/s, and the
// median of 21 single launches on an idle GPU (events around one launch: its ramp-up and tail included).
//
//   moex_stream_probe [--rows 12288] [--k 2048] [--ks 2] [--stages-kb 4] [--reps 200] [--blocks-per-sm 2]
// Exit status 0 when every form folded the same word (they read the same bytes), 1 otherwise.
#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backends/cuda/sm90_tma_launch.cuh"  // encode_fn
#include "backends/cuda/tma_ptx.cuh"
#include "cuda_check.hpp"  // CHECK

namespace {

constexpr int kWarps = 8;        // warps per block (decode_up's)
constexpr int kTileBytes = 2048;  // a 16-row × 128-code tile

struct Work {
  const uint8_t* w;  // [rows, K] row-major (tma2d, ldg) or [rows/16][K/128][16][128] (bulk)
  int rows, K;
  int ks;            // k slices per 16-row tile
  int stages_kb;     // k blocks in flight per warp (ring)
  uint32_t* out;     // one word per warp
};

// The warp's (tile, k slice) and its k blocks [kb0, kb1).
struct Slice {
  int tile, kb0, kb1;
};
__device__ Slice slice_of(const Work& w) {
  const int warp = blockIdx.x * kWarps + (threadIdx.x >> 5);
  const int kblocks = w.K / 128, per = (kblocks + w.ks - 1) / w.ks;
  Slice s;
  s.tile = warp / w.ks;
  s.kb0 = (warp % w.ks) * per;
  s.kb1 = s.kb0 + per < kblocks ? s.kb0 + per : kblocks;
  if (s.tile >= w.rows / 16) s.kb1 = s.kb0;  // past the matrix: nothing
  return s;
}

__device__ __forceinline__ uint32_t fold(uint4 v) { return v.x ^ (v.y * 3u) ^ (v.z * 5u) ^ (v.w * 7u); }

extern __shared__ __align__(1024) uint8_t smem[];

__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Ring forms. KBS k blocks per stage; BULK: the tile-contiguous layout, else TMA boxes of the row-major
// matrix (two boxes of 8 rows × KBS·128 codes: rows 0-7 at 0, 8-15 at half the stage).
template <int KBS, bool BULK>
__global__ void __launch_bounds__(kWarps * 32) ring_reader(const __grid_constant__ CUtensorMap map, Work w) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const Slice s = slice_of(w);
  const int n = w.stages_kb / KBS;  // stages
  constexpr int kStage = KBS * kTileBytes;
  uint8_t* stages = smem + warp * n * kStage;
  const uint32_t bars = uint32_t(__cvta_generic_to_shared(smem + kWarps * n * kStage)) + 8 * warp * n;
  if (lane == 0) {
    for (int i = 0; i < n; ++i) moex::cuda::tma::mbar_init(bars + 8 * i, 1);
    moex::cuda::tma::mbar_fence_init();
  }
  __syncwarp();
  const int kblocks = w.K / 128;
  auto issue = [&](int st, int kb) {
    const uint32_t bar = bars + 8 * st, dst = uint32_t(__cvta_generic_to_shared(stages + st * kStage));
    const int nkb = kb + KBS <= s.kb1 ? KBS : s.kb1 - kb;  // a slice's last stage may be short (bulk)
    if constexpr (BULK) {
      moex::cuda::tma::mbar_arrive_expect_tx(bar, uint32_t(nkb * kTileBytes));
      bulk_load(dst, w.w + (size_t(s.tile) * kblocks + kb) * kTileBytes, uint32_t(nkb * kTileBytes), bar);
    } else {
      moex::cuda::tma::mbar_arrive_expect_tx(bar, uint32_t(kStage));  // boxes past K are zero-filled
      moex::cuda::tma::tma_load_2d(dst, &map, bar, kb * 128, s.tile * 16);
      moex::cuda::tma::tma_load_2d(dst + kStage / 2, &map, bar, kb * 128, s.tile * 16 + 8);
    }
  };
  if (lane == 0)
    for (int i = 0; i < n && s.kb0 + i * KBS < s.kb1; ++i) issue(i, s.kb0 + i * KBS);
  uint32_t acc = 0, phase = 0;
  int slot = 0;
  for (int kb = s.kb0; kb < s.kb1; kb += KBS) {
    moex::cuda::tma::mbar_wait(bars + 8 * slot, phase);
    const uint8_t* st = stages + slot * kStage;
    const int nkb = kb + KBS <= s.kb1 ? KBS : s.kb1 - kb;
    for (int c = lane; c < kStage / 16; c += 32) {
      // the chunk's k block within the stage: blocks past the slice's end (a short last stage) are not its own
      const int o = 16 * c, kbi = BULK ? o / kTileBytes : (o % (kStage / 2)) % (KBS * 128) / 128;
      if (kbi < nkb) acc ^= fold(reinterpret_cast<const uint4*>(st)[c]);
    }
    __syncwarp();
    if (lane == 0 && kb + n * KBS < s.kb1) {
      fence_proxy_async();
      issue(slot, kb + n * KBS);
    }
    if (++slot == n) {
      slot = 0;
      phase ^= 1u;
    }
  }
  for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0) w.out[blockIdx.x * kWarps + warp] = acc;
#endif
}

// The register ring: lane (g = lane / 4, q = lane % 4) loads chunks q and 4 + q of rows g and g + 8 of each
// k block (the decode kernels' lanes), DEPTH k blocks ahead.
template <int DEPTH>
__global__ void __launch_bounds__(kWarps * 32) ldg_reader(Work w) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const Slice s = slice_of(w);
  uint32_t acc = 0;
  auto ld = [&](int kb, int row, int chunk) {
    uint4 v;
    const uint8_t* p = w.w + size_t(s.tile * 16 + row) * w.K + kb * 128 + chunk * 16;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
  };
  uint4 ring[DEPTH][4];
#pragma unroll
  for (int i = 0; i < DEPTH; ++i)
    if (s.kb0 + i < s.kb1) {
      ring[i][0] = ld(s.kb0 + i, g, q);
      ring[i][1] = ld(s.kb0 + i, g, 4 + q);
      ring[i][2] = ld(s.kb0 + i, g + 8, q);
      ring[i][3] = ld(s.kb0 + i, g + 8, 4 + q);
    }
  for (int kb = s.kb0; kb < s.kb1; kb += DEPTH) {
#pragma unroll
    for (int i = 0; i < DEPTH; ++i) {
      if (kb + i < s.kb1) {
        acc ^= fold(ring[i][0]) ^ fold(ring[i][1]) ^ fold(ring[i][2]) ^ fold(ring[i][3]);
        if (kb + i + DEPTH < s.kb1) {
          ring[i][0] = ld(kb + i + DEPTH, g, q);
          ring[i][1] = ld(kb + i + DEPTH, g, 4 + q);
          ring[i][2] = ld(kb + i + DEPTH, g + 8, q);
          ring[i][3] = ld(kb + i + DEPTH, g + 8, 4 + q);
        }
      }
    }
  }
  for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0) w.out[blockIdx.x * kWarps + warp] = acc;
}

// [rows, K] row-major → [rows/16][K/128][16][128] (the bulk form's layout).
__global__ void to_tiles(const uint8_t* src, uint8_t* dst, int rows, int K) {
  const size_t n = size_t(rows) * K;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const int r = int(i / K), k = int(i % K);
    dst[((size_t(r / 16) * (K / 128) + k / 128) * 16 + r % 16) * 128 + k % 128] = src[i];
  }
}
__global__ void fill(uint8_t* p, size_t n, uint32_t seed) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t x = uint32_t(i) * 2654435761u ^ seed;
    x ^= x >> 13;
    x *= 0x5bd1e995u;
    p[i] = uint8_t(x >> 24);
  }
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
      std::printf("usage: moex_stream_probe [--rows 12288] [--k 2048] [--ks 2] [--stages-kb 4] [--reps 200] "
                  "[--blocks-per-sm 2]\n");
      return 0;
    }
  const int rows = arg(argc, argv, "--rows", 12288), K = arg(argc, argv, "--k", 2048);
  const int ks = arg(argc, argv, "--ks", 2), stages_kb = arg(argc, argv, "--stages-kb", 4);
  const int reps = arg(argc, argv, "--reps", 200), per_sm = arg(argc, argv, "--blocks-per-sm", 2);
  if (rows % 16 || K % 128 || ks < 1 || stages_kb < 1 || stages_kb > 8) {
    std::fprintf(stderr, "error: --rows must be a multiple of 16, --k of 128; --ks >= 1; --stages-kb in 1..8\n");
    return 2;
  }
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  if (prop.major < 9) {
    std::fprintf(stderr, "error: needs compute capability 9.0 (TMA), found %d.%d\n", prop.major, prop.minor);
    return 2;
  }
  const size_t bytes = size_t(rows) * K;
  // enough copies that the L2 never holds the next launch's matrix
  const int copies = int(std::max<size_t>(4, (3 * size_t(prop.l2CacheSize)) / bytes + 2));
  std::vector<uint8_t*> plain(copies), tiled(copies);
  for (int c = 0; c < copies; ++c) {
    CHECK(cudaMalloc(&plain[c], bytes));
    CHECK(cudaMalloc(&tiled[c], bytes));
    fill<<<1024, 256>>>(plain[c], bytes, 0x9e3779b9u);  // the same bytes in every copy
    to_tiles<<<1024, 256>>>(plain[c], tiled[c], rows, K);
  }
  const int warps = rows / 16 * ks, blocks = (warps + kWarps - 1) / kWarps;
  uint32_t* out;
  CHECK(cudaMalloc(&out, size_t(blocks) * kWarps * sizeof(uint32_t)));
  CHECK(cudaDeviceSynchronize());

  const auto encode = moex::cuda::tma::encode_fn();  // the library's lookup of cuTensorMapEncodeTiled
  if (!encode) {
    std::fprintf(stderr, "error: the driver has no cuTensorMapEncodeTiled\n");
    return 2;
  }
  auto map_for = [&](const uint8_t* base, int kbs) {
    CUtensorMap m{};
    const cuuint64_t dims[2] = {cuuint64_t(K), cuuint64_t(rows)}, strides[1] = {cuuint64_t(K)};
    const cuuint32_t box[2] = {cuuint32_t(128 * kbs), 8}, estr[2] = {1, 1};
    if (encode(&m, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<uint8_t*>(base), dims, strides, box, estr,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
      std::fprintf(stderr, "error: cuTensorMapEncodeTiled failed\n");
      std::exit(1);
    }
    return m;
  };

  std::printf("# %s, %d SMs, L2 %d MB; matrix [%d, %d] = %.1f MB, %d copies; %d warps (%d blocks of %d), ks %d, "
              "%d k blocks in flight per warp, %d blocks per SM requested\n",
              prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20, rows, K, bytes / 1e6, copies, warps, blocks,
              kWarps, ks, stages_kb, per_sm);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // rows in order with an error on stderr
  std::printf("%-10s %10s %10s %12s %12s\n", "form", "us/launch", "GB/s", "us single", "fold");
  uint32_t want = 0;
  bool first = true, same = true;
  auto run = [&](const char* name, auto launch) {
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    for (int i = 0; i < 2 * copies; ++i) launch(i % copies);  // warm-up
    CHECK(cudaEventRecord(a));
    for (int i = 0; i < reps; ++i) launch(i % copies);
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    CHECK(cudaGetLastError());
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    std::vector<float> one;  // single launches after an idle GPU: ramp-up and tail included
    for (int i = 0; i < 21; ++i) {
      CHECK(cudaDeviceSynchronize());
      CHECK(cudaEventRecord(a));
      launch(i % copies);
      CHECK(cudaEventRecord(b));
      CHECK(cudaEventSynchronize(b));
      float t = 0;
      CHECK(cudaEventElapsedTime(&t, a, b));
      one.push_back(t);
    }
    std::sort(one.begin(), one.end());
    std::vector<uint32_t> h(size_t(blocks) * kWarps);
    CHECK(cudaMemcpy(h.data(), out, h.size() * sizeof(uint32_t), cudaMemcpyDeviceToHost));
    uint32_t f = 0;
    for (uint32_t v : h) f ^= v;
    if (first) want = f;
    first = false;
    same = same && f == want;
    const double us = 1e3 * ms / reps;
    std::printf("%-10s %10.2f %10.0f %12.2f %12u%s\n", name, us, bytes / us / 1e3, 1e3 * one[10], f,
                f == want ? "" : "  (differs)");
    CHECK(cudaEventDestroy(a));
    CHECK(cudaEventDestroy(b));
  };
  // shared memory that leaves per_sm blocks per SM (the decode kernels' two)
  const int pad_smem = int(prop.sharedMemPerMultiprocessor / per_sm) - 2048;
  auto ring = [&](auto kernel, int kbs, bool bulk, const char* name) {
    const int n = stages_kb / kbs;
    if (n < 1) return;
    const int need = kWarps * n * kbs * kTileBytes + kWarps * n * 8;
    const int smem = std::max(need, std::min(pad_smem, int(prop.sharedMemPerBlockOptin)));
    CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    std::vector<CUtensorMap> maps(copies);  // the bulk forms read no map
    if (!bulk)
      for (int c = 0; c < copies; ++c) maps[c] = map_for(plain[c], kbs);
    run(name, [&](int c) {
      Work w{bulk ? tiled[c] : plain[c], rows, K, ks, stages_kb, out};
      kernel<<<blocks, kWarps * 32, smem>>>(maps[c], w);
    });
  };
  ring(ring_reader<1, false>, 1, false, "tma2d 1");
  ring(ring_reader<2, false>, 2, false, "tma2d 2");
  ring(ring_reader<1, true>, 1, true, "bulk 1");
  ring(ring_reader<2, true>, 2, true, "bulk 2");
  ring(ring_reader<4, true>, 4, true, "bulk 4");
  ring(ring_reader<8, true>, 8, true, "bulk 8");
  {
    const int smem = std::min(pad_smem, int(prop.sharedMemPerBlockOptin));
    CHECK(cudaFuncSetAttribute(ldg_reader<3>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    run("ldg 3", [&](int c) { ldg_reader<3><<<blocks, kWarps * 32, smem>>>(Work{plain[c], rows, K, ks, stages_kb, out}); });
  }
  for (int c = 0; c < copies; ++c) {
    CHECK(cudaFree(plain[c]));
    CHECK(cudaFree(tiled[c]));
  }
  CHECK(cudaFree(out));
  if (!same) std::fprintf(stderr, "error: the forms folded different words\n");
  return same ? 0 : 1;
}
