// backends/cuda/routing_plan.cu — the routing plan on the device: a counting sort of the S = T*K
// token–expert pairs by expert (histogram, scan, scatter), per-expert offsets, the inverse
// permutation (pair -> sorted row or -1) and the M-tile table the grouped GEMMs read.
//
// Everything runs on the caller's stream with sizes fixed by T, K, E: no host synchronisation,
// so batched/grouped forwards can be captured in a CUDA graph and replayed with new routing.
//
// NOTE: the scatter reserves row ranges with atomics (per block and expert, then per warp and
// expert inside the block), so the order of pairs inside one expert's block can differ from run to
// run. Results do not: every sorted row is
// computed on its own with the same arithmetic wherever it lands, and the final reduction over
// the K slots reads rows through pair_to_row in slot order.
#include <cstdlib>
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

// counts[e] += pairs of expert e. Each block counts a chunk of kChunk pairs in shared memory (one
// shared atomic per (warp, expert) per round), then adds its counts to the global ones: one global
// atomic per (block, expert) instead of one per (warp, expert), which put ~S/2 atomics on E
// addresses (H200, 2026-12-01, ncu: 14.7 us for qwen15_moe_a2_7b's 65 536 pairs, 34 us for
// deepseek_v3's 131 072). counts: E ints in shared memory (E <= kSmemExperts; more: plan_histogram_global).
constexpr int kPlanThreads = 512, kPairsPerThread = 4, kChunk = kPlanThreads * kPairsPerThread;
constexpr int kSmemExperts = 6144;  // 2 * E ints of the scatter within 48 KB of shared memory

__device__ __forceinline__ int valid_key(const void* idx, bool idx64, int64_t S, int E, int64_t p) {
  if (p >= S) return -1;
  const int64_t e = load_index(idx, idx64, p);
  return e >= 0 && e < E ? int(e) : -1;
}

__global__ void __launch_bounds__(kPlanThreads) plan_histogram(const void* idx, bool idx64, int64_t S, int E, int* counts) {
  extern __shared__ int s_count[];  // [E]
  for (int e = threadIdx.x; e < E; e += kPlanThreads) s_count[e] = 0;
  __syncthreads();
  const int64_t base = int64_t(blockIdx.x) * kChunk;
  const int lane = threadIdx.x & 31;
  int key[kPairsPerThread];
#pragma unroll
  for (int j = 0; j < kPairsPerThread; ++j) key[j] = valid_key(idx, idx64, S, E, base + j * kPlanThreads + threadIdx.x);
#pragma unroll
  for (int j = 0; j < kPairsPerThread; ++j) {
    const unsigned peers = __match_any_sync(0xffffffffu, key[j]);
    if (key[j] >= 0 && lane == __ffs(peers) - 1) atomicAdd(&s_count[key[j]], __popc(peers));
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += kPlanThreads)
    if (s_count[e]) atomicAdd(&counts[e], s_count[e]);
}

// The same count for E > kSmemExperts: one global atomic per (warp, expert).
__global__ void plan_histogram_global(const void* idx, bool idx64, int64_t S, int E, int* counts) {
  const int key = valid_key(idx, idx64, S, E, int64_t(blockIdx.x) * blockDim.x + threadIdx.x);
  const unsigned peers = __match_any_sync(0xffffffffu, key);
  const int lane = threadIdx.x & 31;
  if (key >= 0 && lane == __ffs(peers) - 1) atomicAdd(&counts[key], __popc(peers));
}

// One block: offsets = exclusive scan of counts, cursors and the M-tile table.
//
// Tile order. Plain (paired = false): expert by expert, each expert's tiles in row order. Paired:
// the 2-CTA cluster kernels of the TMA grouped GEMM take the m tiles 2p and 2p + 1 as a pair and
// load a weight tile once for both when they share the expert, so the paired order keeps every
// expert's tiles in pairs: an expert with an even tile count is its pairs; the experts with an odd
// count are taken two at a time, A and B in expert order, as [A's pairs][A's last, B's last][B's
// pairs], so that the one mixed pair sits between the two experts' own tiles (both experts' weights
// are read within a few work items: L2 still holds them for the mixed pair); an odd one left over
// goes last. Layout: the odd experts' blocks, then the even experts, then the one left over. In the
// plain order a pair straddles two experts wherever an expert starts at an odd tile (deepseek_v3 at
// T = 4096, ~1.5 tiles per expert: a third of the pairs shared).
// The scan's body, for a block of kScanThreads threads: counts[e] (global or shared memory) are
// final. Writes offsets, cursor, the tile table and zeroes the work counter. Syncs.
__device__ __forceinline__ void plan_scan_body(const DevicePlan& plan, int E, bool paired, const int* counts) {
  // per-thread partial sums over the thread's experts: rows; tiles of odd-count / even-count
  // experts; odd-count experts
  __shared__ int part_rows[kScanThreads], part_odd_tiles[kScanThreads], part_even_tiles[kScanThreads],
      part_odd[kScanThreads];
  __shared__ int s_lone_tiles;  // paired: tiles of the odd expert left over (0: none)
  const int tid = threadIdx.x;
  const int per = (E + kScanThreads - 1) / kScanThreads;
  const int e0 = min(E, tid * per), e1 = min(E, e0 + per);
  auto tiles_of = [&](int c) { return (c + plan.tile_m - 1) / plan.tile_m; };
  int rows = 0, odd_tiles = 0, even_tiles = 0, odd = 0;
  for (int e = e0; e < e1; ++e) {
    const int c = counts[e], t = tiles_of(c);
    rows += c;
    if (t & 1) {
      odd_tiles += t;
      ++odd;
    } else {
      even_tiles += t;
    }
  }
  part_rows[tid] = rows;
  part_odd_tiles[tid] = odd_tiles;
  part_even_tiles[tid] = even_tiles;
  part_odd[tid] = odd;
  if (tid == 0) s_lone_tiles = 0;
  __syncthreads();
  // inclusive Hillis–Steele scan of the per-thread partial sums
  for (int d = 1; d < kScanThreads; d <<= 1) {
    int r = 0, ot = 0, et = 0, o = 0;
    if (tid >= d) {
      r = part_rows[tid - d];
      ot = part_odd_tiles[tid - d];
      et = part_even_tiles[tid - d];
      o = part_odd[tid - d];
    }
    __syncthreads();
    part_rows[tid] += r;
    part_odd_tiles[tid] += ot;
    part_even_tiles[tid] += et;
    part_odd[tid] += o;
    __syncthreads();
  }
  const int total_odd = part_odd[kScanThreads - 1];
  const int total_tiles = part_odd_tiles[kScanThreads - 1] + part_even_tiles[kScanThreads - 1];
  const int total_even_tiles = part_even_tiles[kScanThreads - 1];
  // exclusive prefixes at this thread's first expert
  int row = tid ? part_rows[tid - 1] : 0, ot = tid ? part_odd_tiles[tid - 1] : 0, et = tid ? part_even_tiles[tid - 1] : 0,
      rank = tid ? part_odd[tid - 1] : 0;
  // the odd expert left over (paired order, odd count of odd experts): its tile count, for the
  // offset of the even experts' block
  if (paired && (total_odd & 1)) {
    int r = rank;
    for (int e = e0; e < e1; ++e) {
      const int t = tiles_of(counts[e]);
      if (t & 1) {
        if (r == total_odd - 1) s_lone_tiles = t;
        ++r;
      }
    }
  }
  if (tid == kScanThreads - 1) plan.offsets[E] = part_rows[tid];
  if (tid == 0) {  // the grouped GEMM's work counter starts each forward at zero
    plan.sched[0] = 0;
    plan.sched[1] = 0;
  }
  __syncthreads();
  const int odd_region = part_odd_tiles[kScanThreads - 1] - s_lone_tiles;  // the paired odd experts' blocks
  for (int e = e0; e < e1; ++e) {
    const int c = counts[e], t = tiles_of(c);
    plan.offsets[e] = row;
    plan.cursor[e] = row;
    // position of tile 0 of the expert's pairs, and of its odd last tile (t odd)
    int first = 0, last = 0;
    if (!paired) {
      first = ot + et;
    } else if (!(t & 1)) {
      first = odd_region + et;
    } else if (rank == total_odd - 1 && (total_odd & 1)) {  // left over: after the even experts
      first = odd_region + total_even_tiles;
      last = first + t - 1;
    } else if (!(rank & 1)) {  // A: [pairs][last | B's last]
      first = ot;
      last = ot + t - 1;
    } else {  // B: [A's last | last][pairs]
      last = ot;
      first = ot + 1;
    }
    const int pairs = paired && (t & 1) ? t - 1 : t;  // tiles placed from `first` on
    for (int j = 0; j < t; ++j) {
      const int begin = row + j * plan.tile_m;
      const int pos = j < pairs ? first + j : last;
      plan.tiles[pos] = make_int4(e, begin, min(begin + plan.tile_m, row + c), 0);
    }
    row += c;
    if (t & 1) {
      ot += t;
      ++rank;
    } else {
      et += t;
    }
  }
  for (int t = total_tiles + tid; t < plan.max_tiles; t += kScanThreads) plan.tiles[t] = make_int4(-1, 0, 0, 0);
}

__global__ void __launch_bounds__(kScanThreads) plan_scan(DevicePlan plan, int E, bool paired) {
  plan_scan_body(plan, E, paired, plan.counts);
}

// key[j]: the expert of pair base + j·stride + threadIdx.x (-1: dropped or past S); rank[j]: its rank
// among this block's pairs of that expert, counted in s_count[E] (shared atomics, one per (warp,
// expert) per round). Whole warps must call it (warp-wide match and shuffle).
template <int N>
__device__ __forceinline__ void count_and_rank(const void* idx, bool idx64, int64_t S, int E, int64_t base, int stride,
                                               int* s_count, int (&key)[N], int (&rank)[N]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int j = 0; j < N; ++j) key[j] = valid_key(idx, idx64, S, E, base + int64_t(j) * stride + threadIdx.x);
#pragma unroll
  for (int j = 0; j < N; ++j) {
    const unsigned peers = __match_any_sync(0xffffffffu, key[j]);
    const int leader = __ffs(peers) - 1;
    int first = 0;
    if (key[j] >= 0 && lane == leader) first = atomicAdd(&s_count[key[j]], __popc(peers));
    rank[j] = __shfl_sync(0xffffffffu, first, leader) + __popc(peers & lanemask_lt());
  }
}

// Sorted rows for the pairs: each block takes the same chunk of pairs as plan_histogram, ranks them
// inside the block per expert (shared atomics, one per (warp, expert) per round), reserves one row
// range per (block, expert) from the global cursors, then writes sorted_pairs and pair_to_row.
__global__ void __launch_bounds__(kPlanThreads) plan_scatter(const void* idx, bool idx64, int64_t S, int E, DevicePlan plan) {
  extern __shared__ int s_plan[];  // [E] pairs of each expert in this chunk, then [E] their first row
  int* s_count = s_plan;
  int* s_base = s_plan + E;
  for (int e = threadIdx.x; e < E; e += kPlanThreads) s_count[e] = 0;
  __syncthreads();
  const int64_t base = int64_t(blockIdx.x) * kChunk;
  int key[kPairsPerThread], rank[kPairsPerThread];
  count_and_rank(idx, idx64, S, E, base, kPlanThreads, s_count, key, rank);
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += kPlanThreads)
    if (s_count[e]) s_base[e] = atomicAdd(&plan.cursor[e], s_count[e]);
  __syncthreads();
#pragma unroll
  for (int j = 0; j < kPairsPerThread; ++j) {
    const int64_t p = base + j * kPlanThreads + threadIdx.x;
    if (p >= S) continue;
    if (key[j] >= 0) {
      const int row = s_base[key[j]] + rank[j];
      plan.sorted_pairs[row] = int(p);
      plan.pair_to_row[p] = row;
    } else {
      plan.pair_to_row[p] = -1;
    }
  }
}

// The same scatter for E > kSmemExperts: one global atomic per (warp, expert).
__global__ void plan_scatter_global(const void* idx, bool idx64, int64_t S, int E, DevicePlan plan) {
  const int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int key = valid_key(idx, idx64, S, E, p);
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

// The whole plan in one block for S <= kSmallPlanPairs pairs and E <= kSmemExperts experts: the
// count and the in-expert ranks in shared memory (as plan_scatter, one pass), the scan's body on
// the shared counts, then the rows. One launch instead of a memset and three kernels (each ~3-5 us
// of latency on the H200 at these sizes, ncu: plan_histogram 2.75, plan_scan 5.15, plan_scatter
// 3.07 us at mixtral_8x7b T = 64). The default where the sizes allow; MOEX_CUDA_PLAN_FUSED=0: the
// three kernels. H200, 2026-12-02 (docs/PERF.md, twenty-third session, FP8 ms, one round, three
// kernels -> one block): mixtral_8x7b T = 64 0.4540 -> 0.4510, qwen15_moe_a2_7b T = 512 0.2912 ->
// 0.2851, qwen3_30b_a3b T = 512 0.3402 -> 0.3383; every other cell within the run's noise.
constexpr int kSmallPlanKeys = 4;
constexpr int64_t kSmallPlanPairs = int64_t(kScanThreads) * kSmallPlanKeys;

__global__ void __launch_bounds__(kScanThreads) plan_small(const void* idx, bool idx64, int64_t S, int E, DevicePlan plan) {
  extern __shared__ int s_count[];  // [E]
  for (int e = threadIdx.x; e < E; e += kScanThreads) s_count[e] = 0;
  __syncthreads();
  int key[kSmallPlanKeys], rank[kSmallPlanKeys];
  count_and_rank(idx, idx64, S, E, 0, kScanThreads, s_count, key, rank);
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += kScanThreads) {
    plan.counts[e] = s_count[e];  // for later readers (deepgemm.cu's layout kernels)
  }
  plan_scan_body(plan, E, plan.pair_aligned, s_count);  // offsets (global), tiles; syncs
  __syncthreads();  // every offset written (global writes of this block, visible after the barrier)
#pragma unroll
  for (int j = 0; j < kSmallPlanKeys; ++j) {
    const int64_t p = int64_t(j) * kScanThreads + threadIdx.x;
    if (p >= S) continue;
    if (key[j] >= 0) {
      const int row = plan.offsets[key[j]] + rank[j];
      plan.sorted_pairs[row] = int(p);
      plan.pair_to_row[p] = row;
    } else {
      plan.pair_to_row[p] = -1;
    }
  }
}

// plan_small where the sizes allow unless MOEX_CUDA_PLAN_FUSED=0 (read per call: the tests switch it).
bool small_plan_enabled() {
  const char* e = std::getenv("MOEX_CUDA_PLAN_FUSED");
  return !(e && *e == '0');
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
  if (S <= kSmallPlanPairs && E <= kSmemExperts && small_plan_enabled()) {
    plan_small<<<1, kScanThreads, size_t(E) * 4, stream>>>(idx, idx64, S, int(E), plan);
    check_launch("plan_small");
    return;
  }
  check(cudaMemsetAsync(plan.counts, 0, size_t(E) * sizeof(int), stream), "cudaMemsetAsync (routing plan)");
  const bool in_smem = E <= kSmemExperts;
  const unsigned blocks = unsigned(in_smem ? ceil_div(S, kChunk) : ceil_div(S, 256));
  if (blocks > 0) {
    if (in_smem) plan_histogram<<<blocks, kPlanThreads, size_t(E) * 4, stream>>>(idx, idx64, S, int(E), plan.counts);
    else plan_histogram_global<<<blocks, 256, 0, stream>>>(idx, idx64, S, int(E), plan.counts);
    check_launch("plan_histogram");
  }
  plan_scan<<<1, kScanThreads, 0, stream>>>(plan, int(E), plan.pair_aligned);
  check_launch("plan_scan");
  if (blocks > 0) {
    if (in_smem) plan_scatter<<<blocks, kPlanThreads, size_t(E) * 8, stream>>>(idx, idx64, S, int(E), plan);
    else plan_scatter_global<<<blocks, 256, 0, stream>>>(idx, idx64, S, int(E), plan);
    check_launch("plan_scatter");
  }
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
    out.sorted_pairs.resize(size_t(out.offsets[size_t(E)]));
    out.pair_to_row.resize(size_t(S));
    if (!out.sorted_pairs.empty())
      check(cudaMemcpy(out.sorted_pairs.data(), plan.sorted_pairs, out.sorted_pairs.size() * 4, cudaMemcpyDeviceToHost),
            "cudaMemcpy (plan probe)");
    if (S > 0)
      check(cudaMemcpy(out.pair_to_row.data(), plan.pair_to_row, size_t(S) * 4, cudaMemcpyDeviceToHost), "cudaMemcpy (plan probe)");
  } catch (...) {
    cudaFree(ws_mem);
    throw;
  }
  cudaFree(ws_mem);
  return out;
}

}  // namespace moex::cuda
