// model/reference_forward.cpp — see reference_forward.hpp.
#include "model/reference_forward.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#include "backends/cpu/kernels.hpp"
#include "backends/cpu/packed_weights.hpp"
#include "model/cpu_attention.hpp"
#include "core/check.hpp"
#include "core/memory.hpp"
#include "moex/backend.hpp"
#include "moex/routing.hpp"

namespace moex::model {

namespace {

using Mat = Floats;  // row-major [rows, cols], elements uninitialised until written

// ---- MOEX_CPU_PROFILE=1: where the CPU forward's time goes ----------------------------------------
// Wall time per stage of forward_batch, summed over every forward of the process separately for
// prefills and decode steps (one new row per sequence), printed to stderr at exit. The process' first
// forward is counted apart: it packs the experts' weights (packed_weights.hpp) as it meets them. A stage's time
// includes its OpenMP parallel regions (their joins too); "other" is the forward's time outside every
// stage (embedding lookup, rope tables, copies). Off by default: then each stage costs one branch.
enum Stage : int { kNorms, kQkvProj, kQkvPost, kAttend, kOProj, kRouter, kExperts, kDenseMlp, kResidual, kHead, kStages };
constexpr int kWholeForward = kStages;  // the profile's slot of the whole forward
constexpr int kTimedInside = kStages + 1;  // a call that times its own stages (not counted)
constexpr const char* kStageNames[kStages] = {"rms norms",  "q/k/v projections", "qk norm + rope", "attention + KV cache",
                                              "o projection", "router",          "routed experts", "dense / shared MLP",
                                              "residual adds", "final norm + head"};

struct CpuProfile {
  const bool on = [] {
    const char* v = std::getenv("MOEX_CPU_PROFILE");
    return v && std::string(v) == "1";
  }();
  static constexpr int kKinds = 3;
  static constexpr const char* kKindNames[kKinds] = {"prefill", "decode", "first forward (packs the experts it meets)"};
  double ms[kKinds][kStages + 2] = {};  // [prefill, decode, first][stage, kWholeForward, kTimedInside]
  int64_t forwards[kKinds] = {}, rows[kKinds] = {};
  int kind = 0;  // of the forward running now (forward_batch is not reentrant per process on this path)
  ~CpuProfile() {
    if (!on) return;
    for (int k = 0; k < kKinds; ++k) {
      if (forwards[k] == 0) continue;
      std::fprintf(stderr, "moex CPU profile, %s: %lld forwards, %lld rows, %.3f ms (MOEX_CPU_PROFILE=1)\n", kKindNames[k],
                   static_cast<long long>(forwards[k]), static_cast<long long>(rows[k]), ms[k][kWholeForward]);
      double staged = 0;
      for (int st = 0; st < kStages; ++st) {
        staged += ms[k][st];
        if (ms[k][st] > 0)
          std::fprintf(stderr, "  %-22s %10.3f ms  %5.1f %%\n", kStageNames[st], ms[k][st], 100.0 * ms[k][st] / ms[k][kWholeForward]);
      }
      std::fprintf(stderr, "  %-22s %10.3f ms  %5.1f %%\n", "other", ms[k][kWholeForward] - staged,
                   100.0 * (ms[k][kWholeForward] - staged) / ms[k][kWholeForward]);
    }
  }
};
CpuProfile& cpu_profile() {
  static CpuProfile p;
  return p;
}

// Adds the scope's wall time to `stage` (or kWholeForward, kTimedInside) when profiling is on; next(s)
// closes the current stage and times s from there.
class StageTimer {
 public:
  explicit StageTimer(int stage) : stage_(stage), on_(cpu_profile().on) {
    if (on_) t0_ = std::chrono::steady_clock::now();
  }
  ~StageTimer() { next(stage_); }
  void next(int stage) {
    if (!on_) return;
    const auto now = std::chrono::steady_clock::now();
    cpu_profile().ms[cpu_profile().kind][stage_] += std::chrono::duration<double, std::milli>(now - t0_).count();
    stage_ = stage;
    t0_ = now;
  }
  StageTimer(const StageTimer&) = delete;
  StageTimer& operator=(const StageTimer&) = delete;

 private:
  int stage_;
  bool on_;
  std::chrono::steady_clock::time_point t0_;
};

// The tensor as f32 (itself, or an exact widening of bf16/f16 weights).
Tensor as_f32(const Tensor& t) { return t.dtype() == DType::f32 ? t : convert_tensor(t.view(), DType::f32); }

// Terms of x in the bf16 linears of T >= 8 rows (MOEX_CPU_LINEAR_TERMS, read once), as the CUDA
// runtime's MOEX_CUDA_LINEAR_TERMS: 1 = bf16(x) only (the default: the reference library's rounding of
// a bf16 layer's input, half the products), 2 = x ≈ hi + lo with hi = bf16(x), lo = bf16(x − hi) (~16
// mantissa bits; two passes). Fewer rows (decode steps, short prompts) take two terms on packed
// weights (terms_for) and keep x in f32 on the other paths.
// Development VM (AMD EPYC, 2 threads), 2026-12-05: a random 1024-wide Qwen3-MoE prefill of 256 tokens
// ~1 500 tok/s with one term, 991–1 175 with two (docs/PERF.md, fortieth session); a 40-token
// prompt's bf16 logits against the same
// tokens one at a time with f32 inputs: worst 1.0e-2 with one term (deepseek_v3 fixture), 2.5e-3 with
// two (Model.LongPromptAtOnceMatchesTokenByToken). An earlier form rounded the inputs of every T and
// flipped a near-tie routing decision of the deepseek_v3 fixture's 6-token prompt (0.43 away).
int linear_terms() {
  static const int terms = [] {
    const char* e = std::getenv("MOEX_CPU_LINEAR_TERMS");
    return e && std::string(e) == "2" ? 2 : 1;
  }();
  return terms;
}

// f32 rows x [T, in] as bf16 terms, stacked: rows [0, T) hi = bf16(x), and with two terms rows
// [T, 2T) lo = bf16(x − hi), so that one kernel call multiplies both (the weights read once).
struct SplitTerms {
  std::vector<uint16_t, UninitAllocator<uint16_t>> rows;  // [terms · T, in], every element written
  size_t n = 0;                                            // T · in
  SplitTerms(const Mat& x, int terms) : rows(size_t(terms) * x.size()), n(x.size()) {
    const bool two = terms == 2;
#pragma omp parallel for schedule(static) if (int64_t(n) > (1 << 16))
    for (int64_t i = 0; i < int64_t(n); ++i) {
      const uint16_t hi = float_to_bf16(x[size_t(i)]);
      rows[size_t(i)] = hi;
      if (two) rows[n + size_t(i)] = float_to_bf16(x[size_t(i)] - bf16_to_float(hi));
    }
  }
  bool two() const { return rows.size() > n; }
  const uint16_t* hi() const { return rows.data(); }
  const uint16_t* lo() const { return rows.data() + n; }
};

// y[r, c] += (lo ? lo[r, c] : 0) + (b ? b[c] : 0) over rows [0, rows) and columns [c0, c1), row stride
// ld: a bf16 linear's two input terms and its bias added in one fixed order, y = y_hi + (y_lo + b), on
// every path (linear, packed_linears, amx_linears).
void add_lo_and_bias(float* y, const float* lo, int64_t rows, int64_t ld, int64_t c0, int64_t c1, const float* b) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = c0; c < c1; ++c) y[r * ld + c] += (lo ? lo[r * ld + c] : 0.0f) + (b ? b[c] : 0.0f);
}

// Whether bf16 panels run on the f32-input FMA kernel (AVX2: packed_matmul_bf16_wide, x kept in f32 as on
// linear()'s path there) rather than on vdpbf16ps with x as bf16 terms.
bool bf16_panels_wide() {
  const cpu::KernelTable& kt = cpu::kernels();
  return !(kt.packed_matmul_bf16 && kt.bf16_dot) && kt.packed_matmul_bf16_wide;
}

// Whether linear l of input width `in` runs on its packed panels (pack_linears_for_cpu) for T rows: bf16
// panels for any T, f32 panels from 8 rows on (fewer rows: the dot kernel, which reads the weights in
// place as fast).
bool packed_path(const Linear& l, int64_t T, int64_t in) {
  const cpu::KernelTable& kt = cpu::kernels();
  if (!l.packed || l.weight.size(1) != in || l.weight.dtype() != l.packed->dtype) return false;
  return l.packed->dtype == DType::bf16 ? (kt.packed_matmul_bf16 && kt.bf16_dot) || kt.packed_matmul_bf16_wide : T >= 8;
}

// bf16 terms of the input of a bf16 linear of T rows: linear_terms() from 8 rows on; fewer rows
// (decode steps, short prompts: reading the weights, not the products, sets their time) two, ~16 bits.
int terms_for(int64_t T) { return T >= 8 ? linear_terms() : 2; }

// y_i [T, out_i] = x [T, in] · W_iᵀ (+ b_i) for several linears of one input on their packed panels
// (packed_path): x made into its bf16 terms once (SplitTerms), every linear's column tiles of 64 (two
// panels) shared out over the threads in one loop. Each output is one f32 chain per term in k order
// (the packed kernel), y = y_hi + (y_lo + b) or y_hi + b, whatever T or the thread count.
std::vector<Mat> packed_linears(const Mat& x, int64_t T, const std::vector<const Linear*>& ls) {
  const cpu::KernelTable& kt = cpu::kernels();
  const int64_t in = ls.front()->weight.size(1);
  MOEX_ASSERT(int64_t(x.size()) == T * in);
  const bool f32 = ls.front()->packed->dtype == DType::f32;  // f32 panels: x as it is, one term
  const bool wide = !f32 && bf16_panels_wide();              // bf16 panels on FMAs: x as it is too
  const SplitTerms xs(f32 || wide ? Mat() : x, terms_for(T));
  struct Job {
    const Linear* l;
    Tensor bias;  // f32, or undefined
    Mat y;        // [terms · T, out]: the hi rows' products, then the lo rows'
  };
  std::vector<Job> jobs;
  std::vector<std::pair<size_t, int64_t>> tiles;  // (job, first column)
  for (const Linear* l : ls) {
    const int64_t out = l->weight.size(0);
    MOEX_ASSERT(l->packed->out == out && l->packed->in == in);
    MOEX_ASSERT(l->packed->dtype == ls.front()->packed->dtype);
    jobs.push_back({l, l->has_bias() ? as_f32(l->bias) : Tensor(), Mat(size_t((xs.two() ? 2 : 1) * T * out))});
    for (int64_t c = 0; c < out; c += 64) tiles.push_back({jobs.size() - 1, c});
  }
  const int64_t panel_elems = f32 ? in * cpu::kPanelCols : cpu::packed_bf16_panel_elems(in);
#pragma omp parallel for schedule(dynamic, 1)
  for (size_t i = 0; i < tiles.size(); ++i) {
    Job& j = jobs[tiles[i].first];
    const int64_t c0 = tiles[i].second, out = j.l->packed->out, w = std::min<int64_t>(64, out - c0);
    const float* b = j.bias.numel() ? j.bias.ptr<float>() : nullptr;
    // the tile's products: f32 rows on f32 panels, or both bf16 terms' rows in one call (the tile's
    // weights read once)
    const auto multiply = [&](auto& a, const auto* xp, int64_t rows, const auto* panels, auto kernel) {
      a.prefetch_ahead = j.l->packed->prefetch_ahead;
      a.x = xp;
      a.ldx = in;
      a.m = rows;
      a.k = in;
      a.panels = panels + (c0 / cpu::kPanelCols) * panel_elems;
      a.y = j.y.data() + c0;
      a.ldy = out;
      a.n0 = 0;
      a.n1 = w;
      kernel(a);
    };
    if (f32) {
      cpu::PackedMatmulArgs a;
      multiply(a, x.data(), T, j.l->packed->f32(), kt.packed_matmul);
    } else if (wide) {
      cpu::PackedBf16WideArgs a;
      multiply(a, x.data(), T, j.l->packed->bf16(), kt.packed_matmul_bf16_wide);
    } else {
      cpu::PackedBf16MatmulArgs a;
      multiply(a, xs.hi(), xs.two() ? 2 * T : T, j.l->packed->bf16(), kt.packed_matmul_bf16);
    }
    if (xs.two() || b)  // the lo rows (two terms) follow the hi rows
      add_lo_and_bias(j.y.data(), xs.two() ? j.y.data() + T * out : nullptr, T, out, c0, c0 + w, b);
  }
  std::vector<Mat> ys;
  for (Job& j : jobs) {
    j.y.resize(size_t(T * j.l->packed->out));  // the hi rows: y
    ys.push_back(std::move(j.y));
  }
  return ys;
}

// Whether bf16 linear l of input width `in` runs on the AMX tile kernel for T rows: the avx512_amx table
// (or its scalar model, MOEX_CPU_ISA=avx512_amx_model) from kAmxMinRows rows, weights read in place.
// MOEX_CPU_AMX_LINEARS=0 sends them back through linear()'s per-tile calls (A/B).
bool amx_path(const Linear& l, int64_t T, int64_t in) {
  static const bool off = [] {
    const char* v = std::getenv("MOEX_CPU_AMX_LINEARS");
    return v && std::string(v) == "0";
  }();
  const cpu::KernelTable& kt = cpu::kernels();
  return !off && T >= cpu::kAmxMinRows && cpu::uses_amx(kt) && kt.bf16_dot && l.weight.dtype() == DType::bf16 &&
         l.weight.view().rank == 2 && l.weight.size(1) == in;
}

// The (rows, columns) of amx_linears' tiles for m rows and linears of widths `outs` on `threads`
// threads. A tile's thread first pulls its rows of packed x (rows × in × 2 bytes, packed by other
// threads) and its weights (columns × in × 2) into its L2, then the kernel re-reads them from there:
// the products per byte pulled grow with rows · columns / (rows + columns), so tiles start at 256 × 512
// (1.5 MB at in = 1024, within a 2 MB L2) and are halved, the wider side first, down to 64 × 64, only
// until there are as many tiles as threads. H100 host (Intel Xeon, AMX, 16 threads), 2026-12-05, the
// random 1024-wide Qwen3-MoE's bf16 prefill: fixed 256 × 64 tiles ran its 16 384-wide head 4× slower
// than 256 × 256, and a 2 048-token prompt's o projection 7× slower than 256 × 512; starting at 256 ×
// 256 instead gave 2 048-token prompts 8 % less (docs/PERF.md, forty-second session).
// MOEX_CPU_AMX_LINEAR_ROWS / _COLS fix either side (multiples of 16 / 32; A/B).
std::pair<int64_t, int64_t> amx_tile_shape(int64_t m, const std::vector<int64_t>& outs, int threads) {
  static const int64_t fixed_rows = [] {
    const char* v = std::getenv("MOEX_CPU_AMX_LINEAR_ROWS");
    return v && std::atoll(v) >= 16 ? std::atoll(v) / 16 * 16 : int64_t(0);
  }();
  static const int64_t fixed_cols = [] {
    const char* v = std::getenv("MOEX_CPU_AMX_LINEAR_COLS");
    return v && std::atoll(v) >= 32 ? std::atoll(v) / 32 * 32 : int64_t(0);
  }();
  const int64_t m16 = (m + 15) / 16 * 16;
  int64_t rows = fixed_rows ? fixed_rows : std::min<int64_t>(256, m16), cols = fixed_cols ? fixed_cols : 512;
  const auto tiles = [&] {
    int64_t n = 0;
    for (int64_t out : outs) n += (out + cols - 1) / cols;
    return n * ((m + rows - 1) / rows);
  };
  while (tiles() < threads) {
    const bool halve_cols = !fixed_cols && cols >= rows && cols > 64;
    const bool halve_rows = !fixed_rows && !halve_cols && rows > 64;
    if (halve_cols)
      cols /= 2;
    else if (halve_rows)
      rows = (rows / 2 + 15) / 16 * 16;
    else if (!fixed_cols && cols > 64)
      cols /= 2;
    else
      break;
  }
  return {rows, cols};
}

// y_i [T, out_i] = x [T, in] · W_iᵀ (+ b_i) for several bf16 linears of one input on the AMX tile kernel
// (amx_path). x's bf16 terms (SplitTerms: hi rows, then lo rows with two terms) are put in the tile
// kernel's layout once (pack_x_vnni, 16-row blocks in parallel), not once per call as the kernel would;
// the work is then tiles of (rows, columns) of every linear in one loop (amx_tile_shape). Each output
// is one f32 chain per term in k order (one accumulator tile, whatever the row block), so y does not
// depend on the tiling, T's blocking or the thread count: the bits of one whole-T call of the kernel.
std::vector<Mat> amx_linears(const Mat& x, int64_t T, const std::vector<const Linear*>& ls) {
  const cpu::KernelTable& kt = cpu::kernels();
  const int64_t in = ls.front()->weight.size(1);
  MOEX_ASSERT(int64_t(x.size()) == T * in && T >= cpu::kAmxMinRows);
  const SplitTerms xs(x, linear_terms());
  const int64_t m = xs.two() ? 2 * T : T;  // the kernel's rows: both terms' rows in one call
  std::vector<uint16_t, UninitAllocator<uint16_t>> xv(size_t(cpu::vnni_elems(m, in)));  // [m/16 blocks][...]
  const int64_t blocks16 = (m + 15) / 16;
#pragma omp parallel for schedule(static) if (blocks16 > 1)
  for (int64_t b = 0; b < blocks16; ++b)
    cpu::pack_x_vnni(xs.hi() + b * 16 * in, in, std::min<int64_t>(16, m - 16 * b), in, xv.data() + cpu::vnni_elems(16 * b, in));
  std::vector<int64_t> outs;
  for (const Linear* l : ls) outs.push_back(l->weight.size(0));
  const auto [row_block, cols] = amx_tile_shape(m, outs, omp_get_max_threads());
  // row blocks of row_block rows (multiples of 16, as the packed blocks); a last block of fewer than 16
  // rows joins the one before (no call ever has fewer than kAmxMinRows rows)
  std::vector<int64_t> row0;
  for (int64_t r = 0; r < m; r += row_block) row0.push_back(r);
  if (row0.size() > 1 && m - row0.back() < 16) row0.pop_back();
  row0.push_back(m);
  struct Job {
    const Linear* l;
    Tensor bias;  // f32, or undefined
    Mat y;        // [m, out]: the hi rows' products, then the lo rows'
  };
  std::vector<Job> jobs;
  struct Tile {
    size_t job;
    int64_t r0, r1, c0;
  };
  std::vector<Tile> tiles;
  for (const Linear* l : ls) {
    const int64_t out = l->weight.size(0);
    MOEX_ASSERT(l->weight.size(1) == in && l->weight.dtype() == DType::bf16);
    jobs.push_back({l, l->has_bias() ? as_f32(l->bias) : Tensor(), Mat(size_t(m * out))});
    for (size_t rb = 0; rb + 1 < row0.size(); ++rb)
      for (int64_t c = 0; c < out; c += cols) tiles.push_back({jobs.size() - 1, row0[rb], row0[rb + 1], c});
  }
#pragma omp parallel for schedule(dynamic, 1)
  for (size_t i = 0; i < tiles.size(); ++i) {
    const Tile& tl = tiles[i];
    Job& j = jobs[tl.job];
    const int64_t out = j.l->weight.size(0);
    cpu::MatmulArgs a;
    a.x = xs.hi() + tl.r0 * in;
    a.x_vnni = xv.data() + cpu::vnni_elems(tl.r0, in);
    a.xdtype = DType::bf16;
    a.ldx = in;
    a.m = tl.r1 - tl.r0;
    a.k = in;
    a.w = j.l->weight.data();
    a.wdtype = DType::bf16;
    a.layout = cpu::WeightLayout::nt;
    a.ldw = in;
    a.y = j.y.data() + tl.r0 * out;
    a.ldy = out;
    a.n0 = tl.c0;
    a.n1 = std::min(out, tl.c0 + cols);
    kt.matmul(a);
  }
  std::vector<Mat> ys;
  for (Job& j : jobs) {
    const int64_t out = j.l->weight.size(0);
    const float* b = j.bias.numel() ? j.bias.ptr<float>() : nullptr;
    if (xs.two() || b) {  // the lo rows (two terms) follow the hi rows
      float* y = j.y.data();
      const float* lo = xs.two() ? y + T * out : nullptr;
#pragma omp parallel for schedule(static) if (T * out > (1 << 15))
      for (int64_t r = 0; r < T; ++r) add_lo_and_bias(y + r * out, lo ? lo + r * out : nullptr, 1, out, 0, out, b);
    }
    j.y.resize(size_t(T * out));
    ys.push_back(std::move(j.y));
  }
  return ys;
}

// y [T, out] = x [T, in] · Wᵀ (+ b) on the CPU matmul kernels (f32 accumulation; weights read in
// their dtype, no converted copy), output columns split over threads in tiles: each element is
// computed by one thread in a fixed order, so results do not depend on the thread count.
Mat linear(const Mat& x, int64_t T, const Linear& l) {
  const int64_t out = l.weight.size(0), in = l.weight.size(1);
  MOEX_ASSERT(int64_t(x.size()) == T * in);
  if (T > 0 && packed_path(l, T, in)) return std::move(packed_linears(x, T, {&l}).front());
  if (amx_path(l, T, in)) return std::move(amx_linears(x, T, {&l}).front());
  const Tensor bt = l.has_bias() ? as_f32(l.bias) : Tensor();
  const float* b = l.has_bias() ? bt.ptr<float>() : nullptr;
  const DType dt = l.weight.dtype();
  MOEX_ASSERT(dt == DType::f32 || dt == DType::bf16 || dt == DType::f16);
  Mat y(size_t(T * out));
  if (T == 0) return y;
  const cpu::KernelTable& kt = cpu::kernels();
  // bf16 weights with many rows run on vdpbf16ps/AMX with x as bf16 terms (linear_terms(): one,
  // the reference's rounding, or two, ~16 bits), several times faster than widening the weights.
  // Otherwise x stays f32.
  const bool split = dt == DType::bf16 && kt.bf16_dot && T >= 8;
  std::unique_ptr<SplitTerms> xs;
  Mat y2;
  if (split) {
    xs = std::make_unique<SplitTerms>(x, linear_terms());
    if (xs->two()) y2.resize(y.size());
  }
  // wide tiles on the split path: on an AMX table (here only with MOEX_CPU_AMX_LINEARS=0; amx_linears
  // otherwise) each call packs its rows again
  const int64_t cols = split ? std::max<int64_t>(64, (out / 8 + 63) / 64 * 64) : 64;
  const int64_t tiles = (out + cols - 1) / cols;
#pragma omp parallel for schedule(dynamic, 1) if (split || T * out * in > (1 << 16))
  for (int64_t t = 0; t < tiles; ++t) {
    cpu::MatmulArgs a;
    a.ldx = in;
    a.m = T;
    a.k = in;
    a.w = l.weight.data();
    a.wdtype = dt;
    a.layout = cpu::WeightLayout::nt;
    a.ldw = in;
    a.ldy = out;
    a.n0 = t * cols;
    a.n1 = std::min(out, a.n0 + cols);
    if (split) {
      a.xdtype = DType::bf16;
      if (xs->two()) {
        a.x = xs->lo();
        a.y = y2.data();
        kt.matmul(a);
      }
      a.x = xs->hi();
    } else {
      a.xdtype = DType::f32;
      a.x = x.data();
    }
    a.y = y.data();
    kt.matmul(a);
    const bool two = split && xs->two();
    if (two || b) add_lo_and_bias(y.data(), two ? y2.data() : nullptr, T, out, a.n0, a.n1, b);
  }
  return y;
}

// RMSNorm over each row of n values (rows = x.size() / n), as the reference: x / sqrt(mean(x²) + eps) * w.
// The sum of squares in f64 in 8 lanes (element i in lane i mod 8, the lanes summed as a fixed tree,
// then the tail), vectorised in the AVX-512 / AVX2 clones with no FMA contraction: the same bits on
// every CPU.
// out may be x (in place); otherwise it is sized to x and written whole (the forward's norms write
// their own row copy instead of copying x first: a 1 MB serial copy per norm at 256 × 1024 rows).
__attribute__((target_clones("avx512f", "avx2", "default"), optimize("fp-contract=off")))
void rmsnorm(const Mat& x, Mat& out, int64_t n, const Tensor& weight, double eps) {
  const Tensor wt = as_f32(weight);
  const float* w = wt.ptr<float>();
  MOEX_ASSERT(weight.numel() == n);
  if (&out != &x) out.resize(x.size());
  const int64_t rows = int64_t(x.size()) / n;
#pragma omp parallel for schedule(static) if (rows * n > (1 << 15))
  for (int64_t r = 0; r < rows; ++r) {
    const float* v = x.data() + r * n;
    float* o = out.data() + r * n;
    double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
      for (int u = 0; u < 8; ++u) lane[u] += double(v[i + u]) * double(v[i + u]);
    double ss = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
    for (; i < n; ++i) ss += double(v[i]) * double(v[i]);
    const double inv = 1.0 / std::sqrt(ss / double(n) + eps);
    for (int64_t k = 0; k < n; ++k) o[k] = float(double(w[k]) * (double(v[k]) * inv));
  }
}
void rmsnorm_inplace(Mat& x, int64_t n, const Tensor& weight, double eps) { rmsnorm(x, x, n, weight, eps); }

float act(const std::string& a, float g) {
  if (a == "silu") return g / (1.f + std::exp(-g));
  if (a == "relu") return g > 0 ? g : 0.f;
  if (a == "gelu") return float(0.5 * g * (1.0 + std::erf(g / std::sqrt(2.0))));
  // gelu_pytorch_tanh
  const double k = std::sqrt(2.0 / M_PI);
  return float(0.5 * g * (1.0 + std::tanh(k * (g + 0.044715 * double(g) * g * g))));
}

// linear() of several linears of one input: together on the packed path or the AMX path (one split
// of x, one loop over all their tiles), each alone otherwise.
std::vector<Mat> linears(const Mat& x, int64_t T, const std::vector<const Linear*>& ls) {
  const int64_t in = ls.front()->weight.size(1);
  bool packed = true, amx = true;
  for (const Linear* l : ls) {
    packed = packed && T > 0 && packed_path(*l, T, in);
    amx = amx && amx_path(*l, T, in);
  }
  if (packed) return packed_linears(x, T, ls);
  if (amx) return amx_linears(x, T, ls);
  std::vector<Mat> ys;
  for (const Linear* l : ls) ys.push_back(linear(x, T, *l));
  return ys;
}

Mat dense_mlp(const Mat& x, int64_t T, const DenseMlp& m, const std::string& a) {
  std::vector<Mat> gu = linears(x, T, {&m.gate, &m.up});
  Mat& g = gu[0];
  const Mat& u = gu[1];
  const int64_t n = int64_t(g.size());
#pragma omp parallel for schedule(static) if (n > (1 << 15))
  for (int64_t i = 0; i < n; ++i) g[size_t(i)] = act(a, g[size_t(i)]) * u[size_t(i)];
  return linear(g, T, m.down);
}

struct Rope {
  int64_t dim = 0;
  std::vector<double> inv_freq;
  double factor = 1.0;
  // cos(pos · f_i) · factor and sin(pos · f_i) · factor of each row's position, [rows, dim / 2]:
  // computed once per forward (set_positions), not per layer and head.
  std::vector<double> cos_t, sin_t;
  void set_positions(const std::vector<int64_t>& pos) {
    const int64_t h = dim / 2;
    cos_t.resize(pos.size() * size_t(h));
    sin_t.resize(pos.size() * size_t(h));
    const int64_t rows = int64_t(pos.size());
#pragma omp parallel for schedule(static) if (rows * h > 4096)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < h; ++i) {
        const double ang = double(pos[size_t(r)]) * inv_freq[size_t(i)];
        cos_t[size_t(r * h + i)] = std::cos(ang) * factor;
        sin_t[size_t(r * h + i)] = std::sin(ang) * factor;
      }
  }
  // Rotates v (dim values) of row `row` (set_positions); interleaved pairs (DeepSeek) or halves (rotate_half).
  void apply(float* v, int64_t row, bool interleave) const {
    const int64_t h = dim / 2;
    float out[2048];  // rotary dims of the supported families are far below; asserted
    MOEX_ASSERT(dim <= 2048);
    const double* c = cos_t.data() + row * h;
    const double* s = sin_t.data() + row * h;
    for (int64_t i = 0; i < h; ++i) {
      const double x1 = interleave ? v[2 * i] : v[i];
      const double x2 = interleave ? v[2 * i + 1] : v[i + h];
      out[i] = float(x1 * c[i] - x2 * s[i]);
      out[i + h] = float(x2 * c[i] + x1 * s[i]);
    }
    std::copy(out, out + dim, v);
  }
};

// Appends the keys k [n, nkv, dq] of positions pos0 .. pos0+n-1 to kt, the keys of positions
// 0 .. pos0-1 in the attention's tiles (cpu_attention.hpp); grows kt by whole zeroed tiles. The KV
// cache keeps its keys so (KvCache::k), appended token by token: a decode step reads them as a
// prefill does, with no transposition per step.
void append_key_tiles(Floats& kt, const float* k, int64_t n, int64_t pos0, int64_t nkv, int64_t dq) {
  const int64_t tile_floats = nkv * dq * kKeyTile;
  const int64_t first_tile = pos0 / kKeyTile, end_tile = (pos0 + n + kKeyTile - 1) / kKeyTile;
  MOEX_ASSERT(int64_t(kt.size()) >= (pos0 + kKeyTile - 1) / kKeyTile * tile_floats);
  if (int64_t(kt.size()) < end_tile * tile_floats) {
    const size_t old = kt.size();
    kt.resize(size_t(end_tile * tile_floats));
    std::fill(kt.begin() + int64_t(old), kt.end(), 0.0f);
  }
  // whole tiles per thread (the keys of one tile share its cache lines)
#pragma omp parallel for schedule(static) if (n * nkv * dq > (1 << 16))
  for (int64_t jt = first_tile; jt < end_tile; ++jt) {
    float* tile = kt.data() + jt * tile_floats;
    for (int64_t p = std::max(pos0, jt * kKeyTile); p < std::min(pos0 + n, (jt + 1) * kKeyTile); ++p) {
      const float* kp = k + (p - pos0) * nkv * dq;
      for (int64_t e = 0; e < nkv * dq; ++e) tile[e * kKeyTile + p % kKeyTile] = kp[e];
    }
  }
}

// The tokens of one sequence inside a packed batch: rows [row0, row0 + n) at positions pos0 .. pos0+n-1.
struct Segment {
  int64_t row0 = 0, n = 0, pos0 = 0;
  KvCache* cache = nullptr;
};

// Attention of the packed rows of several sequences: each segment's new keys/values are appended to
// its own cache and its queries attend over that cache only.
Mat attention(const Mat& x, int64_t T, const AttentionWeights& a, const TextConfig& t, int64_t layer, const Rope& rope,
              const std::vector<Segment>& segs) {
  const int64_t nh = t.num_attention_heads, nkv = t.num_key_value_heads;
  // Appends rows of K/V to each segment's cache and attends; returns [T, nh * dv].
  auto attend_all = [&](const Mat& q, const Mat& K, const Mat& V, int64_t kh, int64_t dq, int64_t dv, double scaling,
                        int64_t window, const float* sinks) {
    Mat o(segs.size() == 1 ? 0 : size_t(T * nh * dv));
    for (const auto& sg : segs) {
      Mat& kc = sg.cache->k[size_t(layer)];
      Mat& vc = sg.cache->v[size_t(layer)];
      append_key_tiles(kc, K.data() + sg.row0 * kh * dq, sg.n, sg.pos0, kh, dq);
      vc.insert(vc.end(), V.begin() + sg.row0 * kh * dv, V.begin() + (sg.row0 + sg.n) * kh * dv);
      const int64_t Tk = int64_t(vc.size()) / (kh * dv);
      MOEX_ASSERT(Tk == sg.pos0 + sg.n);
      Mat os = cpu_attend(q.data() + sg.row0 * nh * dq, kc.data(), vc.data(), sg.n, Tk, sg.pos0, nh, kh, dq, dv, scaling, window, sinks);
      if (segs.size() == 1)
        o = std::move(os);  // one sequence (a prompt, or one decode step): its rows are all of o
      else
        std::copy(os.begin(), os.end(), o.begin() + sg.row0 * nh * dv);
    }
    return o;
  };
  if (t.family == ModelFamily::deepseek_v3) {
    const int64_t nope = t.qk_nope_head_dim, rd = t.qk_rope_head_dim, vd = t.v_head_dim, qk = nope + rd;
    StageTimer timer(kQkvProj);  // the low-rank projections and their norms
    Mat q;
    if (a.q_a.defined()) {
      Mat qa = linear(x, T, a.q_a);
      rmsnorm_inplace(qa, t.q_lora_rank, a.q_a_norm, t.rms_norm_eps);
      q = linear(qa, T, a.q_b);
    } else {
      q = linear(x, T, a.q);
    }
    Mat ckv = linear(x, T, a.kv_a);  // [T, kv_lora + rd]
    const int64_t cw = t.kv_lora_rank + rd;
    Mat kv_nope(size_t(T * t.kv_lora_rank)), k_rot(size_t(T * rd));
    for (int64_t i = 0; i < T; ++i) {
      std::copy_n(ckv.data() + i * cw, t.kv_lora_rank, kv_nope.data() + i * t.kv_lora_rank);
      std::copy_n(ckv.data() + i * cw + t.kv_lora_rank, rd, k_rot.data() + i * rd);
    }
    rmsnorm_inplace(kv_nope, t.kv_lora_rank, a.kv_a_norm, t.rms_norm_eps);
    Mat kvb = linear(kv_nope, T, a.kv_b);  // [T, nh * (nope + vd)]
    timer.next(kQkvPost);
    Mat K(size_t(T * nh * qk)), V(size_t(T * nh * vd));
#pragma omp parallel for schedule(static) if (T * nh * qk > (1 << 14))
    for (int64_t i = 0; i < T; ++i) {
      rope.apply(k_rot.data() + i * rd, i, t.rope_interleave);
      for (int64_t h = 0; h < nh; ++h) {
        float* qh = q.data() + (i * nh + h) * qk;
        rope.apply(qh + nope, i, t.rope_interleave);
        const float* src = kvb.data() + (i * nh + h) * (nope + vd);
        std::copy_n(src, nope, K.data() + (i * nh + h) * qk);
        std::copy_n(k_rot.data() + i * rd, rd, K.data() + (i * nh + h) * qk + nope);
        std::copy_n(src + nope, vd, V.data() + (i * nh + h) * vd);
      }
    }
    double scaling = 1.0 / std::sqrt(double(qk));
    if (t.rope.type != "default" && t.rope.mscale_all_dim && *t.rope.mscale_all_dim != 0.0 && t.rope.factor > 1) {
      const double m = 0.1 * *t.rope.mscale_all_dim * std::log(t.rope.factor) + 1.0;
      scaling *= m * m;
    }
    timer.next(kAttend);
    Mat o = attend_all(q, K, V, nh, qk, vd, scaling, 0, nullptr);
    timer.next(kOProj);
    return linear(o, T, a.o);
  }
  const int64_t hd = t.head_dim;
  StageTimer timer(kQkvProj);
  std::vector<Mat> qkv = linears(x, T, {&a.q, &a.k, &a.v});
  Mat& q = qkv[0];
  Mat& k = qkv[1];
  Mat& v = qkv[2];
  timer.next(kQkvPost);
  if (t.qk_norm) {
    const bool per_head = t.family == ModelFamily::qwen3_moe;
    rmsnorm_inplace(q, per_head ? hd : nh * hd, a.q_norm, t.rms_norm_eps);
    rmsnorm_inplace(k, per_head ? hd : nkv * hd, a.k_norm, t.rms_norm_eps);
  }
  if (t.clip_qkv) {
    const float c = float(*t.clip_qkv);
    for (Mat* m : {&q, &k, &v})
      for (float& e : *m) e = std::min(std::max(e, -c), c);
  }
#pragma omp parallel for schedule(static) if (T * (nh + nkv) * hd > (1 << 14))
  for (int64_t i = 0; i < T; ++i) {
    for (int64_t h = 0; h < nh; ++h) rope.apply(q.data() + (i * nh + h) * hd, i, false);
    for (int64_t h = 0; h < nkv; ++h) rope.apply(k.data() + (i * nkv + h) * hd, i, false);
  }
  timer.next(kAttend);
  const Tensor sinks = a.sinks.numel() ? as_f32(a.sinks) : Tensor();
  Mat o = attend_all(q, k, v, nkv, hd, hd, 1.0 / std::sqrt(double(hd)), t.attention_window(layer),
                     a.sinks.numel() ? sinks.ptr<float>() : nullptr);
  timer.next(kOProj);
  return linear(o, T, a.o);
}

RouterConfig router_config(const TextConfig& t, const Tensor& e_score_correction_bias) {
  RouterConfig r;
  switch (t.family) {
    case ModelFamily::qwen2_moe: r.kind = RouterKind::qwen2_moe; break;
    case ModelFamily::qwen3_moe: r.kind = RouterKind::qwen3_moe; break;
    case ModelFamily::olmoe: r.kind = RouterKind::olmoe; break;
    case ModelFamily::mixtral: r.kind = RouterKind::mixtral; break;
    case ModelFamily::deepseek_v3: r.kind = RouterKind::deepseek_v3; break;
    case ModelFamily::gpt_oss: r.kind = RouterKind::gpt_oss; break;
  }
  r.num_experts = t.num_experts;
  r.top_k = t.num_experts_per_tok;
  r.norm_topk_prob = t.norm_topk_prob;
  r.n_group = t.n_group;
  r.topk_group = t.topk_group;
  r.routed_scaling_factor = float(t.routed_scaling_factor);
  if (e_score_correction_bias.numel()) r.e_score_correction_bias = e_score_correction_bias.ptr<float>();
  return r;
}

Mat moe(const Mat& x, int64_t T, const MoeWeights& m, const TextConfig& t, std::string_view backend) {
  const int64_t H = t.hidden_size, K = t.num_experts_per_tok;
  StageTimer timer(kRouter);
  Mat logits = linear(x, T, m.router);  // f32 router logits (GPT-OSS: with the router bias)
  std::vector<int32_t> idx(size_t(T * K));
  std::vector<float> wts(size_t(T * K));
  const Tensor bias = m.e_score_correction_bias.numel() ? as_f32(m.e_score_correction_bias) : Tensor();
  route(router_config(t, bias), logits.data(), T, idx.data(), wts.data());
  timer.next(kExperts);
  Mat out(size_t(T * H));
  // The experts run in the weights' dtype: f32 (x and out themselves), or bf16/f16 activations
  // (rounded once) and output, converted in parallel.
  const DType dt = m.experts.spec.dtype;
  Tensor xin, xout;
  if (dt != DType::f32) {
    xin = convert_tensor(TensorView(const_cast<float*>(x.data()), DType::f32, {T, H}), dt);
    xout = Tensor::empty(dt, {T, H});
  }
  ExpertsCall call;
  call.hidden = dt == DType::f32 ? TensorView(const_cast<float*>(x.data()), DType::f32, {T, H}) : xin.view();
  call.top_k_index = TensorView(idx.data(), DType::i32, {T, K});
  call.top_k_weights = TensorView(wts.data(), DType::f32, {T, K});
  call.out = dt == DType::f32 ? TensorView(out.data(), DType::f32, {T, H}) : xout.view();
  experts_forward(backend, m.experts, call);
  if (dt != DType::f32) convert_elements(out.data(), DType::f32, xout.data(), dt, T * H);
  timer.next(kDenseMlp);
  if (m.shared.defined()) {
    Mat s = dense_mlp(x, T, m.shared, t.hidden_act);
    if (m.shared_gate.defined()) {
      Mat g = linear(x, T, m.shared_gate);  // [T, 1]
      for (int64_t i = 0; i < T; ++i) {
        const float sg = 1.f / (1.f + std::exp(-g[size_t(i)]));
        for (int64_t d = 0; d < H; ++d) s[size_t(i * H + d)] *= sg;
      }
    }
    for (size_t i = 0; i < out.size(); ++i) out[i] += s[i];
  }
  return out;
}

}  // namespace

std::vector<float> causal_attention(const float* q, const float* k, const float* v, int64_t n, int64_t Tk, int64_t pos0, int64_t nh,
                                    int64_t nkv, int64_t dq, int64_t dv, double scaling, int64_t window, const float* sinks) {
  Floats kt;
  append_key_tiles(kt, k, Tk, 0, nkv, dq);
  const Mat o = cpu_attend(q, kt.data(), v, n, Tk, pos0, nh, nkv, dq, dv, scaling, window, sinks);
  return std::vector<float>(o.begin(), o.end());
}

void pack_linears_for_cpu(ModelWeights& w, int threads) {
  static const bool off = [] {  // MOEX_CPU_PACK_LINEARS=0: the weights read in place (A/B)
    const char* v = std::getenv("MOEX_CPU_PACK_LINEARS");
    return v && std::string(v) == "0";
  }();
  // bf16 weights where the table has a packed bf16 kernel (AVX512_BF16 without AMX: vdpbf16ps; AVX2: f32
  // FMAs on the same panels), f32 weights on the packed f32 kernel every table has
  const bool bf16 = w.dtype == DType::bf16 && cpu::packs_bf16(cpu::kernels());
  if (off || !(bf16 || w.dtype == DType::f32)) return;
  const DType dt = w.dtype;
  std::vector<std::pair<const Tensor*, std::shared_ptr<const PackedLinear>*>> to_pack;  // (weight, where its panels go)
  auto add = [&](Linear& l) {
    if (l.defined() && l.weight.dtype() == dt && l.weight.view().rank == 2) to_pack.push_back({&l.weight, &l.packed});
  };
  for (LayerWeights& lw : w.layers) {
    AttentionWeights& a = lw.attn;
    for (Linear* l : {&a.q, &a.k, &a.v, &a.o, &a.q_a, &a.q_b, &a.kv_a, &a.kv_b}) add(*l);
    for (Linear* l : {&lw.mlp.gate, &lw.mlp.up, &lw.mlp.down}) add(*l);
    MoeWeights& m = lw.moe;
    for (Linear* l : {&m.router, &m.shared.gate, &m.shared.up, &m.shared.down, &m.shared_gate}) add(*l);
  }
  if (w.lm_head.numel() > 0 && w.lm_head.dtype() == dt) to_pack.push_back({&w.lm_head, &w.lm_head_packed});
  std::vector<std::shared_ptr<PackedLinear>> made(to_pack.size());
  size_t total = 0;
  for (size_t i = 0; i < to_pack.size(); ++i) {  // allocations here: errors are not thrown inside the parallel loop
    const Tensor& wt = *to_pack[i].first;
    auto p = std::make_shared<PackedLinear>();
    p->dtype = dt;
    p->out = wt.size(0);
    p->in = wt.size(1);
    const size_t panels = size_t((p->out + cpu::kPanelCols - 1) / cpu::kPanelCols);
    const size_t bytes = dt == DType::bf16 ? panels * size_t(cpu::packed_bf16_panel_elems(p->in)) * 2
                                           : panels * size_t(p->in * cpu::kPanelCols) * sizeof(float);
    void* mem = detail::host_alloc(bytes);
    if (!mem) detail::fail(ErrorCode::out_of_memory, "packing a [{}, {}] linear for the CPU kernels: cannot allocate {} bytes", p->out, p->in, bytes);
    p->storage = std::unique_ptr<char[], void (*)(void*)>(static_cast<char*>(mem), &std::free);
    total += bytes;
    made[i] = std::move(p);
  }
  const int64_t ahead = cpu::stream_prefetch_ahead(total, dt);  // a decode step streams them all
  for (auto& p : made) p->prefetch_ahead = ahead;
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
  for (size_t i = 0; i < to_pack.size(); ++i) {
    PackedLinear& p = *made[i];
    if (dt == DType::bf16)
      cpu::pack_rows_bf16(to_pack[i].first->ptr<uint16_t>(), p.in, 0, p.out, reinterpret_cast<uint16_t*>(p.storage.get()));
    else
      cpu::pack_rows(to_pack[i].first->ptr<float>(), false, p.out, p.in, 0, p.out, reinterpret_cast<float*>(p.storage.get()));
  }
  for (size_t i = 0; i < to_pack.size(); ++i) *to_pack[i].second = std::move(made[i]);
}

void rope_inv_freq(const RopeConfig& r, int64_t dim, int64_t max_pos, std::vector<double>& inv_freq, double& af) {
  const int64_t h = dim / 2;
  inv_freq.assign(size_t(h), 0.0);
  af = 1.0;
  for (int64_t i = 0; i < h; ++i) inv_freq[size_t(i)] = 1.0 / std::pow(r.theta, double(2 * i) / double(dim));
  if (r.type == "default" || r.type == "dynamic") {
    // dynamic NTK equals default for sequences within max_position_embeddings
  } else if (r.type == "linear") {
    for (auto& f : inv_freq) f /= r.factor;
  } else if (r.type == "yarn") {
    auto get_mscale = [](double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; };
    if (r.attention_factor) af = *r.attention_factor;
    else if (r.mscale && *r.mscale != 0 && r.mscale_all_dim && *r.mscale_all_dim != 0)
      af = get_mscale(r.factor, *r.mscale) / get_mscale(r.factor, *r.mscale_all_dim);
    else af = get_mscale(r.factor, 1.0);
    const double base = r.theta, omax = double(r.original_max_position_embeddings);
    auto corr = [&](double rot) { return (double(dim) * std::log(omax / (rot * 2 * M_PI))) / (2 * std::log(base)); };
    double lo = corr(r.beta_fast), hi = corr(r.beta_slow);
    if (r.truncate) {
      lo = std::floor(lo);
      hi = std::ceil(hi);
    }
    lo = std::max(lo, 0.0);
    hi = std::min(hi, double(dim - 1));
    if (lo == hi) hi += 0.001;
    for (int64_t i = 0; i < h; ++i) {
      const double ramp = std::clamp((double(i) - lo) / (hi - lo), 0.0, 1.0);
      const double extra = 1.0 - ramp;  // inv_freq_extrapolation_factor
      const double e = inv_freq[size_t(i)], in = e / r.factor;
      inv_freq[size_t(i)] = in * (1 - extra) + e * extra;
    }
  } else if (r.type == "llama3") {
    const double lf = r.low_freq_factor, hf = r.high_freq_factor, omax = double(r.original_max_position_embeddings);
    const double low_wl = omax / lf, high_wl = omax / hf;
    for (auto& f : inv_freq) {
      const double wl = 2 * M_PI / f;
      if (wl > low_wl) {
        f /= r.factor;
      } else if (wl >= high_wl) {
        const double smooth = (omax / wl - lf) / (hf - lf);
        f = (1 - smooth) * f / r.factor + smooth * f;
      }
    }
  } else {
    detail::fail(ErrorCode::unsupported, "RoPE type '{}' is not supported", r.type);
  }
  (void)max_pos;
}

Floats forward_batch(const ModelWeights& w, const TextConfig& t, const std::vector<SequenceChunk>& chunks,
                     std::string_view backend, LogitRows logit_rows) {
  const int64_t H = t.hidden_size, V = t.vocab_size;
  MOEX_CHECK(!chunks.empty(), "forward: no sequences");
  std::vector<Segment> segs;
  int64_t T = 0;
  for (const auto& c : chunks) {
    MOEX_CHECK(c.n > 0 && c.ids != nullptr && c.cache != nullptr, "forward: a sequence chunk without tokens or cache");
    KvCache& cache = *c.cache;
    if (cache.k.empty()) {
      cache.k.resize(size_t(t.num_hidden_layers));
      cache.v.resize(size_t(t.num_hidden_layers));
    }
    MOEX_CHECK(int64_t(cache.k.size()) == t.num_hidden_layers, "forward: KV cache has {} layers, the model {}",
               cache.k.size(), t.num_hidden_layers);
    for (const auto& s : segs) MOEX_CHECK(s.cache != c.cache, "forward: two chunks share one KV cache");
    segs.push_back({T, c.n, cache.length, c.cache});
    T += c.n;
  }
  if (CpuProfile& prof = cpu_profile(); prof.on) {
    const bool first = prof.forwards[0] + prof.forwards[1] + prof.forwards[2] == 0;
    prof.kind = first ? 2 : T > int64_t(segs.size()) ? 0 : 1;  // decode: one new row per sequence
    ++prof.forwards[prof.kind];
    prof.rows[prof.kind] += T;
  }
  StageTimer forward_timer(kWholeForward);
  Rope rope;
  rope.dim = t.family == ModelFamily::deepseek_v3 ? t.qk_rope_head_dim : t.head_dim;
  rope_inv_freq(t.rope, rope.dim, t.max_position_embeddings, rope.inv_freq, rope.factor);
  {
    std::vector<int64_t> pos(static_cast<size_t>(T));
    for (const auto& sg : segs)
      for (int64_t i = 0; i < sg.n; ++i) pos[size_t(sg.row0 + i)] = sg.pos0 + i;
    rope.set_positions(pos);
  }
  // x += a, elementwise (in parallel for many rows)
  const auto add_into = [](Mat& x, const Mat& a) {
    const int64_t n = int64_t(x.size());
#pragma omp parallel for schedule(static) if (n > (1 << 16))
    for (int64_t i = 0; i < n; ++i) x[size_t(i)] += a[size_t(i)];
  };

  Mat x(size_t(T * H));
  for (const auto& c : chunks)
    for (int64_t i = 0; i < c.n; ++i)
      MOEX_CHECK(c.ids[i] >= 0 && c.ids[i] < V, "token id {} is outside the vocabulary [0, {})", c.ids[i], V);
  {  // only the looked-up rows are widened to f32 (not the whole table: decode steps need one row)
    const char* emb = static_cast<const char*>(w.embed.data());
    const size_t row_bytes = size_t(H) * dtype_size(w.embed.dtype());
    int64_t r = 0;
    for (const auto& c : chunks)
      for (int64_t i = 0; i < c.n; ++i, ++r) cpu::kernels().to_f32(emb + size_t(c.ids[i]) * row_bytes, w.embed.dtype(), x.data() + r * H, H);
  }
  Mat h;  // [T, H]: the normed rows of each layer's two blocks (one buffer for all of them)
  for (int64_t l = 0; l < t.num_hidden_layers; ++l) {
    const LayerWeights& lw = w.layers[size_t(l)];
    StageTimer timer(kNorms);
    rmsnorm(x, h, H, lw.input_norm, t.rms_norm_eps);
    timer.next(kTimedInside);  // attention() times its own stages
    Mat a = attention(h, T, lw.attn, t, l, rope, segs);
    timer.next(kResidual);
    add_into(x, a);
    timer.next(kNorms);
    rmsnorm(x, h, H, lw.post_attention_norm, t.rms_norm_eps);
    timer.next(lw.is_moe ? kTimedInside : kDenseMlp);  // moe() times its own stages
    Mat m = lw.is_moe ? moe(h, T, lw.moe, t, backend) : dense_mlp(h, T, lw.mlp, t.hidden_act);
    timer.next(kResidual);
    add_into(x, m);
  }
  StageTimer head_timer(kHead);
  for (const auto& sg : segs) sg.cache->length += sg.n;
  int64_t rows = T;
  if (logit_rows == LogitRows::last) {  // each chunk's last row only: the rows generation picks from
    Mat last(segs.size() * size_t(H));
    for (size_t c = 0; c < segs.size(); ++c)
      std::copy_n(x.data() + (segs[c].row0 + segs[c].n - 1) * H, H, last.data() + c * size_t(H));
    x = std::move(last);
    rows = int64_t(segs.size());
  }
  rmsnorm_inplace(x, H, w.final_norm, t.rms_norm_eps);
  Linear head;
  head.weight = w.lm_head;
  head.packed = w.lm_head_packed;
  return linear(x, rows, head);
}

std::vector<float> forward_tokens(const ModelWeights& w, const TextConfig& t, const int64_t* ids, int64_t T,
                                  KvCache& cache, std::string_view backend) {
  const Floats logits = forward_batch(w, t, {SequenceChunk{ids, T, &cache}}, backend);
  return std::vector<float>(logits.begin(), logits.end());
}

std::vector<float> reference_logits(const ModelWeights& w, const TextConfig& t, const std::vector<int64_t>& ids,
                                    std::string_view backend) {
  KvCache cache;
  return forward_tokens(w, t, ids.data(), int64_t(ids.size()), cache, backend);
}

std::vector<int64_t> reference_greedy(const ModelWeights& w, const TextConfig& t, std::vector<int64_t> ids,
                                      int64_t max_new_tokens, const std::vector<int64_t>& eos, std::string_view backend) {
  const int64_t V = t.vocab_size;
  for (int64_t n = 0; n < max_new_tokens; ++n) {
    const std::vector<float> logits = reference_logits(w, t, ids, backend);
    const float* last = logits.data() + (int64_t(ids.size()) - 1) * V;
    const int64_t next = std::max_element(last, last + V) - last;  // ties → lowest id
    ids.push_back(next);
    if (std::find(eos.begin(), eos.end(), next) != eos.end()) break;
  }
  return ids;
}

}  // namespace moex::model
