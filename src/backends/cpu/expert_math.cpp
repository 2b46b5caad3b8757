// backends/cpu/expert_math.cpp — one expert's projections and activation on a block of rows.
#include "backends/cpu/expert_math.hpp"

#include <cstdlib>
#include <string>

namespace moex::cpu {

ExpertView expert_view(const Experts& ex, int64_t e, const PackedWeights* packed) {
  const ExpertsSpec& s = ex.spec;
  const int64_t R = s.gate_up_rows(), H = s.hidden, I = s.intermediate;
  const size_t esz = dtype_size(ex.gate_up.dtype);
  ExpertView v{&s, nullptr, nullptr, nullptr, nullptr};
  if (packed) v.packed = &packed->expert(e);
  // per-expert strides come from the tensors themselves (packed FP4 rows are half as long)
  v.gate_up = static_cast<const char*>(ex.gate_up.data) + size_t(e * ex.gate_up.strides[0]) * esz;
  v.down = static_cast<const char*>(ex.down.data) + size_t(e * ex.down.strides[0]) * esz;
  if (s.quant.quantized()) {
    auto scale_ptr = [&](const TensorView& t) {
      return static_cast<const void*>(static_cast<const char*>(t.data) + size_t(e * t.strides[0]) * dtype_size(t.dtype));
    };
    v.gate_up_q = QuantMatrix{s.quant, static_cast<const uint8_t*>(v.gate_up), scale_ptr(ex.gate_up_scale), R, H, s.transposed};
    v.down_q = QuantMatrix{s.quant, static_cast<const uint8_t*>(v.down), scale_ptr(ex.down_scale), H, I, s.transposed};
  }
  if (s.has_bias) {
    v.gate_up_bias = static_cast<const char*>(ex.gate_up_bias.data) + size_t(e * R) * dtype_size(ex.gate_up_bias.dtype);
    v.down_bias = static_cast<const char*>(ex.down_bias.data) + size_t(e * H) * dtype_size(ex.down_bias.dtype);
  }
  return v;
}

namespace {

void add_bias(const void* bias, DType dt, float* y, int64_t ldy, int64_t m, int64_t n0, int64_t n1) {
  if (!bias) return;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t n = n0; n < n1; ++n) y[i * ldy + n] += load_scalar(bias, dt, n);
}


// The packed form of the rows [r0, r0 + width) of one matrix: pieces of up to two packed parts
// (PackedExpert). False when a piece would not start on a panel of its part (then the caller reads
// the weights in place); the backends' column tiles are multiples of 64, so that does not happen.
struct PackedParts {
  const PackedMatrix* parts = nullptr;
  int count = 0;
};

// x: f32 rows for f32 panels, bf16 rows for bf16 panels (f32 rows on the tables with packed_matmul_bf16_wide), for FP8 and FP4 panels the activations' e4m3
// codes as f32 with their scales xs [m, ceil(K / 128)] (false, in place, for any other pairing, and for fewer
// rows than the matrix's min_rows).
bool project_packed(const KernelTable& kt, PackedParts pk, const void* x, DType xdt, int64_t m, int64_t K, int64_t r0,
                    int64_t width, float* y, int64_t ldy, const float* xs = nullptr) {
  for (int i = 0; i < pk.count; ++i) {
    const PackedMatrix& p = pk.parts[i];
    const bool pairing = p.panels_e4m3  ? xdt == DType::f32 && xs && kt.packed_matmul_fp8 && kt.packed_fp8_pairs == p.fp8_pairs
                         : p.panels_fp4  ? xdt == DType::f32 && xs && kt.packed_matmul_fp4 && kt.packed_fp4_pairs == p.fp4_pairs
                         : p.panels_bf16 ? (xdt == DType::bf16 && kt.packed_matmul_bf16) || (xdt == DType::f32 && kt.packed_matmul_bf16_wide)
                                         : xdt == DType::f32;
    const bool kernel = pairing && m >= p.min_rows;
    const int64_t lo = std::max(r0, p.row0), hi = std::min(r0 + width, p.row0 + p.n);
    if (lo < hi && (!kernel || (lo - p.row0) % kPanelCols != 0)) return false;
  }
  for (int i = 0; i < pk.count; ++i) {
    const PackedMatrix& p = pk.parts[i];
    const int64_t lo = std::max(r0, p.row0), hi = std::min(r0 + width, p.row0 + p.n);
    if (lo >= hi) continue;
    // the four argument structs share these fields: x (and FP8 / FP4 activation scales), its rows, the
    // panels, y's columns [lo, hi), the prefetch distance
    auto fill = [&](auto& args, const auto* xp, const auto* panels) {
      args.x = xp;
      args.ldx = K;
      args.m = m;
      args.k = K;
      args.panels = panels;
      args.y = y + (lo - r0);
      args.ldy = ldy;
      args.n0 = lo - p.row0;
      args.n1 = hi - p.row0;
      args.prefetch_ahead = p.prefetch_ahead;
      if constexpr (requires { args.xs; }) args.xs = xs;  // FP8 / FP4: the activation scales
    };
    if (p.panels_e4m3) {
      PackedFp8MatmulArgs a;
      fill(a, static_cast<const float*>(x), p.panels_e4m3);
      a.block_scales = p.block_scales;
      a.block_kind = p.block_kind;
      kt.packed_matmul_fp8(a);
    } else if (p.panels_fp4) {
      PackedFp4MatmulArgs a;
      fill(a, static_cast<const float*>(x), p.panels_fp4);
      a.group_scales = p.group_scales;
      a.group = p.group;
      kt.packed_matmul_fp4(a);
    } else if (p.panels_bf16 && xdt == DType::f32) {  // tables without vdpbf16ps (AVX2): f32 x on FMAs
      PackedBf16WideArgs a;
      fill(a, static_cast<const float*>(x), p.panels_bf16);
      kt.packed_matmul_bf16_wide(a);
    } else if (p.panels_bf16) {
      PackedBf16MatmulArgs a;
      fill(a, static_cast<const uint16_t*>(x), p.panels_bf16);
      kt.packed_matmul_bf16(a);
    } else {
      PackedMatmulArgs a;
      fill(a, static_cast<const float*>(x), p.panels);
      kt.packed_matmul(a);
    }
  }
  return true;
}

// y[0:m, 0:w] (row stride ldy) = x[m, K] · W[r0 : r0 + w, :]ᵀ (+ bias[r0 : r0 + w]): the weight rows
// r0.. of the logical [N, K] matrix, written to columns 0.. of a compact buffer. With `packed` (f32
// experts; bf16 experts with bf16 x, or with f32 x where the table has packed_matmul_bf16_wide) the
// packed copy of W is read instead of W.
// x_vnni: x's bf16 rows already packed for the AMX kernel (MatmulArgs::x_vnni), or null.
void project_rows(const KernelTable& kt, const ExpertsSpec& s, const void* w, const void* bias, const void* x, DType xdt,
                  int64_t m, int64_t N, int64_t K, int64_t r0, int64_t width, float* y, int64_t ldy, PackedParts packed = {},
                  const uint16_t* x_vnni = nullptr) {
  if (packed.count > 0 && project_packed(kt, packed, x, xdt, m, K, r0, width, y, ldy)) {
    if (bias) add_bias(static_cast<const char*>(bias) + r0 * int64_t(dtype_size(s.dtype)), s.dtype, y, ldy, m, 0, width);
    return;
  }
  const size_t esz = dtype_size(s.dtype);
  MatmulArgs a;
  a.x = x;
  a.xdtype = xdt;
  a.ldx = K;
  a.m = m;
  a.k = K;
  // nt: W [N, K] → rows r0.. start r0·K elements in; nn (transposed): W [K, N] → columns r0.. start r0 in
  a.w = static_cast<const char*>(w) + (s.transposed ? r0 : r0 * K) * int64_t(esz);
  a.wdtype = s.dtype;
  a.layout = s.transposed ? WeightLayout::nn : WeightLayout::nt;
  a.ldw = s.transposed ? N : K;
  a.y = y;
  a.ldy = ldy;
  a.n0 = 0;
  a.n1 = width;
  a.x_vnni = xdt == DType::bf16 ? x_vnni : nullptr;
  kt.matmul(a);
  if (bias) add_bias(static_cast<const char*>(bias) + r0 * int64_t(esz), s.dtype, y, ldy, m, 0, width);
}

// y[m, n0:n1] = x[m, K] · Wᵀ (+ bias) for one expert matrix W of logical shape [N, K] (out × in).
void project(const KernelTable& kt, const ExpertsSpec& s, const void* w, const QuantMatrix& wq, const void* bias, const void* x,
             DType xdt, int64_t m, int64_t N, int64_t K, float* y, int64_t n0, int64_t n1, QuantOperand q, PackedParts packed,
             const uint16_t* x_vnni = nullptr) {
  if (s.quant.quantized()) {
    // FP8 / FP4 experts packed (PackedWeights): the packed kernel; else the weights in place
    if (packed.count == 0 || !project_packed(kt, packed, x, DType::f32, m, K, n0, n1 - n0, y + n0, N, q.scales))
      quant_matmul(kt, wq, static_cast<const float*>(x), q.scales, m, y, N, n0, n1, q.scratch);
    add_bias(bias, s.dtype, y, N, m, n0, n1);
  } else {
    project_rows(kt, s, w, bias, x, xdt, m, N, K, n0, n1 - n0, y + n0, N, packed, x_vnni);
  }
}

PackedParts gate_up_parts(const ExpertView& ev) {
  return ev.packed ? PackedParts{ev.packed->gate_up, ev.packed->gate_up_parts} : PackedParts{};
}
PackedParts down_parts(const ExpertView& ev) { return ev.packed ? PackedParts{&ev.packed->down, 1} : PackedParts{}; }

}  // namespace

// Whether h = silu(g) · u can go through the table's vector form (the SiLU-gated experts of most MoE
// models, concatenated gate / up): not for other activations or interleaved gate / up. h is bf16, or
// f32 holding values rounded to the experts' dtype (f32 experts; quantized experts' f32 h).
static bool vector_silu(const ExpertsSpec& s, DType hdt) {
  return s.activation.kind == Activation::silu && s.has_gate && !s.interleaved && (hdt == DType::bf16 || hdt == DType::f32);
}
// h[0:n] = silu(g) · u rounded to hdt (bf16), or to the experts' dtype `dt` and kept in f32 (hdt f32),
// where vector_silu(s, hdt).
static void silu_row(const KernelTable& kt, const float* g, const float* u, int64_t n, void* h, DType hdt, DType dt) {
  if (hdt == DType::f32) {
    float* hf = static_cast<float*>(h);
    kt.silu_mul(g, u, hf, n);
    if (dt == DType::f32) return;
    uint16_t tmp[256];  // round to dt (bf16 / f16) in place, as round_to does one value at a time
    for (int64_t c = 0; c < n; c += 256) {
      const int64_t len = std::min<int64_t>(256, n - c);
      kt.from_f32(hf + c, dt, tmp, len);
      kt.to_f32(tmp, dt, hf + c, len);
    }
    return;
  }
  float tmp[256];
  for (int64_t c = 0; c < n; c += 256) {
    const int64_t len = std::min<int64_t>(256, n - c);
    kt.silu_mul(g + c, u + c, tmp, len);
    kt.from_f32(tmp, DType::bf16, static_cast<uint16_t*>(h) + c, len);
  }
}

// Whether up_activation can run on the gated kernel (PackedBf16GatedArgs): bf16 rows and h, SiLU-gated
// concatenated [gate; up] experts without bias, packed as two bf16 halves of I rows, a table with the
// kernel, columns from a panel boundary. MOEX_CPU_GATED_KERNEL=0: never (A/B).
static bool gated_kernel_applies(const KernelTable& kt, const ExpertView& ev, DType xdt, DType hdt, int64_t c0,
                                 const uint16_t* x_vnni) {
  static const bool on = [] {
    const char* v = std::getenv("MOEX_CPU_GATED_KERNEL");
    return !(v && std::string(v) == "0");
  }();
  const ExpertsSpec& s = *ev.spec;
  if (!on || !kt.packed_gated_bf16 || !kt.packed_matmul_bf16 || !ev.packed || x_vnni || ev.gate_up_bias) return false;
  if (xdt != DType::bf16 || hdt != DType::bf16 || s.activation.kind != Activation::silu || !s.has_gate || s.interleaved) return false;
  const PackedExpert& pe = *ev.packed;
  const int64_t I = s.intermediate;
  return pe.gate_up_parts == 2 && pe.gate_up[0].panels_bf16 && pe.gate_up[1].panels_bf16 && pe.gate_up[0].row0 == 0 &&
         pe.gate_up[0].n == I && pe.gate_up[1].row0 == I && pe.gate_up[1].n == I && pe.gate_up[0].min_rows <= 1 &&
         c0 % kPanelCols == 0;
}

void up_activation(const KernelTable& kt, const ExpertView& ev, const void* x, DType xdt, int64_t m, void* h, DType hdt,
                   int64_t c0, int64_t c1, float* scratch, const uint16_t* x_vnni) {
  const ExpertsSpec& s = *ev.spec;
  const int64_t H = s.hidden, I = s.intermediate, R = s.gate_up_rows(), w = c1 - c0;
  const size_t xrow = size_t(H) * dtype_size(xdt), hsz = dtype_size(hdt);
  if (gated_kernel_applies(kt, ev, xdt, hdt, c0, x_vnni)) {
    // h straight from the kernel's registers, in the same chunks of rows as below (the same bits)
    for (int64_t i0 = 0; i0 < m; i0 += kFusedRows) {
      PackedBf16GatedArgs a;
      a.x = static_cast<const uint16_t*>(x) + i0 * H;
      a.ldx = H;
      a.m = std::min(kFusedRows, m - i0);
      a.k = H;
      a.gate_panels = ev.packed->gate_up[0].panels_bf16;
      a.up_panels = ev.packed->gate_up[1].panels_bf16;
      a.h = static_cast<uint16_t*>(h) + i0 * I + c0;
      a.ldh = I;
      a.n0 = c0;
      a.n1 = c1;
      a.prefetch_ahead = ev.packed->gate_up[0].prefetch_ahead;
      kt.packed_gated_bf16(a);
    }
    return;
  }
  for (int64_t i0 = 0; i0 < m; i0 += kFusedRows) {
    const int64_t mc = std::min(kFusedRows, m - i0);
    const void* xc = static_cast<const char*>(x) + size_t(i0) * xrow;
    static_assert(kFusedRows % 16 == 0, "a chunk starts at a whole 16-row block of the packed rows");
    const uint16_t* xv = x_vnni ? x_vnni + vnni_elems(i0, H) : nullptr;
    // scratch [mc, 2w]: gate values in columns [0, w), up values in [w, 2w) (interleaved: pairs)
    const PackedParts pk = gate_up_parts(ev);
    if (!s.has_gate) {
      project_rows(kt, s, ev.gate_up, ev.gate_up_bias, xc, xdt, mc, R, H, c0, w, scratch, 2 * w, pk, xv);
    } else if (s.interleaved) {
      project_rows(kt, s, ev.gate_up, ev.gate_up_bias, xc, xdt, mc, R, H, 2 * c0, 2 * w, scratch, 2 * w, pk, xv);
    } else {
      project_rows(kt, s, ev.gate_up, ev.gate_up_bias, xc, xdt, mc, R, H, c0, w, scratch, 2 * w, pk, xv);
      project_rows(kt, s, ev.gate_up, ev.gate_up_bias, xc, xdt, mc, R, H, I + c0, w, scratch + w, 2 * w, pk, xv);
    }
    for (int64_t i = 0; i < mc; ++i) {
      const float* g = scratch + i * 2 * w;
      char* hr = static_cast<char*>(h) + (size_t(i0 + i) * size_t(I) + size_t(c0)) * hsz;
      if (vector_silu(s, hdt)) {
        silu_row(kt, g, g + w, w, hr, hdt, s.dtype);
        continue;
      }
      for (int64_t c = 0; c < w; ++c) {
        const float v = !s.has_gate ? plain_act(s.activation, g[c])
                        : s.interleaved ? gated_act(s.activation, g[2 * c], g[2 * c + 1])
                                        : gated_act(s.activation, g[c], g[w + c]);
        if (hdt == DType::bf16)
          reinterpret_cast<uint16_t*>(hr)[c] = float_to_bf16(v);
        else
          reinterpret_cast<float*>(hr)[c] = round_to(s.dtype, v);
      }
    }
  }
}

DType operand_dtype(const KernelTable& kt, const ExpertsSpec& s) {
  return kt.bf16_dot && s.dtype == DType::bf16 && !s.transposed && !s.quant.quantized() ? DType::bf16 : DType::f32;
}

void up_projection(const KernelTable& kt, const ExpertView& ev, const void* x, DType xdt, int64_t m, float* gu, int64_t n0,
                   int64_t n1, QuantOperand q) {
  const ExpertsSpec& s = *ev.spec;
  project(kt, s, ev.gate_up, ev.gate_up_q, ev.gate_up_bias, x, xdt, m, s.gate_up_rows(), s.hidden, gu, n0, n1, q, gate_up_parts(ev));
}

namespace {
template <class Store>
void activation_rows_as(const ExpertsSpec& s, const float* gu, int64_t m, Store store) {
  const int64_t I = s.intermediate, R = s.gate_up_rows();
  for (int64_t i = 0; i < m; ++i) {
    const float* g = gu + i * R;
    if (!s.has_gate) {
      for (int64_t c = 0; c < I; ++c) store(i * I + c, plain_act(s.activation, g[c]));
    } else if (s.interleaved) {  // rows g0, u0, g1, u1, ...
      for (int64_t c = 0; c < I; ++c) store(i * I + c, gated_act(s.activation, g[2 * c], g[2 * c + 1]));
    } else {  // [gate; up]
      for (int64_t c = 0; c < I; ++c) store(i * I + c, gated_act(s.activation, g[c], g[I + c]));
    }
  }
}
}  // namespace

void activation_rows(const KernelTable& kt, const ExpertsSpec& s, const float* gu, int64_t m, void* h, DType hdt) {
  if (vector_silu(s, hdt)) {
    const int64_t I = s.intermediate, R = s.gate_up_rows();
    const size_t hsz = dtype_size(hdt);
    for (int64_t i = 0; i < m; ++i) silu_row(kt, gu + i * R, gu + i * R + I, I, static_cast<char*>(h) + size_t(i * I) * hsz, hdt, s.dtype);
    return;
  }
  if (hdt == DType::bf16) {  // only for bf16 experts: rounding to bf16 is rounding to the activation dtype
    uint16_t* hb = static_cast<uint16_t*>(h);
    activation_rows_as(s, gu, m, [&](int64_t i, float v) { hb[i] = float_to_bf16(v); });
  } else {
    float* hf = static_cast<float*>(h);
    activation_rows_as(s, gu, m, [&](int64_t i, float v) { hf[i] = round_to(s.dtype, v); });
  }
}

void down_projection(const KernelTable& kt, const ExpertView& ev, const void* h, DType hdt, int64_t m, float* y, int64_t n0,
                     int64_t n1, QuantOperand q, const uint16_t* h_vnni) {
  const ExpertsSpec& s = *ev.spec;
  project(kt, s, ev.down, ev.down_q, ev.down_bias, h, hdt, m, s.hidden, s.intermediate, y, n0, n1, q, down_parts(ev), h_vnni);
}

}  // namespace moex::cpu
