// backends/cuda/batched_gemv.cu — batched_mm on CUDA: every token–expert pair multiplies its
// token by its own expert's matrices, read in place (no per-pair weight copies; the reference
// library copies them and runs out of memory at a few hundred tokens). Built for decode (small T):
// GEMV-style kernels streaming the weights with 16-byte loads.
//
//   up:   h[p, i] = round(act(x_t · Wgᵉ[i] + b, x_t · Wuᵉ[i] + b))          h: [S, I] workspace
//   down: out[t, n] = round(Σ_j w[t,j] · (h[t*K+j] · Wdᵉʲ[n] + bᵈ[n]))   (slot order, f32)
//
// The down kernel fuses the weighted reduction over the K slots, so the extra memory is h only
// (S·I elements). No routing plan, no host synchronisation: capturable in a CUDA graph.
// Weights stored [E, out, in] (default) use one warp per output row; transposed weights
// [E, in, out] use 64 output columns × 4 k-slices per block (coalesced along the output dim).
#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/pdl.cuh"

namespace moex::cuda {

namespace {

constexpr int THREADS = 256;

template <class T>
__device__ __forceinline__ float dot_vec(const uint4& xa, const uint4& wa, float acc);
template <>
__device__ __forceinline__ float dot_vec<__nv_bfloat16>(const uint4& xa, const uint4& wa, float acc) {
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
template <>
__device__ __forceinline__ float dot_vec<__half>(const uint4& xa, const uint4& wa, float acc) {
  const __half2* x2 = reinterpret_cast<const __half2*>(&xa);
  const __half2* w2 = reinterpret_cast<const __half2*>(&wa);
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const float2 xf = __half22float2(x2[q]), wf = __half22float2(w2[q]);
    acc = fmaf(xf.x, wf.x, acc);
    acc = fmaf(xf.y, wf.y, acc);
  }
  return acc;
}
template <>
__device__ __forceinline__ float dot_vec<float>(const uint4& xa, const uint4& wa, float acc) {
  const float* x = reinterpret_cast<const float*>(&xa);
  const float* w = reinterpret_cast<const float*>(&wa);
#pragma unroll
  for (int q = 0; q < 4; ++q) acc = fmaf(x[q], w[q], acc);
  return acc;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// A 16-byte weight chunk. CS (stream_weights_enabled() below): loaded as streaming data (ld.global.cs,
// evict-first in L2) — the experts' weights are read once per step, and at normal priority their
// 75 MB per layer (qwen3, batch 1) push the residual, the activations and the KV cache out of the
// 50 MB L2, which the latency-bound kernels after them (RMSNorm, attention) then fetch from DRAM
// behind the next GEMV's weight requests.
template <bool CS>
__device__ __forceinline__ uint4 load_weight(const uint4* p) {
  if constexpr (CS) return __ldcs(p);
  else return __ldg(p);
}

// Σ_k x[k]·w[k] over n elements, by one warp (all lanes get the sum).
template <class T, bool VEC, bool CS = false>
__device__ __forceinline__ float warp_dot(const T* x, const T* w, int64_t n, int lane) {
  float acc = 0.0f;
  if constexpr (VEC) {
    constexpr int V = 16 / sizeof(T);
    const uint4* xv = reinterpret_cast<const uint4*>(x);
    const uint4* wv = reinterpret_cast<const uint4*>(w);
    const int64_t nv = n / V;
#pragma unroll 4
    for (int64_t c = lane; c < nv; c += 32) acc = dot_vec<T>(__ldg(xv + c), load_weight<CS>(wv + c), acc);
  } else {
    for (int64_t k = lane; k < n; k += 32) acc = fmaf(to_f32(x[k]), to_f32(w[k]), acc);
  }
  return warp_sum(acc);
}

// Two dot products sharing x (gate and up rows), by one warp.
template <class T, bool VEC, bool CS = false>
__device__ __forceinline__ float2 warp_dot2(const T* x, const T* wg, const T* wu, int64_t n, int lane) {
  float g = 0.0f, u = 0.0f;
  if constexpr (VEC) {
    constexpr int V = 16 / sizeof(T);
    const uint4* xv = reinterpret_cast<const uint4*>(x);
    const uint4* gv = reinterpret_cast<const uint4*>(wg);
    const uint4* uv = reinterpret_cast<const uint4*>(wu);
    const int64_t nv = n / V;
#pragma unroll 4
    for (int64_t c = lane; c < nv; c += 32) {
      const uint4 xa = __ldg(xv + c);
      g = dot_vec<T>(xa, load_weight<CS>(gv + c), g);
      u = dot_vec<T>(xa, load_weight<CS>(uv + c), u);
    }
  } else {
    for (int64_t k = lane; k < n; k += 32) {
      const float xf = to_f32(x[k]);
      g = fmaf(xf, to_f32(wg[k]), g);
      u = fmaf(xf, to_f32(wu[k]), u);
    }
  }
  return make_float2(warp_sum(g), warp_sum(u));
}

// ---- up projection, weights [E, R, H]: one warp per (pair, i) ----
// MULTI: a warp computes a.up_channels channels, i0, i0 + stride, ... (stride: the warps of a
// pair's blocks), one after the other: where one channel per warp would need a second wave of
// blocks (qwen3 at batch 1: 768 blocks, 660 resident), two per warp put every block on the GPU at
// once (launch_typed). A separate instantiation: the loop costs registers (bf16: 62 against 48),
// which would cut the one-channel kernel's blocks per SM. Each channel's arithmetic is the same.
template <class T, bool VEC, bool MULTI, bool CS>
__global__ void __launch_bounds__(THREADS) batched_up_nt(BatchedArgs a) {
  MOEX_CUDA_TRACE_BLOCK(k_batched_up);
  pdl_wait();  // launched with PDL (pdl.cuh): the expert index comes from the previous kernels
  MOEX_CUDA_TRACE_WAITED();
  pdl_launch_dependents();
  const int64_t p = blockIdx.x;
  const int64_t e = load_index(a.idx, a.idx64, p);
  if (e < 0 || e >= a.E) return;  // dropped slot: h row never read
  const int lane = threadIdx.x & 31;
  const int64_t stride = int64_t(gridDim.y) * (THREADS / 32);
  const int64_t H = a.H, I = a.I, R = a.has_gate ? 2 * I : I;
  const T* x = static_cast<const T*>(a.hidden) + (p / a.K) * H;
  const T* W = static_cast<const T*>(a.gate_up) + e * R * H;
  const T* bias = a.gate_up_bias ? static_cast<const T*>(a.gate_up_bias) + e * R : nullptr;
  const int channels = MULTI ? a.up_channels : 1;
#pragma unroll 1
  for (int64_t i = int64_t(blockIdx.y) * (THREADS / 32) + (threadIdx.x >> 5), c = 0; c < channels && i < I;
       ++c, i += stride) {
    float h;
    if (a.has_gate) {
      const int64_t wg = a.interleaved ? 2 * i : i, wu = a.interleaved ? 2 * i + 1 : I + i;
      float2 gu = warp_dot2<T, VEC, CS>(x, W + wg * H, W + wu * H, H, lane);
      if (bias) {
        gu.x += to_f32(bias[wg]);
        gu.y += to_f32(bias[wu]);
      }
      h = gated_act(a.act, gu.x, gu.y);
    } else {
      float v = warp_dot<T, VEC, CS>(x, W + i * H, H, lane);
      if (bias) v += to_f32(bias[i]);
      h = plain_act(a.act, v);
    }
    if (lane == 0) static_cast<T*>(a.h)[p * I + i] = from_f32<T>(h);
  }
}

// ---- down projection + weighted slot sum, weights [E, H, I]: one warp per (token, n) ----
// At batch 1 its blocks are resident beside the up kernel's from early on (PDL; the fifty-seventh and
// fifty-eighth sessions' traces), idle at pdl_wait. Requesting its weights before then was slower every
// time (docs/PERF.md): this kernel issuing prefetch.global.L2 per line before its wait (twenty-sixth
// session), and the up kernel's blocks
// issuing cp.async.bulk.prefetch.L2 for their slot's down matrix (thirty-fifth session: H200, 48-layer
// Qwen3-30B-A3B, batch 1 +0.17 ms per step) — the up kernel's own stream is what they delay.
// Copying them into shared memory before the wait was slower too (fifty-fourth session, H100, 2026-12-07,
// commit 19f4db8, removed): a block of 8 warps per 16 output rows of one token, its K down rows (192 KB
// on qwen3 bf16) cp.async'd before pdl_wait, the up kernel's carve-out set to the largest shared part —
// bit-identical, but qwen3_30b_a3b / qwen15_moe_a2_7b T = 1 0.046 / 0.041 ms against 0.037 / 0.035, and
// the 48-layer model's batch-1 step 4.419 ms against 3.594 (two interleaved rounds each).
// And the first third of them only, before the wait, bit-identical (fifty-eighth session, H100, 2026-12-07,
// commits 2f49d2d / 781039b, removed; docs/PERF.md): though bench/experts_stream_probe.cu's copy of the pair
// gained 2.9 µs per layer that way (31.5 → 28.6), the runtime's step lost — in registers (171, or 128 with spills under a 2-block bound,
// with the addressing slimmed: 32-bit expert ids, offsets per load) 3.64–3.66 ms against 3.55–3.57 at batch 1
// and 14.8 against 13.3 at batch 8; staged in shared memory by cp.async (32 KB a block) 3.76 and 16.3.
// Slots in groups of SLOTS whose dot products run interleaved, UC chunks of each in flight
// (SLOTS·UC = 8 sixteen-byte weight loads per lane): a row of W is short (I elements: 1.5 KB on
// qwen3), so one slot at a time left too few loads in flight (H200, batch 1: 17 µs for 25 MB), and
// with K = 2 (mixtral) four slots in flight were two. Each slot's per-lane partial sum runs over its
// chunks in order and the warp reduction is warp_dot's, and the slots are added in slot order: the
// same f32 result whatever SLOTS and UC are.
template <class T, bool VEC, int SLOTS, bool CS>
__global__ void __launch_bounds__(THREADS) batched_down_nt(BatchedArgs a) {
  MOEX_CUDA_TRACE_BLOCK(k_batched_down);
  pdl_wait();
  MOEX_CUDA_TRACE_WAITED();
  pdl_launch_dependents();
  constexpr int UC = VEC ? 8 / SLOTS : 1;
  const int64_t t = blockIdx.x;
  const int64_t n = int64_t(blockIdx.y) * (THREADS / 32) + (threadIdx.x >> 5);
  if (n >= a.H) return;
  const int lane = threadIdx.x & 31;
  const int64_t H = a.H, I = a.I;
  float acc = 0.0f;
  for (int64_t j0 = 0; j0 < a.K; j0 += SLOTS) {
    const T* hp[SLOTS];
    const T* W[SLOTS];
    bool ok[SLOTS];
    int64_t e[SLOTS];
#pragma unroll
    for (int q = 0; q < SLOTS; ++q) {
      const int64_t j = j0 + q;
      e[q] = j < a.K ? load_index(a.idx, a.idx64, t * a.K + j) : -1;
      ok[q] = e[q] >= 0 && e[q] < a.E;
      hp[q] = static_cast<const T*>(a.h) + (t * a.K + j) * I;
      W[q] = static_cast<const T*>(a.down) + ((ok[q] ? e[q] : 0) * H + n) * I;
    }
    float part[SLOTS];
#pragma unroll
    for (int q = 0; q < SLOTS; ++q) part[q] = 0.0f;
    if constexpr (VEC) {
      constexpr int V = 16 / sizeof(T);
      const int64_t nv = I / V;
      for (int64_t c0 = lane; c0 < nv; c0 += 32 * UC) {
        uint4 xh[SLOTS][UC], xw[SLOTS][UC];
#pragma unroll
        for (int q = 0; q < SLOTS; ++q)
#pragma unroll
          for (int u = 0; u < UC; ++u)
            if (ok[q] && c0 + 32 * u < nv) {
              xh[q][u] = __ldg(reinterpret_cast<const uint4*>(hp[q]) + c0 + 32 * u);
              xw[q][u] = load_weight<CS>(reinterpret_cast<const uint4*>(W[q]) + c0 + 32 * u);
            }
#pragma unroll
        for (int q = 0; q < SLOTS; ++q)
#pragma unroll
          for (int u = 0; u < UC; ++u)
            if (ok[q] && c0 + 32 * u < nv) part[q] = dot_vec<T>(xh[q][u], xw[q][u], part[q]);
      }
    } else {
      for (int64_t k = lane; k < I; k += 32)
#pragma unroll
        for (int q = 0; q < SLOTS; ++q)
          if (ok[q]) part[q] = fmaf(to_f32(hp[q][k]), to_f32(W[q][k]), part[q]);
    }
#pragma unroll
    for (int q = 0; q < SLOTS; ++q) {
      if (!ok[q]) continue;
      float y = warp_sum(part[q]);
      if (a.down_bias) y += to_f32(static_cast<const T*>(a.down_bias)[e[q] * H + n]);
      acc += load_any(a.topw, a.topw_code, t * a.K + j0 + q) * y;
    }
  }
  if (lane == 0) static_cast<T*>(a.out)[t * H + n] = from_f32<T>(acc);
}

// ---- the expert-shared form (batched_shares_experts, cuda_common.cuh) ----
// At T·K >= E most experts serve several pairs, and the per-pair kernels above read each expert's
// matrices once per pair: at batch 64 on Qwen3-30B-A3B (512 pairs, 128 experts) ~2.4 GB per layer
// from L2 where 1.2 GB are distinct, a decode step 1.87x slower than grouped_mm's (H100, docs/PERF.md,
// fifty-fifth session). Here the pairs come sorted by expert (the routing plan, tiles of kSharedRows
// rows of one expert) and a warp streams one weight row ONCE for its tile's rows: per 16-byte weight
// chunk, one dot_vec per row. Every row's per-lane partial sum runs over the chunks in warp_dot's order
// and is reduced by warp_sum, so h and y equal the per-pair kernels' bit for bit; the slot-order sum
// (combine.cu) adds topw · (y + bias) as batched_down_nt does.

// A warp takes several weight rows at once (up: kSharedUpChannels channels, i.e. their gate and up
// rows; down: kSharedDownRows output rows) and loads each activation chunk once for all of them: a
// first form with one row per warp was latency-bound (qwen3_30b_a3b T = 64, H100: 0.669 ms against
// grouped_mm's 0.421; the down kernel's warps read 1.5 KB each, three loads per lane in flight).
constexpr int kSharedUpChannels = 2, kSharedDownRows = 4;
// The weights are loaded into registers in the chunk loop; __launch_bounds__(THREADS, 4) keeps the
// kernels at <= 64 registers, four blocks (32 warps) per SM: against three blocks (<= 80 registers)
// qwen3_30b_a3b T = 64 0.518 ms against 0.548, the 48-layer model's batch-64 step 28.95 against 30.60 ms
// (H100, 2026-12-07, docs/PERF.md, fifty-sixth session, call 7). Measured there and removed: a register
// double buffer (the next chunk's loads issued before this chunk's arithmetic; 94 / 120 registers, 16 warps
// per SM): qwen3_30b_a3b T = 64 0.649 ms against 0.578;
// the weights through a 3-stage per-warp shared-memory ring filled by cp.async (48 KB per block; not
// profiled — perhaps L1 left too small for the tiles' activation rows): 0.580 against 0.547, deepseek_v3
// T = 512 34.4 against 27.5.

// The tile's rows: pair ids (sorted order) and their activation rows as 16-byte chunks.
template <class T>
__device__ __forceinline__ int tile_rows(const BatchedArgs& a, const int4& tile, const void* base, int64_t row_len,
                                         bool by_token, int64_t (&pair)[kSharedRows], const uint4* (&rowv)[kSharedRows]) {
  const int rows = tile.z - tile.y;  // 1..kSharedRows, uniform over the block
#pragma unroll
  for (int r = 0; r < kSharedRows; ++r) {
    pair[r] = a.plan.sorted_pairs[tile.y + (r < rows ? r : 0)];
    rowv[r] = reinterpret_cast<const uint4*>(static_cast<const T*>(base) + (by_token ? pair[r] / a.K : pair[r]) * row_len);
  }
  return rows;
}

// up, weights [E, R, H]: grid (plan tile, I / (8·NC)); a warp computes NC consecutive channels
// i0 .. i0+NC-1 for the tile's rows. h[p, i] by pair p (the down kernel reads it through sorted_pairs).
template <class T, bool CS, bool GATE>
__global__ void __launch_bounds__(THREADS, 4) shared_up_nt(BatchedArgs a) {
  MOEX_CUDA_TRACE_BLOCK(k_batched_up);
  pdl_wait();  // the plan is the previous kernel's
  MOEX_CUDA_TRACE_WAITED();
  pdl_launch_dependents();
  constexpr int NC = kSharedUpChannels, NW = GATE ? 2 * NC : NC;  // weight rows per warp: (gate, up) per channel
  const int4 tile = a.plan.tiles[blockIdx.x];  // (expert, first row, end row)
  if (tile.x < 0) return;                      // past the plan's tiles
  const int64_t i0 = (int64_t(blockIdx.y) * (THREADS / 32) + (threadIdx.x >> 5)) * NC;
  if (i0 >= a.I) return;
  const int lane = threadIdx.x & 31;
  const int64_t e = tile.x, H = a.H, I = a.I, R = GATE ? 2 * I : I;
  constexpr int V = 16 / sizeof(T);
  int64_t pair[kSharedRows];
  const uint4* xv[kSharedRows];
  const int rows = tile_rows<T>(a, tile, a.hidden, H, /*by_token=*/true, pair, xv);
  const int64_t nv = H / V;
  const T* W = static_cast<const T*>(a.gate_up) + e * R * H;
  const uint4* wrow[NW];  // (gate, up) rows of each channel, or its one row
  int64_t wg[NC], wu[NC];
#pragma unroll
  for (int q = 0; q < NC; ++q) {
    const int64_t i = i0 + q < I ? i0 + q : I - 1;  // past I: a valid row, its result not written
    wg[q] = GATE && a.interleaved ? 2 * i : i;
    wu[q] = a.interleaved ? 2 * i + 1 : I + i;
    wrow[GATE ? 2 * q : q] = reinterpret_cast<const uint4*>(W + wg[q] * H);
    if constexpr (GATE) wrow[2 * q + 1] = reinterpret_cast<const uint4*>(W + wu[q] * H);
  }
  float g[NC][kSharedRows], u[NC][kSharedRows];
#pragma unroll
  for (int q = 0; q < NC; ++q)
#pragma unroll
    for (int r = 0; r < kSharedRows; ++r) g[q][r] = u[q][r] = 0.0f;
  // k counts the warp's steps (the same for every lane: a lane past nv sits the last one out)
  const int64_t steps = (nv + 31) / 32;
  for (int64_t k = 0; k < steps; ++k) {
    const int64_t c = lane + 32 * k;
    if (c >= nv) continue;
    uint4 w[NW];
#pragma unroll
    for (int q = 0; q < NW; ++q) w[q] = load_weight<CS>(wrow[q] + c);
#pragma unroll
    for (int r = 0; r < kSharedRows; ++r)
      if (r < rows) {
        const uint4 xa = __ldg(xv[r] + c);
#pragma unroll
        for (int q = 0; q < NC; ++q) {
          g[q][r] = dot_vec<T>(xa, w[GATE ? 2 * q : q], g[q][r]);
          if constexpr (GATE) u[q][r] = dot_vec<T>(xa, w[2 * q + 1], u[q][r]);
        }
      }
  }
  const T* bias = a.gate_up_bias ? static_cast<const T*>(a.gate_up_bias) + e * R : nullptr;
#pragma unroll
  for (int q = 0; q < NC; ++q) {
    if (i0 + q >= I) break;
#pragma unroll
    for (int r = 0; r < kSharedRows; ++r)
      if (r < rows) {
        float hv;
        if constexpr (GATE) {
          float gs = warp_sum(g[q][r]), us = warp_sum(u[q][r]);
          if (bias) {
            gs += to_f32(bias[wg[q]]);
            us += to_f32(bias[wu[q]]);
          }
          hv = gated_act(a.act, gs, us);
        } else {
          float v = warp_sum(g[q][r]);
          if (bias) v += to_f32(bias[wg[q]]);
          hv = plain_act(a.act, v);
        }
        if (lane == 0) static_cast<T*>(a.h)[pair[r] * I + i0 + q] = from_f32<T>(hv);
      }
  }
}

// down, weights [E, H, I]: grid (plan tile, H / (8·NR)); a warp computes NR consecutive outputs
// n0 .. n0+NR-1 for the tile's rows: y[row, n] = h[pair(row)] · Wdᵉ[n] in f32 by sorted row (no bias:
// the combine adds it).
template <class T, bool CS>
__global__ void __launch_bounds__(THREADS, 4) shared_down_nt(BatchedArgs a) {
  MOEX_CUDA_TRACE_BLOCK(k_batched_down);
  pdl_wait();
  MOEX_CUDA_TRACE_WAITED();
  pdl_launch_dependents();
  constexpr int NR = kSharedDownRows;
  const int4 tile = a.plan.tiles[blockIdx.x];
  if (tile.x < 0) return;
  const int64_t n0 = (int64_t(blockIdx.y) * (THREADS / 32) + (threadIdx.x >> 5)) * NR;
  if (n0 >= a.H) return;
  const int lane = threadIdx.x & 31;
  const int64_t e = tile.x, H = a.H, I = a.I;
  constexpr int V = 16 / sizeof(T);
  int64_t pair[kSharedRows];
  const uint4* hv[kSharedRows];
  const int rows = tile_rows<T>(a, tile, a.h, I, /*by_token=*/false, pair, hv);
  const int64_t nv = I / V;
  const uint4* wrow[NR];  // past H: a valid row, its result not written
#pragma unroll
  for (int q = 0; q < NR; ++q)
    wrow[q] = reinterpret_cast<const uint4*>(static_cast<const T*>(a.down) + (e * H + (n0 + q < H ? n0 + q : H - 1)) * I);
  float part[NR][kSharedRows];
#pragma unroll
  for (int q = 0; q < NR; ++q)
#pragma unroll
    for (int r = 0; r < kSharedRows; ++r) part[q][r] = 0.0f;
  // k counts the warp's steps (the same for every lane: a lane past nv sits the last one out)
  const int64_t steps = (nv + 31) / 32;
  for (int64_t k = 0; k < steps; ++k) {
    const int64_t c = lane + 32 * k;
    if (c >= nv) continue;
    uint4 w[NR];
#pragma unroll
    for (int q = 0; q < NR; ++q) w[q] = load_weight<CS>(wrow[q] + c);
#pragma unroll
    for (int r = 0; r < kSharedRows; ++r)
      if (r < rows) {
        const uint4 ha = __ldg(hv[r] + c);
#pragma unroll
        for (int q = 0; q < NR; ++q) part[q][r] = dot_vec<T>(ha, w[q], part[q][r]);
      }
  }
#pragma unroll
  for (int q = 0; q < NR; ++q) {
    if (n0 + q >= H) break;
#pragma unroll
    for (int r = 0; r < kSharedRows; ++r)
      if (r < rows) {
        const float y = warp_sum(part[q][r]);
        if (lane == 0) a.y[int64_t(tile.y + r) * H + n0 + q] = y;
      }
  }
}

// ---- transposed weights: 64 output columns × 4 k-slices per block ----
constexpr int TN_COLS = 64, TN_SLICES = THREADS / TN_COLS;

// up, weights [E, H, R]. Gated: the block's 64 columns are 32 gate and 32 up columns of 32 i's.
template <class T>
__global__ void __launch_bounds__(THREADS) batched_up_tn(BatchedArgs a) {
  __shared__ float part[TN_SLICES][TN_COLS];
  const int64_t p = blockIdx.x;
  const int64_t e = load_index(a.idx, a.idx64, p);
  if (e < 0 || e >= a.E) return;
  const int cx = threadIdx.x % TN_COLS, ks = threadIdx.x / TN_COLS;
  const int64_t H = a.H, I = a.I, R = a.has_gate ? 2 * I : I;
  const int per = a.has_gate ? TN_COLS / 2 : TN_COLS;
  const int64_t i0 = int64_t(blockIdx.y) * per;
  int64_t i, w;
  if (a.has_gate) {
    const bool up = cx >= per;
    i = i0 + (up ? cx - per : cx);
    w = a.interleaved ? 2 * i + (up ? 1 : 0) : (up ? I + i : i);
  } else {
    i = i0 + cx;
    w = i;
  }
  const T* x = static_cast<const T*>(a.hidden) + (p / a.K) * H;
  const T* W = static_cast<const T*>(a.gate_up) + e * H * R;
  float acc = 0.0f;
  if (i < I)
    for (int64_t k = ks; k < H; k += TN_SLICES) acc = fmaf(to_f32(x[k]), to_f32(W[k * R + w]), acc);
  part[ks][cx] = acc;
  __syncthreads();
  if (ks == 0) {
    float v = part[0][cx];
#pragma unroll
    for (int s = 1; s < TN_SLICES; ++s) v += part[s][cx];
    if (i < I && a.gate_up_bias) v += to_f32(static_cast<const T*>(a.gate_up_bias)[e * R + w]);
    part[0][cx] = v;
  }
  __syncthreads();
  if (threadIdx.x < per) {
    const int64_t io = i0 + threadIdx.x;
    if (io < I) {
      const float hv = a.has_gate ? gated_act(a.act, part[0][threadIdx.x], part[0][threadIdx.x + per])
                                  : plain_act(a.act, part[0][threadIdx.x]);
      static_cast<T*>(a.h)[p * I + io] = from_f32<T>(hv);
    }
  }
}

// down + weighted slot sum, weights [E, I, H].
template <class T>
__global__ void __launch_bounds__(THREADS) batched_down_tn(BatchedArgs a) {
  __shared__ float part[TN_SLICES][TN_COLS];
  const int64_t t = blockIdx.x;
  const int cx = threadIdx.x % TN_COLS, ks = threadIdx.x / TN_COLS;
  const int64_t H = a.H, I = a.I;
  const int64_t n = int64_t(blockIdx.y) * TN_COLS + cx;
  float acc = 0.0f;
  for (int64_t j = 0; j < a.K; ++j) {
    const int64_t p = t * a.K + j;
    const int64_t e = load_index(a.idx, a.idx64, p);
    if (e < 0 || e >= a.E) continue;  // uniform over the block
    const T* hp = static_cast<const T*>(a.h) + p * I;
    const T* W = static_cast<const T*>(a.down) + e * I * H;
    float s = 0.0f;
    if (n < H)
      for (int64_t k = ks; k < I; k += TN_SLICES) s = fmaf(to_f32(hp[k]), to_f32(W[k * H + n]), s);
    part[ks][cx] = s;
    __syncthreads();
    if (ks == 0 && n < H) {
      float y = part[0][cx];
#pragma unroll
      for (int q = 1; q < TN_SLICES; ++q) y += part[q][cx];
      if (a.down_bias) y += to_f32(static_cast<const T*>(a.down_bias)[e * H + n]);
      acc += load_any(a.topw, a.topw_code, p) * y;
    }
    __syncthreads();
  }
  if (ks == 0 && n < H) static_cast<T*>(a.out)[t * H + n] = from_f32<T>(acc);
}

// Blocks of an up kernel resident on the current device at once (blocks per SM sized once per
// process: they depend on the kernel's registers, not on the device's SM count).
template <class T, bool VEC, bool MULTI>
int64_t resident_up_blocks() {
  static const int per_sm = [] {
    int blocks = 0;
    // CS changes the load instruction only, not the registers (ptxas: 48 / 62 for bf16 either way)
    check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, batched_up_nt<T, VEC, MULTI, false>, THREADS, 0),
          "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    return blocks;
  }();
  return int64_t(per_sm) * current_device_sms();
}

// Channels per warp of the up kernel: 2 where one per warp needs more than one wave of blocks and
// the two-channel kernel's fit in one (a second wave started ~10 µs into qwen3's batch-1 up kernel:
// docs/PERF.md, thirty-third session), else 1. MOEX_CUDA_UP_CHANNELS=n forces n (A/B measurement).
template <class T, bool VEC>
int up_channels(int64_t pairs, int64_t I) {
  if (const char* e = std::getenv("MOEX_CUDA_UP_CHANNELS"); e && *e) return std::max(1, std::atoi(e));
  const int warps = THREADS / 32;
  const int64_t one = pairs * ceil_div(I, warps), two = pairs * ceil_div(I, 2 * warps);
  return one > resident_up_blocks<T, VEC, false>() && two <= resident_up_blocks<T, VEC, true>() ? 2 : 1;
}

// Whether the 16-byte weight loads of the [E, out, in] kernels are streaming loads (load_weight);
// MOEX_CUDA_EXPERT_STREAM=0: ordinary loads (A/B measurement). Read once per process.
bool stream_weights_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("MOEX_CUDA_EXPERT_STREAM");
    return !(e && std::string(e) == "0");
  }();
  return on;
}

template <class T, bool CS>
void launch_vec(const BatchedArgs& a, dim3 g_up, dim3 g_down, cudaStream_t stream) {
  launch_pdl("batched_up_nt", a.up_channels > 1 ? batched_up_nt<T, true, true, CS> : batched_up_nt<T, true, false, CS>,
             g_up, dim3(THREADS), 0, stream, a);
  // slots interleaved: K itself up to 8 (rounded up to a power of two), else groups of 8
  const auto down = a.K <= 1   ? batched_down_nt<T, true, 1, CS>
                    : a.K <= 2 ? batched_down_nt<T, true, 2, CS>
                    : a.K <= 4 ? batched_down_nt<T, true, 4, CS>
                               : batched_down_nt<T, true, 8, CS>;
  launch_pdl("batched_down_nt", down, g_down, dim3(THREADS), 0, stream, a);
}

// The expert-shared form: plan, up, down, combine (the last three chained with PDL).
template <class T, bool CS>
void launch_shared(const BatchedArgs& a, DType dtype, cudaStream_t stream) {
  const int64_t S = a.T * a.K;
  const int warps = THREADS / 32;
  build_plan(a.plan, a.idx, a.idx64, S, a.E, stream);
  const unsigned tiles = unsigned(a.plan.max_tiles);
  launch_pdl("shared_up_nt", a.has_gate ? shared_up_nt<T, CS, true> : shared_up_nt<T, CS, false>,
             dim3(tiles, unsigned(ceil_div(a.I, int64_t(warps) * kSharedUpChannels))), dim3(THREADS), 0, stream, a);
  launch_pdl("shared_down_nt", shared_down_nt<T, CS>, dim3(tiles, unsigned(ceil_div(a.H, int64_t(warps) * kSharedDownRows))),
             dim3(THREADS), 0, stream, a);
  CombineArgs c{};
  c.y = a.y;
  c.pair_to_row = a.plan.pair_to_row;
  c.idx = a.idx;
  c.idx64 = a.idx64;
  c.topw = a.topw;
  c.topw_code = a.topw_code;
  c.down_bias = a.down_bias;
  c.T = a.T;
  c.K = a.K;
  c.H = a.H;
  c.out = a.out;
  launch_combine(c, dtype, stream, /*pdl=*/true);
}

template <class T>
void launch_typed(const BatchedArgs& a_in, DType dtype, bool vec16, cudaStream_t stream) {
  BatchedArgs a = a_in;
  const int64_t S = a.T * a.K;
  MOEX_CHECK(S < (int64_t(1) << 31) && a.T < (int64_t(1) << 31), "batched_mm on CUDA: T*K = {} pairs is too many", S);
  const int warps = THREADS / 32;
  if (a.share_experts && vec16 && !a.transposed) {
    MOEX_CHECK(a.plan.tile_m == kSharedRows && a.y, "batched_mm on CUDA: the expert-shared form needs its plan and y");
    MOEX_CHECK(ceil_div(a.I, warps) <= 65535 && ceil_div(a.H, warps) <= 65535 && a.plan.max_tiles <= 65535,
               "batched_mm on CUDA: sizes H={} I={} too large", a.H, a.I);
    if (stream_weights_enabled()) launch_shared<T, true>(a, dtype, stream);
    else launch_shared<T, false>(a, dtype, stream);
    return;
  }
  if (!a.transposed) {
    a.up_channels = vec16 ? up_channels<T, true>(S, a.I) : up_channels<T, false>(S, a.I);
    dim3 g_up(unsigned(S), unsigned(ceil_div(a.I, int64_t(warps) * a.up_channels)));
    dim3 g_down(unsigned(a.T), unsigned(ceil_div(a.H, warps)));
    MOEX_CHECK(g_up.y <= 65535 && g_down.y <= 65535, "batched_mm on CUDA: sizes H={} I={} too large", a.H, a.I);
    if (vec16) {
      if (stream_weights_enabled()) launch_vec<T, true>(a, g_up, g_down, stream);
      else launch_vec<T, false>(a, g_up, g_down, stream);
    } else {
      launch_pdl("batched_up_nt", a.up_channels > 1 ? batched_up_nt<T, false, true, false> : batched_up_nt<T, false, false, false>,
                 g_up, dim3(THREADS), 0, stream, a);
      launch_pdl("batched_down_nt", batched_down_nt<T, false, 4, false>, g_down, dim3(THREADS), 0, stream, a);
    }
  } else {
    const int per = a.has_gate ? TN_COLS / 2 : TN_COLS;
    dim3 g_up(unsigned(S), unsigned(ceil_div(a.I, per)));
    dim3 g_down(unsigned(a.T), unsigned(ceil_div(a.H, TN_COLS)));
    MOEX_CHECK(g_up.y <= 65535 && g_down.y <= 65535, "batched_mm on CUDA: sizes H={} I={} too large", a.H, a.I);
    batched_up_tn<T><<<g_up, THREADS, 0, stream>>>(a);
    check_launch("batched_up_tn");
    batched_down_tn<T><<<g_down, THREADS, 0, stream>>>(a);
    check_launch("batched_down_tn");
  }
}

}  // namespace

bool batched_shares_experts(int64_t S, int64_t E, bool transposed) {
  if (transposed || S <= 0 || max_m_tiles(S, E, kSharedRows) > 65535) return false;
  if (const char* e = std::getenv("MOEX_CUDA_BATCHED_SHARED"); e && *e) return *e != '0';
  // from one pair per expert on average: forced on at S = E (H100, 2026-12-07, docs/PERF.md, fifty-sixth
  // session) qwen3_30b_a3b T = 16 0.276 ms against 0.289 per pair, deepseek_v3 T = 32 4.56 against 4.95;
  // below it slower (qwen3_30b_a3b T = 8: 0.188 against 0.181)
  return S >= E;
}

void launch_batched(const BatchedArgs& a, DType dtype, bool vec16, cudaStream_t stream) {
  switch (dtype) {
    case DType::f32: launch_typed<float>(a, dtype, vec16, stream); break;
    case DType::f16: launch_typed<__half>(a, dtype, vec16, stream); break;
    case DType::bf16: launch_typed<__nv_bfloat16>(a, dtype, vec16, stream); break;
    default: detail::fail(ErrorCode::internal, "batched_mm on CUDA: unexpected dtype {}", dtype_name(dtype));
  }
}

}  // namespace moex::cuda
