// backends/cuda/sm90_tma_grouped_gemm.cu — the grouped GEMM on Hopper with a warp-specialised,
// persistent, mbarrier-pipelined schedule (sm_90a):
//
//   * weights (B, K-major [E, N, K]) arrive by TMA (cp.async.bulk.tensor.3d, tensor map built
//     with cuTensorMapEncodeTiled through cudaGetDriverEntryPointByVersion, 128B swizzle, passed
//     as a __grid_constant__ parameter); out-of-range rows / k are zero-filled by the TMA unit;
//   * A: the down projection's contiguous h rows by TMA (2-D map over [S, I], boxes of 32 rows,
//     only the boxes that hold the tile's rows; rows past the expert's block are computed and
//     discarded); the up projection's gathered token rows by
//     cp.async from the producer warpgroup (16-byte chunks written into the same 128B-swizzled
//     layout), which signal the stage's full barrier with cp.async.mbarrier.arrive.noinc;
//   * STAGES-deep ring (4 stages at BN = 256, 6 at BN = 128) with full/empty mbarriers: no
//     block-wide barrier in the main loop;
//   * 3 warpgroups: WG0 producer (setmaxnreg 56), WG1/WG2 consumers (setmaxnreg 224), each
//     consumer owns 64 rows × BN columns of the 128 × BN tile (wgmma m64nBNk16, one group kept in
//     flight, the stage released to the producer as soon as its MMAs retired);
//   * persistent grid (one block per SM) walking (m tile, n tile) work items of the device tile
//     table in groups of 8 m tiles (n-major inside a group) so that concurrently running blocks
//     share weight tiles in L2; the number of valid m tiles is found on the device (the table
//     holds valid tiles first, then expert -1), so the host knows nothing of the routing;
//   * epilogues from registers: f32 rows for the down projection (bias added), the gated
//     activation for the up projection writing h in the activation dtype; an optional output
//     row map (TmaFp8Extra::out_rows) for the deepgemm layouts.
//
// FP8 variant (deepgemm.cu; e4m3 codes in A and B, 128 bytes = 128 elements of K per stage, the
// same 128B-swizzled smem layout): QGMMA m64n128k32 (a 256-wide tile as two 128-column parts), and the
// two-level accumulation of SPEC §6 —
// each 128-K block's partial sums (a second register set, wgmma scale-d = 0 on its first step)
// are multiplied by the rows' activation scales (loaded with the stage: a 512-byte TMA box of the
// MN-major scale array, or 4-byte cp.async in the gather variant) and the block's weight scale,
// and added to the f32 accumulators. The consumer waits for each block's MMAs before promoting
// them (no overlap). Measured alternatives (H200, 2026-11-29), both reverted: two partial sets in
// ping-pong (commit 6c584a9; producer 40 / consumers 232 registers, the gather producer spilled)
// ran deepseek_v3 T=4096 in 7.87 ms instead of 5.92; promoting after every 32-K step (commit
// 34f13a7) ran at 140..210 TFLOP/s instead of ~570 and faulted in the masked layout.
//
// Accuracy (same day): Hopper's FP8 MMA adds into its accumulator with reduced precision, so this
// path measures 3.9e-3..8.7e-3 relative L2 against the f64 reference with the same quantization
// (bf16-MMA-on-codes paths: ~2e-4); SPEC §8 asks 2e-3. It serves `deepgemm` (DeepGEMM's own choice
// of a 128-K interval), whose tests state the wider bar they hold it to, and grouped_mm's down GEMM
// (its error reaches y directly: 1.9e-4 / 2.8e-4 / 1.7e-3 on f32 / f16 / bf16 activations with the
// exact up GEMM, H200, 2026-12-01); both of grouped_mm's GEMMs only with MOEX_CUDA_FP8_TMA=qgmma.
//
// Exact FP8 variant (X; TmaFp8Extra::exact; grouped_mm's FP8 up GEMM on Hopper above the decode
// path's T, and its down GEMM with MOEX_CUDA_FP8_TMA=exact): the same producer, ring and schedule, the product computed transposed, D[weight row][A row]:
//   * the weights stay e4m3 (TMA, 128 rows x 128 k per stage); each consumer thread loads its two
//     weight rows' 16-byte chunks from the stage and converts them in registers (F2FP e4m3x2 ->
//     f16x2, exact) into the A fragments of wgmma m64nNk16 with A from registers; gated layouts
//     pair each channel's gate and up rows in one thread (x_weight_rows);
//   * the A rows (tokens / h) are f16 values of the e4m3 codes (exact), written by deepgemm.cu's
//     quantizer with the k order inside every 64 permuted (x_code_col) so that those register
//     fragments are contiguous bytes; a stage holds them as two 128B-swizzled [128][64] sub-tiles,
//     the wgmma B operand; N = the tile's rows rounded up to 16 / 32 / 64 / 128;
//   * per 128-k block: fresh partial sums (HGMMA, f32), then acc += part x activation scale (per A
//     row) x weight block scale (per weight row): the CPU's sums up to f32 rounding (measured 1.2e-5
//     on f32 activations, the portable mma.sync path's figure).
// Wide exact variants (X = 4 / 5; TmaFp8Extra::exact_wide; opt-in MOEX_CUDA_FP8_X_WIDE=1 / 2): the
// transposed kernel with 256 weight rows per tile (two m64 blocks per consumer warpgroup, 128
// accumulators; a stage brings 64 KB per 4.2 M MACs instead of 48 KB per 2.1 M), and instead of
// per-block partial sums one accumulator set kept as R = acc / s(kb), rescaled by s(kb) / s(kb + 1)
// between blocks (see the kernel); X = 5 pipelines the two blocks. Down / plain GEMMs and the
// concatenated gated layout with I % 128 == 0. Measured (H100, 2026-12-05, docs/PERF.md, forty-third
// session): correct on every dtype, but slower than X = 1 (FP8 forward at T = 4096 0.78-0.98x the
// default's speed, X = 5 0.80-0.84x); ncu on qwen3_30b_a3b T = 4096: the up GEMM 884 us against 654
// with 21 % fewer L2 bytes, so X = 1 is not bound by its operand feed.
// Converting exact variant (X = 6; TmaFp8Extra::exact_conv; the default from 256 pairs per expert, deepgemm.cu's
// kConvMinRowsPerExpert; MOEX_CUDA_FP8_X_CONV=1 / 0 forces it on / off): the gated up
// GEMM (concatenated, I % 128 == 0) untransposed as the bf16 kernel computes it: 256 weight rows per
// tile, stages of 64 k; TMA brings the A rows' f16 codes (pre-gathered, natural k order) and the
// weights' e4m3 bytes, the producer warpgroup's warps 1-3 convert the weights into the 128B-swizzled
// f16 tile that the consumers' SS HGMMA m64n256k16 reads (a conv barrier per stage), and the
// consumers keep one accumulator set rescaled per 128-k block as X = 4 (no partial sums, nothing
// but MMAs in their chain between blocks). h is quantized in its epilogue for the QGMMA down GEMM
// (store_tile_hq). Why: each of X = 1's consumer warpgroups converts its weight fragments and
// promotes partial sums between its MMAs (35 % tensor pipe on qwen3 T = 4096), and its 128-wide
// tiles re-read the A codes twice as often as a 256-wide tile. Measured (H100, 2026-12-06, docs/PERF.md,
// forty-sixth session): the up GEMM 572-579 us against X = 1's 644-649 on qwen3_30b_a3b T = 4096 (tensor
// pipe 48 %), the FP8 forward 0.76-1.10x bf16 at T = 4096 against the default's 0.64-1.15x (slower at
// T = 512 and on deepseek_v3: the pre-gathered codes), so it is the default only from 256 rows per expert. Tried and removed in that
// session: the weights loaded by the converting warps into registers instead of a TMA staging buffer
// (four 48.5 KB stages; bit-identical output): 1085 us, twice the L2 bytes (the 64-byte row pieces of a
// stage read as 128-byte L1 lines, evicted before the next stage used their other half) and the
// converter's addresses spilled to local memory.
// Untransposed exact variant (X = 2; TmaFp8Extra::exact_nt; opt-in MOEX_CUDA_FP8_X_NT=1; on the
// H200 it passes the tests and is not faster than the transposed kernel, docs/PERF.md): the same
// ring, the product D[A row][weight row] as the QGMMA kernel computes it; the consumers convert
// each stage's e4m3 weight tile into one of two f16 copies in shared memory (the next stage's while
// this stage's HGMMAs run, named barrier 1 between the two warpgroups), HGMMA reads both operands
// by descriptor, and the promotion needs two scale products per row. The A
// codes are in natural k order (the quantizer's `natural`). Why: ncu on the transposed kernel (qwen3
// T = 4096, 2026-12-02) measured 634 us for the up GEMM against bf16's 396, tensor pipe 35 %.
// Measured (H200, 2026-12-01, docs/PERF.md, fourteenth session): 0.52-1.39x the bf16 grouped_mm
// speed at T = 512 / 4096 (QGMMA 0.92-1.68x), 5-10x the portable path. With the QGMMA down GEMM
// (grouped_mm's default since the fifteenth session) and, up to 8192 pairs, the token codes
// pre-gathered by the quantizer (TMA A instead of the cp.async gather): 1.07-1.69x at T = 512,
// 0.61-0.87x at 4096.
// Without its MMAs (a timing-only build, commit 7d9079a) the up GEMM left the FP8 forward at 77 %
// (mixtral_8x7b) / 91 % (qwen3_30b_a3b) of its time at T = 4096, without the e4m3 conversion at
// 98-100 %: what bounds the up GEMM is not the tensor cores or the conversion but the rest, most
// likely its operand feed (an f16 A tile of 128 rows per 128 weight rows: 3 bytes per 128 MACs
// through L2 into shared memory, where the bf16 kernel's 256-wide clustered tiles take 2; the
// epilogue was not ablated separately). ncu on qwen3_30b_a3b
// T = 4096: tensor pipe active 20-38 %, issue slots 34-43 %, no pipe saturated, 0.5-0.7 eligible
// warps per scheduler: latency-bound, each warpgroup waits for a stage's MMAs before promoting them.
// A 64-row double-buffered variant (next stage's MMAs in flight during a promotion; both warpgroups
// converting the same weights) measured 1.3-1.8x slower and was reverted (commit c1ac57b, PERF.md).
//
// Gated up projection in the concatenated layout: the B tile is loaded as two TMA boxes, gate
// rows [n*BN/2, +BN/2) into tile columns [0, BN/2) and up rows [I + n*BN/2, +BN/2) into
// [BN/2, BN); gate column c and up column c + BN/2 then live in the same thread (accumulator
// fragment nf and nf + NF/2). Interleaved: columns (2i, 2i+1) are adjacent as in the weights.
//
// N tile and clusters per GEMM: choose_tma_tile (grouped_mm and deepgemm's bf16 path), with the
// measurements behind each rule.
//
// 2-CTA clusters (MC kernels; bf16 / f16, and the QGMMA FP8 kernel for up projections, see
// fp8_cluster): the two CTAs of a cluster take m tiles 2p and 2p+1 of one work item
// (pair p, n tile). When both belong to one expert they need the same B tile: each CTA loads one
// half (the gate / up box, or rows [n*BN, +BN/2) / [n*BN + BN/2, +BN/2)) and multicasts it into both
// CTAs' stage, so a CTA pulls 32 KB instead of 48 KB per 256-wide stage from L2. Otherwise each loads
// its whole B tile. The protocol does not depend on that choice: every full barrier expects the
// whole stage, and every empty barrier counts the 8 consumer warps of BOTH CTAs (the peer's
// multicast writes into this CTA's stage, so a stage is refilled only when neither CTA reads it);
// rank 1 of an odd last pair recomputes tile 2p and writes nothing. The remote release is a
// CTA-scoped arrive issued by a second lane: with a cluster-scoped release fence per stage the
// kernel ran 1.3-1.9x slower (H200, 2026-11-30, first run of this design). ncu on mixtral_8x7b
// T = 16384 (same day): the down GEMM 6.52 ms at 77 % SM throughput (128-wide, no cluster) against
// 5.10 ms at 95 % (256-wide, clusters); the up GEMM is the slower one (gathered A rows, K = 4096:
// 64 stages per tile, its epilogue not overlapped with MMAs).
//
// Ping-pong (PP kernels, opt-in: MOEX_CUDA_TMA_PINGPONG=1, 128-wide tiles, clusters or not): each
// consumer warpgroup computes whole 128 × 128 tiles (two m64n128 accumulator sets: the register
// footprint of the cooperative 256-wide kernel) on alternate work items, so that one warpgroup's
// epilogue (the activation and the h / y stores, with the tensor cores idle in the cooperative
// schedule) runs while the other's MMAs go on. Turn barriers order the two (see pingpong_consumer).
//
// Source layout: this file holds the dispatch (which kernel, tile and schedule per GEMM) and the
// host helpers; the kernel and its typed launcher are in sm90_tma_kernel.cuh, compiled by the
// sm90_tma_kernels_*.cu files (a few instantiations each, so that a parallel build compiles them
// side by side).
//
// Measured (H200, 2026-11-29, one run, CUDA-graph replay of the whole grouped_mm forward in
// CudaPerf.Shapes, bf16, median of 10; old = sm90_bf16_grouped_gemm.cu via MOEX_CUDA_NO_TMA=1):
//   shape          T      old ms (TFLOP/s)   TMA ms (TFLOP/s)
//   qwen3_30b_a3b  4096   1.136 (272)        1.073 (288)
//   qwen3_30b_a3b  16384  3.774 (328)        4.030 (307)
//   mixtral_8x7b   4096   6.844 (422)        6.476 (446)
//   mixtral_8x7b   16384  29.64 (390)        25.41 (454)
//   deepseek_v3    4096   10.91 (265)        9.185 (314)
//   deepseek_v3    16384  33.07 (349)        25.80 (448)
// SASS: HGMMA (4 per kernel: the k16 steps of one 64-wide stage), UTMALDG, USETMAXREG, LDGSTS in
// the gather variants; 168 registers at entry, no local memory. The 600 / 450 TFLOP/s targets are
// not met (see choose_tma_tile and docs/PERF.md for the numbers since).
#include <cstdlib>

#include "backends/cuda/sm90_tma_launch.cuh"

namespace moex::cuda {

namespace tma {

EncodeTiledFn encode_fn() {
  static const EncodeTiledFn fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return EncodeTiledFn(nullptr);
    }
    return reinterpret_cast<EncodeTiledFn>(p);
  }();
  return fn;
}

CUresult try_make_map(CUtensorMap& map, CUtensorMapDataType type, const void* base, int rank, const cuuint64_t* dims,
                      const cuuint64_t* strides_bytes, const cuuint32_t* box, CUtensorMapSwizzle swizzle) {
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  // 256-byte L2 promotion (128 B measured no faster on the H200, 2026-11-29)
  return encode_fn()(&map, type, cuuint32_t(rank), const_cast<void*>(base), dims, strides_bytes, box, elem_strides,
                     CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

CUtensorMap make_map(CUtensorMapDataType type, const void* base, int rank, const cuuint64_t* dims,
                     const cuuint64_t* strides_bytes, const cuuint32_t* box, CUtensorMapSwizzle swizzle) {
  CUtensorMap map;
  const CUresult r = try_make_map(map, type, base, rank, dims, strides_bytes, box, swizzle);
  if (r != CUDA_SUCCESS)
    detail::fail(ErrorCode::internal, "cuTensorMapEncodeTiled failed ({}) for the grouped GEMM's TMA descriptor", int(r));
  return map;
}

int sm_count() { return current_device_sms(); }

}  // namespace tma

namespace {

// The bf16 / f16 kernels (T: the activation dtype) with BN-wide tiles, in 2-CTA clusters or not,
// with ping-pong consumers or not.
template <int BN, bool MC, bool PP = false>
void launch_bf16_f16(const GroupedGemmArgs& a, DType dtype, const TmaFp8Extra& x, int64_t a_rows, int64_t E, cudaStream_t stream) {
  if (dtype == DType::bf16) tma::launch_bn<__nv_bfloat16, BN, false, MC, PP>(a, dtype, x, a_rows, E, stream);
  else tma::launch_bn<__half, BN, false, MC, PP>(a, dtype, x, a_rows, E, stream);
}

// The FP8 kernels with 128-wide tiles per activation dtype: exact (X, no clusters) or QGMMA, in 2-CTA
// clusters (MC) or not (the 256-wide QGMMA kernels: fp8_wide_tiles below).
// BN = 256: the wide (X = 4 / 5) and converting (X = 6) exact kernels.
template <int X, bool MC = false, int BN = 128>
void launch_fp8(const GroupedGemmArgs& a, DType dtype, const TmaFp8Extra& x, int64_t a_rows, int64_t E, cudaStream_t stream) {
  static_assert(!(X && MC), "the exact FP8 kernel runs without clusters");
  if (dtype == DType::bf16) tma::launch_bn<__nv_bfloat16, BN, true, MC, false, X>(a, dtype, x, a_rows, E, stream);
  else if (dtype == DType::f16) tma::launch_bn<__half, BN, true, MC, false, X>(a, dtype, x, a_rows, E, stream);
  else tma::launch_bn<float, BN, true, MC, false, X>(a, dtype, x, a_rows, E, stream);
}

// The wide exact FP8 kernels (X = 4 / 5, TmaFp8Extra::exact_wide): 256 weight rows per tile; down /
// plain GEMMs and the concatenated gated layout with I % 128 == 0 (its gate and up halves are whole
// 128-row scale blocks), not the interleaved one.
static bool fp8_exact_wide_fits(const GroupedGemmArgs& a) {
  return a.epi == Epi::down || a.epi == Epi::up_plain || (a.epi == Epi::up_concat && a.I % 128 == 0);
}

// The converting exact FP8 kernel (X = 6, TmaFp8Extra::exact_conv): the gated up GEMM in the
// concatenated layout with I % 128 == 0 (its gate and up halves are whole 128-row scale blocks and a
// tile's 128 h columns one 128-channel block of the down GEMM's activation quantization), A rows by
// TMA (pre-gathered codes in natural k order).
static bool fp8_exact_conv_fits(const GroupedGemmArgs& a) {
  return a.epi == Epi::up_concat && a.I % 128 == 0 && !a.a_gather;
}

// The QGMMA FP8 kernel with 256-wide tiles for bf16 activations (default; MOEX_CUDA_FP8_N=128: the
// 128-wide tiles). Its stage holds 16 KB of A and 32 KB of weights for 8.4 MFLOP (5.7 KB per MFLOP
// against the 128-wide tile's 7.6; with the cluster multicast 3.8 against 5.7); the partial-sum set
// covers one 128-column half at a time, so the consumers fit 224 registers. Measured on the H200
// (2026-12-02, nineteenth session, two interleaved rounds, deepgemm FP8 ms, 128 -> 256 wide):
// deepseek_v3 T = 4096 5.73 -> 4.86, T = 16384 18.71 -> 16.17; mixtral_8x7b 4.24 -> 3.56 /
// 16.39 -> 13.73; qwen3_30b_a3b 0.735 -> 0.674 / 2.43 -> 2.25; grouped_mm's QGMMA down GEMM 1-4 %.
// f16 / f32 activations keep the 128-wide tiles (no 256-wide instantiation).
static bool fp8_wide_tiles(const GroupedGemmArgs& a, DType dtype) {
  static const bool wide = [] {
    const char* s = std::getenv("MOEX_CUDA_FP8_N");
    return !(s && std::atoi(s) == 128);
  }();
  return wide && dtype == DType::bf16 && (a.epi != Epi::up_concat || a.I % 128 == 0);
}

}  // namespace

bool tma_fp8_quantizes_h(const GroupedGemmArgs& a, DType act_dtype, bool exact, bool exact_conv) {
  if (exact) return exact_conv && fp8_exact_conv_fits(a);
  return a.epi == Epi::up_concat && fp8_wide_tiles(a, act_dtype);  // wide: I % 128 == 0 there
}

bool tma_disabled() {
  static const bool disabled = [] {
    const char* s = std::getenv("MOEX_CUDA_NO_TMA");
    return s && *s && *s != '0';
  }();
  return disabled;
}


bool tma_usable(const GroupedGemmArgs& a, bool vec16) {
  if (tma_disabled() || !vec16 || a.w_transposed || a.plan.tile_m != tma::BM || a.plan.max_tiles <= 0) return false;
  if (a.Kdim <= 0 || a.Kdim % 8 != 0 || a.N % 8 != 0 || a.I % 8 != 0 || a.ldo % 8 != 0) return false;
  if (!aligned16(a.A) || !aligned16(a.W) || !aligned16(a.out)) return false;
  if (a.w_expert_stride != int64_t(a.N) * a.Kdim) return false;
  if (current_device_cc() != 90) return false;
  return tma::encode_fn() != nullptr;
}

bool tma_fp8_usable(const GroupedGemmArgs& a) {
  if (a.w_transposed || a.plan.tile_m != tma::BM || a.plan.max_tiles <= 0) return false;
  if (a.Kdim <= 0 || a.Kdim % 16 != 0 || a.N % 8 != 0 || a.ldo % 8 != 0) return false;
  if (a.epi == Epi::up_concat && a.I % 64 != 0) return false;
  if (!aligned16(a.A) || !aligned16(a.W) || !aligned16(a.out)) return false;
  if (a.w_expert_stride != int64_t(a.N) * a.Kdim) return false;
  if (current_device_cc() != 90) return false;
  return tma::encode_fn() != nullptr;
}

void choose_tma_tile(const GroupedGemmArgs& a, int64_t pairs, int64_t E, TmaFp8Extra& x) {
  // N tile: 128 columns with 6 stages unless the experts hold >= 128 rows on average and the
  // weights have >= 2e9 elements. Measured on the H200 (2026-11-29, grouped_mm, bf16, the four SPEC
  // shapes at T = 512 / 4096 / 16384, docs/PERF.md): 128 was faster everywhere (up to 1.4x at
  // T = 512: more work items and a deeper ring where experts hold few rows) except on deepseek_v3 at
  // T >= 4096 (8.64 vs 9.40 ms at 4096, 24.9 vs 30.4 ms at 16384), the one shape whose weights are far
  // beyond L2 with >= 128 rows per expert: there the 256-wide tile halves the re-reads of the A rows.
  //
  // 2-CTA clusters (the weight tile loaded once per pair of m tiles and multicast) where the experts
  // hold >= 256 rows on average, so that most pairs of m tiles share their expert, with 256-wide
  // tiles for every GEMM in clusters. Measured on the H200, grouped_mm ms (docs/PERF.md):
  //   - clusters, 256-wide down tiles, against no clusters (2026-11-30, eighth session): mixtral_8x7b
  //     T = 16384 25.0 -> 22.2, T = 4096 5.46 -> 5.13, qwen3_30b_a3b T = 16384 3.25 -> 3.04, qwen15
  //     T = 16384 2.71 -> 2.55; T = 512 unchanged (below the row bar); on deepseek_v3's 256-wide
  //     tiles clusters were slower (25.8 vs 24.8 ms at T = 16384);
  //   - 256-wide up tiles too, once the SiLU epilogue was compiled per tile (ninth session, one call,
  //     policy 3 -> 4): mixtral_8x7b T = 4096 4.81 -> 4.22, T = 16384 20.70 -> 16.49, qwen3_30b_a3b
  //     0.85 -> 0.75 / 2.69 -> 2.37, qwen15 0.75 -> 0.66 / 2.23 -> 1.96 (with the per-element
  //     epilogue 256-wide up tiles had been the slower choice).
  //   - deepseek-like up projections in 256-wide clusters too (2026-12-01, with the paired tile order
  //     and the dynamic schedule of the unclustered kernels; one call, policy 4 -> 6 / 7): deepseek_v3
  //     T = 4096 7.83 -> 7.32 / 7.50 ms, T = 16384 22.1 -> 19.0 / 20.6 (the large-T figures move by
  //     ±10 % between runs with the clock); the other shapes unchanged (their GEMMs are not big).
  //   - 128-wide clusters below 256 rows per expert too, from 1024 pairs and 16 rows per expert on
  //     (2026-12-01, two calls, MOEX_CUDA_TMA_CLUSTER=1 against the unclustered kernels at T = 512):
  //     deepseek_v3 5.84 / 5.88 -> 5.44 / 5.46 ms, mixtral_8x7b 1.11 / 1.13 -> 1.01 / 1.01, qwen3_30b_a3b
  //     0.396 / 0.400 -> 0.371 / 0.373, qwen15_moe_a2_7b 0.340 / 0.350 -> 0.324 / 0.339 (policy 8).
  //     As the default against policy 6 (2026-12-01, twelfth session, two interleaved rounds):
  //     mixtral_8x7b T = 512 1.006 vs 1.118 ms, deepseek_v3 5.46 vs 5.54, the others within 1-3 %.
  //     T <= 64 (fewer pairs) is not measured in clusters and keeps the unclustered kernels.
  // MOEX_CUDA_TMA_POLICY=1: no clusters; 2: clusters, 128-wide tiles; 3: clusters with 256-wide
  // down tiles only; 4: clusters with 256-wide tiles; 5: as 4, and deepseek-like GEMMs' down
  // projection in 256-wide clusters too; 6: as 4, and deepseek-like up projections in 256-wide
  // clusters; 7: as 4, and both deepseek-like GEMMs in 256-wide clusters; 8 (default): as 6, and
  // 128-wide clusters for GEMMs of >= 1024 pairs and >= 16 rows per expert below the other bars.
  static const int policy = [] {
    const char* s = std::getenv("MOEX_CUDA_TMA_POLICY");
    const int v = s ? std::atoi(s) : 0;
    return v >= 1 && v <= 8 ? v : 8;
  }();
  const double weight_elems = double(E) * double(a.N) * double(a.Kdim);
  const bool big_weights = pairs >= 128 * E && weight_elems >= 2e9;
  x.n_tile = big_weights ? 256 : 128;
  x.cluster = false;
  if (policy >= 2 && pairs >= 256 * E) {
    if (!big_weights) {
      x.cluster = true;
      if ((policy == 3 && a.epi == Epi::down) || policy >= 4) x.n_tile = 256;
    } else if (policy == 5 && a.epi == Epi::down) {
      x.cluster = true;
    }
  }
  // policies 6 - 8: deepseek-like GEMMs (big weights, >= 128 rows per expert) in clusters, where the
  // paired tile order shares every two-tile expert's weight tile (T = 4096: ~128 rows, 1-2 tiles)
  if (big_weights && (((policy == 6 || policy == 8) && a.epi != Epi::down) || policy == 7)) x.cluster = true;
  // policy 8: fewer rows per expert (T = 512 on the SPEC shapes) in 128-wide clusters
  if (policy == 8 && !big_weights && !x.cluster && pairs >= 1024 && pairs >= 16 * E) x.cluster = true;
}

// The QGMMA FP8 kernel in 2-CTA clusters: its 128 x 128 tile pulls 32 KB from L2 per 128-deep stage
// for 4.2 MFLOP, twice the bytes per FLOP of the bf16 kernel's 256-wide tiles at twice the MMA rate,
// so it is bound by its operand feed; in clusters, two m tiles of one expert share the 16 KB weight
// tile (each CTA loads and multicasts one half: 24 KB per CTA and stage).
// Measured on the H200 (2026-12-01, eighteenth session, two interleaved rounds, every QGMMA GEMM in
// clusters against none): deepgemm FP8 deepseek_v3 T = 4096 6.55 -> 5.76 ms, T = 16384 20.80 ->
// 19.89, mixtral_8x7b 4.72 -> 4.03 / 18.09 -> 15.94, qwen3_30b_a3b 0.805 -> 0.769 / 2.75 -> 2.60;
// but grouped_mm's FP8 path, whose only QGMMA GEMM is the down projection (its up GEMM is the exact
// kernel), 1-4 % slower. Hence the default: the up (gated) GEMMs in clusters, the down GEMMs not;
// measured next (same day, one round, deepgemm FP8 ms, none / all / up only): deepseek_v3 T = 4096
// 6.35 / 6.05 / 5.60, T = 16384 20.45 / 19.63 / 19.01, qwen3_30b_a3b 0.817 / 0.753 / 0.753 and
// 2.75 / 2.62 / 2.51, mixtral_8x7b 4.27 / 4.31 / 4.38 and 18.10 / 16.22 / 16.29.
// MOEX_CUDA_FP8_CLUSTER=0: none; 1: every QGMMA GEMM; 2 (default): the up GEMMs.
static bool fp8_cluster(const GroupedGemmArgs& a) {
  static const int mode = [] {
    const char* s = std::getenv("MOEX_CUDA_FP8_CLUSTER");
    const int v = s && *s ? std::atoi(s) : 2;
    return v >= 0 && v <= 2 ? v : 2;
  }();
  return mode == 1 || (mode == 2 && a.epi != Epi::down);
}

void launch_grouped_gemm_tma(const GroupedGemmArgs& a, DType dtype, int64_t a_rows, int64_t E, cudaStream_t stream) {
  TmaFp8Extra x{};
  choose_tma_tile(a, a_rows, E, x);
  launch_grouped_gemm_tma_ex(a, dtype, false, x, a_rows, E, stream);
}

void launch_grouped_gemm_tma_ex(const GroupedGemmArgs& a, DType act_dtype, bool fp8, const TmaFp8Extra& x_in, int64_t a_rows,
                                int64_t E, cudaStream_t stream) {
  MOEX_ASSERT(a.plan.tile_m == tma::BM);
  // The SiLU epilogue dispatched once per tile (MOEX_CUDA_COMPACT_EPILOGUE=0: per element, for
  // A/B runs). ncu on the H200 (2026-11-30, mixtral_8x7b T = 16384, up GEMM) put "no instruction"
  // (warps waiting for instruction fetch) first among the per-element form's stalls, 30.6 % of the
  // cycles between issues: its switch inlines every formula at every accumulator (19 k / 38 k SASS
  // instructions per 128- / 256-wide kernel). The compact form measured mixtral_8x7b T = 16384
  // 22.92 -> 18.81 ms, T = 4096 5.25 -> 4.95, qwen3_30b_a3b T = 16384 3.06 -> 2.77 (same call);
  // its fast SiLU 0-4 % faster again (next call, within that call's ±4 % spread; it was
  // measured there as MOEX_CUDA_FAST_SILU=1, a switch since removed).
  static const bool compact = [] {
    const char* e = std::getenv("MOEX_CUDA_COMPACT_EPILOGUE");
    return !(e && *e == '0');
  }();
  // The dynamic schedule (work items claimed in order from the plan's counter; see the kernel) for
  // the cooperative kernels outside clusters; MOEX_CUDA_TMA_DYNAMIC=0: the static stride.
  static const bool dynamic = [] {
    const char* e = std::getenv("MOEX_CUDA_TMA_DYNAMIC");
    return !(e && *e == '0');
  }();
  // Idle consumer warpgroups skip their MMAs (see the kernel); MOEX_CUDA_TMA_IDLE_SKIP=0 turns it off
  static const bool idle_skip = [] {
    const char* e = std::getenv("MOEX_CUDA_TMA_IDLE_SKIP");
    return !(e && *e == '0');
  }();
  // Work-order groups (see decode_work): 8 m tiles (pairs in clusters) unless MOEX_CUDA_TMA_GROUP_M
  // (1 - 64) says otherwise, for A/B runs
  static const int group_m = [] {
    const char* e = std::getenv("MOEX_CUDA_TMA_GROUP_M");
    const int v = e ? std::atoi(e) : 0;
    return v >= 1 && v <= 64 ? v : 8;
  }();
  TmaFp8Extra x = x_in;
  x.group_m = group_m;
  x.compact_epilogue = compact;
  x.skip_idle_rows = idle_skip;
  x.work_counter = dynamic ? a.plan.sched : nullptr;  // the kernels in clusters / ping-pong ignore it
  if (fp8) {
    MOEX_ASSERT(x.a_scales && x.w_scales && x.a_scales_ld % 4 == 0);
    MOEX_ASSERT(!x.exact || (x.a_ld % 128 == 0 && x.a_ld >= a.Kdim));
    MOEX_ASSERT(!x.h_codes || (x.h_scales && tma_fp8_quantizes_h(a, act_dtype, x.exact, x.exact_conv)));
    const bool cluster = !x.exact && fp8_cluster(a), wide = !x.exact && fp8_wide_tiles(a, act_dtype);
    if (x.exact && x.exact_conv && fp8_exact_conv_fits(a)) launch_fp8<6, false, 256>(a, act_dtype, x, a_rows, E, stream);
    else if (x.exact && x.exact_nt) launch_fp8<2>(a, act_dtype, x, a_rows, E, stream);
    else if (x.exact && x.exact_few_rows && !a.a_gather) launch_fp8<3>(a, act_dtype, x, a_rows, E, stream);
    else if (x.exact && x.exact_wide == 1 && fp8_exact_wide_fits(a)) launch_fp8<4, false, 256>(a, act_dtype, x, a_rows, E, stream);
    else if (x.exact && x.exact_wide == 2 && fp8_exact_wide_fits(a)) launch_fp8<5, false, 256>(a, act_dtype, x, a_rows, E, stream);
    else if (x.exact) launch_fp8<1>(a, act_dtype, x, a_rows, E, stream);
    else if (wide && cluster) tma::launch_bn<__nv_bfloat16, 256, true, true, false>(a, act_dtype, x, a_rows, E, stream);
    else if (wide) tma::launch_bn<__nv_bfloat16, 256, true, false, false>(a, act_dtype, x, a_rows, E, stream);
    else if (cluster) launch_fp8<0, true>(a, act_dtype, x, a_rows, E, stream);
    else launch_fp8<0>(a, act_dtype, x, a_rows, E, stream);
    return;
  }
  // N tile: x.n_tile (grouped_mm sets it from the GEMM's size, see launch_grouped_gemm_tma), 256
  // where unset (deepgemm's bf16 path, measured with it); MOEX_CUDA_TMA_N=128 / 256 forces either.
  static const int forced = [] {
    const char* s = std::getenv("MOEX_CUDA_TMA_N");
    const int v = s ? std::atoi(s) : 0;
    return v == 128 || v == 256 ? v : 0;
  }();
  const int bn = forced ? forced : x.n_tile == 128 ? 128 : 256;
  // 2-CTA clusters multicasting the weight tile: MOEX_CUDA_TMA_CLUSTER=1 / 0 forces on / off
  static const int cluster_env = [] {
    const char* s = std::getenv("MOEX_CUDA_TMA_CLUSTER");
    return s && *s ? (*s == '0' ? 0 : 1) : -1;
  }();
  const bool cluster = cluster_env == 1 || (cluster_env < 0 && x.cluster);
  // MOEX_CUDA_TMA_PINGPONG=1: the 128-wide GEMMs with ping-pong consumers (each consumer warpgroup
  // a whole tile, one's epilogue under the other's MMAs), in clusters or not. Opt-in until measured
  // (MOEX_CUDA_TMA_POLICY=2 runs clustered GEMMs 128-wide).
  static const bool pingpong = [] {
    const char* s = std::getenv("MOEX_CUDA_TMA_PINGPONG");
    return s && *s == '1';
  }();
  if (bn == 128) {
    if (cluster && pingpong) launch_bf16_f16<128, true, true>(a, act_dtype, x, a_rows, E, stream);
    else if (cluster) launch_bf16_f16<128, true>(a, act_dtype, x, a_rows, E, stream);
    else if (pingpong) launch_bf16_f16<128, false, true>(a, act_dtype, x, a_rows, E, stream);
    else launch_bf16_f16<128, false>(a, act_dtype, x, a_rows, E, stream);
  } else {
    if (cluster) launch_bf16_f16<256, true>(a, act_dtype, x, a_rows, E, stream);
    else launch_bf16_f16<256, false>(a, act_dtype, x, a_rows, E, stream);
  }
}

}  // namespace moex::cuda