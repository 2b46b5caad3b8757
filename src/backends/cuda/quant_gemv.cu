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
// No routing plan, no host synchronisation, no allocation: capturable.
#include "backends/cuda/quant_common.cuh"

namespace moex::cuda {

namespace {

constexpr int THREADS = 256, WARPS = THREADS / 32;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// 16 e4m3 codes of a uint4 as f32.
__device__ __forceinline__ void decode16(const uint4& v, float* f) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const float2 lo = e4m3x2_value(uint16_t(w[q] & 0xffffu)), hi = e4m3x2_value(uint16_t(w[q] >> 16));
    f[4 * q] = lo.x;
    f[4 * q + 1] = lo.y;
    f[4 * q + 2] = hi.x;
    f[4 * q + 3] = hi.y;
  }
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
    if (vec_up) quant_up_nt<T, true><<<g_up, THREADS, 0, stream>>>(a);
    else quant_up_nt<T, false><<<g_up, THREADS, 0, stream>>>(a);
    check_launch("quant_up_nt");
    launch_quantize_activations(b.h, dtype, S, b.I, nullptr, a.hq, a.hs, nullptr, stream);
    if (vec_down) quant_down_nt<T, true><<<g_down, THREADS, 0, stream>>>(a);
    else quant_down_nt<T, false><<<g_down, THREADS, 0, stream>>>(a);
    check_launch("quant_down_nt");
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
