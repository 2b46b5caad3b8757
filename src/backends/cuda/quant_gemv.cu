// backends/cuda/quant_gemv.cu — batched_mm on FP8 block-scaled and FP4 experts: the structure of
// batched_gemv.cu (one warp per output row of a pair, weights read in place) on quantized
// weights, with the activation quantization of quant_activation.cu around the up projection:
//
//   quantize x [T, H] → xq, xs;  up: h[p, i] = round(act(gate, up));  quantize h [S, I] → hq, hs;
//   down: out[t, n] = round(Σ_j w[t,j] · (y_j[n] + bias))                      (slot order, f32)
//
// where a projection is Σ_kb xs[kb] · wscale(n, kb) · Σ_{k in kb} code[k] · wv[n, k] (f32).
// Default layout [E, out, in]: each lane reads 16 weight bytes at a time (16 FP8 codes or 32
// FP4 values, converted in registers) and the matching 16 or 32 activation codes; the per-block
// factor multiplies each lane's chunk partial sum (a chunk never crosses a 128-k block).
// Rows that are not 16-byte aligned fall back to element-wise loads. Transposed FP8 weights
// [E, in, out]: 64 output columns × 4 k-slices per block, coalesced along the output dim.
// FP8 [E, out, in] with in % 32 == 0 on sm_89+ can instead run on tensor cores (mma.sync
// m16n8k32 e4m3, quant_up_mma / quant_down_mma): MOEX_CUDA_FP8_MMA_GEMV=1 selects it, =0 forces
// the CUDA-core kernels. No routing plan, no host synchronisation, no allocation: capturable.
#include <cstdlib>
#include <cstring>

#include "backends/cuda/quant_common.cuh"

namespace moex::cuda {

namespace {

constexpr int THREADS = 256, WARPS = THREADS / 32;
// Tensor-core FP8 GEMV (below) when MOEX_CUDA_FP8_MMA_GEMV is unset: off until timed on the H200.
constexpr bool kMmaGemvDefault = false;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}


// Σ_k x_code[k] · wv_r[k] · factor(r, kb) for NR weight rows of expert e, by one warp (every lane
// gets the sums). xq/xs: one quantized activation row [K] / [ceil(K/128)].
template <int NR, bool VEC>
__device__ __forceinline__ void warp_quant_dots(const QuantWeights& w, int64_t e, const int64_t (&rows)[NR], const uint8_t* xq,
                                                const float* xs, int lane, float (&out)[NR]) {
  float acc[NR];
#pragma unroll
  for (int r = 0; r < NR; ++r) acc[r] = 0.0f;
  const int64_t K = w.K;
  if constexpr (VEC) {
    const uint4* xv = reinterpret_cast<const uint4*>(xq);
    if (!w.fp4) {
      // chunk c: codes k = 16c .. 16c+15, block kb = c / 8
      const uint4* wr[NR];
#pragma unroll
      for (int r = 0; r < NR; ++r) wr[r] = reinterpret_cast<const uint4*>(w.data + e * w.data_stride + rows[r] * K);
      const int64_t nv = K / 16;
#pragma unroll 2
      for (int64_t c = lane; c < nv; c += 32) {
        uint4 wa[NR];
#pragma unroll
        for (int r = 0; r < NR; ++r) wa[r] = __ldg(wr[r] + c);
        float xf[16];
        decode16(__ldg(xv + c), xf);
        const int64_t kb = c >> 3;
        const float xscale = xs[kb];
#pragma unroll
        for (int r = 0; r < NR; ++r) {
          float wf[16];
          decode16(wa[r], wf);
          float s = 0.0f;
#pragma unroll
          for (int q = 0; q < 16; ++q) s = fmaf(xf[q], wf[q], s);
          acc[r] = fmaf(s, xscale * fp8_block_scale(w, e, rows[r], kb), acc[r]);
        }
      }
    } else {
      // chunk c: 16 packed bytes = values k = 32c .. 32c+31, block kb = c / 4
      const int64_t row_bytes = K / 2, groups = (K + w.group - 1) / w.group;
      const uint8_t* sc = static_cast<const uint8_t*>(w.scales) + e * w.scale_stride;
      const uint4* wr[NR];
#pragma unroll
      for (int r = 0; r < NR; ++r) wr[r] = reinterpret_cast<const uint4*>(w.data + e * w.data_stride + rows[r] * row_bytes);
      const int64_t nv = K / 32;
#pragma unroll 2
      for (int64_t c = lane; c < nv; c += 32) {
        uint4 wa[NR];
#pragma unroll
        for (int r = 0; r < NR; ++r) wa[r] = __ldg(wr[r] + c);
        float xf[32];
        decode16(__ldg(xv + 2 * c), xf);
        decode16(__ldg(xv + 2 * c + 1), xf + 16);
        const float xscale = xs[c >> 2];
        const int64_t k0 = 32 * c;
#pragma unroll
        for (int r = 0; r < NR; ++r) {
          const uint32_t b[4] = {wa[r].x, wa[r].y, wa[r].z, wa[r].w};
          const uint8_t* rs = sc + rows[r] * groups;
          float s = 0.0f;
          if (w.group >= 32) {  // the whole chunk shares one group scale
#pragma unroll
            for (int q = 0; q < 32; ++q) s = fmaf(xf[q], e2m1_value(b[q >> 3] >> ((q & 7) * 4)), s);
            s *= ue8m0_value(rs[k0 / w.group]);
          } else {
#pragma unroll
            for (int q = 0; q < 32; ++q)
              s = fmaf(xf[q], e2m1_value(b[q >> 3] >> ((q & 7) * 4)) * ue8m0_value(rs[(k0 + q) / w.group]), s);
          }
          acc[r] = fmaf(s, xscale, acc[r]);
        }
      }
    }
  } else {
    for (int64_t k = lane; k < K; k += 32) {
      const float x = e4m3_value(xq[k]) * xs[k / kQuantGroup];
#pragma unroll
      for (int r = 0; r < NR; ++r)
        acc[r] = fmaf(x, weight_value(w, e, rows[r], k) * weight_block_factor(w, e, rows[r], k / kQuantGroup), acc[r]);
    }
  }
#pragma unroll
  for (int r = 0; r < NR; ++r) out[r] = warp_sum(acc[r]);
}

// The 16-byte path needs whole 16-byte chunks per row (K multiple of 16 codes / 32 FP4 values)
// and 16-byte aligned bases; the callers check the bases.
__host__ __device__ inline bool rows_vec16(const QuantWeights& w) {
  return w.fp4 ? (w.K % 32 == 0 && w.data_stride % 16 == 0) : (w.K % 16 == 0 && w.data_stride % 16 == 0);
}

// ---- up projection, weights [E, R, H]: one warp per (pair, i) ----
template <class T, bool VEC>
__global__ void __launch_bounds__(THREADS) quant_up_nt(QuantBatchedArgs a) {
  const BatchedArgs& b = a.b;
  const int64_t p = blockIdx.x;
  const int64_t e = load_index(b.idx, b.idx64, p);
  if (e < 0 || e >= b.E) return;  // dropped slot: h row never read
  const int lane = threadIdx.x & 31;
  const int64_t i = int64_t(blockIdx.y) * WARPS + (threadIdx.x >> 5);
  if (i >= b.I) return;
  const int64_t H = b.H, I = b.I, R = b.has_gate ? 2 * I : I, t = p / b.K, gh = quant_groups(H);
  const uint8_t* xq = a.xq + t * H;
  const float* xs = a.xs + t * gh;
  const T* bias = b.gate_up_bias ? static_cast<const T*>(b.gate_up_bias) + e * R : nullptr;
  float hv;
  if (b.has_gate) {
    const int64_t rows[2] = {b.interleaved ? 2 * i : i, b.interleaved ? 2 * i + 1 : I + i};
    float gu[2];
    warp_quant_dots<2, VEC>(a.up, e, rows, xq, xs, lane, gu);
    if (bias) {
      gu[0] += to_f32(bias[rows[0]]);
      gu[1] += to_f32(bias[rows[1]]);
    }
    hv = gated_act(b.act, gu[0], gu[1]);
  } else {
    const int64_t rows[1] = {i};
    float v[1];
    warp_quant_dots<1, VEC>(a.up, e, rows, xq, xs, lane, v);
    if (bias) v[0] += to_f32(bias[i]);
    hv = plain_act(b.act, v[0]);
  }
  if (lane == 0) static_cast<T*>(b.h)[p * I + i] = from_f32<T>(hv);
}

// ---- down projection + weighted slot sum, weights [E, H, I]: one warp per (token, n) ----
template <class T, bool VEC>
__global__ void __launch_bounds__(THREADS) quant_down_nt(QuantBatchedArgs a) {
  const BatchedArgs& b = a.b;
  const int64_t t = blockIdx.x;
  const int64_t n = int64_t(blockIdx.y) * WARPS + (threadIdx.x >> 5);
  if (n >= b.H) return;
  const int lane = threadIdx.x & 31;
  const int64_t H = b.H, I = b.I, gi = quant_groups(I);
  float acc = 0.0f;
  for (int64_t j = 0; j < b.K; ++j) {
    const int64_t p = t * b.K + j;
    const int64_t e = load_index(b.idx, b.idx64, p);
    if (e < 0 || e >= b.E) continue;
    const int64_t rows[1] = {n};
    float y[1];
    warp_quant_dots<1, VEC>(a.down, e, rows, a.hq + p * I, a.hs + p * gi, lane, y);
    if (b.down_bias) y[0] += to_f32(static_cast<const T*>(b.down_bias)[e * H + n]);
    acc += load_any(b.topw, b.topw_code, p) * y[0];
  }
  if (lane == 0) static_cast<T*>(b.out)[t * H + n] = from_f32<T>(acc);
}

// ---- transposed FP8 weights [E, in, out]: 64 output columns × 4 k-slices per block ----
constexpr int TN_COLS = 64, TN_SLICES = THREADS / TN_COLS;

// Σ_kb xs[kb] · ws(col, kb) · Σ_{k in kb, k ≡ ks mod 4} code[k] · W[k, col] (one k-slice's share).
__device__ __forceinline__ float slice_dot_tn(const QuantWeights& w, int64_t e, int64_t col, const uint8_t* xq,
                                              const float* xs, int ks) {
  const uint8_t* W = w.data + e * w.data_stride;
  float acc = 0.0f;
  for (int64_t k0 = 0; k0 < w.K; k0 += kQuantGroup) {
    const int64_t k1 = k0 + kQuantGroup < w.K ? k0 + kQuantGroup : w.K;
    float s = 0.0f;
    for (int64_t k = k0 + ks; k < k1; k += TN_SLICES) s = fmaf(e4m3_value(xq[k]), e4m3_value(W[k * w.N + col]), s);
    const int64_t kb = k0 / kQuantGroup;
    acc = fmaf(s, xs[kb] * fp8_block_scale(w, e, col, kb), acc);
  }
  return acc;
}

// up, weights [E, H, R]. Gated: the block's 64 columns are 32 gate and 32 up columns of 32 i's.
template <class T>
__global__ void __launch_bounds__(THREADS) quant_up_tn(QuantBatchedArgs a) {
  __shared__ float part[TN_SLICES][TN_COLS];
  const BatchedArgs& b = a.b;
  const int64_t p = blockIdx.x;
  const int64_t e = load_index(b.idx, b.idx64, p);
  if (e < 0 || e >= b.E) return;
  const int cx = threadIdx.x % TN_COLS, ks = threadIdx.x / TN_COLS;
  const int64_t H = b.H, I = b.I, R = b.has_gate ? 2 * I : I, t = p / b.K;
  const int per = b.has_gate ? TN_COLS / 2 : TN_COLS;
  const int64_t i0 = int64_t(blockIdx.y) * per;
  int64_t i, col;
  if (b.has_gate) {
    const bool up = cx >= per;
    i = i0 + (up ? cx - per : cx);
    col = b.interleaved ? 2 * i + (up ? 1 : 0) : (up ? I + i : i);
  } else {
    i = i0 + cx;
    col = i;
  }
  part[ks][cx] = i < I ? slice_dot_tn(a.up, e, col, a.xq + t * H, a.xs + t * quant_groups(H), ks) : 0.0f;
  __syncthreads();
  if (ks == 0) {
    float v = part[0][cx];
#pragma unroll
    for (int s = 1; s < TN_SLICES; ++s) v += part[s][cx];
    if (i < I && b.gate_up_bias) v += to_f32(static_cast<const T*>(b.gate_up_bias)[e * R + col]);
    part[0][cx] = v;
  }
  __syncthreads();
  if (threadIdx.x < per) {
    const int64_t io = i0 + threadIdx.x;
    if (io < I) {
      const float hv = b.has_gate ? gated_act(b.act, part[0][threadIdx.x], part[0][threadIdx.x + per])
                                  : plain_act(b.act, part[0][threadIdx.x]);
      static_cast<T*>(b.h)[p * I + io] = from_f32<T>(hv);
    }
  }
}

// down + weighted slot sum, weights [E, I, H].
template <class T>
__global__ void __launch_bounds__(THREADS) quant_down_tn(QuantBatchedArgs a) {
  __shared__ float part[TN_SLICES][TN_COLS];
  const BatchedArgs& b = a.b;
  const int64_t t = blockIdx.x;
  const int cx = threadIdx.x % TN_COLS, ks = threadIdx.x / TN_COLS;
  const int64_t H = b.H, I = b.I, gi = quant_groups(I);
  const int64_t n = int64_t(blockIdx.y) * TN_COLS + cx;
  float acc = 0.0f;
  for (int64_t j = 0; j < b.K; ++j) {
    const int64_t p = t * b.K + j;
    const int64_t e = load_index(b.idx, b.idx64, p);
    if (e < 0 || e >= b.E) continue;  // uniform over the block
    part[ks][cx] = n < H ? slice_dot_tn(a.down, e, n, a.hq + p * I, a.hs + p * gi, ks) : 0.0f;
    __syncthreads();
    if (ks == 0 && n < H) {
      float y = part[0][cx];
#pragma unroll
      for (int q = 1; q < TN_SLICES; ++q) y += part[q][cx];
      if (b.down_bias) y += to_f32(static_cast<const T*>(b.down_bias)[e * H + n]);
      acc += load_any(b.topw, b.topw_code, p) * y;
    }
    __syncthreads();
  }
  if (ks == 0 && n < H) static_cast<T*>(b.out)[t * H + n] = from_f32<T>(acc);
}

// ---- FP8 default layout on tensor cores: mma.sync m16n8k32 e4m3 (sm_89+) ----
// A warp computes a 16-row tile of W_e [N, K] against one activation row: A = the 16 weight rows,
// B = the activation codes broadcast to all 8 columns (every column holds the same product, so
// every lane ends up with the sums of its own two rows). A dot product is invariant under a
// permutation of k applied to both operands, so k is permuted to make each lane's fragment bytes
// contiguous: in a 128-k block, lane (g = lane/4, q = lane%4) loads bytes [32q, 32q+32) of rows g
// and g+8 (two 16-byte loads each) and the same 32 activation bytes; MMA j (0..3) uses words 2j,
// 2j+1 of them. PTX fragment layout of m16n8k32 (8-bit types): A regs {a0, a1, a2, a3} = row g
// k 4q..4q+3, row g+8 k 4q.., row g k 16+4q.., row g+8 k 16+4q..; B regs {b0, b1} = column g,
// k 4q..4q+3 and 16+4q..; so logical k 4q+b ↔ physical 32q+8j+b and 16+4q+b ↔ 32q+8j+4+b, the
// same map for A and B. D: {d0, d1, d2, d3} = (row g, col 2q), (g, 2q+1), (g+8, 2q), (g+8, 2q+1).
// Each 128-k block is summed in fresh f32 accumulators (4 MMAs), then scaled by activation scale ×
// weight block scale into the running f32 sums, as the CPU does. Needs K % 32 == 0 and 16-byte
// aligned rows; a partial last block zero-fills the lanes past K.
constexpr int MMA_ROWS = 16;

struct MmaFrag {
  uint4 lo[2], hi[2], x[2];  // 32 bytes of row g, of row g+8 and of the activation row
};

// Loads the lane's share of 128-k block kb. row_lo/row_hi: byte pointers of the two rows.
__device__ __forceinline__ void mma_load(const uint8_t* row_lo, const uint8_t* row_hi, const uint8_t* x, int64_t K,
                                         int64_t kb, int quarter, MmaFrag& f) {
  const int64_t k = kb * kQuantGroup + 32 * quarter;
  if (k < K) {  // K % 32 == 0: the lane's 32 bytes are all inside or all past K
    const uint4* a = reinterpret_cast<const uint4*>(row_lo + k);
    const uint4* h = reinterpret_cast<const uint4*>(row_hi + k);
    const uint4* xv = reinterpret_cast<const uint4*>(x + k);
    f.lo[0] = __ldg(a);
    f.lo[1] = __ldg(a + 1);
    f.hi[0] = __ldg(h);
    f.hi[1] = __ldg(h + 1);
    f.x[0] = __ldg(xv);
    f.x[1] = __ldg(xv + 1);
  } else {
    const uint4 z = make_uint4(0, 0, 0, 0);
    f.lo[0] = f.lo[1] = f.hi[0] = f.hi[1] = f.x[0] = f.x[1] = z;
  }
}

__device__ __forceinline__ void mma_e4m3(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
  __trap();  // the host dispatch only picks this path on sm_89+
#endif
}

// Σ over the block's 128 k of code_x · code_w for rows g (d[0]) and g+8 (d[2]).
__device__ __forceinline__ void mma_block(const MmaFrag& f, float (&d)[4]) {
  d[0] = d[1] = d[2] = d[3] = 0.0f;
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    mma_e4m3(d, f.lo[c].x, f.hi[c].x, f.lo[c].y, f.hi[c].y, f.x[c].x, f.x[c].y);
    mma_e4m3(d, f.lo[c].z, f.hi[c].z, f.lo[c].w, f.hi[c].w, f.x[c].z, f.x[c].w);
  }
}

// One warp's share of a tile: Σ_{kb = kb0, kb0 + step, ...} xs[kb] · ws(row, kb) · block sum, for
// rows r_lo (lane's row g) and r_hi (row g+8) of expert e, times `factor`, added to acc_lo/acc_hi.
// Two blocks per iteration keep 12 16-byte loads per lane in flight.
__device__ __forceinline__ void mma_rows_dot(const QuantWeights& w, int64_t e, int64_t r_lo, int64_t r_hi,
                                             const uint8_t* x, const float* xs, int64_t kb0, int64_t step, int quarter,
                                             float factor, float& acc_lo, float& acc_hi) {
  const uint8_t* base = w.data + e * w.data_stride;
  const uint8_t* row_lo = base + r_lo * w.K;
  const uint8_t* row_hi = base + r_hi * w.K;
  const int64_t nb = quant_groups(w.K);
  for (int64_t kb = kb0; kb < nb; kb += 2 * step) {
    const int64_t kb1 = kb + step;
    const bool two = kb1 < nb;  // warp-uniform
    MmaFrag f0, f1;
    mma_load(row_lo, row_hi, x, w.K, kb, quarter, f0);
    if (two) mma_load(row_lo, row_hi, x, w.K, kb1, quarter, f1);
    float d[4];
    mma_block(f0, d);
    float s = factor * xs[kb];
    acc_lo = fmaf(d[0], s * fp8_block_scale(w, e, r_lo, kb), acc_lo);
    acc_hi = fmaf(d[2], s * fp8_block_scale(w, e, r_hi, kb), acc_hi);
    if (two) {
      mma_block(f1, d);
      s = factor * xs[kb1];
      acc_lo = fmaf(d[0], s * fp8_block_scale(w, e, r_lo, kb1), acc_lo);
      acc_hi = fmaf(d[2], s * fp8_block_scale(w, e, r_hi, kb1), acc_hi);
    }
  }
}

// The block's 8 warps are WARPS / split tiles × `split` warps that share a tile's k blocks (or its
// (slot, k block) items on the down side); their partial sums meet in shared memory and are added
// in warp order (deterministic).
struct MmaSplit {
  int split;  // 1, 2, 4 or 8
};

// up, weights [E, R, H]: a tile is 8 outputs i (gated: rows g = gate of i, g+8 = up of i) or 16
// (no gate: rows g and g+8 are outputs i0+g and i0+8+g). grid (S, ceil(tiles / tiles per block)).
template <class T>
__global__ void __launch_bounds__(THREADS) quant_up_mma(QuantBatchedArgs a, MmaSplit ms) {
  __shared__ float part[WARPS][MMA_ROWS];
  const BatchedArgs& b = a.b;
  const int64_t p = blockIdx.x;
  const int64_t e = load_index(b.idx, b.idx64, p);
  if (e < 0 || e >= b.E) return;  // dropped slot, uniform over the block: h row never read
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, quarter = lane & 3;
  const int split = ms.split, tiles_per_block = WARPS / split;
  const int64_t H = b.H, I = b.I, R = b.has_gate ? 2 * I : I, t = p / b.K;
  const int per_tile = b.has_gate ? MMA_ROWS / 2 : MMA_ROWS;
  const int64_t i0 = (int64_t(blockIdx.y) * tiles_per_block + warp / split) * per_tile;
  // The lane's outputs and rows; rows past the end read row 0's neighbours clamped into range.
  int64_t i_lo, i_hi, r_lo, r_hi;
  if (b.has_gate) {
    i_lo = i_hi = i0 + g;
    const int64_t ic = i_lo < I ? i_lo : I - 1;
    r_lo = b.interleaved ? 2 * ic : ic;
    r_hi = b.interleaved ? 2 * ic + 1 : I + ic;
  } else {
    i_lo = i0 + g;
    i_hi = i0 + 8 + g;
    r_lo = i_lo < I ? i_lo : I - 1;
    r_hi = i_hi < I ? i_hi : I - 1;
  }
  float lo = 0.0f, hi = 0.0f;
  if (i0 < I)
    mma_rows_dot(a.up, e, r_lo, r_hi, a.xq + t * H, a.xs + t * quant_groups(H), warp % split, split, quarter, 1.0f, lo,
                 hi);
  if (quarter == 0) {
    part[warp][g] = lo;
    part[warp][g + 8] = hi;
  }
  __syncthreads();
  if (warp % split != 0 || quarter != 0 || i0 >= I) return;
  for (int s = 1; s < split; ++s) {
    lo += part[warp + s][g];
    hi += part[warp + s][g + 8];
  }
  const T* bias = b.gate_up_bias ? static_cast<const T*>(b.gate_up_bias) + e * R : nullptr;
  T* h = static_cast<T*>(b.h) + p * I;
  if (b.has_gate) {
    if (i_lo >= I) return;
    if (bias) {
      lo += to_f32(bias[r_lo]);
      hi += to_f32(bias[r_hi]);
    }
    h[i_lo] = from_f32<T>(gated_act(b.act, lo, hi));
  } else {
    if (i_lo < I) h[i_lo] = from_f32<T>(plain_act(b.act, lo + (bias ? to_f32(bias[r_lo]) : 0.0f)));
    if (i_hi < I) h[i_hi] = from_f32<T>(plain_act(b.act, hi + (bias ? to_f32(bias[r_hi]) : 0.0f)));
  }
}

// down + weighted slot sum, weights [E, H, I]: a tile is 16 outputs n of token t; its `split`
// warps share the (slot j, k block) items j·nb + kb round robin. grid (T, ceil(tiles / per block)).
template <class T>
__global__ void __launch_bounds__(THREADS) quant_down_mma(QuantBatchedArgs a, MmaSplit ms) {
  __shared__ float part[WARPS][MMA_ROWS];
  const BatchedArgs& b = a.b;
  const int64_t t = blockIdx.x;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, quarter = lane & 3;
  const int split = ms.split, tiles_per_block = WARPS / split, ks = warp % split;
  const int64_t H = b.H, I = b.I, gi = quant_groups(I);
  const int64_t n0 = (int64_t(blockIdx.y) * tiles_per_block + warp / split) * MMA_ROWS;
  const int64_t n_lo = n0 + g, n_hi = n0 + 8 + g;
  const int64_t r_lo = n_lo < H ? n_lo : H - 1, r_hi = n_hi < H ? n_hi : H - 1;
  float lo = 0.0f, hi = 0.0f;
  if (n0 < H) {
    // Slot j's items are kb = (ks - j·nb) mod split, + split, ...: its first k block for this warp.
    for (int64_t j = 0; j < b.K; ++j) {
      const int64_t kb0 = ((ks - (j * gi) % split) % split + split) % split;
      if (kb0 >= gi) continue;
      const int64_t p = t * b.K + j;
      const int64_t e = load_index(b.idx, b.idx64, p);
      if (e < 0 || e >= b.E) continue;
      const float wj = load_any(b.topw, b.topw_code, p);
      mma_rows_dot(a.down, e, r_lo, r_hi, a.hq + p * I, a.hs + p * gi, kb0, split, quarter, wj, lo, hi);
      if (b.down_bias && kb0 == 0) {
        const T* bias = static_cast<const T*>(b.down_bias) + e * H;
        lo = fmaf(wj, to_f32(bias[r_lo]), lo);
        hi = fmaf(wj, to_f32(bias[r_hi]), hi);
      }
    }
  }
  if (quarter == 0) {
    part[warp][g] = lo;
    part[warp][g + 8] = hi;
  }
  __syncthreads();
  if (ks != 0 || quarter != 0 || n0 >= H) return;
  for (int s = 1; s < split; ++s) {
    lo += part[warp + s][g];
    hi += part[warp + s][g + 8];
  }
  T* out = static_cast<T*>(b.out) + t * H;
  if (n_lo < H) out[n_lo] = from_f32<T>(lo);
  if (n_hi < H) out[n_hi] = from_f32<T>(hi);
}

// Warps per tile: enough warps in flight to cover the weight bandwidth (~8 K warps on an H200,
// 132 SMs × 64), while each warp keeps at least 2 of its `items` (k blocks or slot × k blocks).
MmaSplit mma_split(int64_t tiles, int64_t items) {
  int split = 1;
  while (split < WARPS && tiles * split < 8192 && items >= int64_t(4) * split) split *= 2;
  return MmaSplit{split};
}

// MOEX_CUDA_FP8_MMA_GEMV: "0" forces the CUDA-core kernels, anything else (or unset) allows the
// tensor-core path where the layout permits. Read per launch so tests can flip it.
bool mma_gemv_enabled() {
  const char* s = std::getenv("MOEX_CUDA_FP8_MMA_GEMV");
  if (s && *s) return std::strcmp(s, "0") != 0;
  return kMmaGemvDefault;
}

// The tensor-core path: FP8, [E, N, K] layout, K % 32 == 0 (whole 32-byte lane shares), 16-byte
// aligned expert bases and activation rows, sm_89+.
bool mma_usable(const QuantWeights& w, const uint8_t* x) {
  return !w.fp4 && !w.transposed && w.K % 32 == 0 && w.data_stride % 16 == 0 && aligned16(w.data) && aligned16(x);
}

bool bases_aligned16(const QuantWeights& w) { return aligned16(w.data); }

template <class T>
void launch_typed(const QuantBatchedArgs& a, DType dtype, cudaStream_t stream) {
  const BatchedArgs& b = a.b;
  const int64_t S = b.T * b.K;
  MOEX_CHECK(S < (int64_t(1) << 31) && b.T < (int64_t(1) << 31), "batched_mm on CUDA: T*K = {} pairs is too many", S);
  MOEX_ASSERT(!(a.up.fp4 && a.up.transposed));
  // The activation codes rows are 16-byte aligned when the weight rows are (same K, workspace bases).
  const bool vec_up = rows_vec16(a.up) && bases_aligned16(a.up) && aligned16(a.xq) && b.H % 16 == 0;
  const bool vec_down = rows_vec16(a.down) && bases_aligned16(a.down) && aligned16(a.hq) && b.I % 16 == 0;
  if (!a.up.transposed) {
    dim3 g_up(unsigned(S), unsigned(ceil_div(b.I, WARPS)));
    dim3 g_down(unsigned(b.T), unsigned(ceil_div(b.H, WARPS)));
    MOEX_CHECK(g_up.y <= 65535 && g_down.y <= 65535, "batched_mm on CUDA: sizes H={} I={} too large", b.H, b.I);
    const bool mma = mma_gemv_enabled() && current_device_cc() >= 89;
    if (mma && mma_usable(a.up, a.xq)) {
      const int64_t tiles = ceil_div(b.I, b.has_gate ? MMA_ROWS / 2 : MMA_ROWS);
      const MmaSplit ms = mma_split(S * tiles, quant_groups(b.H));
      const dim3 grid(unsigned(S), unsigned(ceil_div(tiles, WARPS / ms.split)));
      quant_up_mma<T><<<grid, THREADS, 0, stream>>>(a, ms);
      check_launch("quant_up_mma");
    } else {
      if (vec_up) quant_up_nt<T, true><<<g_up, THREADS, 0, stream>>>(a);
      else quant_up_nt<T, false><<<g_up, THREADS, 0, stream>>>(a);
      check_launch("quant_up_nt");
    }
    launch_quantize_activations(b.h, dtype, S, b.I, nullptr, a.hq, a.hs, nullptr, stream);
    if (mma && mma_usable(a.down, a.hq)) {
      const int64_t tiles = ceil_div(b.H, MMA_ROWS);
      const MmaSplit ms = mma_split(b.T * tiles, b.K * quant_groups(b.I));
      const dim3 grid(unsigned(b.T), unsigned(ceil_div(tiles, WARPS / ms.split)));
      quant_down_mma<T><<<grid, THREADS, 0, stream>>>(a, ms);
      check_launch("quant_down_mma");
    } else {
      if (vec_down) quant_down_nt<T, true><<<g_down, THREADS, 0, stream>>>(a);
      else quant_down_nt<T, false><<<g_down, THREADS, 0, stream>>>(a);
      check_launch("quant_down_nt");
    }
  } else {
    const int per = b.has_gate ? TN_COLS / 2 : TN_COLS;
    dim3 g_up(unsigned(S), unsigned(ceil_div(b.I, per)));
    dim3 g_down(unsigned(b.T), unsigned(ceil_div(b.H, TN_COLS)));
    MOEX_CHECK(g_up.y <= 65535 && g_down.y <= 65535, "batched_mm on CUDA: sizes H={} I={} too large", b.H, b.I);
    quant_up_tn<T><<<g_up, THREADS, 0, stream>>>(a);
    check_launch("quant_up_tn");
    launch_quantize_activations(b.h, dtype, S, b.I, nullptr, a.hq, a.hs, nullptr, stream);
    quant_down_tn<T><<<g_down, THREADS, 0, stream>>>(a);
    check_launch("quant_down_tn");
  }
}

}  // namespace

void launch_quant_batched(const QuantBatchedArgs& a, DType dtype, cudaStream_t stream) {
  if (a.b.T == 0) return;
  launch_quantize_activations(a.b.hidden, dtype, a.b.T, a.b.H, nullptr, a.xq, a.xs, nullptr, stream);
  switch (dtype) {
    case DType::f32: launch_typed<float>(a, dtype, stream); break;
    case DType::f16: launch_typed<__half>(a, dtype, stream); break;
    case DType::bf16: launch_typed<__nv_bfloat16>(a, dtype, stream); break;
    default: detail::fail(ErrorCode::internal, "batched_mm on CUDA: unexpected dtype {}", dtype_name(dtype));
  }
}

}  // namespace moex::cuda
