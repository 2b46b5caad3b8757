// backends/cuda/combine.cu — the small kernels around the GEMMs:
//   combine:     out[t] = round(Σ_j w[t,j] · y[pair_to_row[t*K+j]]) in slot order, in f32
//                (un-permute + weighted sum over K in one kernel; dropped slots add nothing;
//                each output element is written by one thread: no atomics, deterministic)
//   gather_rows: xs[r] = hidden[token of sorted row r]            (eager, before cuBLAS)
//   act_rows:    h[r, i] = round(act(gu[r, gate] + b, gu[r, up] + b))  (eager, after cuBLAS)
#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/pdl.cuh"

namespace moex::cuda {

namespace {

constexpr int THREADS = 256, COLS = 4;

// One block per (token, 1024 columns); each thread 4 columns. The slots are taken in chunks of
// SLOT_CHUNK: the chunk's rows and weights first, then all of its y loads (in flight together
// instead of one row's latency after another's), then the sum in slot order, one slot at a time —
// the same arithmetic as a plain loop over j.
constexpr int SLOT_CHUNK = 8;

template <class T>
__global__ void __launch_bounds__(THREADS) combine_kernel(CombineArgs a) {
  MOEX_CUDA_TRACE_BLOCK(k_combine);
  pdl_wait();  // no-op unless launched with PDL (launch_combine's `pdl`): y is the previous kernel's
  MOEX_CUDA_TRACE_WAITED();
  pdl_launch_dependents();
  const int64_t t = blockIdx.x;
  const int64_t n0 = (int64_t(blockIdx.y) * THREADS + threadIdx.x) * COLS;
  if (n0 >= a.H) return;
  const bool full = n0 + COLS <= a.H && (a.H % COLS) == 0;
  float acc[COLS] = {};
  for (int64_t j0 = 0; j0 < a.K; j0 += SLOT_CHUNK) {
    const int64_t nj = a.K - j0 < SLOT_CHUNK ? a.K - j0 : SLOT_CHUNK;
    int row[SLOT_CHUNK];
    float w[SLOT_CHUNK], v[SLOT_CHUNK][COLS];
#pragma unroll
    for (int q = 0; q < SLOT_CHUNK; ++q) {
      const int64_t p = t * a.K + j0 + q;
      row[q] = q < nj ? a.pair_to_row[p] : -1;  // -1: dropped slot (or past K): adds nothing
      w[q] = row[q] >= 0 ? load_any(a.topw, a.topw_code, p) : 0.0f;
    }
#pragma unroll
    for (int q = 0; q < SLOT_CHUNK; ++q) {
      const float* y = a.y + int64_t(row[q] >= 0 ? row[q] : 0) * a.H + n0;
      if (row[q] >= 0 && full) {
        const float4 f = *reinterpret_cast<const float4*>(y);
        v[q][0] = f.x;
        v[q][1] = f.y;
        v[q][2] = f.z;
        v[q][3] = f.w;
      } else {
#pragma unroll
        for (int c = 0; c < COLS; ++c) v[q][c] = row[q] >= 0 && n0 + c < a.H ? y[c] : 0.0f;
      }
    }
    if (a.down_bias) {
#pragma unroll
      for (int q = 0; q < SLOT_CHUNK; ++q) {
        if (row[q] < 0) continue;
        const int64_t e = load_index(a.idx, a.idx64, t * a.K + j0 + q);
        const T* b = static_cast<const T*>(a.down_bias) + e * a.H + n0;
#pragma unroll
        for (int c = 0; c < COLS; ++c)
          if (n0 + c < a.H) v[q][c] += to_f32(b[c]);
      }
    }
#pragma unroll
    for (int q = 0; q < SLOT_CHUNK; ++q) {
      if (row[q] < 0) continue;
#pragma unroll
      for (int c = 0; c < COLS; ++c) acc[c] += w[q] * v[q][c];
    }
  }
  T* out = static_cast<T*>(a.out) + t * a.H + n0;
  if (full && (reinterpret_cast<uintptr_t>(out) % (COLS * sizeof(T))) == 0) {
    // one 8-byte (16-bit types) or 16-byte (f32) store per thread
    if constexpr (sizeof(T) == 4) {
      *reinterpret_cast<float4*>(out) = make_float4(acc[0], acc[1], acc[2], acc[3]);
    } else {
      alignas(8) T q[COLS];
#pragma unroll
      for (int c = 0; c < COLS; ++c) q[c] = from_f32<T>(acc[c]);
      *reinterpret_cast<uint2*>(out) = *reinterpret_cast<const uint2*>(q);
    }
    return;
  }
#pragma unroll
  for (int c = 0; c < COLS; ++c)
    if (n0 + c < a.H) out[c] = from_f32<T>(acc[c]);
}

template <class T>
__global__ void gather_rows_kernel(const T* hidden, const int* sorted_pairs, const int* offsets, int E, int64_t K, int64_t H,
                                   T* xs) {
  const int64_t r = blockIdx.x;
  if (r >= offsets[E]) return;
  const T* src = hidden + int64_t(sorted_pairs[r] / K) * H;
  T* dst = xs + r * H;
  if ((H * int64_t(sizeof(T))) % 16 == 0 && ((reinterpret_cast<uintptr_t>(hidden) | reinterpret_cast<uintptr_t>(xs)) & 15u) == 0) {
    // 16-byte chunks: the row copy runs at memory speed (the grouped_mm pre-gather moves S·H elements)
    const uint4* s4 = reinterpret_cast<const uint4*>(src);
    uint4* d4 = reinterpret_cast<uint4*>(dst);
    const int64_t n4 = H * int64_t(sizeof(T)) / 16;
    for (int64_t k = threadIdx.x; k < n4; k += blockDim.x) d4[k] = s4[k];
    return;
  }
  for (int64_t k = threadIdx.x; k < H; k += blockDim.x) dst[k] = src[k];
}

template <class T>
__global__ void act_rows_kernel(ActRowsArgs a) {
  const int64_t r = blockIdx.x;
  if (r >= a.offsets[a.E]) return;
  const int64_t i = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  if (i >= a.I) return;
  const float* g = a.gu + r * a.R;
  const T* bias = nullptr;
  if (a.gate_up_bias) {
    const int64_t e = load_index(a.idx, a.idx64, a.sorted_pairs[r]);
    bias = static_cast<const T*>(a.gate_up_bias) + e * a.R;
  }
  float h;
  if (!a.has_gate) {
    h = plain_act(a.act, g[i] + (bias ? to_f32(bias[i]) : 0.0f));
  } else {
    const int64_t wg = a.interleaved ? 2 * i : i, wu = a.interleaved ? 2 * i + 1 : a.I + i;
    h = gated_act(a.act, g[wg] + (bias ? to_f32(bias[wg]) : 0.0f), g[wu] + (bias ? to_f32(bias[wu]) : 0.0f));
  }
  static_cast<T*>(a.h)[r * a.I + i] = from_f32<T>(h);
}

template <class F>
void by_dtype(DType dt, F&& f) {
  switch (dt) {
    case DType::f32: f(float{}); break;
    case DType::f16: f(__half{}); break;
    case DType::bf16: f(__nv_bfloat16{}); break;
    default: detail::fail(ErrorCode::internal, "CUDA experts: unexpected dtype {}", dtype_name(dt));
  }
}

}  // namespace

void launch_combine(const CombineArgs& a, DType dtype, cudaStream_t stream, bool pdl) {
  dim3 grid(unsigned(a.T), unsigned(ceil_div(a.H, THREADS * COLS)));
  by_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    if (pdl) {
      launch_pdl("combine", combine_kernel<T>, grid, dim3(THREADS), 0, stream, a);
      return;
    }
    combine_kernel<T><<<grid, THREADS, 0, stream>>>(a);
    check_launch("combine");
  });
}

void launch_combine_call(const ExpertsCall& call, const float* y, const int* pair_to_row, int64_t H, const void* down_bias,
                         DType dtype, cudaStream_t stream) {
  CombineArgs c{};
  c.y = y;
  c.pair_to_row = pair_to_row;
  c.idx = call.top_k_index.data;
  c.idx64 = call.top_k_index.dtype == DType::i64;
  c.topw = call.top_k_weights.data;
  c.topw_code = dtype_code(call.top_k_weights.dtype);
  c.down_bias = down_bias;
  c.T = call.top_k_index.shape[0];
  c.K = call.top_k_index.shape[1];
  c.H = H;
  c.out = call.out.data;
  launch_combine(c, dtype, stream);
}

void launch_gather_rows(const void* hidden, const int* sorted_pairs, const int* offsets, int64_t E, int64_t rows_bound,
                        int64_t K, int64_t H, DType dtype, void* xs, cudaStream_t stream) {
  by_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    gather_rows_kernel<T><<<unsigned(rows_bound), THREADS, 0, stream>>>(static_cast<const T*>(hidden), sorted_pairs, offsets,
                                                                        int(E), K, H, static_cast<T*>(xs));
  });
  check_launch("gather_rows");
}

void launch_act_rows(const ActRowsArgs& a, DType dtype, cudaStream_t stream) {
  dim3 grid(unsigned(a.rows_bound), unsigned(ceil_div(a.I, THREADS)));
  by_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    act_rows_kernel<T><<<grid, THREADS, 0, stream>>>(a);
  });
  check_launch("act_rows");
}

}  // namespace moex::cuda
