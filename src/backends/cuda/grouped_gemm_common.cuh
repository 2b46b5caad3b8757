// backends/cuda/grouped_gemm_common.cuh — tile-column mapping and epilogues shared by the grouped
// GEMM kernels (tensor-core and f32).
//
// A block computes a tile of BN "tile columns" for up to BM sorted rows of one expert. Tile
// column c maps to a weight output row w (a row of gate_up [R, H] or down [H, I]):
//   down, up_plain, up_interleaved: w = tile_n*BN + c (interleaved: w even = gate, odd = up)
//   up_concat:  columns come in groups of 8; even groups are gate outputs i, odd groups the up
//               outputs I+i of the same i: g = c/8, i = tile_n*BN/2 + (g/2)*8 + c%8,
//               w = g odd ? I+i : i.
// So a gated tile holds BN/2 intermediate columns, and the gate and up values of one i land in
// the same thread: columns (c, c+1) for interleaved, (c, c+8) for concat. The gated activation is
// then computed in the epilogue and h is written once, rounded to the activation dtype.
#pragma once
#include "backends/cuda/cuda_common.cuh"

namespace moex::cuda {

struct ColMap {
  Epi epi;
  int tile_n, bn, N, I;
  // weight output row of tile column c, or -1 when outside the matrix
  __device__ __forceinline__ int w_of(int c) const {
    if (epi == Epi::up_concat) {
      const int g = c >> 3;
      const int i = tile_n * (bn >> 1) + (g >> 1) * 8 + (c & 7);
      if (i >= I) return -1;
      return (g & 1) ? I + i : i;
    }
    const int w = tile_n * bn + c;
    return w < N ? w : -1;
  }
  // intermediate column of the gate tile column c (gated epilogues)
  __device__ __forceinline__ int i_of(int c) const {
    if (epi == Epi::up_concat) return tile_n * (bn >> 1) + ((c >> 3) >> 1) * 8 + (c & 7);
    return (tile_n * bn + c) >> 1;
  }
};

inline int n_tiles_of(Epi epi, int N, int I, int bn) {
  return (epi == Epi::up_concat || epi == Epi::up_interleaved) ? int(ceil_div(I, bn / 2)) : int(ceil_div(N, bn));
}

template <class T>
__device__ __forceinline__ float bias_at(const T* bias, int w) {
  return bias ? to_f32(bias[w]) : 0.0f;
}

// down / up_plain: one value at (row, tile column c)
template <class T>
__device__ __forceinline__ void epi_single(const GroupedGemmArgs& a, const ColMap& m, const T* bias, int row, int c, float v) {
  const int w = m.w_of(c);
  if (w < 0) return;
  v += bias_at(bias, w);
  if (a.epi == Epi::down) {
    static_cast<float*>(a.out)[int64_t(row) * a.ldo + w] = v;
  } else {
    static_cast<T*>(a.out)[int64_t(row) * a.ldo + w] = from_f32<T>(plain_act(a.act, v));
  }
}

// gated: gate value at tile column cg, up value of the same i
template <class T>
__device__ __forceinline__ void epi_pair(const GroupedGemmArgs& a, const ColMap& m, const T* bias, int row, int cg, float g,
                                         float u) {
  const int i = m.i_of(cg);
  if (i >= a.I) return;
  if (bias) {
    if (a.epi == Epi::up_concat) {
      g += to_f32(bias[i]);
      u += to_f32(bias[a.I + i]);
    } else {
      g += to_f32(bias[2 * i]);
      u += to_f32(bias[2 * i + 1]);
    }
  }
  static_cast<T*>(a.out)[int64_t(row) * a.ldo + i] = from_f32<T>(gated_act(a.act, g, u));
}

// One warp's MF × 4 mma.sync m16n8 accumulator fragments through the epilogue: fragment (mf, nf)
// holds rows row0 + mf·16 + lane/4 (+8: elements 2, 3) and tile columns col0 + nf·8 + 2·(lane%4) (+1);
// rows >= row_end are not written. Gated layouts: interleaved (gate, up) are adjacent columns;
// concatenated, fragments nf and nf + 1 hold the gate and up values of the same i.
template <class T, int MF>
__device__ __forceinline__ void store_fragments(const GroupedGemmArgs& a, const ColMap& cm, const T* bias, int row0, int row_end,
                                                int col0, int lane, const float (&acc)[MF][4][4]) {
#pragma unroll
  for (int mf = 0; mf < MF; ++mf) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int row = row0 + mf * 16 + (lane >> 2) + hh * 8;
      if (row >= row_end) continue;
      if (a.epi == Epi::down || a.epi == Epi::up_plain) {
#pragma unroll
        for (int nf = 0; nf < 4; ++nf) {
          const int c = col0 + nf * 8 + 2 * (lane & 3);
          epi_single<T>(a, cm, bias, row, c, acc[mf][nf][2 * hh]);
          epi_single<T>(a, cm, bias, row, c + 1, acc[mf][nf][2 * hh + 1]);
        }
      } else if (a.epi == Epi::up_interleaved) {
#pragma unroll
        for (int nf = 0; nf < 4; ++nf) {
          const int c = col0 + nf * 8 + 2 * (lane & 3);
          epi_pair<T>(a, cm, bias, row, c, acc[mf][nf][2 * hh], acc[mf][nf][2 * hh + 1]);
        }
      } else {  // up_concat
#pragma unroll
        for (int nf = 0; nf < 4; nf += 2) {
          const int c = col0 + nf * 8 + 2 * (lane & 3);
          epi_pair<T>(a, cm, bias, row, c, acc[mf][nf][2 * hh], acc[mf][nf + 1][2 * hh]);
          epi_pair<T>(a, cm, bias, row, c + 1, acc[mf][nf][2 * hh + 1], acc[mf][nf + 1][2 * hh + 1]);
        }
      }
    }
  }
}

}  // namespace moex::cuda
