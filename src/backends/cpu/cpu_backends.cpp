// backends/cpu/cpu_backends.cpp — eager, batched_mm and grouped_mm on the CPU (SPEC §2).
//
// All three compute per-pair results y[p] = down_e(act(gate_up_e · x_t)) in f32 and finish with
// the same fixed-order reduction over the K slots (reduce_slots), so they agree to rounding and
// every one is deterministic for a given thread count-independent schedule: each output element
// is computed by exactly one thread with a fixed summation order.
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backends/backend_impls.hpp"
#include "backends/cpu/expert_math.hpp"
#include "core/check.hpp"
#include "moex/routing.hpp"

namespace moex::detail {

using namespace moex::cpu;

namespace {

constexpr int64_t kTile = 64;  // output columns per work item (a multiple of every micro-kernel's width)

// Output columns per work item when `blocks` row blocks (experts) of one projection of width N are
// shared by `threads`: about 8 items per thread, in multiples of kTile. Wide tiles matter to the
// AMX kernel, which repacks its activation rows once per call.
int64_t tile_width(int64_t N, int64_t blocks, int threads) {
  const int64_t want = N * std::max<int64_t>(blocks, 1) / (8 * int64_t(threads));
  return std::clamp<int64_t>((want + kTile - 1) / kTile * kTile, kTile, (N + kTile - 1) / kTile * kTile);
}

int threads_of(const Problem& p) { return p.cpu_threads > 0 ? p.cpu_threads : omp_get_max_threads(); }

size_t floats(int64_t n) { return WorkspaceCarver::round_up(size_t(n) * sizeof(float)); }

// Gathers rows of hidden into rows of the GEMM operand dtype `xdt` (f32, or bf16 as stored):
// dst[r] = hidden[token_of(r)].
template <class TokenOf>
void gather_rows(const KernelTable& kt, const ExpertsCall& call, int64_t rows, TokenOf token_of, void* dst, DType xdt,
                 int threads) {
  const int64_t H = call.hidden.shape[1];
  const size_t esz = dtype_size(call.hidden.dtype);
  const char* x = static_cast<const char*>(call.hidden.data);
  char* d = static_cast<char*>(dst);
  const size_t row_bytes = size_t(H) * dtype_size(xdt);
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const char* src = x + token_of(r) * H * int64_t(esz);
    if (xdt == call.hidden.dtype)
      std::memcpy(d + size_t(r) * row_bytes, src, row_bytes);
    else
      kt.to_f32(src, call.hidden.dtype, reinterpret_cast<float*>(d + size_t(r) * row_bytes), H);
  }
}

// A row-major [rows, width] buffer of the operand dtype.
struct OperandRows {
  char* base;
  DType dt;
  int64_t width;
  void* row(int64_t r) const { return base + size_t(r * width) * dtype_size(dt); }
};

// Scales and per-thread scratch of quantized experts (empty otherwise). x rows and h rows are
// replaced in place by their e4m3 codes (quantize_rows), their scales kept here.
struct QuantBuffers {
  bool on = false;
  int64_t gh = 0, gi = 0;  // scale groups per x row (H) and per h row (I)
  float* xs = nullptr;     // [x rows, gh]
  float* hs = nullptr;     // [h rows, gi]
  float* scratch = nullptr;  // [threads, kQuantScratch]
  QuantOperand x_at(int64_t row) const { return on ? QuantOperand{xs + row * gh, thread_scratch()} : QuantOperand{}; }
  QuantOperand h_at(int64_t row) const { return on ? QuantOperand{hs + row * gi, thread_scratch()} : QuantOperand{}; }
  float* thread_scratch() const { return scratch + int64_t(omp_get_thread_num()) * kQuantScratch; }
  // Quantizes rows [0, n) of an f32 operand in place (x: width H; h: width I), in parallel.
  void quantize_x(const OperandRows& x, int64_t n, int threads) const { quantize(x, n, xs, gh, threads); }
  // Rows [0, n) of x-shaped rows (width H) quantized in place, their scales [n, gh] at `scales`.
  void quantize_rows_into(const OperandRows& rows, int64_t n, float* scales, int threads) const { quantize(rows, n, scales, gh, threads); }
  void quantize_h(const OperandRows& h, int64_t n, int threads) const { quantize(h, n, hs, gi, threads); }

  static size_t bytes(const ExpertsSpec& s, int64_t x_rows, int64_t h_rows, int threads) {
    if (!s.quant.quantized()) return 0;
    return floats(x_rows * groups(s.hidden)) + floats(h_rows * groups(s.intermediate)) + floats(int64_t(threads) * kQuantScratch);
  }
  static QuantBuffers take(WorkspaceCarver& ws, const ExpertsSpec& s, int64_t x_rows, int64_t h_rows, int threads) {
    QuantBuffers q;
    if (!s.quant.quantized()) return q;
    q.on = true;
    q.gh = groups(s.hidden);
    q.gi = groups(s.intermediate);
    q.xs = ws.take<float>(size_t(std::max<int64_t>(x_rows, 1) * q.gh));
    q.hs = ws.take<float>(size_t(std::max<int64_t>(h_rows, 1) * q.gi));
    q.scratch = ws.take<float>(size_t(threads) * size_t(kQuantScratch));
    return q;
  }

 private:
  static int64_t groups(int64_t width) { return (width + kActGroup - 1) / kActGroup; }
  void quantize(const OperandRows& rows, int64_t n, float* scales, int64_t g, int threads) const {
    if (!on) return;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t r = 0; r < n; ++r) kernels().quantize_rows(static_cast<float*>(rows.row(r)), 1, rows.width, scales + r * g);
  }
};

struct Tile {
  int64_t e, n0, n1;
};

void add_tiles(std::vector<Tile>& tiles, int64_t e, int64_t N, int64_t width) {
  for (int64_t n = 0; n < N; n += width) tiles.push_back({e, n, std::min(N, n + width)});
}

// Tiles in decreasing order of work (rows × columns; ties keep expert order): handed out dynamically,
// the largest go first and the small ones fill the threads' ends, instead of a large expert's tile
// starting last while the other threads wait at the barrier (routing makes experts' row counts
// uneven). Each tile's arithmetic does not depend on the order. MOEX_CPU_TILE_ORDER=index keeps the
// expert order (A/B measurement).
void largest_first(std::vector<Tile>& tiles, const RoutingPlan& plan) {
  static const bool by_index = [] {
    const char* v = std::getenv("MOEX_CPU_TILE_ORDER");
    return v && std::string(v) == "index";
  }();
  if (by_index) return;
  std::stable_sort(tiles.begin(), tiles.end(), [&](const Tile& a, const Tile& b) {
    return plan.count(a.e) * (a.n1 - a.n0) > plan.count(b.e) * (b.n1 - b.n0);
  });
}

// The packed copies of f32 / bf16 experts (packed_weights.hpp), prepared for the experts this call routes
// to; nullptr when packing does not apply.
std::shared_ptr<PackedWeights> packed_for_call(const Experts& ex, const ExpertsCall& call, int threads) {
  std::shared_ptr<PackedWeights> pw = PackedWeights::of(ex);
  if (!pw) return pw;
  const int64_t E = ex.spec.num_experts, S = call.top_k_index.numel();
  std::vector<char> used(static_cast<size_t>(E), 0);
  for (int64_t p = 0; p < S; ++p)
    if (const int64_t e = expert_of(call, p, E); e >= 0) used[size_t(e)] = 1;
  std::vector<int64_t> experts;
  for (int64_t e = 0; e < E; ++e)
    if (used[size_t(e)]) experts.push_back(e);
  pw->prepare(ex, experts, threads);
  return pw;
}

}  // namespace

Support cpu_supports(const Problem& p, std::string_view backend) {
  if (!is_float_activation(p.spec.dtype))
    return Support::no(fmt::format("{} on the CPU needs f32, f16 or bf16 activations (got {})", backend, dtype_name(p.spec.dtype)));
  const QuantSpec& q = p.spec.quant;
  if (q.quantized()) {
    if (q.activation_scheme == ActivationScheme::static_)
      return Support::no(fmt::format("{} runs FP8/FP4 experts with dynamic per-token activation scales (1x128) only; a static "
                                     "activation scheme (one scale per tensor) is rejected: requantize with activation_scheme "
                                     "\"dynamic\" or load with dequantize",
                                     backend));
    if (q.kind == QuantKind::fp8_block && q.block_k != kActGroup)
      return Support::no(fmt::format("{} needs FP8 weight blocks 128 wide along the input (got {}x{}), aligned with the 1x128 "
                                     "activation scales; load with dequantize",
                                     backend, q.block_n, q.block_k));
    if (q.kind == QuantKind::fp4_group && (kActGroup % q.block_k != 0 || p.spec.transposed))
      return Support::no(fmt::format("{} needs FP4 groups that divide 128 (got {}) and the default [E, out, in] layout; load "
                                     "with dequantize",
                                     backend, q.block_k));
  }
  return Support::yes();
}

// ---- eager: loop over the experts that received tokens ------------------------------------

size_t cpu_eager_workspace(const Problem& p) {
  const int64_t S = p.tokens * p.top_k, H = p.spec.hidden, I = p.spec.intermediate, R = p.spec.gate_up_rows();
  return floats(S * H) * 3 + floats(S * R) + floats(S * I) + floats(int64_t(threads_of(p)) * H) + floats(S) +
         QuantBuffers::bytes(p.spec, S, S, threads_of(p));
}

void cpu_eager(const Experts& ex, const ExpertsCall& call, const RunContext& ctx) {
  const KernelTable& kt = kernels();
  const ExpertsSpec& s = ex.spec;
  const int64_t T = call.hidden.shape[0], K = call.top_k_index.shape[1], S = T * K;
  const int64_t E = s.num_experts, H = s.hidden, I = s.intermediate, R = s.gate_up_rows();
  const int nt = ctx.num_threads;
  WorkspaceCarver ws(ctx.workspace.data(), ctx.workspace.capacity());
  const DType xdt = operand_dtype(kt, s);
  const OperandRows x{ws.take<char>(size_t(S * H) * 4), xdt, H};  // [m, H] the expert's tokens
  float* gu = ws.take<float>(size_t(S * R));                      // [m, R]
  const OperandRows h{ws.take<char>(size_t(S * I) * 4), xdt, I};  // [m, I]
  float* ye = ws.take<float>(size_t(S * H));    // [m, H] the expert's outputs
  float* y = ws.take<float>(size_t(S * H));     // [S, H] per-pair outputs, indexed by pair id
  float* scratch = ws.take<float>(size_t(nt) * size_t(H));
  int32_t* pairs = reinterpret_cast<int32_t*>(ws.take<float>(size_t(S)));
  const QuantBuffers q = QuantBuffers::take(ws, s, S, S, nt);
  const std::shared_ptr<PackedWeights> packed = packed_for_call(ex, call, nt);

  for (int64_t e = 0; e < E; ++e) {
    int64_t m = 0;  // this expert's pairs, in pair order (host-side scan: the "data-dependent loop")
    for (int64_t p = 0; p < S; ++p)
      if (expert_of(call, p, E) == e) pairs[m++] = int32_t(p);
    if (m == 0) continue;
    const ExpertView ev = expert_view(ex, e, packed.get());
    gather_rows(kt, call, m, [&](int64_t r) { return int64_t(pairs[r]) / K; }, x.base, xdt, nt);
    q.quantize_x(x, m, nt);
    const int64_t up_w = tile_width(R, 1, nt), down_w = tile_width(H, 1, nt);
    const int64_t up_tiles = (R + up_w - 1) / up_w, down_tiles = (H + down_w - 1) / down_w;
#pragma omp parallel num_threads(nt)
    {
#pragma omp for schedule(static)
      for (int64_t t = 0; t < up_tiles; ++t) up_projection(kt, ev, x.base, xdt, m, gu, t * up_w, std::min(R, (t + 1) * up_w), q.x_at(0));
#pragma omp for schedule(static)
      for (int64_t r = 0; r < m; ++r) activation_rows(kt, s, gu + r * R, 1, h.row(r), xdt);
    }
    q.quantize_h(h, m, nt);
#pragma omp parallel num_threads(nt)
    {
#pragma omp for schedule(static)
      for (int64_t t = 0; t < down_tiles; ++t)
        down_projection(kt, ev, h.base, xdt, m, ye, t * down_w, std::min(H, (t + 1) * down_w), q.h_at(0));
#pragma omp for schedule(static)
      for (int64_t r = 0; r < m; ++r) std::copy(ye + r * H, ye + (r + 1) * H, y + int64_t(pairs[r]) * H);
    }
  }
  reduce_slots(kt, call, H, y, [&](int64_t p) { return expert_of(call, p, E) < 0 ? int64_t(-1) : p; }, nt, scratch);
}

// ---- batched_mm: every pair multiplies its token by its own expert's weights, in place -------

size_t cpu_batched_workspace(const Problem& p) {
  const int64_t T = p.tokens, S = T * p.top_k, H = p.spec.hidden, I = p.spec.intermediate, R = p.spec.gate_up_rows();
  return floats(T * H) + floats(S * R) + floats(S * I) + floats(S * H) + floats(int64_t(threads_of(p)) * H) +
         QuantBuffers::bytes(p.spec, T, S, threads_of(p));
}

void cpu_batched(const Experts& ex, const ExpertsCall& call, const RunContext& ctx) {
  const KernelTable& kt = kernels();
  const ExpertsSpec& s = ex.spec;
  const int64_t T = call.hidden.shape[0], K = call.top_k_index.shape[1], S = T * K;
  const int64_t E = s.num_experts, H = s.hidden, I = s.intermediate, R = s.gate_up_rows();
  const int nt = ctx.num_threads;
  WorkspaceCarver ws(ctx.workspace.data(), ctx.workspace.capacity());
  const DType xdt = operand_dtype(kt, s);
  const OperandRows xt{ws.take<char>(size_t(T * H) * 4), xdt, H};  // [T, H] tokens
  float* gu = ws.take<float>(size_t(S * R));                       // [S, R]
  const OperandRows h{ws.take<char>(size_t(S * I) * 4), xdt, I};   // [S, I]
  float* y = ws.take<float>(size_t(S * H));   // [S, H]
  float* scratch = ws.take<float>(size_t(nt) * size_t(H));

  const QuantBuffers q = QuantBuffers::take(ws, s, T, S, nt);
  const std::shared_ptr<PackedWeights> packed = packed_for_call(ex, call, nt);
  gather_rows(kt, call, T, [](int64_t r) { return r; }, xt.base, xdt, nt);
  q.quantize_x(xt, T, nt);
  const int64_t up_tiles = (R + kTile - 1) / kTile, down_tiles = (H + kTile - 1) / kTile;
#pragma omp parallel num_threads(nt)
  {
    // one GEMV per (pair, tile): the expert's weights are read where they are
#pragma omp for schedule(dynamic, 4) collapse(2)
    for (int64_t p = 0; p < S; ++p)
      for (int64_t t = 0; t < up_tiles; ++t) {
        const int64_t e = expert_of(call, p, E);
        if (e < 0) continue;
        up_projection(kt, expert_view(ex, e, packed.get()), xt.row(p / K), xdt, 1, gu + p * R, t * kTile, std::min(R, (t + 1) * kTile),
                      q.x_at(p / K));
      }
#pragma omp for schedule(static)
    for (int64_t p = 0; p < S; ++p)
      if (expert_of(call, p, E) >= 0) {
        activation_rows(kt, s, gu + p * R, 1, h.row(p), xdt);
        if (q.on) kt.quantize_rows(static_cast<float*>(h.row(p)), 1, I, q.hs + p * q.gi);
      }
#pragma omp for schedule(dynamic, 4) collapse(2)
    for (int64_t p = 0; p < S; ++p)
      for (int64_t t = 0; t < down_tiles; ++t) {
        const int64_t e = expert_of(call, p, E);
        if (e < 0) continue;
        down_projection(kt, expert_view(ex, e, packed.get()), h.row(p), xdt, 1, y + p * H, t * kTile, std::min(H, (t + 1) * kTile), q.h_at(p));
      }
  }
  reduce_slots(kt, call, H, y, [&](int64_t p) { return expert_of(call, p, E) < 0 ? int64_t(-1) : p; }, nt, scratch);
}

// ---- grouped_mm: sort pairs by expert, one grouped GEMM per projection -----------------------

// Per-thread scratch of the fused up projection + activation: [kFusedRows, 2 · widest h tile].
int64_t fused_scratch_floats(int64_t I) { return kFusedRows * 2 * ((I + kTile - 1) / kTile * kTile); }

// bf16 experts on AMX: the bf16 rows of every expert with >= kAmxMinRows rows, packed once in the
// tile kernel's layout (pack_x_vnni) — at most S/16 + min(S, E) blocks of 16 rows for k columns.
size_t vnni_bytes(const Problem& p, int64_t k) {
  if (p.spec.dtype != DType::bf16 || p.spec.quant.quantized()) return 0;
  const int64_t S = p.tokens * p.top_k, blocks = S / 16 + std::min<int64_t>(S, p.spec.num_experts);
  return WorkspaceCarver::round_up(size_t(vnni_elems(16 * blocks, k)) * sizeof(uint16_t));
}

size_t cpu_grouped_workspace(const Problem& p) {
  const int64_t S = p.tokens * p.top_k, H = p.spec.hidden, I = p.spec.intermediate, R = p.spec.gate_up_rows();
  // quantized experts keep the [S, R] up-projection buffer; the others fuse the activation
  const size_t up = p.spec.quant.quantized() ? floats(S * R) : floats(int64_t(threads_of(p)) * fused_scratch_floats(I));
  // quantized experts: each token's codes and scales once ([T, H] + [T, ceil(H / 128)]), copied to its pairs' rows
  const size_t tokens = p.spec.quant.quantized() ? floats(p.tokens * H) + floats(p.tokens * ((H + kActGroup - 1) / kActGroup)) : 0;
  return floats(S * H) + up + floats(S * I) + floats(int64_t(threads_of(p)) * H) + QuantBuffers::bytes(p.spec, S, S, threads_of(p)) +
         vnni_bytes(p, H) + vnni_bytes(p, I) + tokens;
}

void cpu_grouped(const Experts& ex, const ExpertsCall& call, const RunContext& ctx) {
  const KernelTable& kt = kernels();
  const ExpertsSpec& s = ex.spec;
  const int64_t K = call.top_k_index.shape[1];
  const int64_t E = s.num_experts, H = s.hidden, I = s.intermediate, R = s.gate_up_rows();
  const int nt = ctx.num_threads;
  const RoutingPlan plan = build_routing_plan(call.top_k_index, E);
  const int64_t rows = plan.num_valid();
  WorkspaceCarver ws(ctx.workspace.data(), ctx.workspace.capacity());
  const DType xdt = operand_dtype(kt, s);
  const int64_t rows1 = std::max<int64_t>(rows, 1);
  float* y = ws.take<float>(size_t(rows1 * H));                         // [rows, H] outputs
  const OperandRows x{reinterpret_cast<char*>(y), xdt, H};             // [rows, H] sorted inputs (y overwrites them later)
  const bool fused = !s.quant.quantized();
  // quantized: [rows, R] up-projection results; otherwise per-thread scratch of the fused activation
  float* gu = fused ? ws.take<float>(size_t(nt) * size_t(fused_scratch_floats(I))) : ws.take<float>(size_t(rows1 * R));
  const OperandRows h{ws.take<char>(size_t(rows1 * I) * 4), xdt, I};  // [rows, I]
  float* scratch = ws.take<float>(size_t(nt) * size_t(H));

  const QuantBuffers q = QuantBuffers::take(ws, s, rows, rows, nt);
  // bf16 on AMX: each expert's input rows and h rows packed once for the tile kernel (vnni_bytes),
  // instead of once per matmul call — per column tile and per gate / up half
  static const bool vnni_on = [] {  // MOEX_CPU_VNNI_PREPACK=0: the AMX kernel packs per call (A/B)
    const char* v = std::getenv("MOEX_CPU_VNNI_PREPACK");
    return !(v && std::string(v) == "0");
  }();
  const bool vnni = vnni_on && fused && xdt == DType::bf16 && uses_amx(kt);
  std::vector<int64_t> xv_off(size_t(E), -1), hv_off(size_t(E), -1);
  uint16_t* xv = nullptr;
  uint16_t* hv = nullptr;
  if (vnni) {
    int64_t nx = 0, nh = 0;
    for (int64_t e = 0; e < E; ++e)
      if (plan.count(e) >= kAmxMinRows) {
        xv_off[size_t(e)] = nx;
        hv_off[size_t(e)] = nh;
        nx += vnni_elems(plan.count(e), H);
        nh += vnni_elems(plan.count(e), I);
      }
    if (nx > 0) {
      xv = ws.take<uint16_t>(size_t(nx));
      hv = ws.take<uint16_t>(size_t(nh));
    }
  }
  const auto x_vnni = [&](int64_t e) { return xv && xv_off[size_t(e)] >= 0 ? xv + xv_off[size_t(e)] : nullptr; };
  const auto h_vnni = [&](int64_t e) { return hv && hv_off[size_t(e)] >= 0 ? hv + hv_off[size_t(e)] : nullptr; };
  const std::shared_ptr<PackedWeights> packed = packed_for_call(ex, call, nt);
  const auto token_of = [&](int64_t r) { return int64_t(plan.sorted_pairs[size_t(r)]) / K; };
  if (q.on) {
    // each token converted and quantized once (not once per routed pair: K times fewer), then its codes
    // and scales copied to its pairs' rows
    const int64_t T = call.hidden.shape[0];
    float* tok = ws.take<float>(size_t(std::max<int64_t>(T, 1) * H));
    float* tok_scales = ws.take<float>(size_t(std::max<int64_t>(T, 1) * q.gh));
    const OperandRows t{reinterpret_cast<char*>(tok), DType::f32, H};
    gather_rows(kt, call, T, [](int64_t r) { return r; }, tok, DType::f32, nt);
    q.quantize_rows_into(t, T, tok_scales, nt);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(x.row(r), tok + token_of(r) * H, size_t(H) * sizeof(float));
      std::memcpy(q.xs + r * q.gh, tok_scales + token_of(r) * q.gh, size_t(q.gh) * sizeof(float));
    }
  } else {
    gather_rows(kt, call, rows, token_of, x.base, xdt, nt);
  }
  std::vector<Tile> up, down;
  int64_t active = 0;
  for (int64_t e = 0; e < E; ++e) active += plan.count(e) > 0;
  // fused: work items are columns of h (each computes its gate and up columns); else columns of gu
  const int64_t up_n = fused ? I : R, up_w = tile_width(up_n, active, nt), down_w = tile_width(H, active, nt);
  for (int64_t e = 0; e < E; ++e) {
    if (plan.count(e) == 0) continue;
    add_tiles(up, e, up_n, up_w);
    add_tiles(down, e, H, down_w);
  }
  largest_first(up, plan);
  largest_first(down, plan);
  const auto off = [&](int64_t e) { return plan.expert_offsets[size_t(e)]; };
#pragma omp parallel num_threads(nt)
  {
    if (xv) {
#pragma omp for schedule(dynamic, 1)
      for (int64_t e = 0; e < E; ++e)
        if (x_vnni(e)) pack_x_vnni(static_cast<const uint16_t*>(x.row(off(e))), H, plan.count(e), H, x_vnni(e));
    }
    // skewed routing makes tiles uneven: dynamic scheduling balances them
#pragma omp for schedule(dynamic, 1)
    for (size_t i = 0; i < up.size(); ++i) {
      const Tile& t = up[i];
      if (fused)
        up_activation(kt, expert_view(ex, t.e, packed.get()), x.row(off(t.e)), xdt, plan.count(t.e), h.row(off(t.e)), xdt, t.n0, t.n1,
                      gu + int64_t(omp_get_thread_num()) * fused_scratch_floats(I), x_vnni(t.e));
      else
        up_projection(kt, expert_view(ex, t.e, packed.get()), x.row(off(t.e)), xdt, plan.count(t.e), gu + off(t.e) * R, t.n0, t.n1,
                      q.x_at(off(t.e)));
    }
    if (!fused) {
#pragma omp for schedule(static)
      for (int64_t r = 0; r < rows; ++r) {
        activation_rows(kt, s, gu + r * R, 1, h.row(r), xdt);
        kt.quantize_rows(static_cast<float*>(h.row(r)), 1, I, q.hs + r * q.gi);
      }
    }
    if (hv) {  // after the up loop's barrier: every h column is written
#pragma omp for schedule(dynamic, 1)
      for (int64_t e = 0; e < E; ++e)
        if (h_vnni(e)) pack_x_vnni(static_cast<const uint16_t*>(h.row(off(e))), I, plan.count(e), I, h_vnni(e));
    }
#pragma omp for schedule(dynamic, 1)
    for (size_t i = 0; i < down.size(); ++i) {
      const Tile& t = down[i];
      down_projection(kt, expert_view(ex, t.e, packed.get()), h.row(off(t.e)), xdt, plan.count(t.e), y + off(t.e) * H, t.n0, t.n1,
                      q.h_at(off(t.e)), h_vnni(t.e));
    }
  }
  reduce_slots(kt, call, H, y, [&](int64_t p) { return int64_t(plan.pair_to_row[size_t(p)]); }, nt, scratch);
}

}  // namespace moex::detail
