// model/cpu_attention_impl.hpp — the CPU runtime's causal attention, written once for every ISA: included
// by cpu_attention.cpp (baseline x86-64 and other CPUs), cpu_attention_avx2.cpp and
// cpu_attention_avx512.cpp, each compiled with its own flags and -ffp-contract=off (the only fused
// multiply-adds are Isa::fma's). cpu_attend (cpu_attention.hpp) picks one at run time.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "model/cpu_attention.hpp"

namespace moex::model::attention_kernels {
// Everything here is local to each including file (compiled with that file's ISA flags): no inline
// function compiled for AVX-512 can stand in for another file's at link time.
namespace {

// 16 floats (GCC vector extension: one zmm, two ymm or four xmm, elementwise): the scores of 16 keys,
// a row of a key tile, 16 values of a value row.
typedef float KeyLanes __attribute__((vector_size(64)));
typedef int32_t Ints16 __attribute__((vector_size(64)));

// (the helpers taking or returning KeyLanes are always inlined into attend_impl: no call ABI, and
// GCC's note that a 64-byte vector argument changes the ABI without AVX-512 does not apply)
#pragma GCC diagnostic ignored "-Wpsabi"
// 16 floats from / to memory by value (no address of a vector variable taken: GCC then keeps the
// attention's accumulators in registers; with memcpy into them it stored all 16 of the value sums'
// accumulators on every key, 2026-12-05).
__attribute__((always_inline)) inline KeyLanes load16(const float* p) {
  KeyLanes x;
  std::memcpy(&x, p, sizeof x);
  return x;
}
__attribute__((always_inline)) inline void store16(float* p, KeyLanes x) { std::memcpy(p, &x, sizeof x); }
__attribute__((always_inline)) inline KeyLanes splat(float v) { return KeyLanes{v, v, v, v, v, v, v, v, v, v, v, v, v, v, v, v}; }

// e^x for 16 x ≤ 0 (scores minus their row's maximum), in f32: 2^k · e^r with k = round(x · log2 e) and
// r = x − k · ln 2 (ln 2 in two parts, Cody–Waite; |r| ≤ 0.35), e^r by its Taylor polynomial to degree
// 7 (truncation < 2^-27), multiply-adds by Isa::fma. x < −87 (e^x near the smallest normal float: a
// softmax weight < 2e-38) gives 0, −inf gives 0, NaN stays NaN.
template <class Isa>
__attribute__((always_inline)) inline KeyLanes exp16(KeyLanes x) {
  constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693145751953125f, kLn2Lo = 1.42860682030941723e-6f;
  constexpr float kShift = 12582912.0f;  // 1.5 · 2^23: adding and subtracting it rounds to an integer
  const KeyLanes kd = Isa::fma(x, splat(kLog2e), splat(kShift)) - kShift;
  const KeyLanes r = Isa::fma(kd, splat(-kLn2Lo), Isa::fma(kd, splat(-kLn2Hi), x));
  KeyLanes p = Isa::fma(r, splat(1.0f / 5040), splat(1.0f / 720));
  for (const float c : {1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f}) p = Isa::fma(p, r, splat(c));
  const Ints16 bits = (__builtin_convertvector(kd, Ints16) + 127) << 23;
  KeyLanes scale;
  std::memcpy(&scale, &bits, sizeof scale);
  const KeyLanes zero = {};
  return x < -87.0f ? zero : p * scale;
}

// a where the lanes of mask are all ones, else b — as bits (a vector ?: here, next to exp16's own,
// was compiled lane by lane, 16 scalar compares, 2026-12-05)
__attribute__((always_inline)) inline KeyLanes select(Ints16 mask, KeyLanes a, KeyLanes b) {
  Ints16 ai, bi;
  std::memcpy(&ai, &a, sizeof ai);
  std::memcpy(&bi, &b, sizeof bi);
  const Ints16 r = (ai & mask) | (bi & ~mask);
  KeyLanes out;
  std::memcpy(&out, &r, sizeof out);
  return out;
}

// The attention's rows: R (query, head) pairs of one kv head — a quad of a query's heads, for up to
// kRowsMax / G queries in a row. A row's arithmetic depends on neither R nor the other rows: one query
// at a time gives the same bits as many.
constexpr int kRowsMax = 8;

// The scores of R rows (qr[r], dq long) against the 16 keys of one tile t (row d: the keys' element d):
// out[r] = Σ_d qr[r][d] · key[d] in two chains of Isa::fma per row (even and odd d) added at the end. Each key
// row is loaded once for the R rows.
template <class Isa, int R>
__attribute__((always_inline)) inline void tile_scores(const float* const* qr, const float* t, int64_t dq, KeyLanes* out) {
  KeyLanes even[R] = {}, odd[R] = {};
  int64_t d = 0;
  for (; d + 2 <= dq; d += 2) {
    const KeyLanes k0 = load16(t + d * kKeyTile), k1 = load16(t + (d + 1) * kKeyTile);
    for (int r = 0; r < R; ++r) {
      even[r] = Isa::fma(splat(qr[r][d]), k0, even[r]);
      odd[r] = Isa::fma(splat(qr[r][d + 1]), k1, odd[r]);
    }
  }
  if (d < dq) {
    const KeyLanes k0 = load16(t + d * kKeyTile);
    for (int r = 0; r < R; ++r) even[r] = Isa::fma(splat(qr[r][d]), k0, even[r]);
  }
  for (int r = 0; r < R; ++r) out[r] = even[r] + odd[r];
}

// Value sums of R rows over 16·C values: out_r[0 .. 16C) = scale[r] · Σ_j w_r[j] · v_j[0 .. 16C), j from j0
// in order: keys j0 .. jc shared by every row (each value row loaded once for the R rows), then each
// row's own keys jc + 1 .. j1[r]. w_r = w + r · row, v_j = v + j · vstride. One chain of Isa::fma per
// output vector.
template <class Isa, int R, int C>
__attribute__((always_inline)) inline void value_sums(const float* w, int64_t row, const float* v, int64_t vstride, int64_t j0,
                                                      int64_t jc, const int64_t* j1, const float* scale, float* const* out) {
  KeyLanes a[R][C] = {};
  for (int64_t j = j0; j <= jc; ++j) {
    KeyLanes vj[C];
    for (int c = 0; c < C; ++c) vj[c] = load16(v + j * vstride + 16 * c);
    for (int r = 0; r < R; ++r) {
      const KeyLanes wj = splat(w[r * row + j]);
      for (int c = 0; c < C; ++c) a[r][c] = Isa::fma(wj, vj[c], a[r][c]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int64_t j = jc + 1; j <= j1[r]; ++j) {
      const KeyLanes wj = splat(w[r * row + j]);
      for (int c = 0; c < C; ++c) a[r][c] = Isa::fma(wj, load16(v + j * vstride + 16 * c), a[r][c]);
    }
    for (int c = 0; c < C; ++c) store16(out[r] + 16 * c, a[r][c] * scale[r]);
  }
}

// f(std::integral_constant<int, R>) for R = 1 .. kRowsMax
template <class F>
__attribute__((always_inline)) inline void with_rows(int R, F&& f) {
  switch (R) {
    case 8: f(std::integral_constant<int, 8>{}); break;
    case 7: f(std::integral_constant<int, 7>{}); break;
    case 6: f(std::integral_constant<int, 6>{}); break;
    case 5: f(std::integral_constant<int, 5>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    default: f(std::integral_constant<int, 1>{}); break;
  }
}

// cpu_attend's kernel (arguments: cpu_attention.hpp). Work items: (kv head, block of queries, quad of the group's query heads), each by one thread in a
// fixed order over its rows (kRowsMax above): the rows' scores 16 keys at a time (tile_scores) and
// their maxima, per row the exponentials (exp16) and the denominator in 16 lanes added as a fixed
// tree, all in f32; then the value sums of the rows together over the exponentials, each divided by
// its row's denominator at the end (value_sums; a pass dividing the weights first, and the lane masks
// on every tile instead of a row's first and last, took 40 % of the time). Every output depends
// only on its query, head and keys: the same bits for one query at a time as for many, whatever the
// thread count. Isa (cpu_attention_*.cpp) gives the multiply-add: a fused one where the CPU has it,
// written out so that no compiler decides (GCC 13 contracted some block sizes' multiply-adds and not
// others', and one query at a time then differed from many: H200 host, 2026-12-05), and whether
// blocks may hold several queries (AVX-512's 32 vector registers; never with a window).
template <class Isa>
Floats attend_impl(const float* q, const float* kt, const float* v, int64_t n, int64_t Tk, int64_t pos0, int64_t nh, int64_t nkv,
           int64_t dq, int64_t dv, double scaling, int64_t window, const float* sinks) {
  Floats o(size_t(n * nh * dv));  // every (query, head) row written below
  const int64_t group = nh / nkv, quads = (group + 3) / 4, quad_heads = std::min<int64_t>(4, group);
  const int64_t qb = Isa::kQueryBlocks && window <= 0 ? std::max<int64_t>(1, kRowsMax / quad_heads) : 1;  // queries per block
  const int64_t blocks = (n + qb - 1) / qb;
  // chunks of 4 items where there are many (prefill), else of 1: a decode step has only nkv · quads
  // items (chunks of 4 gave all of a 4-kv-head model's to one thread)
  const int chunk = nkv * blocks * quads >= 64 ? 4 : 1;
  const int64_t row = (Tk + kKeyTile - 1) / kKeyTile * kKeyTile;  // a row's scores / weights, padded to whole tiles
  const float scale = float(scaling);
  const Ints16 iota = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  const KeyLanes minus_inf = KeyLanes{} - std::numeric_limits<float>::infinity(), zero = {};
#pragma omp parallel if (n * nh * Tk * (dq + dv) > (1 << 16))
  {
    std::vector<float> w(size_t(kRowsMax * row));  // [R, row]: the rows' scores, then their exponentials
#pragma omp for schedule(dynamic, chunk) collapse(3)
    for (int64_t kh = 0; kh < nkv; ++kh) {
      for (int64_t b = 0; b < blocks; ++b) {
        for (int64_t quad = 0; quad < quads; ++quad) {
          const int64_t h0 = kh * group + 4 * quad;
          const int64_t G = std::min<int64_t>(4, kh * group + group - h0);  // the quad's heads
          const int64_t i0 = b * qb, nq = std::min(qb, n - i0);
          const int R = int(nq * G);
          // row r = (query i0 + r / G, head h0 + r % G): its query, output, keys [j0[r], j1[r]]
          const float* qr[kRowsMax];
          float* orow[kRowsMax];
          int64_t j0[kRowsMax] = {}, j1[kRowsMax] = {};
          for (int r = 0; r < R; ++r) {
            const int64_t i = i0 + r / G, h = h0 + r % G, p = pos0 + i;
            qr[r] = q + (i * nh + h) * dq;
            orow[r] = o.data() + (i * nh + h) * dv;
            j0[r] = window > 0 ? std::max<int64_t>(0, p - window + 1) : 0;
            j1[r] = std::min(p, Tk - 1);
          }
          // every row's keys are inside [j0[0], j1[R - 1]] (queries in position order); keys j0 .. jc are
          // every row's (rows of one query: all theirs; no window when a block has several queries)
          const int64_t jlo = j0[0], jhi = j1[R - 1], jc = j1[0];
          const int64_t t0 = jlo / kKeyTile, t1 = jhi / kKeyTile;
          // the scores, and per row the maximum of its keys' (NaN never taken, as std::max(mx, NaN): the
          // same in any order); a row's first and last tiles may hold keys outside its range
          const auto inside = [&](int r, int64_t jt) {  // the lanes of tile jt in row r's keys: all ones, else zero
            const Ints16 j = int32_t(jt * kKeyTile) + iota;
            return (j >= int32_t(j0[r])) & (j <= int32_t(j1[r]));
          };
          const auto whole = [&](int r, int64_t jt) { return jt * kKeyTile >= j0[r] && (jt + 1) * kKeyTile - 1 <= j1[r]; };
          KeyLanes mxv[kRowsMax];
          for (int r = 0; r < R; ++r) mxv[r] = minus_inf;
          for (int64_t jt = t0; jt <= t1; ++jt) {
            const float* t = kt + (jt * nkv + kh) * dq * kKeyTile;
            KeyLanes sc[kRowsMax];
            with_rows(R, [&](auto rows) { tile_scores<Isa, decltype(rows)::value>(qr, t, dq, sc); });
            for (int r = 0; r < R; ++r) {
              const KeyLanes x = sc[r] * scale;
              store16(w.data() + r * row + jt * kKeyTile, x);
              if (jt * kKeyTile > j1[r] || (jt + 1) * kKeyTile - 1 < j0[r]) continue;
              const KeyLanes m = whole(r, jt) ? x : select(inside(r, jt), x, minus_inf);
              mxv[r] = mxv[r] < m ? m : mxv[r];
            }
          }
          float inv_den[kRowsMax];  // the value sums are divided by each row's denominator at the end
          for (int r = 0; r < R; ++r) {
            float* wr = w.data() + r * row;
            const int64_t h = h0 + r % G, r0 = j0[r] / kKeyTile, r1 = j1[r] / kKeyTile;
            float mx = -std::numeric_limits<float>::infinity();
            for (int c = 0; c < kKeyTile; ++c) mx = mx < mxv[r][c] ? mxv[r][c] : mx;
            if (sinks) mx = std::max(mx, sinks[h]);
            // the exponentials (zero outside the row's keys) and their sum in 16 lanes, added as a fixed tree
            KeyLanes acc = {};
            for (int64_t jt = r0; jt <= r1; ++jt) {
              KeyLanes e = exp16<Isa>(load16(wr + jt * kKeyTile) - mx);
              if (!whole(r, jt)) e = select(inside(r, jt), e, zero);
              store16(wr + jt * kKeyTile, e);
              acc += e;
            }
            float l8[8], l4[4];
            for (int c = 0; c < 8; ++c) l8[c] = acc[c] + acc[c + 8];
            for (int c = 0; c < 4; ++c) l4[c] = l8[c] + l8[c + 4];
            float den = (l4[0] + l4[2]) + (l4[1] + l4[3]);
            if (sinks) den += std::exp(sinks[h] - mx);
            inv_den[r] = 1.0f / den;
          }
          // the value sums: 32 values at a time, then 16, then one at a time
          const float* vh = v + kh * dv;
          int64_t d0 = 0;
          const auto sums = [&](auto vectors) {  // values d0 .. d0 + 16 · vectors
            float* out[kRowsMax];
            for (int r = 0; r < R; ++r) out[r] = orow[r] + d0;
            with_rows(R, [&](auto rows) {
              value_sums<Isa, decltype(rows)::value, decltype(vectors)::value>(w.data(), row, vh + d0, nkv * dv, jlo, jc, j1, inv_den, out);
            });
          };
          for (; d0 + 32 <= dv; d0 += 32) sums(std::integral_constant<int, 2>{});
          for (; d0 + 16 <= dv; d0 += 16) sums(std::integral_constant<int, 1>{});
          for (; d0 < dv; ++d0)
            for (int r = 0; r < R; ++r) {
              float a = 0.0f;
              for (int64_t j = j0[r]; j <= j1[r]; ++j) a += w[size_t(r * row + j)] * vh[j * nkv * dv + d0];
              orow[r][d0] = a * inv_den[r];
            }
        }
      }
    }
  }
  return o;
}

}  // namespace
}  // namespace moex::model::attention_kernels
