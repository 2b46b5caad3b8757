// backends/cuda/routing_plan.cu — the routing plan on the device: a counting sort of the S = T*K
// token–expert pairs by expert (histogram, scan, scatter), per-expert offsets, the inverse
// permutation (pair -> sorted row or -1) and the M-tile table the grouped GEMMs read.
//
// Everything runs on the caller's stream with sizes fixed by T, K, E: no host synchronisation,
// so batched/grouped forwards can be captured in a CUDA graph and replayed with new routing.
//
// NOTE: the scatter reserves row ranges with warp-aggregated atomics, so the order of pairs
// inside one expert's block can differ from run to run. Results do not: every sorted row is
// computed on its own with the same arithmetic wherever it lands, and the final reduction over
// the K slots reads rows through pair_to_row in slot order.
#include <vector>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/plan_probe.hpp"

namespace moex::cuda {

namespace {

constexpr int kScanThreads = 1024;

__device__ __forceinline__ unsigned lanemask_lt() {
  unsigned m;
  asm("mov.u32 %0, %%lanemask_lt;" : "=r"(m));
  return m;
}

// counts[e] += pairs of expert e. One atomic per (warp, expert).
__global__ void plan_histogram(const void* idx, bool idx64, int64_t S, int E, int* counts) {
  const int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  int key = -1;
  if (p < S) {
    const int64_t e = load_index(idx, idx64, p);
    if (e >= 0 && e < E) key = int(e);
  }
  const unsigned peers = __match_any_sync(0xffffffffu, key);
  const int lane = threadIdx.x & 31;
  if (key >= 0 && lane == __ffs(peers) - 1) atomicAdd(&counts[key], __popc(peers));
}

// One block: offsets = exclusive scan of counts, cursors, M-tile offsets and the tile table.
//
// Tile order. Plain (paired = false): expert by expert, each expert's tiles in row order. Paired:
// first every expert's tiles but its last one of an odd count ("pair region", expert by expert, so
// that tiles 2p and 2p + 1 always belong to one expert), then those odd last tiles ("singles"). The
// 2-CTA cluster kernels of the TMA grouped GEMM take the m tiles 2p and 2p + 1 as a pair and load a
// weight tile once for both when they share the expert: in the paired order every pair of the pair
// region does, where in the plain order a pair straddles two experts whenever an expert starts at
// an odd tile (deepseek_v3 at T = 4096: ~1.5 tiles per expert, a third of the pairs shared).
__global__ void __launch_bounds__(kScanThreads) plan_scan(DevicePlan plan, int E, bool paired) {
  extern __shared__ int tile_off[];  // [2 (E + 1)]: pair-region offsets, then the singles' offsets
  int* single_off = tile_off + (E + 1);
  __shared__ int part_rows[kScanThreads], part_tiles[kScanThreads], part_single[kScanThreads];
  const int tid = threadIdx.x;
  const int per = (E + kScanThreads - 1) / kScanThreads;
  const int e0 = min(E, tid * per), e1 = min(E, e0 + per);
  // the tiles of expert e in the pair region / among the singles
  auto region_tiles = [&](int c, int& in_pairs, int& single) {
    const int t = (c + plan.tile_m - 1) / plan.tile_m;
    single = paired ? (t & 1) : 0;
    in_pairs = t - single;
  };
  int rows = 0, tiles = 0, singles = 0;
  for (int e = e0; e < e1; ++e) {
    const int c = plan.counts[e];
    int tp, ts;
    region_tiles(c, tp, ts);
    rows += c;
    tiles += tp;
    singles += ts;
  }
  part_rows[tid] = rows;
  part_tiles[tid] = tiles;
  part_single[tid] = singles;
  __syncthreads();
  // inclusive Hillis–Steele scan of the per-thread partial sums
  for (int d = 1; d < kScanThreads; d <<= 1) {
    int r = 0, t = 0, u = 0;
    if (tid >= d) {
      r = part_rows[tid - d];
      t = part_tiles[tid - d];
      u = part_single[tid - d];
    }
    __syncthreads();
    part_rows[tid] += r;
    part_tiles[tid] += t;
    part_single[tid] += u;
    __syncthreads();
  }
  int row = tid ? part_rows[tid - 1] : 0, tile = tid ? part_tiles[tid - 1] : 0, single = tid ? part_single[tid - 1] : 0;
  for (int e = e0; e < e1; ++e) {
    const int c = plan.counts[e];
    int tp, ts;
    region_tiles(c, tp, ts);
    plan.offsets[e] = row;
    plan.cursor[e] = row;
    tile_off[e] = tile;
    single_off[e] = single;
    row += c;
    tile += tp;
    single += ts;
  }
  if (tid == kScanThreads - 1) {
    plan.offsets[E] = part_rows[tid];
    tile_off[E] = part_tiles[tid];
    single_off[E] = part_single[tid];
  }
  if (tid == 0) {  // the grouped GEMM's work counter starts each forward at zero
    plan.sched[0] = 0;
    plan.sched[1] = 0;
  }
  __syncthreads();
  const int in_pairs = tile_off[E], total = in_pairs + single_off[E];
  for (int t = tid; t < plan.max_tiles; t += kScanThreads) {
    int4 info = make_int4(-1, 0, 0, 0);
    if (t < total) {
      // the last e with off[e] <= u (its block in that region is non-empty)
      const int* off = t < in_pairs ? tile_off : single_off;
      const int u = t < in_pairs ? t : t - in_pairs;
      int lo = 0, hi = E - 1;
      while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (off[mid] <= u) lo = mid; else hi = mid - 1;
      }
      const int e = lo;
      // the tile's index within its expert: its place in the pair region, or the expert's last tile
      const int j = t < in_pairs ? u - tile_off[e] : tile_off[e + 1] - tile_off[e];
      const int begin = plan.offsets[e] + j * plan.tile_m;
      const int end = min(begin + plan.tile_m, plan.offsets[e] + plan.counts[e]);
      info = make_int4(e, begin, end, 0);
    }
    plan.tiles[t] = info;
  }
}

__global__ void plan_scatter(const void* idx, bool idx64, int64_t S, int E, DevicePlan plan) {
  const int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  int key = -1;
  if (p < S) {
    const int64_t e = load_index(idx, idx64, p);
    if (e >= 0 && e < E) key = int(e);
  }
  const unsigned peers = __match_any_sync(0xffffffffu, key);
  const int lane = threadIdx.x & 31;
  const int leader = __ffs(peers) - 1;
  int base = 0;
  if (key >= 0 && lane == leader) base = atomicAdd(&plan.cursor[key], __popc(peers));
  base = __shfl_sync(0xffffffffu, base, leader);
  if (p < S) {
    if (key >= 0) {
      const int row = base + __popc(peers & lanemask_lt());
      plan.sorted_pairs[row] = int(p);
      plan.pair_to_row[p] = row;
    } else {
      plan.pair_to_row[p] = -1;
    }
  }
}

}  // namespace

size_t plan_workspace_bytes(int64_t S, int64_t E, int64_t tile_m) {
  using W = WorkspaceCarver;
  return W::round_up(size_t(E) * 4) * 2 + W::round_up(size_t(E + 1) * 4) + W::round_up(size_t(S) * 4) * 2 +
         W::round_up(size_t(max_m_tiles(S, E, tile_m)) * sizeof(int4)) + W::round_up(2 * sizeof(int));
}

DevicePlan carve_plan(WorkspaceCarver& ws, int64_t S, int64_t E, int64_t tile_m) {
  DevicePlan p{};
  p.counts = ws.take<int>(size_t(E));
  p.cursor = ws.take<int>(size_t(E));
  p.offsets = ws.take<int>(size_t(E + 1));
  p.sorted_pairs = ws.take<int>(size_t(S));
  p.pair_to_row = ws.take<int>(size_t(S));
  p.max_tiles = int(max_m_tiles(S, E, tile_m));
  p.tiles = ws.take<int4>(size_t(p.max_tiles));
  p.tile_m = int(tile_m);
  p.sched = ws.take<int>(2);
  p.pair_aligned = false;
  return p;
}

void build_plan(const DevicePlan& plan, const void* idx, bool idx64, int64_t S, int64_t E, cudaStream_t stream) {
  MOEX_CHECK(S < (int64_t(1) << 31) - 1024, "CUDA routing plan: T*K = {} pairs exceeds 2^31", S);
  check(cudaMemsetAsync(plan.counts, 0, size_t(E) * sizeof(int), stream), "cudaMemsetAsync (routing plan)");
  const unsigned blocks = unsigned(ceil_div(S, 256));
  plan_histogram<<<blocks, 256, 0, stream>>>(idx, idx64, S, int(E), plan.counts);
  check_launch("plan_histogram");
  const size_t smem = 2 * size_t(E + 1) * sizeof(int);
  if (smem > 48 * 1024) {
    static thread_local size_t raised = 0;  // per thread, cheap; the attribute is per device+function
    if (raised < smem) {
      check(cudaFuncSetAttribute(plan_scan, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)), "cudaFuncSetAttribute");
      raised = smem;
    }
  }
  plan_scan<<<1, kScanThreads, smem, stream>>>(plan, int(E), plan.pair_aligned);
  check_launch("plan_scan");
  plan_scatter<<<blocks, 256, 0, stream>>>(idx, idx64, S, int(E), plan);
  check_launch("plan_scatter");
}

PlanProbe probe_device_plan(const std::vector<int32_t>& top_k_index, int64_t E, int64_t tile_m, bool paired) {
  const int64_t S = int64_t(top_k_index.size());
  const size_t ws_bytes = plan_workspace_bytes(S, E, tile_m) + size_t(S) * 4 + 256;
  void* ws_mem = nullptr;
  check(cudaMalloc(&ws_mem, ws_bytes), "cudaMalloc (plan probe)");
  PlanProbe out;
  try {
    WorkspaceCarver ws(ws_mem, ws_bytes);
    int* idx = ws.take<int>(size_t(std::max<int64_t>(S, 1)));
    DevicePlan plan = carve_plan(ws, S, E, tile_m);
    plan.pair_aligned = paired;
    if (S > 0) check(cudaMemcpy(idx, top_k_index.data(), size_t(S) * 4, cudaMemcpyHostToDevice), "cudaMemcpy (plan probe)");
    build_plan(plan, idx, false, S, E, nullptr);
    std::vector<int4> tiles(size_t(plan.max_tiles));
    out.offsets.resize(size_t(E + 1));
    check(cudaMemcpy(tiles.data(), plan.tiles, tiles.size() * sizeof(int4), cudaMemcpyDeviceToHost), "cudaMemcpy (plan probe)");
    check(cudaMemcpy(out.offsets.data(), plan.offsets, out.offsets.size() * 4, cudaMemcpyDeviceToHost), "cudaMemcpy (plan probe)");
    for (const int4& t : tiles) out.tiles.push_back({t.x, t.y, t.z});
  } catch (...) {
    cudaFree(ws_mem);
    throw;
  }
  cudaFree(ws_mem);
  return out;
}

}  // namespace moex::cuda
