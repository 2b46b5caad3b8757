// bench/amx_layout_probe.cpp — does packing bf16 expert weights into contiguous AMX tiles beat reading
// them in place? A standalone probe (not part of the build), run on the 2-core development machine
// (2026-11-30, docs/PERF.md): the AMX nt matmul of moex (kernels_avx512bf16.cpp: 16-row weight tiles
// loaded from the [out, in] rows, 512 bytes of prefetch ahead along k) over 128 experts of
// qwen3_30b_a3b's shape (gate_up [1536, 2048], down [2048, 768], bf16, 805 MB), 32 activation rows,
// the two threads splitting each expert's output rows, against the same loop over weights packed as
// [n/32][k/32][32 rows][32 k] (2 KB contiguous per step) with no prefetch / 4 / 8 steps ahead.
//   g++ -O2 -march=sapphirerapids -fopenmp bench/amx_layout_probe.cpp -o /tmp/amx_layout_probe
//   /tmp/amx_layout_probe 2      # threads; prints ms and GB/s per mode, best of 3, four rounds
// mode 0 = in place (moex), 1 = packed, 2 = packed + prefetch 4 steps ahead, 3 = 8 steps ahead.
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <omp.h>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <vector>
#include <chrono>
#include <algorithm>
struct alignas(64) TileConfig { uint8_t palette_id = 1, start_row = 0; uint8_t reserved[14] = {}; uint16_t colsb[16] = {}; uint8_t rows[16] = {}; };
static void cfg() { thread_local bool c = false; if (c) return; TileConfig t; for (int i = 0; i < 8; ++i) { t.colsb[i] = 64; t.rows[i] = 16; } _tile_loadconfig(&t); c = true; }
static inline void pf(const void* p) { asm volatile("prefetcht0 (%0)" : : "r"(p)); }
// y[m, n] for rows n in [n0,n1), x vnni [2 mblocks][chunks][512]
static float sink;
void inplace(const uint16_t* w, int64_t ldw, int64_t k, int64_t n0, int64_t n1, const uint16_t* xv, float* y) {
  const int64_t chunks = k / 32; alignas(64) float ct[4][256];
  for (int64_t n = n0; n < n1; n += 32) {
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t k0 = c * 32, ahead = k0 + 256;
      if (ahead < k) for (int rr = 0; rr < 32; ++rr) pf(w + (n + rr) * ldw + ahead);
      else if (n + 32 < n1) for (int rr = 0; rr < 32; ++rr) pf(w + (n + 32 + rr) * ldw + ahead - k);
      _tile_loadd(4, w + n * ldw + k0, ldw * 2); _tile_loadd(5, w + (n + 16) * ldw + k0, ldw * 2);
      _tile_loadd(6, xv + c * 512, 64); _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 5, 6);
      _tile_loadd(7, xv + (chunks + c) * 512, 64); _tile_dpbf16ps(2, 4, 7); _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, ct[0], 64); _tile_stored(1, ct[1], 64); _tile_stored(2, ct[2], 64); _tile_stored(3, ct[3], 64);
    y[n] += ct[0][0] + ct[3][5];
  }
}
// packed: [n/32][chunks][2][16][32] (32 rows x 32 k per chunk = 2 KB contiguous)
template <int PFD>
void packed(const uint16_t* wp, int64_t k, int64_t n0, int64_t n1, const uint16_t* xv, float* y) {
  const int64_t chunks = k / 32; alignas(64) float ct[4][256];
  for (int64_t n = n0; n < n1; n += 32) {
    const uint16_t* blk = wp + (n / 32) * chunks * 1024;
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    for (int64_t c = 0; c < chunks; ++c) {
      const uint16_t* t = blk + c * 1024;
      if (PFD) { const char* p = (const char*)(t + PFD * 1024); for (int l = 0; l < 32; ++l) pf(p + 64 * l); }
      _tile_loadd(4, t, 64); _tile_loadd(5, t + 512, 64);
      _tile_loadd(6, xv + c * 512, 64); _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 5, 6);
      _tile_loadd(7, xv + (chunks + c) * 512, 64); _tile_dpbf16ps(2, 4, 7); _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, ct[0], 64); _tile_stored(1, ct[1], 64); _tile_stored(2, ct[2], 64); _tile_stored(3, ct[3], 64);
    y[n] += ct[0][0] + ct[3][5];
  }
}
int main(int argc, char** argv) {
  syscall(SYS_arch_prctl, 0x1023, 18);
  const int E = 128; const int64_t N = 1536, K = 2048, N2 = 2048, K2 = 768;
  std::vector<uint16_t> up(E * N * K), dn(E * N2 * K2), upp(E * N * K), dnp(E * N2 * K2);
  for (size_t i = 0; i < up.size(); ++i) up[i] = 0x3c00 + (i * 7 % 64);
  for (size_t i = 0; i < dn.size(); ++i) dn[i] = 0x3c00 + (i * 5 % 64);
  auto pack = [](const uint16_t* w, int64_t n, int64_t k, uint16_t* o) {
    const int64_t ch = k / 32;
    for (int64_t nb = 0; nb < n / 32; ++nb) for (int64_t c = 0; c < ch; ++c) for (int r = 0; r < 32; ++r)
      std::memcpy(o + ((nb * ch + c) * 32 + r) * 32, w + (nb * 32 + r) * k + c * 32, 64);
  };
  for (int e = 0; e < E; ++e) { pack(&up[e * N * K], N, K, &upp[e * N * K]); pack(&dn[e * N2 * K2], N2, K2, &dnp[e * N2 * K2]); }
  std::vector<uint16_t> xv(2 * (K / 32) * 512, 0x3c00);
  const int threads = argc > 1 ? atoi(argv[1]) : 2;
  omp_set_num_threads(threads);
  auto run = [&](int mode) {
    auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel
    {
      cfg(); std::vector<float> y(4096);
      const int tid = omp_get_thread_num(), nt = omp_get_num_threads();
      for (int e = 0; e < E; ++e) {
        // split the N range of each expert over threads (like the backend's tiles)
        const int64_t a = N / 32 * tid / nt * 32, b = N / 32 * (tid + 1) / nt * 32;
        const int64_t a2 = N2 / 32 * tid / nt * 32, b2 = N2 / 32 * (tid + 1) / nt * 32;
        if (mode == 0) { inplace(&up[e * N * K], K, K, a, b, xv.data(), y.data()); inplace(&dn[e * N2 * K2], K2, K2, a2, b2, xv.data(), y.data()); }
        else if (mode == 1) { packed<0>(&upp[e * N * K], K, a, b, xv.data(), y.data()); packed<0>(&dnp[e * N2 * K2], K2, a2, b2, xv.data(), y.data()); }
        else if (mode == 2) { packed<4>(&upp[e * N * K], K, a, b, xv.data(), y.data()); packed<4>(&dnp[e * N2 * K2], K2, a2, b2, xv.data(), y.data()); }
        else { packed<8>(&upp[e * N * K], K, a, b, xv.data(), y.data()); packed<8>(&dnp[e * N2 * K2], K2, a2, b2, xv.data(), y.data()); }
      }
      sink += y[0];
    }
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  const double bytes = double(E) * (N * K + N2 * K2) * 2;
  for (int round = 0; round < 4; ++round) {
    for (int mode = 0; mode < 4; ++mode) {
      double best = 1e9; for (int i = 0; i < 3; ++i) best = std::min(best, run(mode));
      printf("mode %d: %.1f ms  %.1f GB/s   ", mode, best, bytes / best / 1e6);
    }
    printf("\n");
  }
}
