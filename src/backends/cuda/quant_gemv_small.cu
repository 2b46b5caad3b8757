// backends/cuda/quant_gemv_small.cu — batched_mm (and grouped_mm) on FP8 block-scaled experts at
// decode (T = 1 by default): two kernels chained with programmatic dependent launch (pdl.cuh), each
// quantizing its own activations in shared memory, so that a forward is the two weight streams:
//
//   small_up    grid (pair p, ceil(I / (8·OPW))), OPW outputs i per warp: the warp copies its gate
//               and up weight rows (e4m3) into shared memory with cp.async, all at once; while they
//               arrive, the block quantizes the pair's token row per 128 channels into shared
//               memory; h[p, i] = round(act(gate, up)) in the activation dtype.
//   small_down  grid (token t, ceil(H / 8)), one output n per warp: the warp copies row n of every
//               routed slot's expert into shared memory before pdl_wait (the routing was written at
//               least two kernels back: final once small_up has passed its own wait, as in
//               quant_decode.cu), then the block quantizes the token's K h rows into shared memory;
//               out[t, n] = round(Σ_j w_j · (y_j[n] + bias_j[n])) in slot order (f32).
//
// Why: at T = 1 the decode path (quant_decode.cu) is four dependent kernels, and its tensor-core up
// kernel streams qwen3_30b_a3b's 25 MB at 1.86 TB/s with 117 registers (two blocks per SM), where
// bf16 batched_mm's GEMV (batched_gemv.cu) streams at 2.9 TB/s (H200, docs/PERF.md, twenty-second
// session). A first version of these kernels held the weights in registers (80-95 per thread, 96
// KB in flight per SM) and streamed at 1.3 / 0.6 TB/s (H200, 2026-12-03, thirty-first session):
// at T = 1 what sets the pace is the bytes in flight per SM, and cp.async puts a warp's whole share
// in flight without registers.
//
// Numerics (SPEC §6, as quant_gemv.cu and the CPU): activations quantized per token and 128
// channels (scale = amax / 448, 1 when amax is 0 or not finite; codes e4m3, saturating, nearest
// even); a lane sums a 16-code chunk's exact products (code × code, both exact in f32) in f32 and
// adds the sum times activation scale × weight block scale (a chunk never crosses a 128-k block);
// the lanes' sums meet in a warp reduction.
//
// Shared memory holds the activation code VALUES as f32, permuted so that the four float4 loads of
// a lane's chunk are conflict-free: element k of a row of n = 16·nv channels sits at float4
// ((k/4) % 4)·nv + k/16, lane (k % 4). Requirements (quant_small_usable): FP8 [E, out, in]
// weights, H and I multiples of 16, 16-byte aligned expert bases and strides, each block's shared
// memory (the activation rows as f32 and the warps' weight rows) within kSmallMaxSmem — the
// small-expert shapes (qwen3_30b_a3b, qwen15_moe_a2_7b); larger ones keep the decode path.
#include <cstdlib>
#include <cstring>

#include "backends/cuda/mma_ptx.cuh"
#include "backends/cuda/pdl.cuh"
#include "backends/cuda/quant_common.cuh"

namespace moex::cuda {

namespace {

constexpr int THREADS = 256, WARPS = THREADS / 32;
constexpr int STAGE_BATCH = 2;  // 128-channel groups whose loads a warp issues together (quantize_rows)
// Shared memory of one block at most: two blocks per SM.
constexpr int64_t kSmallMaxSmem = 112 * 1024;
// T bound of the default route (MOEX_CUDA_FP8_SMALL=1: any T, =0: never).
constexpr int64_t kSmallMaxTokens = 1;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Float index of element k in the permuted shared-memory row of nv 16-element chunks.
__device__ __forceinline__ int64_t perm_index(int64_t k, int64_t nv) { return (((k >> 2) & 3) * nv + (k >> 4)) * 4 + (k & 3); }

// Rows [0, rows) of n channels quantized per 128 channels into shared memory by the block's warps:
// row j's code values into codes + j·n (permuted), its group scales into scales + j·ceil(n/128).
// row_of(j): the row's first element, nullptr to skip it. A warp takes the (row, group) items
// warp, warp + WARPS, ... and issues the loads of B items before reducing any of them, so that the
// staging costs one memory round trip per B items. Same arithmetic as quant_activation.cu.
template <class T, int B, class RowOf>
__device__ __forceinline__ void quantize_rows(int64_t rows, int64_t n, int nv, RowOf row_of, float* codes, float* scales,
                                              int warp, int lane) {
  constexpr int PER_LANE = kQuantGroup / 32;
  const int64_t gpr = quant_groups(n), items = rows * gpr;
  for (int64_t base = warp; base < items; base += int64_t(WARPS) * B) {
    const T* src[B];
    float v[B][PER_LANE];
#pragma unroll
    for (int b = 0; b < B; ++b) {
      const int64_t item = base + int64_t(WARPS) * b;
      src[b] = item < items ? row_of(item / gpr) : nullptr;
      const int64_t c0 = (item % gpr) * kQuantGroup;
#pragma unroll
      for (int q = 0; q < PER_LANE; ++q) {
        const int64_t c = c0 + q * 32 + lane;
        v[b][q] = src[b] && c < n ? to_f32(src[b][c]) : 0.0f;
      }
    }
#pragma unroll
    for (int b = 0; b < B; ++b) {
      if (!src[b]) continue;  // warp-uniform
      const int64_t item = base + int64_t(WARPS) * b, j = item / gpr, g = item % gpr;
      float amax = 0.0f;
#pragma unroll
      for (int q = 0; q < PER_LANE; ++q) amax = fmaxf(amax, fabsf(v[b][q]));
      amax = warp_max(amax);
      const float s = amax > 0.0f && isfinite(amax) ? __fdiv_rn(amax, 448.0f) : 1.0f;
      if (lane == 0) scales[j * gpr + g] = s;
#pragma unroll
      for (int q = 0; q < PER_LANE; ++q) {
        const int64_t c = g * kQuantGroup + q * 32 + lane;
        if (c < n) codes[j * n + perm_index(c, nv)] = e4m3_value(e4m3_code_sat(__fdiv_rn(v[b][q], s)));
      }
    }
  }
}

// s + Σ of 4 exact products: activation code values x (one float4 of the permuted row) × the 4
// e4m3 weight codes of word w (low byte first). A chunk's 16 products are its 4 words in order.
__device__ __forceinline__ float dot4(const float4& x, uint32_t w, float s) {
  const float2 lo = e4m3x2_value(uint16_t(w & 0xffffu)), hi = e4m3x2_value(uint16_t(w >> 16));
  s = fmaf(x.x, lo.x, s);
  s = fmaf(x.y, lo.y, s);
  s = fmaf(x.z, hi.x, s);
  return fmaf(x.w, hi.y, s);
}
__device__ __forceinline__ uint32_t word(const uint4& v, int q) { return q == 0 ? v.x : q == 1 ? v.y : q == 2 ? v.z : v.w; }

// Index of weight row n's first block scale in expert e (fp8_block_scale's, without the k block).
__device__ __forceinline__ int64_t scale_row(const QuantWeights& w, int64_t e, int64_t n) {
  return e * w.scale_stride + (n / w.block_n) * quant_groups(w.K);
}
__device__ __forceinline__ float scale_at(const QuantWeights& w, int64_t i) {
  return w.ue8m0 ? ue8m0_value(static_cast<const uint8_t*>(w.scales)[i]) : static_cast<const float*>(w.scales)[i];
}


// Shared memory of a block (bytes), in this order: the activation code values (f32, rows × n
// permuted), their scales (rows × ceil(n/128) f32, rounded up to 16 bytes), then each warp's
// weight rows (WARPS × wrows × n e4m3 bytes, 16-byte aligned).
__host__ __device__ inline int64_t smem_scales_offset(int64_t rows, int64_t n) { return rows * n * 4; }
__host__ __device__ inline int64_t smem_weights_offset(int64_t rows, int64_t n) {
  return (smem_scales_offset(rows, n) + rows * quant_groups(n) * 4 + 15) / 16 * 16;
}
__host__ __device__ inline int64_t smem_bytes(int64_t rows, int64_t n, int64_t wrows) {
  return smem_weights_offset(rows, n) + int64_t(WARPS) * wrows * n;
}

// Copies `bytes` (a multiple of 16) from global src to shared dst, 16 bytes per lane at a time.
__device__ __forceinline__ void warp_copy_async(uint8_t* dst, const uint8_t* src, int64_t bytes, int lane) {
  for (int64_t o = int64_t(lane) * 16; o < bytes; o += 32 * 16) ptx::cp_async16(ptx::smem_u32(dst + o), src + o, true);
}

// ---- up: OPW outputs i per warp, gate and up rows (GATED) or one row each -------------------
template <class T, bool GATED, int OPW>
__global__ void __launch_bounds__(THREADS, 2) small_up(QuantBatchedArgs a) {
  extern __shared__ float4 smem4[];
  constexpr int NR = (GATED ? 2 : 1) * OPW;  // weight rows per warp
  const BatchedArgs& b = a.b;
  const int64_t H = b.H, I = b.I;
  const int nv = int(H / 16);  // 16-byte chunks per weight row
  uint8_t* const smem = reinterpret_cast<uint8_t*>(smem4);
  float* const xcodes = reinterpret_cast<float*>(smem);                           // [H] permuted
  float* const xscale = reinterpret_cast<float*>(smem + smem_scales_offset(1, H));  // [ceil(H/128)]
  pdl_wait();  // the routing and the tokens come from the previous kernels
  pdl_launch_dependents();
  const int64_t p = blockIdx.x;
  const int64_t e = load_index(b.idx, b.idx64, p);
  if (e < 0 || e >= b.E) return;  // dropped slot (uniform over the block): its h row is never read
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t i0 = (int64_t(blockIdx.y) * WARPS + warp) * OPW;
  // Weight row r of the warp: output i0 + r / (GATED ? 2 : 1), gate (even r) or up (odd r) when
  // gated. Rows of outputs past I are not read.
  uint8_t* const wsm = smem + smem_weights_offset(1, H) + int64_t(warp) * NR * H;
  int64_t srow[NR];
#pragma unroll
  for (int r = 0; r < NR; ++r) {
    const int64_t i = i0 + (GATED ? r / 2 : r);
    const int64_t row = !GATED ? i : b.interleaved ? 2 * i + (r & 1) : (r & 1) * I + i;
    if (i < I) warp_copy_async(wsm + r * H, a.up.data + e * a.up.data_stride + row * H, H, lane);
    srow[r] = scale_row(a.up, e, i < I ? row : 0);
  }
  ptx::cp_async_commit();
  // the pair's token row, quantized into shared memory while the weights arrive
  const T* x = static_cast<const T*>(b.hidden) + (p / b.K) * H;
  quantize_rows<T, STAGE_BATCH>(1, H, nv, [&](int64_t) { return x; }, xcodes, xscale, warp, lane);
  ptx::cp_async_wait<0>();
  __syncthreads();
  if (i0 >= I) return;
  float acc[NR];
#pragma unroll
  for (int r = 0; r < NR; ++r) acc[r] = 0.0f;
#pragma unroll 2
  for (int c = lane; c < nv; c += 32) {
    const int kb = c >> 3;
    float part[NR];
#pragma unroll
    for (int r = 0; r < NR; ++r) part[r] = 0.0f;
    uint4 w[NR];
#pragma unroll
    for (int r = 0; r < NR; ++r) w[r] = ptx::lds128(ptx::smem_u32(wsm + r * H + int64_t(c) * 16));
#pragma unroll
    for (int q = 0; q < 4; ++q) {  // one float4 of codes at a time
      const float4 x4 = smem4[q * nv + c];
#pragma unroll
      for (int r = 0; r < NR; ++r) part[r] = dot4(x4, word(w[r], q), part[r]);
    }
    const float xs = xscale[kb];
#pragma unroll
    for (int r = 0; r < NR; ++r) acc[r] = fmaf(part[r], xs * scale_at(a.up, srow[r] + kb), acc[r]);
  }
  const T* bias = b.gate_up_bias ? static_cast<const T*>(b.gate_up_bias) + e * (GATED ? 2 * I : I) : nullptr;
  T* h = static_cast<T*>(b.h) + p * I;
#pragma unroll
  for (int o = 0; o < OPW; ++o) {
    const int64_t i = i0 + o;
    if (i >= I) break;  // warp-uniform; the outputs past I are the last ones
    if constexpr (GATED) {
      float g = warp_sum(acc[2 * o]), u = warp_sum(acc[2 * o + 1]);
      if (bias) {
        g += to_f32(bias[b.interleaved ? 2 * i : i]);
        u += to_f32(bias[b.interleaved ? 2 * i + 1 : I + i]);
      }
      if (lane == 0) h[i] = from_f32<T>(gated_act(b.act, g, u));
    } else {
      float v = warp_sum(acc[o]);
      if (bias) v += to_f32(bias[i]);
      if (lane == 0) h[i] = from_f32<T>(plain_act(b.act, v));
    }
  }
}

// ---- down + weighted slot sum: one output n per warp, all K slots' rows in shared memory -------
template <class T>
__global__ void __launch_bounds__(THREADS, 2) small_down(QuantBatchedArgs a) {
  extern __shared__ float4 smem4[];
  const BatchedArgs& b = a.b;
  const int64_t H = b.H, I = b.I, K = b.K, gI = quant_groups(I);
  const int nv = int(I / 16);  // 16-byte chunks per weight row
  uint8_t* const smem = reinterpret_cast<uint8_t*>(smem4);
  float* const hcodes = reinterpret_cast<float*>(smem);                           // [K][I] permuted rows
  float* const hscale = reinterpret_cast<float*>(smem + smem_scales_offset(K, I));  // [K][gI]
  const int64_t t = blockIdx.x;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t n = int64_t(blockIdx.y) * WARPS + warp;
  const bool active = n < H;
  uint8_t* const wsm = smem + smem_weights_offset(K, I) + int64_t(warp) * K * I;  // [K][I] this warp's rows
  // the weight rows of every routed slot before pdl_wait: the routing is final (see the header),
  // weights are never written
  if (active)
    for (int64_t j = 0; j < K; ++j) {
      const int64_t e = load_index(b.idx, b.idx64, t * K + j);
      if (e >= 0 && e < b.E) warp_copy_async(wsm + j * I, a.down.data + e * a.down.data_stride + n * I, I, lane);
    }
  ptx::cp_async_commit();
  pdl_wait();
  pdl_launch_dependents();
  // the token's K h rows, quantized into shared memory (dropped slots skipped: never read)
  const T* h = static_cast<const T*>(b.h) + t * K * I;
  quantize_rows<T, STAGE_BATCH>(
      K, I, nv,
      [&](int64_t j) -> const T* {
        const int64_t ej = load_index(b.idx, b.idx64, t * K + j);
        return ej >= 0 && ej < b.E ? h + j * I : nullptr;
      },
      hcodes, hscale, warp, lane);
  ptx::cp_async_wait<0>();
  __syncthreads();
  if (!active) return;
  const int64_t sblock = (n / a.down.block_n) * gI;  // row n's block scales, past the expert's
  float acc = 0.0f;
  for (int64_t j = 0; j < K; ++j) {
    const int64_t e = load_index(b.idx, b.idx64, t * K + j);
    if (e < 0 || e >= b.E) continue;  // warp-uniform
    const float4* row = smem4 + j * (I / 4);
    const uint8_t* wrow = wsm + j * I;
    const int64_t sbase = e * a.down.scale_stride + sblock;
    float part = 0.0f;
#pragma unroll 2
    for (int c = lane; c < nv; c += 32) {
      const int kb = c >> 3;
      const uint4 w = ptx::lds128(ptx::smem_u32(wrow + int64_t(c) * 16));
      float s = 0.0f;
#pragma unroll
      for (int q = 0; q < 4; ++q) s = dot4(row[q * nv + c], word(w, q), s);
      part = fmaf(s, hscale[j * gI + kb] * scale_at(a.down, sbase + kb), part);
    }
    float y = warp_sum(part);
    if (b.down_bias) y += to_f32(static_cast<const T*>(b.down_bias)[e * H + n]);
    acc += load_any(b.topw, b.topw_code, t * K + j) * y;
  }
  if (lane == 0) static_cast<T*>(b.out)[t * H + n] = from_f32<T>(acc);
}

int64_t up_smem(const BatchedArgs& b, int opw) { return smem_bytes(1, b.H, (b.has_gate ? 2 : 1) * opw); }
int64_t down_smem(const BatchedArgs& b) { return smem_bytes(b.K, b.I, b.K); }

// MOEX_CUDA_FP8_SMALL_OPW=2: two outputs i per warp in the up kernel (half the blocks); default 1.
int outputs_per_warp() {
  const char* s = std::getenv("MOEX_CUDA_FP8_SMALL_OPW");
  return s && std::atoi(s) == 2 ? 2 : 1;
}

// The block's dynamic shared memory allowed, and the SM's L1 / shared split set to the largest
// shared part, so that several blocks fit per SM (these kernels read little through L1).
template <class Kernel>
void allow_smem(Kernel kernel, int64_t bytes) {
  if (bytes > 48 * 1024)
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)), "cudaFuncSetAttribute");
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, int(cudaSharedmemCarveoutMaxShared)),
        "cudaFuncSetAttribute");
}

template <class T, bool GATED>
void launch_up(const QuantBatchedArgs& a, int opw, cudaStream_t stream) {
  const BatchedArgs& b = a.b;
  const dim3 grid(unsigned(b.T * b.K), unsigned(ceil_div(b.I, int64_t(WARPS) * opw)));
  const int64_t smem = up_smem(b, opw);
  const auto kernel = opw == 2 ? small_up<T, GATED, 2> : small_up<T, GATED, 1>;
  allow_smem(kernel, smem);
  launch_pdl("quant_small_up", kernel, grid, dim3(THREADS), size_t(smem), stream, a);
}

template <class T>
void launch_typed(const QuantBatchedArgs& a, cudaStream_t stream) {
  const BatchedArgs& b = a.b;
  const int opw = outputs_per_warp();
  if (b.has_gate) launch_up<T, true>(a, opw, stream);
  else launch_up<T, false>(a, opw, stream);
  const dim3 grid(unsigned(b.T), unsigned(ceil_div(b.H, WARPS)));
  const int64_t smem = down_smem(b);
  allow_smem(small_down<T>, smem);
  launch_pdl("quant_small_down", small_down<T>, grid, dim3(THREADS), size_t(smem), stream, a);
}

bool weights_ok(const QuantWeights& w) {
  return !w.fp4 && !w.transposed && w.K % 16 == 0 && w.data_stride % 16 == 0 && aligned16(w.data);
}

}  // namespace

bool quant_small_wanted(int64_t T) {
  const char* s = std::getenv("MOEX_CUDA_FP8_SMALL");
  if (s && *s) return std::strcmp(s, "0") != 0;
  // the decode path's own tests force it with MOEX_CUDA_FP8_DECODE=1; leave them that path
  const char* d = std::getenv("MOEX_CUDA_FP8_DECODE");
  if (d && std::strcmp(d, "1") == 0) return false;
  return T <= kSmallMaxTokens;
}

bool quant_small_usable(const QuantBatchedArgs& a) {
  const BatchedArgs& b = a.b;
  if (!quant_small_wanted(b.T) || b.T <= 0 || b.K <= 0) return false;
  if (!weights_ok(a.up) || !weights_ok(a.down) || b.H % 16 != 0 || b.I % 16 != 0) return false;
  if (up_smem(b, 2) > kSmallMaxSmem || down_smem(b) > kSmallMaxSmem) return false;
  const int64_t S = b.T * b.K;
  return S < (int64_t(1) << 31) && ceil_div(b.I, WARPS) <= 65535 && ceil_div(b.H, WARPS) <= 65535;
}

void launch_quant_batched_small(const QuantBatchedArgs& a, DType dtype, cudaStream_t stream) {
  switch (dtype) {
    case DType::f32: launch_typed<float>(a, stream); break;
    case DType::f16: launch_typed<__half>(a, stream); break;
    case DType::bf16: launch_typed<__nv_bfloat16>(a, stream); break;
    default: detail::fail(ErrorCode::internal, "batched_mm on CUDA: unexpected dtype {}", dtype_name(dtype));
  }
}

}  // namespace moex::cuda
