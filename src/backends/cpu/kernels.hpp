// backends/cpu/kernels.hpp — the vectorised CPU micro-kernels the CPU backends share.
// One implementation (kernels_impl.hpp) is compiled per instruction set (AVX-512, AVX2,
// portable) and the best one the CPU supports is chosen once at run time.
#pragma once
#include <cstdint>

#include "moex/dtype.hpp"

namespace moex::cpu {

// How a weight matrix of an expert is stored relative to y = x · op(W):
//   nt: W is [N, K] row-major (out × in, the default layout):  y[i, n] = Σ_k x[i, k] · W[n, k]
//   nn: W is [K, N] row-major (in × out, "transposed" experts): y[i, n] = Σ_k x[i, k] · W[k, n]
enum class WeightLayout { nt, nn };

// Y[0:m, n0:n1] = X[0:m, 0:k] · op(W)[:, n0:n1]; Y is f32, W is f32/f16/bf16, X is f32 — or bf16
// when W is bf16, the layout nt and the table has `bf16_dot` (vdpbf16ps: bf16 products, f32 sums).
// Columns outside [n0, n1) of Y are not touched, so threads can split the n range.
struct KernelTable;

struct MatmulArgs {
  const void* x = nullptr;  // [m, k], row stride ldx
  DType xdtype = DType::f32;
  int64_t ldx = 0;
  int64_t m = 0, k = 0;
  const void* w = nullptr;  // see WeightLayout; row stride ldw (elements)
  DType wdtype = DType::f32;
  WeightLayout layout = WeightLayout::nt;
  int64_t ldw = 0;
  float* y = nullptr;  // [m, N], row stride ldy
  int64_t ldy = 0;
  int64_t n0 = 0, n1 = 0;
  // Optional: the bf16 rows of x already in the AMX kernel's layout (pack_x_vnni over the same m rows
  // and k). Only the AMX path reads it (every other path reads x): a caller running several matmuls
  // over the same rows packs them once instead of once per call.
  const uint16_t* x_vnni = nullptr;
};

// The AMX kernel's activation layout: bf16 rows x [m, k] (row stride ldx) as (k, k+1) pairs in
// [ceil(m/16)][ceil(k/32)][16 pairs][16 rows][2], zero-padded past m and k; vnni_elems(m, k) uint16
// elements. Rows r0 = 16·j.. of a packed block start vnni_elems(16·j, k) elements in.
int64_t vnni_elems(int64_t m, int64_t k);
void pack_x_vnni(const uint16_t* x, int64_t ldx, int64_t m, int64_t k, uint16_t* out);
// Whether `kt` runs bf16 matmuls of at least kAmxMinRows rows on AMX, or its model (and so reads x_vnni).
constexpr int64_t kAmxMinRows = 8;  // fewer rows: the vdpbf16ps kernel (AMX would idle 15/16 of its tile)
bool uses_amx(const KernelTable& kt);

// FP8 block-scaled nt matmul (SPEC §6): W is e4m3 [N, K] (row stride ldw bytes) with one scale per
// block_n × 128 block; X holds the e4m3 codes of the activations as f32 with one scale per row and
// 128 columns. For each 128-wide k block the code products are summed in f32, scaled by
// x scale × weight block scale and added:
//   y[i, n] = Σ_kb xs[i, kb] · ws[n / block_n, kb] · Σ_{k in kb} x[i, k] · e4m3(w[n, k])
struct Fp8MatmulArgs {
  const float* x = nullptr;  // [m, K] codes, row stride ldx
  int64_t ldx = 0;
  const float* xs = nullptr;  // [m, ceil(K / 128)]
  int64_t m = 0, k = 0;
  const uint8_t* w = nullptr;  // [N, K] e4m3
  int64_t ldw = 0;
  const void* ws = nullptr;  // [ceil(N / block_n), ceil(K / 128)] f32 or UE8M0 bytes
  bool ws_ue8m0 = false;
  int64_t block_n = 128;
  float* y = nullptr;  // [m, N], row stride ldy; columns [n0, n1) written
  int64_t ldy = 0;
  int64_t n0 = 0, n1 = 0;
};

// Output columns per panel of a packed f32 weight matrix (see PackedMatmulArgs).
constexpr int64_t kPanelCols = 32;

// Y[0:m, 0:n1−n0] = X[0:m, 0:k] · P[:, n0:n1] for f32 X and a packed f32 weight matrix P of logical
// shape [k, N] (the transposed [N, k] out × in weights): panel p holds output columns
// [32p, 32p + 32) as a row-major [k, 32] block, so one k step reads 128 contiguous bytes; panels are
// stored one after the other, the last one zero-padded. n0 must be a multiple of kPanelCols.
// Each output is one f32 sum in k order 0, 1, …, k−1, whatever m, the column range or the ISA
// (so results do not depend on how callers split the work).
struct PackedMatmulArgs {
  const float* x = nullptr;  // [m, k], row stride ldx
  int64_t ldx = 0;
  int64_t m = 0, k = 0;
  const float* panels = nullptr;  // [ceil(N / 32), k, 32]
  float* y = nullptr;             // [m, n1 − n0], row stride ldy: column 0 is output column n0
  int64_t ldy = 0;
  int64_t n0 = 0, n1 = 0;
  // Where all of m fits one row block (decode), how far ahead of its reads the kernel prefetches
  // the panels, in bytes; 0: one k chunk ahead (the form used wherever there are several row
  // blocks); negative: no software prefetch (the hardware prefetchers alone). PackedMatrix::
  // prefetch_ahead says why and when each is set.
  int64_t prefetch_ahead = 0;
};

// Y[0:m, 0:n1−n0] = X[0:m, 0:k] · P[:, n0:n1] for bf16 X and a packed bf16 weight matrix P of
// logical shape [k, N] (the transposed [N, k] out × in weights), for vdpbf16ps: panel p holds output
// columns [32p, 32p + 32) as [ceil(k / 2), 32, 2] — for each pair of k, the 32 columns' two weights
// side by side (W[32p + c, 2j], W[32p + c, 2j + 1]) — so one pair step reads 128 contiguous bytes and
// one broadcast 32-bit word of X (its two k) multiplies 16 columns per vector. Panels are stored one
// after the other (packed_bf16_panel_elems each), zero-padded: the last panel's columns, and the
// weight beside the last k when k is odd. n0 must be a multiple of kPanelCols. Each output is one
// f32 chain of vdpbf16ps in k order, whatever m, the column range or the row blocking.
struct PackedBf16MatmulArgs {
  const uint16_t* x = nullptr;       // [m, k] bf16, row stride ldx
  int64_t ldx = 0;
  int64_t m = 0, k = 0;
  const uint16_t* panels = nullptr;  // [ceil(N / 32), ceil(k / 2), 32, 2]
  float* y = nullptr;                // [m, n1 − n0], row stride ldy: column 0 is output column n0
  int64_t ldy = 0;
  int64_t n0 = 0, n1 = 0;
  int64_t prefetch_ahead = 0;        // as PackedMatmulArgs::prefetch_ahead
};
// bf16 elements of one panel of PackedBf16MatmulArgs.
inline int64_t packed_bf16_panel_elems(int64_t k) { return (k + 1) / 2 * 2 * kPanelCols; }

// Y[0:m, 0:n1−n0] = X[0:m, 0:k] · P[:, n0:n1] for f32 X and the packed bf16 panels of
// PackedBf16MatmulArgs, on f32 FMAs: for the tables without vdpbf16ps (AVX2), whose bf16 experts take
// f32 activations. Per pair of k, one vector load of a panel row holds W columns' two weights; a
// shift and a mask make them the f32 vectors of the even and the odd k (bf16 → f32 is exact), each
// multiplied by one broadcast x per row. Each output is one f32 FMA chain in k order 0, 1, …, k−1 —
// the arithmetic of packed_matmul on the weights widened to f32, bit for bit — whatever m or the
// column range. The weights stay bf16 in memory: half the bytes of an f32 panel.
struct PackedBf16WideArgs {
  const float* x = nullptr;          // [m, k] f32, row stride ldx
  int64_t ldx = 0;
  int64_t m = 0, k = 0;
  const uint16_t* panels = nullptr;  // [ceil(N / 32), ceil(k / 2), 32, 2] (PackedBf16MatmulArgs)
  float* y = nullptr;                // [m, n1 − n0], row stride ldy: column 0 is output column n0
  int64_t ldy = 0;
  int64_t n0 = 0, n1 = 0;
  int64_t prefetch_ahead = 0;        // as PackedMatmulArgs::prefetch_ahead
};

// The gated up projection in one pass: H[0:m, 0:n1−n0] = bf16(silu(G) · U) with G = X · Pg[:, n0:n1]
// and U = X · Pu[:, n0:n1] for bf16 X and the gate and up halves of a packed bf16 [2I, k] weight
// (two PackedBf16MatmulArgs panel sets over the same columns). Each G and U value is the f32 chain of
// packed_matmul_bf16, silu(g) · u and the rounding are those of KernelTable::silu_mul and from_f32: H is
// bit for bit what the two projections, silu_mul and from_f32 give, without the f32 G / U rows in
// memory. n0 must be a multiple of kPanelCols.
struct PackedBf16GatedArgs {
  const uint16_t* x = nullptr;  // [m, k] bf16, row stride ldx
  int64_t ldx = 0;
  int64_t m = 0, k = 0;
  const uint16_t* gate_panels = nullptr;  // [ceil(I / 32), ceil(k / 2), 32, 2]
  const uint16_t* up_panels = nullptr;    // the same for the up rows
  uint16_t* h = nullptr;                  // [m, n1 − n0] bf16, row stride ldh: column 0 is h column n0
  int64_t ldh = 0;
  int64_t n0 = 0, n1 = 0;
  // As PackedMatmulArgs::prefetch_ahead where all of m fits one row block: negative, no software
  // prefetch (the hardware prefetchers alone); otherwise the next column's panels are prefetched.
  int64_t prefetch_ahead = 0;
};

// What the codes of one 128-k block of a packed FP8 panel hold, so that the kernels convert them with
// the fewest operations that are exact for them.
enum Fp8BlockKind : uint8_t {
  kFp8BlockAny = 0,     // a NaN code (or anything else)
  kFp8BlockNormal = 1,  // normal numbers only (exponent field 1..15, no NaN)
  kFp8BlockSmall = 2,   // normal numbers and zero / subnormal codes, no NaN
};

// Y[0:m, 0:n1−n0] = Σ_kb xs[:, kb] · ws[·, kb] · Σ_{k in kb} X[:, k] · W[·, k] for FP8 block-scaled
// weights packed into panels of 32 output columns (PackedWeights, FP8 experts): panel p holds the
// e4m3 codes of output columns [32p, 32p + 32) as [k, 32] bytes, or — for the tables whose kernel runs
// on vdpbf16ps (KernelTable::packed_fp8_pairs) — in k pairs as [ceil(k / 2), 32, 2] bytes (an odd k's
// last pair padded with a normal code), beside each 128-k block's 32 weight scales (f32, whatever the
// checkpoint's scale format) and the kind of codes the block holds (Fp8BlockKind: the fewer kinds of
// code, the fewer operations convert them). X: the activations' e4m3 codes as f32 with one scale per row and 128
// channels (quantize_rows). n0 must be a multiple of kPanelCols. Each output is, per 128-k block, one
// f32 chain in k order (pairs of k on vdpbf16ps), so results do not depend on m or the column range.
struct PackedFp8MatmulArgs {
  const float* x = nullptr;  // [m, k] codes, row stride ldx
  int64_t ldx = 0;
  const float* xs = nullptr;  // [m, ceil(k / 128)]
  int64_t m = 0, k = 0;
  const uint8_t* panels = nullptr;        // [ceil(N / 32), k, 32] e4m3, or [ceil(N / 32), ceil(k / 2), 32, 2]
  const float* block_scales = nullptr;    // [ceil(N / 32), ceil(k / 128), 32]
  const uint8_t* block_kind = nullptr;  // [ceil(N / 32), ceil(k / 128)]: Fp8BlockKind
  float* y = nullptr;  // [m, n1 − n0], row stride ldy: column 0 is output column n0
  int64_t ldy = 0;
  int64_t n0 = 0, n1 = 0;
  // as PackedMatmulArgs::prefetch_ahead, where the kernel prefetches (the k-pair kernel); 0 there:
  // the next panel, its lines shared out over the row blocks' passes
  int64_t prefetch_ahead = 0;
};

// Y[0:m, 0:n1−n0] = Σ_kb xs[:, kb] · Σ_{k in kb} X[:, k] · e2m1(W[·, k]) · 2^(s[·, k / group] − 127) for FP4
// experts (e2m1 codes, one UE8M0 scale per row and `group` channels; group even and a divisor of 128)
// packed into panels of 32 output columns (PackedWeights): for the tables whose kernel runs on vdpbf16ps
// (KernelTable::packed_fp4_pairs) panel p holds per k pair j 32 bytes, byte i holding the code of
// column i / 2 at k = 2j + i % 2 in its low nibble and that of column 16 + i / 2 in its high nibble;
// for the f32 kernel (AVX-512) per k 16 bytes, byte i holding column i's code (low nibble) and column
// 16 + i's (high); padding codes 0. One widening and one shift give either kernel its two vectors.
// Beside the codes, the group scales as f32 [ceil(N / 32), ceil(k / group), 32]. X, xs, n0 and
// prefetch_ahead as PackedFp8MatmulArgs. The group sums are scaled per group, the block sums per
// 128-k block, each in a fixed order: results do not depend on m or the column range.
struct PackedFp4MatmulArgs {
  const float* x = nullptr;  // [m, k] e4m3 codes, row stride ldx
  int64_t ldx = 0;
  const float* xs = nullptr;  // [m, ceil(k / 128)]
  int64_t m = 0, k = 0;
  const uint8_t* panels = nullptr;        // [ceil(N / 32), ceil(k / 2), 32] pairs, or [ceil(N / 32), k, 16]
  const float* group_scales = nullptr;    // [ceil(N / 32), ceil(k / group), 32]
  int64_t group = 32;
  float* y = nullptr;  // [m, n1 − n0], row stride ldy: column 0 is output column n0
  int64_t ldy = 0;
  int64_t n0 = 0, n1 = 0;
  int64_t prefetch_ahead = 0;
};
// Bytes of one FP4 panel (PackedFp4MatmulArgs) of k codes per column: in k pairs, or [k, 16].
inline int64_t fp4_panel_bytes(int64_t k, bool pairs) { return pairs ? (k + 1) / 2 * kPanelCols : k * kPanelCols / 2; }

struct KernelTable {
  const char* isa;  // "avx512_amx", "avx512_bf16", "avx512", "avx2", "generic" (and "avx512_amx_model", tests only)
  bool bf16_dot;    // matmul takes bf16 X with bf16 nt weights
  void (*matmul)(const MatmulArgs& a);
  // n elements of dtype dt (f32/f16/bf16) → f32, and back (round to nearest even).
  void (*to_f32)(const void* src, DType dt, float* dst, int64_t n);
  void (*from_f32)(const float* src, DType dt, void* dst, int64_t n);
  // Runs `iters` rounds of independent FMA chains on one thread; returns the flops done
  // (the benchmark's peak-rate probe).
  double (*fma_probe)(int64_t iters);
  // n FP8 e4m3 codes → f32 (exact; NaN codes give NaN).
  void (*e4m3_to_f32)(const uint8_t* src, float* dst, int64_t n);
  void (*fp8_matmul)(const Fp8MatmulArgs& a);
  void (*packed_matmul)(const PackedMatmulArgs& a);
  // out[i] = silu(g[i]) · u[i] = g / (1 + e^−g) · u in f32 (the gated SiLU of the up projection);
  // out may alias g or u. Every element takes the same path whatever n (AVX-512: masked tail), so
  // results do not depend on how callers split the columns.
  void (*silu_mul)(const float* g, const float* u, float* out, int64_t n);
  // Σ src[0:n] with full-width vector loads (the benchmark's streaming-read probe).
  double (*read_probe)(const float* src, int64_t n);
  // Runs `iters` rounds of independent vdpbf16ps chains on one thread; returns the flops done (two
  // per bf16 product and sum). nullptr where the table has no bf16 dot product.
  double (*bf16_dot_probe)(int64_t iters);
  // The packed bf16 micro-kernel (PackedBf16MatmulArgs); nullptr where the table has none (no
  // AVX512_BF16, or AMX, whose tiles read the weights in place).
  void (*packed_matmul_bf16)(const PackedBf16MatmulArgs& a);
  // The packed FP8 kernel (PackedFp8MatmulArgs); nullptr where the table has none (generic), and FP8
  // experts are then read in place (fp8_matmul).
  void (*packed_matmul_fp8)(const PackedFp8MatmulArgs& a);
  // Whether packed_matmul_fp8 reads k-pair panels ([ceil(k / 2), 32, 2]: AVX512_BF16 tables, whose
  // kernel runs on vdpbf16ps) rather than [k, 32] ones (PackedFp8MatmulArgs).
  bool packed_fp8_pairs;
  // quantize_rows (quant_math.hpp: x rows → their e4m3 values in place, scales per 128 channels), in
  // vectors where the table has them; the same results bit for bit.
  void (*quantize_rows)(float* x, int64_t m, int64_t k, float* scales);
  // The packed FP4 kernel (PackedFp4MatmulArgs); nullptr where the table has none (generic), and FP4
  // experts are then read in place.
  void (*packed_matmul_fp4)(const PackedFp4MatmulArgs& a);
  // Whether it reads k-pair panels (AVX512_BF16 tables, vdpbf16ps) rather than [k, 16] ones (f32 FMAs:
  // AVX-512, AVX2).
  bool packed_fp4_pairs;
  // The gated up projection on packed bf16 panels (PackedBf16GatedArgs); nullptr where the table has
  // none (then: two packed_matmul_bf16 calls, silu_mul and from_f32).
  void (*packed_gated_bf16)(const PackedBf16GatedArgs& a) = nullptr;
  // The packed bf16 panels with f32 activations on FMAs (PackedBf16WideArgs); nullptr where the
  // table has none (AVX-512 tables: not measured there; vdpbf16ps tables use packed_matmul_bf16).
  void (*packed_matmul_bf16_wide)(const PackedBf16WideArgs& a) = nullptr;
};

// Whether bf16 weights are worth packing into the bf16 panels for this table: it has a kernel that reads
// them (packed_matmul_bf16 on vdpbf16ps, or packed_matmul_bf16_wide on FMAs).
inline bool packs_bf16(const KernelTable& kt) { return kt.packed_matmul_bf16 || kt.packed_matmul_bf16_wide; }

// The table for this CPU. MOEX_CPU_ISA=avx512|avx2|generic forces a (supported) variant.
const KernelTable& kernels();
const KernelTable& generic_kernels();
#if defined(MOEX_X86)
const KernelTable& avx2_kernels();
const KernelTable& avx512_kernels();
const KernelTable& avx512_bf16_kernels();
const KernelTable& avx512_amx_kernels();
// The same table with every tile operation on a scalar model of the tile unit (any AVX512_BF16 CPU;
// MOEX_CPU_ISA=avx512_amx_model): slow, for testing the AMX paths of the backends without AMX.
const KernelTable& avx512_amx_model_kernels();
// True when the CPU has AMX-BF16 and the OS granted this process the tile state.
bool amx_available();
// The AMX kernels — the bf16 nt matmul (the avx512_amx table's for >= kAmxMinRows rows) and the FP8 /
// FP4 ones (k-pair panels; the table's for >= kAmxMinRows rows, amx_quant_rows) — on the tile unit (needs
// amx_available()), or with tile_model on a scalar model of the tile operations that any AVX512_BF16
// CPU runs (the tests check the kernels' logic with it).
void matmul_bf16_amx(const MatmulArgs& a, bool tile_model);
// Whether the avx512_amx tables run FP8 / FP4 experts on the tiles: at all (not MOEX_CPU_AMX_QUANT=0),
// and for a call of m rows (>= kAmxMinRows by default; every call with MOEX_CPU_AMX_QUANT=1).
bool amx_quant_enabled();
bool amx_quant_rows(int64_t m);
void packed_matmul_fp8_amx(const PackedFp8MatmulArgs& a, bool tile_model);
void packed_matmul_fp4_amx(const PackedFp4MatmulArgs& a, bool tile_model);
#endif

}  // namespace moex::cpu
