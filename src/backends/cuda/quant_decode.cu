// backends/cuda/quant_decode.cu — FP8 block-scaled experts at decode / small batch (SPEC §6):
// each routed expert's weights are read ONCE for all the rows routed to it, at memory speed,
// in four kernels per forward (grouped_mm and batched_mm on FP8 both route here when T is small):
//
//   1. decode_prep    block 0: the routing plan in shared memory (hit experts, per-expert row
//                     ranges, pair list), decode_up's counters zeroed; blocks 1..: the tokens
//                     quantized per 128 channels (xq [T, H] e4m3, xs [T, ceil(H/128)] f32).
//   2. decode_up      grid (column block, hit-expert slot): W_up[e] rows × the expert's token rows,
//                     gated activation in the epilogue, h [S, I] written in the activation dtype.
//                     Above T = 8 the last block of each 128-wide group of h (an integer counter)
//                     quantizes that group of the expert's rows: hq [S, I] e4m3, hs [S, ceil(I/128)].
//   3. decode_down    grid (column block, slot): W_down[e] rows × the quantized h rows → y [S, H]
//                     f32 (+ bias). At T <= 8 it quantizes the h rows itself while staging them.
//   4. combine        (combine.cu's kernel) out[t, n] = Σ_j w[t, j] · y[t·K + j, n] over the
//                     valid slots in slot order, in f32.
//
// Tried on the H200 and removed (2026-12-02, twenty-fourth session, docs/PERF.md): at T <= 8 the
// same work in two kernels — decode_up planning from the routing indices and quantizing its token
// rows itself, decode_down's last block per column block summing the slots — bit-identical but
// slower (qwen3_30b_a3b T = 1 0.0265 ms against 0.0243, T = 8 0.1066 against 0.0839): the last
// blocks' slot sums add a serial tail, and decode_up can no longer request weights before pdl_wait.
//
// Tried on the H200 and removed (2026-12-03, thirty-first session, docs/PERF.md): at T = 1, two
// CUDA-core GEMV kernels in batched_mm's structure (batched_gemv.cu; one warp per output row, the
// weights' e4m3 codes converted to f32 and multiplied by activation code values staged in shared
// memory), each quantizing its own activations in shared memory — correct (the same references,
// 1.5e-6 / 2.1e-4 / 1.7e-3) but slower: qwen3_30b_a3b 0.0391 ms against 0.0237, qwen15_moe_a2_7b
// 0.0334 against 0.0231. ncu: the up kernel 18.8 us for 25 MB executes 9.2 M warp instructions
// (bf16's up GEMV: 4.4 M for 50 MB) with its issue slots 48 % busy — an FP8 byte is twice the
// elements of a bf16 byte, each converted twice on CUDA cores — and the down kernel 25.7 us for
// 12.6 MB, 10.8 M instructions, most of them every block re-quantizing the token's 8 h rows. With
// the weights in registers (80-95 of them) instead of cp.async into shared memory: as slow. The
// tensor-core MMAs of this file convert once per two codes and sum 16 × 8 × 16 per instruction.
//
// Tried on the H200 and removed (2026-12-03, thirty-second session, docs/PERF.md): at T = 1 the
// down projection and the combine as one kernel (one block per 16 output rows, warp j = slot j's
// expert, all K h rows staged in every block, the slot-order sum in shared memory) — correct, but
// slower: qwen3_30b_a3b 0.0261 ms against 0.0237 (ncu: 13.0 us alone against decode_down's 10.7);
// with h quantized by decode_up instead, 0.0246. Block tiles other than 8 / KS m16 tiles × KS
// k slices (3 × 2 and 2 × 4 in decode_up — 3 × 2 spreads qwen3's T = 1 up rows evenly, two blocks
// on 124 of 132 SMs — and 4 × 2 in decode_down, warps past M·K idle): no gain at T = 1, 12-20 %
// slower at T = 8; the switches were removed with them.
// Also removed (same session): the NT = 1 kernels' weights through a 4-stage shared-memory ring
// (each lane cp.async-ing its own four 16-byte chunks per stage, 6 KB per warp in flight instead of
// 4 KB, 84-110 registers instead of 118-127) — correct, memcheck clean, but slower everywhere:
// qwen3_30b_a3b T = 1 0.0253 ms against 0.0236, deepseek_v3 T = 1 0.1354 against 0.1010, T = 8
// 20-40 % slower (ncu of the register ring at qwen3 T = 1: 14 cycles per issued instruction, 37 %
// of them the L1TEX scoreboard, 1.83 TB/s).
//
// Tried on an H100 and removed (2026-12-06, forty-seventh session, commit 1dff815, docs/PERF.md):
// decode_down copying its whole weight slice (BM rows × I codes, ~96 KB) into shared memory with
// cp.async before pdl_wait, where its grid is one wave (T = 1 on the qwen shapes), so that the 12.6 MB
// of qwen3's down projection are requested while decode_up streams — bit-identical (its test compared
// the outputs byte for byte), memcheck / racecheck clean, and no faster: qwen3_30b_a3b T = 1 0.0255 ms
// against 0.0257, qwen15_moe_a2_7b 0.0249 against 0.0248 (three rounds, CUDA-graph replay). The
// down projection's weight stream is not what the T = 1 chain waits for.
//
// Measured on an H100 and kept (2026-12-06, forty-eighth session, docs/PERF.md): the weights of
// decode_up / decode_down by TMA into a 4-stage shared-memory ring per warp (the TMA ring below,
// where most of a warp's weights are requested before pdl_wait): qwen3_30b_a3b T = 1 0.0228-0.0239 ms
// against the register ring's 0.0255-0.0258, qwen15_moe_a2_7b 0.0231-0.0243 against 0.0252-0.0256 (three
// calls, CUDA-graph replay); each kernel alone (ncu) is no faster — what it buys is twice the bytes
// requested before the wait. Tried in the same calls and removed: decode_up's blocks asking L2 for
// their slot's down matrix before the wait (cp.async.bulk.prefetch.L2; MOEX_CUDA_FP8_DECODE_L2DOWN):
// T = 1 no change (0.0242 / 0.0240), T = 8 and 64 15-45 % slower on every shape.
//
// Tried on an H100 and removed (2026-12-06, forty-ninth session, commit bdacce9, docs/PERF.md): at
// T·K <= 8, decode_up, decode_down and the combine as ONE kernel after decode_prep (decode_fused: one
// block of 8 warps per 16 output rows, grid H/16 <= the SM count; before pdl_wait each block requested
// by TMA its whole down slice — every hit expert's 16 rows × I codes, 96 KB on qwen3_30b_a3b — into a
// shared-memory slab and the first stages of its share of the up tiles into per-warp rings; after it the
// up tiles, a grid-wide barrier, h staged and quantized in every block, the down GEMV from the slab and
// the slot-order sum) — bit-identical to these kernels with the same k slices, memcheck / racecheck
// clean, and 30-50 % slower: qwen3_30b_a3b T = 1 0.0332-0.0355 ms against 0.0236-0.0241,
// qwen15_moe_a2_7b 0.0307-0.0316 against 0.0238-0.0251; ncu: 35-41 us alone at 0.95-1.08 TB/s (8 warps
// per SM moving 7 GB/s each SM, decode_up's 16 move 11); neither deeper rings, nor the slab requested
// later, nor other up k slices, nor the routing and the block scales staged ahead changed it.
//
// Tried on an H100 and removed (2026-12-06, fifty-first session, commit 8b0ed58, docs/PERF.md): decode_down's
// first pass' pair-list entries read before pdl_wait (MOEX_CUDA_FP8_DECODE_EARLY_COLS=1): correct, no
// measurable change (qwen15_moe_a2_7b / qwen3_30b_a3b T = 1 0.0240 / 0.0241 ms against 0.0240 / 0.0243, CUDA-graph replay).
//
// Measured on an H100 before building it (2026-12-06, fiftieth session, bench/stream_probe.cu, docs/PERF.md):
// a load-time weight layout with each 16-row × 128-code tile contiguous, streamed with 1-D cp.async.bulk
// copies of 2-4 KB instead of the TMA ring's 8-row boxes. Pure readers with decode_up's split read qwen3's
// 25.2 MB in 11.8 µs either way (back-to-back launches; 15.8-16.1 µs single) and decode_down's 12.6 MB in
// 7.5 µs: the request shape does not set the pace, so the layout was not built.
//
// The four are chained with programmatic dependent launch (pdl.cuh): each becomes resident while
// its predecessor runs. decode_up finds its slot's expert from the routing indices and decode_down
// reads decode_prep's plan — both written at least two kernels back, final once the predecessor
// has passed its own pdl_wait (each kernel releases its dependents only after that wait) — so
// both request their first weight stages before pdl_wait. A pass' activation rows (8·NT codes
// rows + scales) are staged in shared memory with cp.async where they fit, so the MMAs of a k
// block wait for the weights only.
//
// Rows are indexed by pair p = t·K + j (h, hq, y), so no inverse permutation is needed; the
// order of pairs inside an expert's block depends on shared-memory atomics, but every column is
// computed on its own with the same arithmetic wherever it lands: results are deterministic and
// bit-reproducible (no float atomics; graph replay = direct call).
//
// The MMA ("swap AB"): weight rows are the M side of mma.sync m16n8k16 (f16 × f16 → f32), the
// expert's rows (tokens or pairs) the N side (n8 tiles, NT of them per pass, more passes when an
// expert has more than 8·NT rows), K streamed 128 (one scale block) at a time. Both operands are
// e4m3 codes converted with the packed hardware convert cvt.rn.f16x2.e4m3x2 (exact: every e4m3
// value is an f16), so each MMA sums exact products; a 128-k block is summed in fresh f32
// registers and promoted: acc += block · (activation scale × weight block scale), as on the CPU.
// A dot product is invariant under a permutation of k applied to both operands, so k is permuted
// to make each lane's bytes contiguous: in a 128-k block lane (g = lane/4, q = lane%4) loads the
// 16-byte chunks [16q, 16q+16) and [64+16q, 64+16q+16) of weight rows g and g+8 (each warp load
// instruction covers 64 contiguous bytes of 8 rows: whole sectors) and the same bytes of its
// activation row g; word j (0..7) of those 32 bytes feeds MMA j: bytes 0-1 → fragment regs
// a0/a1/b0 (logical k 2q, 2q+1), bytes 2-3 → a2/a3/b1 (k 2q+8, 2q+9), identical for A and B.
//
// A block is 8 warps = (8/KS) m16 tiles × KS slices of the K blocks (KS chosen on the host so
// that there are about one (NT = 1) or two (NT = 4) blocks per SM); the KS partial sums meet in shared memory
// and are added in slice order. Each warp keeps two K blocks of weight loads in flight while it
// computes a third (3-stage register ring, 64 bytes per lane per stage: 4 KB per warp in flight).
//
// Budget per 128-k block and m16 tile (2 KB of weights, one warp) with NU n8 tiles of rows: 4
// LDG.128 of weights, 32 F2FP (A) + 16·NU F2FP (B), 8·NU HMMA, 8·NU FMUL/FFMA of promotion, the
// activation and scale loads. The SASS (2026-12-01, seventeenth session) has ~130 warp
// instructions per k block at NU = 1, 168-174 at NU = 2 and 243-259 at NU = 4 (0.06-0.12 per
// weight byte, where the H200 issues ~0.25 per byte of DRAM bandwidth), with no branch: the code
// rows are zero-padded to whole k blocks, a weight chunk past K is clamped into its row, and a
// column past the pass' rows reuses column 0 (before that, 134-148 / 170-190 / ~300). Earlier,
// before the pass' columns were hoisted out of the k loop (PassCols) and NU made a compile-time
// count, it was 163-194 at NT = 1 and 404 at NT = 4: at mixtral T = 64 (8 warps per SM, 5.9
// cycles per issued instruction) that stream, not DRAM, sets decode_up's pace (ncu, H200).
//
// Requirements (checked by quant_decode_usable): FP8 block-scaled weights in the default
// [E, out, in] layout with 128-wide k blocks, H and I multiples of 16 (16-byte rows), 16-byte
// aligned bases, E <= kDecodeMaxExperts, compute capability >= 8.9 (the e4m3x2 convert).
// Shapes: W_up [E, R, H] (R = 2I gated, concatenated or interleaved, or I), W_down [E, H, I],
// block scales [E, ceil(out/block_n), ceil(in/128)] f32 or UE8M0.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "backends/cuda/mma_ptx.cuh"
#include "backends/cuda/pdl.cuh"
#include "backends/cuda/quant_common.cuh"
#include "backends/cuda/sm90_tma_launch.cuh"
#include "backends/cuda/tma_ptx.cuh"
#include "backends/cuda/wgmma_ptx.cuh"

namespace moex::cuda {

namespace {

constexpr int THREADS = 256, WARPS = THREADS / 32;

// Everything the three kernels read; passed by value.
struct DecodeParams {
  const void* hidden;   // [T, H] activation dtype
  const void* idx;      // [T, K]
  bool idx64;
  const void* topw;     // [T, K]
  int topw_code;
  QuantWeights up, down;
  const void* up_bias;  // [E, R] or nullptr
  const void* down_bias;// [E, H] or nullptr
  Epi up_epi;
  ActParams act;
  int T, K, E, H, I, R, S, slots, gH, gI;
  int Hp, Ip;           // H, I rounded up to 128: the code rows' stride (zeros past H / I)
  // workspace
  uint8_t* xq;          // [T, Hp]
  float* xs;            // [T, gH]
  void* h;              // [S, I] activation dtype
  uint8_t* hq;          // [S, Ip]
  float* hs;            // [S, gI]
  float* y;             // [S, H]
  int* n_hit;           // [1]     number of experts with rows
  int* hit_expert;      // [slots] expert of slot b
  int* slot_off;        // [slots + 1] slot b owns pair-list entries [slot_off[b], slot_off[b+1])
  int* pairs;           // [S]     pair ids grouped by expert
  int* pair_row;        // [S]     row of y of pair p: p, or -1 for a dropped slot (launch_combine)
  int* up_ctr;          // [slots * gI] finished up blocks per (slot, 128-group of I)
  int n_ctr;            // counters (zeroed by decode_prep)
  bool h_quant_in_down; // decode_down quantizes h while staging it (else decode_up's last blocks)
  bool early_plan;      // decode_up / decode_down read the routing / plan before pdl_wait
  int ring_stages;      // stages of the TMA ring (the kTma kernels; set per launch by launch_gemv)
  int ring_kbs;         // k blocks per TMA ring stage: 2 (256-byte boxes; the default), or 1
                        // (MOEX_CUDA_FP8_DECODE_TMA_BOX=128, and the wide form)
  int ring_scale_steps; // > 0: the TMA ring kernels stage each warp's weight block scales (up to this many
                        // k blocks) in shared memory before pdl_wait (the default; MOEX_CUDA_FP8_DECODE_TMA_SCALES=0: not)
  void* out;            // [T, H]
};

// ---- small device helpers ------------------------------------------------------------------
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Loads through L2 (coherent with other blocks' writes of this kernel after their fence).
__device__ __forceinline__ float ld_cg(const float* p) { return __ldcg(p); }
__device__ __forceinline__ float ld_cg(const __half* p) {
  return __half2float(__ushort_as_half(__ldcg(reinterpret_cast<const unsigned short*>(p))));
}
__device__ __forceinline__ float ld_cg(const __nv_bfloat16* p) {
  return __bfloat162float(__ushort_as_bfloat16(__ldcg(reinterpret_cast<const unsigned short*>(p))));
}

// Streaming 16-byte weight load: read once, not kept in L1; 256-byte L2 prefetch. volatile: the
// register ring guards its loads with the warp's k-block bound, and a plain asm may be
// if-converted into an unconditional load (compute-sanitizer found the last row of the last
// expert read past its end that way, when the loads were also guarded by k < K).
__device__ __forceinline__ uint4 ld_stream16(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// Four e4m3 codes (one 32-bit word) as two f16x2 registers: bytes 0-1 → lo, bytes 2-3 → hi.
__device__ __forceinline__ void e4m3x4_to_f16x2(uint32_t w, uint32_t& lo, uint32_t& hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n cvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(w));
#else
  lo = hi = 0;
  __trap();  // the host dispatch only picks this path on sm_89+
#endif
}

__device__ __forceinline__ uint32_t word_of(const uint4& v, int j) {
  return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

// FP8 block scale kb of a weight row whose scale row starts at `row` (f32 or UE8M0 table).
__device__ __forceinline__ float block_scale(const void* row, bool ue8m0, int kb) {
  return ue8m0 ? ue8m0_value(__ldg(static_cast<const uint8_t*>(row) + kb)) : __ldg(static_cast<const float*>(row) + kb);
}

// One warp quantizes channels [128g, 128g+128) ∩ [0, K) of one row (quant_activation.cu's math):
// scale = amax / 448 (1 when amax is 0 or not finite), codes = e4m3(v / scale), saturating.
// The whole group of codes is written, zeros past K: every code row is padded to a multiple of
// 128 (padded_k), so that the MMA loops read whole 128-k blocks of activations without a guard.
// kShared: the row is in shared memory (staged by decode_down), else global memory.
template <class T, bool kShared = false>
__device__ __forceinline__ void quantize_group_warp(const T* row, int K, int g, uint8_t* codes, float* scale_out, int lane) {
  float v[kQuantGroup / 32];
  float amax = 0.0f;
#pragma unroll
  for (int q = 0; q < kQuantGroup / 32; ++q) {
    const int c = g * kQuantGroup + q * 32 + lane;
    if constexpr (kShared) v[q] = c < K ? to_f32(row[c]) : 0.0f;
    else v[q] = c < K ? ld_cg(row + c) : 0.0f;
    amax = fmaxf(amax, fabsf(v[q]));
  }
  amax = warp_max(amax);
  const float scale = amax > 0.0f && isfinite(amax) ? __fdiv_rn(amax, 448.0f) : 1.0f;
  if (lane == 0) *scale_out = scale;
#pragma unroll
  for (int q = 0; q < kQuantGroup / 32; ++q) codes[g * kQuantGroup + q * 32 + lane] = e4m3_code_sat(__fdiv_rn(v[q], scale));
}

// ---- 1. plan + token quantization ----------------------------------------------------------
template <class T>
__global__ void __launch_bounds__(THREADS) decode_prep(DecodeParams a) {
  const int tid = threadIdx.x;
  pdl_wait();  // hidden states and routing come from the previous kernels
  pdl_launch_dependents();  // after the wait: decode_up may read the routing before its own wait
  if (blockIdx.x > 0) {  // tokens: one warp per (row, 128-group)
    const int64_t item = int64_t(blockIdx.x - 1) * WARPS + (tid >> 5);
    if (item >= int64_t(a.T) * a.gH) return;
    const int r = int(item / a.gH), g = int(item % a.gH);
    quantize_group_warp<T>(static_cast<const T*>(a.hidden) + int64_t(r) * a.H, a.H, g, a.xq + int64_t(r) * a.Hp,
                           a.xs + int64_t(r) * a.gH + g, tid & 31);
    return;
  }
  __shared__ int s_count[kDecodeMaxExperts];
  __shared__ int s_cursor[kDecodeMaxExperts];
  __shared__ int s_rows[THREADS], s_hits[THREADS];
  for (int e = tid; e < a.E; e += THREADS) s_count[e] = 0;
  for (int i = tid; i < a.n_ctr; i += THREADS) a.up_ctr[i] = 0;
  __syncthreads();
  for (int p = tid; p < a.S; p += THREADS) {
    const int64_t e = load_index(a.idx, a.idx64, p);
    if (e >= 0 && e < a.E) atomicAdd(&s_count[e], 1);
  }
  __syncthreads();
  // each thread owns a run of experts; inclusive scan of (rows, hit experts) over the runs
  const int per = (a.E + THREADS - 1) / THREADS;
  const int e0 = min(a.E, tid * per), e1 = min(a.E, e0 + per);
  int rows = 0, hits = 0;
  for (int e = e0; e < e1; ++e) {
    rows += s_count[e];
    hits += s_count[e] > 0;
  }
  s_rows[tid] = rows;
  s_hits[tid] = hits;
  __syncthreads();
  for (int d = 1; d < THREADS; d <<= 1) {
    const int r = tid >= d ? s_rows[tid - d] : 0, h = tid >= d ? s_hits[tid - d] : 0;
    __syncthreads();
    s_rows[tid] += r;
    s_hits[tid] += h;
    __syncthreads();
  }
  int row = s_rows[tid] - rows, slot = s_hits[tid] - hits;
  for (int e = e0; e < e1; ++e) {
    const int c = s_count[e];
    s_cursor[e] = row;
    if (c > 0) {
      a.hit_expert[slot] = e;
      a.slot_off[slot] = row;
      ++slot;
      row += c;
    }
  }
  if (tid == THREADS - 1) {
    *a.n_hit = s_hits[tid];
    a.slot_off[s_hits[tid]] = s_rows[tid];
  }
  __syncthreads();
  for (int p = tid; p < a.S; p += THREADS) {
    const int64_t e = load_index(a.idx, a.idx64, p);
    const bool valid = e >= 0 && e < a.E;
    if (valid) a.pairs[atomicAdd(&s_cursor[e], 1)] = p;
    a.pair_row[p] = valid ? p : -1;
  }
}

// ---- the expert tile: BM weight rows × up to 8·NT activation rows -----------------------------
// One warp: m16 tile `mt` (local rows 16mt .. 16mt+15 → weight rows row_lo (g), row_hi (g+8)),
// k blocks [kb0, kb1). Activation row of column c: s_arow[c] (-1 = none); its codes act + arow·K,
// its scales act_s + arow·gK. Results: acc[nt][0..3] = (g, 8nt+2q), (g, 8nt+2q+1), (g+8, 8nt+2q),
// (g+8, 8nt+2q+1).
struct Stage {
  uint4 lo0, lo1, hi0, hi1;  // row g / g+8, chunks [16q, +16) and [64+16q, +16) of the k block
  float ws_lo, ws_hi;        // their block scales
};

template <int NT>
struct TileArgs {
  const uint8_t* row_lo;  // weight rows (bytes)
  const uint8_t* row_hi;
  const void* ws_lo;      // their block-scale rows (f32 or UE8M0, gK entries)
  const void* ws_hi;
  bool ue8m0;
  int K, gK;
  const uint8_t* act;     // activation codes, row r at act + r·act_stride (global or shared memory;
                          // rows padded with zero codes to a multiple of 128)
  const float* act_s;     // activation scales, row r at act_s + r·gK
  int act_stride;
  const int* s_arow;      // shared: activation row per column
  int q, g;
};

// This lane's activation operands of a pass, found once per pass (the pass' columns are the same
// for every k block): x[nt] the codes of column 8·nt + g (its B fragment), s[nt][0..1] the scale
// rows of columns 8·nt + 2q, 8·nt + 2q + 1 (its accumulators). Looked up per k block instead, the
// table reads, the address arithmetic and the branches around them were half of the k loop's ~400
// warp instructions (SASS of decode_up<bf16, 4, staged>, 2026-12-01).
template <int NU>
struct PassCols {
  const uint8_t* x[NU];
  const float* s[NU][2];
};

// A column past the pass' last row computes column 0's row again (the epilogue writes columns
// < ncols only): the k loop then has no branch and no zero fallback per operand. (Zero rows staged
// for those columns instead cost 16-37 % at T = 1 / 8 on the deepseek / qwen shapes: every block
// staged, and at T <= 8 quantized, 8 rows where one expert row needs 1; H200, 2026-12-01.)
template <int NT, int NU>
__device__ __forceinline__ PassCols<NU> pass_cols(const TileArgs<NT>& t) {
  PassCols<NU> c;
  const int first = t.s_arow[0];  // column 0 always has a row (ncols >= 1)
#pragma unroll
  for (int nt = 0; nt < NU; ++nt) {
    const int col = nt * 8 + t.g, c0 = nt * 8 + 2 * t.q, c1 = c0 + 1;
    const int ar = t.s_arow[col], r0 = t.s_arow[c0], r1 = t.s_arow[c1];
    c.x[nt] = t.act + int64_t(ar < 0 ? first : ar) * t.act_stride;
    c.s[nt][0] = t.act_s + int64_t(r0 < 0 ? first : r0) * t.gK;
    c.s[nt][1] = t.act_s + int64_t(r1 < 0 ? first : r1) * t.gK;
  }
  return c;
}

// A chunk at k >= K (the last k block when K is not a multiple of 128) is read from the row's
// last 16 bytes instead: real weights, finite (or a NaN the row's own position already gives the
// output), times activation codes that are zero there, so they add exactly 0 — no guard, no zero
// fallback, no branch in the k loop (the guarded loads and their branches were ~20 of its ~200
// warp instructions per k block at NU = 2).
template <int NT>
__device__ __forceinline__ void load_stage(const TileArgs<NT>& t, int kb, Stage& s) {
  const int k0 = min(kb * kQuantGroup + 16 * t.q, t.K - 16), k1 = min(kb * kQuantGroup + 64 + 16 * t.q, t.K - 16);
  s.lo0 = ld_stream16(t.row_lo + k0);
  s.hi0 = ld_stream16(t.row_hi + k0);
  s.lo1 = ld_stream16(t.row_lo + k1);
  s.hi1 = ld_stream16(t.row_hi + k1);
  s.ws_lo = block_scale(t.ws_lo, t.ue8m0, kb);
  s.ws_hi = block_scale(t.ws_hi, t.ue8m0, kb);
}

// One k block of the pass: NU n8 tiles (the pass' columns rounded up to 8), all computed.
template <int NT, int NU>
__device__ __forceinline__ void compute_stage(const TileArgs<NT>& t, const PassCols<NU>& cols, int kb, const Stage& s,
                                              float (&acc)[NU][4]) {
  const int k0 = kb * kQuantGroup + 16 * t.q, k1 = k0 + 64;
  uint4 xb[NU][2];
  float xsc[NU][2];
#pragma unroll
  for (int nt = 0; nt < NU; ++nt) {
    // generic loads: the activations are in shared memory (staged per pass) or global memory,
    // their rows padded with zero codes to a multiple of 128 (no guard at a partial k block)
    const uint8_t* x = cols.x[nt];
    xb[nt][0] = *reinterpret_cast<const uint4*>(x + k0);
    xb[nt][1] = *reinterpret_cast<const uint4*>(x + k1);
#pragma unroll
    for (int h = 0; h < 2; ++h) xsc[nt][h] = cols.s[nt][h][kb];
  }
  float d[NU][4];
#pragma unroll
  for (int nt = 0; nt < NU; ++nt) d[nt][0] = d[nt][1] = d[nt][2] = d[nt][3] = 0.0f;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    uint32_t a[4];
    e4m3x4_to_f16x2(word_of(j < 4 ? s.lo0 : s.lo1, j & 3), a[0], a[2]);
    e4m3x4_to_f16x2(word_of(j < 4 ? s.hi0 : s.hi1, j & 3), a[1], a[3]);
#pragma unroll
    for (int nt = 0; nt < NU; ++nt) {
      uint32_t b[2];
      e4m3x4_to_f16x2(word_of(xb[nt][j >> 2], j & 3), b[0], b[1]);
      ptx::mma16816<__half>(d[nt], a, b);
    }
  }
  // promotion, as the CPU: acc += block sum · (activation scale × weight block scale)
#pragma unroll
  for (int nt = 0; nt < NU; ++nt) {
    acc[nt][0] = fmaf(d[nt][0], xsc[nt][0] * s.ws_lo, acc[nt][0]);
    acc[nt][1] = fmaf(d[nt][1], xsc[nt][1] * s.ws_lo, acc[nt][1]);
    acc[nt][2] = fmaf(d[nt][2], xsc[nt][0] * s.ws_hi, acc[nt][2]);
    acc[nt][3] = fmaf(d[nt][3], xsc[nt][1] * s.ws_hi, acc[nt][3]);
  }
}

// The warp's k blocks [kb0, kb1) through a 3-stage register ring: two blocks of loads in flight
// while the third is computed. ring_prologue issues the first two (weights only: it may run
// before pdl_wait), ring_run the rest and all the MMAs.
template <int NT>
__device__ __forceinline__ void ring_prologue(const TileArgs<NT>& t, int kb0, int kb1, Stage& s0, Stage& s1) {
  if (kb0 < kb1) load_stage(t, kb0, s0);
  if (kb0 + 1 < kb1) load_stage(t, kb0 + 1, s1);
}

template <int NT, int NU>
__device__ __forceinline__ void ring_run(const TileArgs<NT>& t, int kb0, int kb1, Stage& s0, Stage& s1, float (&acc)[NU][4]) {
#pragma unroll
  for (int nt = 0; nt < NU; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
  const PassCols<NU> cols = pass_cols<NT, NU>(t);
  Stage s2;
  for (int kb = kb0; kb < kb1; kb += 3) {
    if (kb + 2 < kb1) load_stage(t, kb + 2, s2);
    compute_stage<NT, NU>(t, cols, kb, s0, acc);
    if (kb + 1 >= kb1) break;
    if (kb + 3 < kb1) load_stage(t, kb + 3, s0);
    compute_stage<NT, NU>(t, cols, kb + 1, s1, acc);
    if (kb + 2 >= kb1) break;
    if (kb + 4 < kb1) load_stage(t, kb + 4, s1);
    compute_stage<NT, NU>(t, cols, kb + 2, s2, acc);
  }
}

// ---- the weights by TMA into a shared-memory ring (NT = 1, sm_90; MOEX_CUDA_FP8_DECODE_TMA) -----
// The register ring above holds two k blocks (4 KB) per warp in flight: at T = 1 on the qwen shapes
// decode_up streamed 25 MB at 1.8 TB/s of the H200's ~4.3 (ncu, thirty-second session: 2.9 warps per
// scheduler, 37 % of their stalls on the weight loads), decode_down 12.6 MB at ~1.2. Here lane 0 of
// each warp issues its tile's k blocks as TMA copies into a ring of a.ring_stages shared-memory
// stages of its own (4 by default, see tma_ring_stages; up to 8 in the wide form's decode_down), one
// mbarrier per stage, the first a.ring_stages k blocks before pdl_wait, and the lanes read the chunks
// the register ring would have loaded from there: the same
// MMAs and promotion, bit for bit (a chunk past K is zero-filled by the TMA instead of clamped into
// the row; it meets zero activation codes either way). A stage is the tile's 16 rows × kbs·128 codes
// (kbs = 2 k blocks by default, 1 with MOEX_CUDA_FP8_DECODE_TMA_BOX=128) as two 8-row boxes of the tensor
// map over the [E, N, K] codes: rows 0-7 at byte 0, rows 8-15 at kbs·1024, row r of a box at kbs·128·r
// (no swizzle); the host's stage count is in k blocks (4: two stages of two). Longer boxes measured 3-4 %
// faster at T = 1 (fewer, longer requests per row; forty-ninth session). The warps' weight block scales
// are staged in shared memory before the wait (ring_stage_scales) unless MOEX_CUDA_FP8_DECODE_TMA_SCALES=0.
constexpr int kRingStage = 16 * kQuantGroup;  // bytes
constexpr int kRingMaxStages = 8;
// dynamic shared memory of a ring of `stages`: WARPS rings, their mbarriers, slack for the 1024-byte alignment
__host__ __device__ constexpr size_t ring_smem_bytes(int stages) {
  return size_t(WARPS) * size_t(stages) * (kRingStage + 8) + 1024;
}

struct TmaRing {
  const CUtensorMap* map;  // [E, N, K] e4m3 codes, box 128 codes × 8 rows × 1 expert
  uint8_t* stages;         // this warp's stage 0 (shared memory, 1024-byte aligned)
  uint32_t bars;           // shared address of its n mbarriers
  int row0, row1, e;       // first weight row of the tile's two boxes; the expert
  int n;                   // stages
  int kbs;                 // k blocks per stage (1, or 2: boxes of 8 rows × 256 codes, rows 256 bytes apart)
  int slot;                // the stage the next k block is read from
  uint32_t phase;          // its mbarrier's phase parity (flips each time slot wraps to 0)
  float* scales;           // ring_scale_steps > 0: this warp's block scales, k block kb0 + i, tile row r at
                           // scales[16 i + r] (shared memory); else nullptr (loaded in the k loop)
};

// The staged block scales' shared memory (after the rings and their barriers).
__host__ __device__ constexpr size_t ring_scale_bytes(int steps) { return size_t(WARPS) * size_t(steps) * 16 * sizeof(float); }

// The warp's ring of n stages of kbs k blocks at dyn + offset (rounded up to 1024 bytes): every warp's
// stages, then every warp's mbarriers, then (scale_steps > 0) every warp's staged block scales;
// lane 0 initialises its barriers.
__device__ __forceinline__ void ring_tma_init(TmaRing& r, uint8_t* dyn, size_t offset, int n, int kbs, int scale_steps,
                                              const CUtensorMap* map, int e, int row0, int row1) {
  const int warp = threadIdx.x >> 5;
  const uint32_t base = uint32_t(__cvta_generic_to_shared(dyn + offset)), aligned = (base + 1023u) & ~1023u;
  uint8_t* const first = dyn + offset + (aligned - base);  // warp 0's stage 0
  const int stages_bytes = WARPS * n * kbs * kRingStage, bars_bytes = WARPS * n * 8;
  r.kbs = kbs;
  r.map = map;
  r.stages = first + warp * n * kbs * kRingStage;
  r.bars = aligned + uint32_t(stages_bytes) + uint32_t(warp * n * 8);
  r.row0 = row0;
  r.row1 = row1;
  r.e = e;
  r.n = n;
  r.slot = 0;
  r.phase = 0;
  r.scales = scale_steps > 0 ? reinterpret_cast<float*>(first + stages_bytes + bars_bytes) + warp * scale_steps * 16 : nullptr;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if ((threadIdx.x & 31) == 0) {
    for (int s = 0; s < n; ++s) tma::mbar_init(r.bars + 8 * s, 1);
    tma::mbar_fence_init();
  }
  __syncwarp();
#else
  __trap();  // the host launches the TMA kernels on compute capability 9.0 only
#endif
}

// Where the ring has room for them (r.scales): the block scales of the warp's k blocks [kb0, kb1) of its
// rows g and g + 8 into shared memory (lane (g, q) loads k blocks kb0 + q, kb0 + q + 4, ...: every load in
// flight at once, before pdl_wait), so that the k loop reads no global memory.
template <int NT>
__device__ __forceinline__ void ring_stage_scales(const TmaRing& r, const TileArgs<NT>& t, int kb0, int kb1) {
  if (!r.scales) return;
  for (int kb = kb0 + t.q; kb < kb1; kb += 4) {
    r.scales[(kb - kb0) * 16 + t.g] = block_scale(t.ws_lo, t.ue8m0, kb);
    r.scales[(kb - kb0) * 16 + t.g + 8] = block_scale(t.ws_hi, t.ue8m0, kb);
  }
  __syncwarp();
}

// Lane 0: k blocks [kb, kb + kbs) into stage s (a block past K is zero-filled: never read).
__device__ __forceinline__ void ring_tma_issue(const TmaRing& r, int s, int kb) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const int sb = r.kbs * kRingStage;
  const uint32_t bar = r.bars + 8 * s, dst = uint32_t(__cvta_generic_to_shared(r.stages + s * sb));
  tma::mbar_arrive_expect_tx(bar, uint32_t(sb));
  tma::tma_load_3d(dst, r.map, bar, kb * kQuantGroup, r.row0, r.e);
  tma::tma_load_3d(dst + sb / 2, r.map, bar, kb * kQuantGroup, r.row1, r.e);
#endif
}

// The first n k blocks of [kb0, kb1) into the n stages from r.slot on (weights only: may run before
// pdl_wait; the ring is empty). A later pass re-reads the rows: the fence orders the last pass'
// reads of the stages before these writes.
__device__ __forceinline__ void ring_tma_prologue(const TmaRing& r, int kb0, int kb1, bool again) {
  if ((threadIdx.x & 31) == 0) {
    if (again) wgmma::fence_proxy_async();
    int s = r.slot;
    for (int i = 0; i < r.n && kb0 + i * r.kbs < kb1; ++i) {
      ring_tma_issue(r, s, kb0 + i * r.kbs);
      s = s + 1 == r.n ? 0 : s + 1;
    }
  }
}

template <int NT, int NU>
__device__ __forceinline__ void ring_tma_run(const TileArgs<NT>& t, int kb0, int kb1, TmaRing& r, float (&acc)[NU][4]) {
#pragma unroll
  for (int nt = 0; nt < NU; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
  const PassCols<NU> cols = pass_cols<NT, NU>(t);
  // lane (g, q) reads chunks q and 4 + q (16 codes each) of rows g and g + 8; odd rows read the two in
  // the other order, so that the 8 lanes of each quarter warp (rows g, g + 1) meet 32 distinct banks
  const bool odd = t.g & 1;
  const int sb = r.kbs * kRingStage, row_stride = r.kbs * kQuantGroup;  // a stage's bytes; a box row's
  const int first = t.g * row_stride + 16 * (odd ? 4 + t.q : t.q), second = t.g * row_stride + 16 * (odd ? t.q : 4 + t.q);
  // block kb's scale of row g (hi: g + 8), staged or from global memory
  auto scale = [&](int kb, bool hi) {
    return r.scales ? r.scales[(kb - kb0) * 16 + t.g + (hi ? 8 : 0)] : block_scale(hi ? t.ws_hi : t.ws_lo, t.ue8m0, kb);
  };
  float ws_lo = scale(kb0, false), ws_hi = scale(kb0, true);
  for (int kb = kb0; kb < kb1; ++kb) {
    float next_lo = ws_lo, next_hi = ws_hi;  // the next block's scales, requested before this one's wait
    if (kb + 1 < kb1) {
      next_lo = scale(kb + 1, false);
      next_hi = scale(kb + 1, true);
    }
    const int sub = r.kbs == 2 ? (kb - kb0) & 1 : 0;  // the k block's place in its stage
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (sub == 0) tma::mbar_wait(r.bars + 8 * r.slot, r.phase);
#endif
    const uint8_t* st = r.stages + r.slot * sb + sub * kQuantGroup;
    const uint4 lo_a = *reinterpret_cast<const uint4*>(st + first), lo_b = *reinterpret_cast<const uint4*>(st + second);
    const uint4 hi_a = *reinterpret_cast<const uint4*>(st + sb / 2 + first);
    const uint4 hi_b = *reinterpret_cast<const uint4*>(st + sb / 2 + second);
    Stage sg;
    sg.lo0 = odd ? lo_b : lo_a;
    sg.lo1 = odd ? lo_a : lo_b;
    sg.hi0 = odd ? hi_b : hi_a;
    sg.hi1 = odd ? hi_a : hi_b;
    sg.ws_lo = ws_lo;
    sg.ws_hi = ws_hi;
    compute_stage<NT, NU>(t, cols, kb, sg, acc);
    // the stage's last k block: every lane has used the stage (its values fed the MMAs), lane 0 refills
    // it with the blocks n stages on, the generic-proxy reads ordered before the TMA's async-proxy write
    if (sub == r.kbs - 1 || kb + 1 == kb1) {
      __syncwarp();
      const int refill = kb - sub + r.n * r.kbs;
      if ((threadIdx.x & 31) == 0 && refill < kb1) {
        wgmma::fence_proxy_async();
        ring_tma_issue(r, r.slot, refill);
      }
      if (++r.slot == r.n) {
        r.slot = 0;
        r.phase ^= 1u;
      }
    }
    ws_lo = next_lo;
    ws_hi = next_hi;
  }
}

// Shared memory of the up/down kernels.
template <int NT>
struct TileSmem {
  float part[WARPS][16][8 * NT];  // per-warp partial tiles
  int arow[8 * NT];               // activation row of each column (token / pair), -1 = none
  int col[8 * NT];                // c for the columns with a row, -1 = none (rows staged in shared memory)
  int pair[8 * NT];               // pair of each column, -1 = none
  int last;                       // this block finished a counter
};

// The warp's share of one block tile, weights side only (no access to activations: may run
// before pdl_wait): its two weight rows, their scale rows, its k slice.
template <int NT>
struct WarpTile {
  TileArgs<NT> t;
  int kb0, kb1;
  Stage s0, s1;  // the register ring's first two stages
  TmaRing ring;  // the TMA ring (kTma kernels)
  int row0, row1;  // first weight row of the warp's m16 tile and of its second half (the TMA boxes)
};

template <int NT>
__device__ __forceinline__ void tile_setup(WarpTile<NT>& wt, const QuantWeights& w, int e, const int* rows_of_m, int K,
                                           int ks_count) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int mt_count = WARPS / ks_count, mt = warp % mt_count, ks = warp / mt_count;
  TileArgs<NT>& t = wt.t;
  t.g = lane >> 2;
  t.q = lane & 3;
  const int n_lo = rows_of_m[mt * 16 + t.g], n_hi = rows_of_m[mt * 16 + t.g + 8];
  wt.row0 = rows_of_m[mt * 16];
  wt.row1 = rows_of_m[mt * 16 + 8];
  const uint8_t* base = w.data + int64_t(e) * w.data_stride;
  t.row_lo = base + int64_t(n_lo) * K;
  t.row_hi = base + int64_t(n_hi) * K;
  t.K = K;
  t.gK = int(quant_groups(K));
  t.ue8m0 = w.ue8m0;
  const int64_t s_lo = int64_t(e) * w.scale_stride + int64_t(n_lo / w.block_n) * t.gK;
  const int64_t s_hi = int64_t(e) * w.scale_stride + int64_t(n_hi / w.block_n) * t.gK;
  if (w.ue8m0) {
    t.ws_lo = static_cast<const uint8_t*>(w.scales) + s_lo;
    t.ws_hi = static_cast<const uint8_t*>(w.scales) + s_hi;
  } else {
    t.ws_lo = static_cast<const float*>(w.scales) + s_lo;
    t.ws_hi = static_cast<const float*>(w.scales) + s_hi;
  }
  wt.kb0 = ks * t.gK / ks_count;
  wt.kb1 = (ks + 1) * t.gK / ks_count;
}

// Runs the pass (columns = pair-list entries [r, min(r + 8·NT, r_end))) from the issued
// prologue and leaves the KS-reduced values readable through tile_value(). Syncs before returning.
template <int NT, bool kStaged, bool kTma>
__device__ __forceinline__ void tile_finish(TileSmem<NT>& sm, WarpTile<NT>& wt, const uint8_t* act, const float* act_s,
                                            int act_stride, int ncols) {
  const int warp = threadIdx.x >> 5;
  TileArgs<NT>& t = wt.t;
  t.act = act;
  t.act_s = act_s;
  t.act_stride = act_stride;
  t.s_arow = kStaged ? sm.col : sm.arow;
  // the pass' n8 tiles as a compile-time count: every MMA issued is needed (a run-time bound left
  // the unused tiles' instructions predicated off, still issued)
  auto run = [&](auto nu_tag) {
    constexpr int NU = decltype(nu_tag)::value;
    float acc[NU][4];
    if constexpr (kTma) ring_tma_run<NT, NU>(t, wt.kb0, wt.kb1, wt.ring, acc);
    else ring_run<NT, NU>(t, wt.kb0, wt.kb1, wt.s0, wt.s1, acc);
#pragma unroll
    for (int nt = 0; nt < NU; ++nt) {
      const int c = nt * 8 + 2 * t.q;
      sm.part[warp][t.g][c] = acc[nt][0];
      sm.part[warp][t.g][c + 1] = acc[nt][1];
      sm.part[warp][t.g + 8][c] = acc[nt][2];
      sm.part[warp][t.g + 8][c + 1] = acc[nt][3];
    }
  };
  const int nu = (ncols + 7) / 8;  // 1..NT (block-uniform)
  if constexpr (NT == 1) {
    run(std::integral_constant<int, 1>{});
  } else {
    static_assert(NT == 4, "decode tiles: NT = 1 or 4");
    if (nu <= 1) run(std::integral_constant<int, 1>{});
    else if (nu == 2) run(std::integral_constant<int, 2>{});
    else if (nu == 3) run(std::integral_constant<int, 3>{});
    else run(std::integral_constant<int, 4>{});
  }
  __syncthreads();
}

// Code rows (xq, hq, the staged rows) are padded with zeros to a multiple of 128 codes.
__host__ __device__ constexpr int padded_k(int K) { return (K + kQuantGroup - 1) / kQuantGroup * kQuantGroup; }

// Shared-memory staging of a pass' activation rows (written by the previous kernel; after
// pdl_wait): codes of column c at s_act + c·staged_stride(K), its scales at s_act_s + c·gK. The
// stride is padded_k(K) + 16 so that the 8 rows a warp reads in one instruction fall on different banks.
// Staged when the pass' rows fit (staged_smem_bytes <= the kernel's limit): the MMAs of each k
// block then wait for the weights only, not for an L1/L2 round trip of the activations.
__host__ __device__ constexpr int staged_stride(int K) { return padded_k(K) + 16; }
__host__ __device__ inline size_t staged_smem_bytes(int nt, int K) {
  return size_t(8 * nt) * size_t(staged_stride(K)) + size_t(8 * nt) * size_t(quant_groups(K)) * sizeof(float);
}

// Columns c < ncols: row sm.arow[c] of `src` (row_bytes each, a multiple of 16) to dst + c·dst_stride
// with cp.async, zeros for a column without a row; committed, not waited for.
template <int NT>
__device__ __forceinline__ void copy_rows_async(const TileSmem<NT>& sm, uint8_t* dst, int dst_stride, const void* src,
                                                int row_bytes, int ncols) {
  const int chunks = row_bytes / 16;
  for (int i = threadIdx.x; i < ncols * chunks; i += THREADS) {
    const int c = i / chunks, k = 16 * (i % chunks), r = sm.arow[c];
    ptx::cp_async16(uint32_t(__cvta_generic_to_shared(dst + c * dst_stride + k)),
                    static_cast<const uint8_t*>(src) + int64_t(r < 0 ? 0 : r) * row_bytes + k, r >= 0);
  }
  ptx::cp_async_commit();
}

template <int NT>
__device__ __forceinline__ void stage_activations(const TileSmem<NT>& sm, uint8_t* s_act, float* s_act_s, const uint8_t* act,
                                                  const float* act_s, int K, int ncols) {
  const int gK = int(quant_groups(K));
  copy_rows_async(sm, s_act, staged_stride(K), act, padded_k(K), ncols);
  for (int i = threadIdx.x; i < ncols * gK; i += THREADS) {
    const int c = i / gK, g = i % gK, r = sm.arow[c];
    s_act_s[c * gK + g] = r < 0 ? 0.0f : __ldcg(act_s + int64_t(r) * gK + g);
  }
  ptx::cp_async_wait<0>();
  __syncthreads();
}

// decode_down's staging when it quantizes h itself: the pass' h rows (activation dtype) copied
// to `raw` [8·NT, K], then one warp per (row, 128-group) quantizes from shared memory with
// decode_up's arithmetic (quantize_group_warp): the same codes and scales, without decode_up's
// per-block counter and its last block's extra round trips.
__host__ __device__ inline size_t staged_h_smem_bytes(int nt, int K, size_t esz) {
  return staged_smem_bytes(nt, K) + size_t(8 * nt) * size_t(K) * esz;
}

template <class T, int NT>
__device__ __forceinline__ void stage_h_quantized(const TileSmem<NT>& sm, uint8_t* s_act, float* s_act_s, T* raw, const T* h,
                                                  int K, int ncols) {
  const int gK = int(quant_groups(K)), stride = staged_stride(K), row_bytes = K * int(sizeof(T));
  copy_rows_async(sm, reinterpret_cast<uint8_t*>(raw), row_bytes, h, row_bytes, ncols);
  ptx::cp_async_wait<0>();
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int item = warp; item < ncols * gK; item += WARPS) {
    const int c = item / gK, g = item % gK;
    quantize_group_warp<T, true>(raw + c * K, K, g, s_act + c * stride, s_act_s + c * gK + g, lane);
  }
  __syncthreads();
}

// Local row m, column c of the block tile: the KS slices added in slice order.
template <int NT>
__device__ __forceinline__ float tile_value(const TileSmem<NT>& sm, int ks_count, int m, int c) {
  const int mt_count = WARPS / ks_count;
  float v = 0.0f;
  for (int ks = 0; ks < ks_count; ++ks) v += sm.part[ks * mt_count + m / 16][m % 16][c];
  return v;
}

// Fills the pass' column tables: pair-list entries [r, r + ncols).
template <int NT>
__device__ __forceinline__ void set_columns(TileSmem<NT>& sm, const DecodeParams& a, int r, int ncols, bool by_token) {
  if (threadIdx.x < 8 * NT) {
    const int c = threadIdx.x;
    const int p = c < ncols ? __ldg(a.pairs + r + c) : -1;
    sm.pair[c] = p;
    sm.arow[c] = p < 0 ? -1 : by_token ? p / a.K : p;
    sm.col[c] = p < 0 ? -1 : c;
  }
  __syncthreads();
}

// Routing index p read through L2 (pre-wait reads must not hit a stale L1 line).
__device__ __forceinline__ int64_t load_index_cg(const void* idx, bool idx64, int64_t p) {
  return idx64 ? int64_t(__ldcg(static_cast<const long long*>(idx) + p)) : int64_t(__ldcg(static_cast<const int*>(idx) + p));
}

// The expert of slot b — the b-th expert, ascending, with at least one valid pair: decode_prep's
// order — or -1, computed by the block from the routing indices alone, so that decode_up can
// request its weights before pdl_wait (decode_prep released its dependents only after its own
// wait, so the indices are final). Block-uniform result; syncs.
__device__ int slot_expert_from_idx(const DecodeParams& a, int b, unsigned* s_bits, int* s_expert) {
  const int tid = threadIdx.x, words = (a.E + 31) / 32;
  for (int i = tid; i < words; i += THREADS) s_bits[i] = 0u;
  if (tid == 0) *s_expert = -1;
  __syncthreads();
  for (int p = tid; p < a.S; p += THREADS) {
    const int64_t e = load_index_cg(a.idx, a.idx64, p);
    if (e >= 0 && e < a.E) atomicOr(&s_bits[e >> 5], 1u << (e & 31));
  }
  __syncthreads();
  if (tid < 32) {
    int before = 0;  // hit experts in the words already scanned
    for (int base = 0; base < words; base += 32) {
      const unsigned w = base + tid < words ? s_bits[base + tid] : 0u;
      const int c = __popc(w);
      int incl = c;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, incl, o);
        if (tid >= o) incl += v;
      }
      const int k = b - before - (incl - c);  // rank of slot b inside this lane's word
      if (k >= 0 && k < c) {
        unsigned rest = w;
        for (int j = 0; j < k; ++j) rest &= rest - 1u;  // drop the k lowest set bits
        *s_expert = (base + tid) * 32 + __ffs(rest) - 1;
      }
      before += __shfl_sync(0xffffffffu, incl, 31);
      if (before > b) break;
    }
  }
  __syncthreads();
  return *s_expert;
}

// The dynamic shared memory of the staged kernels (one declaration for every instantiation).
__device__ __forceinline__ uint8_t* dynamic_smem() {
  extern __shared__ uint4 s_dynamic[];
  return reinterpret_cast<uint8_t*>(s_dynamic);
}

// ---- 2. up projection + gated activation + quantization of h ---------------------------------
// Column block bx covers outputs i in [i0, i0 + BI): BI = BM/2 gated (local rows [0, BI) gate,
// [BI, BM) up for the concatenated layout; rows 2i, 2i+1 interleaved), BI = BM otherwise.
// Blocks per SM the kernels are compiled for: 2 at NT = 1, 3 for the wide TMA form of decode_up
// (MOEX_CUDA_FP8_DECODE_TMA_WIDE: <= 80 registers), 1 at NT = 4.
constexpr int decode_min_blocks(int nt, bool wide) { return wide ? 3 : nt == 1 ? 2 : 1; }

// kTma: the weights through the TMA ring (wmap: the tensor map of a.up's codes), else the register ring.
// kWide: the same code compiled for three blocks per SM (the wide form, unstaged, 4 stages).
template <class T, int NT, bool kStaged, bool kTma, bool kWide = false>
__global__ void __launch_bounds__(THREADS, decode_min_blocks(NT, kWide))
    decode_up(DecodeParams a, int ks_count, const __grid_constant__ CUtensorMap wmap) {
  __shared__ TileSmem<NT> sm;
  __shared__ int rows_of_m[16 * WARPS];
  __shared__ unsigned s_bits[kDecodeMaxExperts / 32];
  __shared__ int s_expert;
  const int b = blockIdx.y;
  const int BM = 16 * (WARPS / ks_count);
  const bool gated = a.up_epi != Epi::up_plain;
  const int BI = gated ? BM / 2 : BM, i0 = int(blockIdx.x) * BI;
  const int tid = threadIdx.x;
  if (tid < BM) {
    const int m = tid;
    int row;
    if (a.up_epi == Epi::up_concat) row = m < BI ? min(i0 + m, a.I - 1) : a.I + min(i0 + m - BI, a.I - 1);
    else if (a.up_epi == Epi::up_interleaved) row = 2 * min(i0 + m / 2, a.I - 1) + (m & 1);
    else row = min(i0 + m, a.I - 1);
    rows_of_m[m] = row;
  }
  // early_plan: before pdl_wait the slot's expert, the warp's weight rows, the first two stages
  // of loads; else all after it.
  int e;
  if (a.early_plan) {
    e = slot_expert_from_idx(a, b, s_bits, &s_expert);  // syncs: rows_of_m is ready
  } else {
    pdl_wait();  // decode_prep's plan and quantized tokens
    e = b < __ldcg(a.n_hit) ? __ldcg(a.hit_expert + b) : -1;
    __syncthreads();  // rows_of_m
  }
  WarpTile<NT> wt;
  if (e >= 0) {
    tile_setup<NT>(wt, a.up, e, rows_of_m, a.H, ks_count);
    if constexpr (kTma) {
      ring_tma_init(wt.ring, dynamic_smem(), kStaged ? staged_smem_bytes(NT, a.H) : 0, a.ring_stages, a.ring_kbs,
                    a.ring_scale_steps, &wmap, e, wt.row0, wt.row1);
      ring_tma_prologue(wt.ring, wt.kb0, wt.kb1, false);
      ring_stage_scales(wt.ring, wt.t, wt.kb0, wt.kb1);
    } else {
      ring_prologue<NT>(wt.t, wt.kb0, wt.kb1, wt.s0, wt.s1);
    }
  }
  if (a.early_plan) pdl_wait();
  pdl_launch_dependents();
  if (e < 0) return;  // b >= number of hit experts (block-uniform)
  const int r_begin = __ldg(a.slot_off + b), r_end = __ldg(a.slot_off + b + 1);
  const T* bias = a.up_bias ? static_cast<const T*>(a.up_bias) + int64_t(e) * a.R : nullptr;
  T* h = static_cast<T*>(a.h);
  for (int r = r_begin; r < r_end; r += 8 * NT) {
    const int ncols = min(8 * NT, r_end - r);
    set_columns(sm, a, r, ncols, true);
    if (r != r_begin) {  // the pass re-reads the rows
      if constexpr (kTma) ring_tma_prologue(wt.ring, wt.kb0, wt.kb1, true);
      else ring_prologue<NT>(wt.t, wt.kb0, wt.kb1, wt.s0, wt.s1);
    }
    if constexpr (kStaged) {
      uint8_t* s_act = dynamic_smem();
      float* s_act_s = reinterpret_cast<float*>(s_act + 8 * NT * staged_stride(a.H));
      stage_activations<NT>(sm, s_act, s_act_s, a.xq, a.xs, a.H, ncols);
      tile_finish<NT, true, kTma>(sm, wt, s_act, s_act_s, staged_stride(a.H), ncols);
    } else {
      tile_finish<NT, false, kTma>(sm, wt, a.xq, a.xs, a.Hp, ncols);
    }
    for (int item = tid; item < BI * ncols; item += THREADS) {
      const int il = item / ncols, c = item % ncols, i = i0 + il;
      if (i >= a.I) continue;
      float v;
      if (gated) {
        const int mg = a.up_epi == Epi::up_concat ? il : 2 * il, mu = a.up_epi == Epi::up_concat ? BI + il : 2 * il + 1;
        float gv = tile_value(sm, ks_count, mg, c), uv = tile_value(sm, ks_count, mu, c);
        if (bias) {
          gv += to_f32(bias[rows_of_m[mg]]);
          uv += to_f32(bias[rows_of_m[mu]]);
        }
        v = gated_act(a.act, gv, uv);
      } else {
        v = tile_value(sm, ks_count, il, c) + (bias ? to_f32(bias[i]) : 0.0f);
        v = plain_act(a.act, v);
      }
      h[int64_t(sm.pair[c]) * a.I + i] = from_f32<T>(v);
    }
    __syncthreads();  // the tables and partial tiles are rewritten by the next pass
  }
  if (a.h_quant_in_down) return;  // decode_down quantizes the h rows it stages
  // The last block of this 128-wide group of h (for this expert) quantizes the group's rows.
  const int per_group = kQuantGroup / BI, grp = i0 / kQuantGroup;
  const int first = grp * per_group, n_blocks = int(gridDim.x);
  const int in_group = min(n_blocks, first + per_group) - first;
  __threadfence();
  __syncthreads();
  if (tid == 0) {
    int* ctr = a.up_ctr + int64_t(b) * a.gI + grp;
    const int prev = atomicAdd(ctr, 1);
    sm.last = prev == in_group - 1;
    if (sm.last) *ctr = 0;  // ready for the next forward (graph replay)
  }
  __syncthreads();
  if (!sm.last) return;
  __threadfence();
  const int warp = tid >> 5, lane = tid & 31;
  for (int r = r_begin + warp; r < r_end; r += WARPS) {
    const int p = __ldg(a.pairs + r);
    quantize_group_warp<T>(h + int64_t(p) * a.I, a.I, grp, a.hq + int64_t(p) * a.Ip, a.hs + int64_t(p) * a.gI + grp, lane);
  }
}

// ---- 3. down projection ------------------------------------------------------------------------
template <class T, int NT, bool kStaged, bool kTma>
__global__ void __launch_bounds__(THREADS, decode_min_blocks(NT, false))
    decode_down(DecodeParams a, int ks_count, const __grid_constant__ CUtensorMap wmap) {
  __shared__ TileSmem<NT> sm;
  __shared__ int rows_of_m[16 * WARPS];
  const int b = blockIdx.y, tid = threadIdx.x;
  const int BM = 16 * (WARPS / ks_count), n0 = int(blockIdx.x) * BM, n1 = min(a.H, n0 + BM);
  if (tid < BM) rows_of_m[tid] = min(n0 + tid, a.H - 1);
  // Before pdl_wait: decode_prep's plan (two kernels back: decode_up released its dependents only
  // after its own wait), the warp's weight rows and the first two stages of loads.
  // (four independent loads: b < slots, so every address is inside the plan). Without early_plan
  // everything waits for decode_up first.
  if (!a.early_plan) pdl_wait();
  const int n_hit = __ldcg(a.n_hit);
  const int e = __ldcg(a.hit_expert + b), r_begin = __ldcg(a.slot_off + b), r_end = __ldcg(a.slot_off + b + 1);
  __syncthreads();  // rows_of_m
  if (b >= n_hit) return;  // (block-uniform; the combine writes the output of dropped slots)
  WarpTile<NT> wt;
  tile_setup<NT>(wt, a.down, e, rows_of_m, a.I, ks_count);
  if constexpr (kTma) {
    const size_t staged = !kStaged ? 0 : a.h_quant_in_down ? staged_h_smem_bytes(NT, a.I, sizeof(T)) : staged_smem_bytes(NT, a.I);
    ring_tma_init(wt.ring, dynamic_smem(), staged, a.ring_stages, a.ring_kbs, a.ring_scale_steps, &wmap, e, wt.row0, wt.row1);
    ring_tma_prologue(wt.ring, wt.kb0, wt.kb1, false);
    ring_stage_scales(wt.ring, wt.t, wt.kb0, wt.kb1);
  } else {
    ring_prologue<NT>(wt.t, wt.kb0, wt.kb1, wt.s0, wt.s1);
  }
  if (a.early_plan) pdl_wait();  // decode_up's h
  pdl_launch_dependents();
  const T* bias = a.down_bias ? static_cast<const T*>(a.down_bias) + int64_t(e) * a.H : nullptr;
  for (int r = r_begin; r < r_end; r += 8 * NT) {
    const int ncols = min(8 * NT, r_end - r);
    set_columns(sm, a, r, ncols, false);
    if (r != r_begin) {
      if constexpr (kTma) ring_tma_prologue(wt.ring, wt.kb0, wt.kb1, true);
      else ring_prologue<NT>(wt.t, wt.kb0, wt.kb1, wt.s0, wt.s1);
    }
    if constexpr (kStaged) {
      uint8_t* s_act = dynamic_smem();
      float* s_act_s = reinterpret_cast<float*>(s_act + 8 * NT * staged_stride(a.I));
      if (a.h_quant_in_down) {
        T* raw = reinterpret_cast<T*>(s_act + staged_smem_bytes(NT, a.I));
        stage_h_quantized<T, NT>(sm, s_act, s_act_s, raw, static_cast<const T*>(a.h), a.I, ncols);
      } else {
        stage_activations<NT>(sm, s_act, s_act_s, a.hq, a.hs, a.I, ncols);
      }
      tile_finish<NT, true, kTma>(sm, wt, s_act, s_act_s, staged_stride(a.I), ncols);
    } else {
      tile_finish<NT, false, kTma>(sm, wt, a.hq, a.hs, a.Ip, ncols);
    }
    for (int item = tid; item < BM * ncols; item += THREADS) {
      const int m = item / ncols, c = item % ncols, n = n0 + m;
      if (n >= a.H) continue;
      a.y[int64_t(sm.pair[c]) * a.H + n] = tile_value(sm, ks_count, m, c) + (bias ? to_f32(bias[n]) : 0.0f);
    }
    __syncthreads();
  }
}

// ---- host side -------------------------------------------------------------------------------
// The path's A/B switches (MOEX_CUDA_FP8_DECODE_*) are read at every launch, like
// MOEX_CUDA_FP8_DECODE itself, so that one process (the tests) can run each variant.
const char* decode_env(const char* name) {
  const char* s = std::getenv(name);
  return s && *s ? s : nullptr;
}
bool decode_env_is(const char* name, const char* value) {
  const char* s = decode_env(name);
  return s && std::strcmp(s, value) == 0;
}

int sm_count() {
  static int n = [] {
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
      cudaGetLastError();
      return 132;
    }
    return v;
  }();
  return n;
}

// K slices per block: split the k blocks of each m16 tile over more warps (smaller column blocks,
// more blocks) until the target number of blocks is reached, keeping >= 2 k blocks per warp.
// Target: one block per SM at NT = 1 (measured on the H200, 2026-12-01: at T = 1 a second,
// partial wave of blocks cost more than the longer k loops; no change at T = 8 / 64), two at
// NT = 4 (fewer blocks were slower there). MOEX_CUDA_FP8_DECODE_BLOCKS=n sets n per SM (A/B).
int choose_ks(int64_t slots, int64_t out_rows, int nt, int64_t k_blocks) {
  const char* blocks = decode_env("MOEX_CUDA_FP8_DECODE_BLOCKS");
  const int64_t per_sm_env = blocks && std::atoi(blocks) > 0 ? int64_t(std::atoi(blocks)) : int64_t(0);
  const int64_t per_sm = per_sm_env > 0 ? per_sm_env : nt == 1 ? 1 : 2;
  const int64_t target = per_sm * int64_t(sm_count());
  int ks = 1;
  while (ks < WARPS && k_blocks >= 4 * ks) {
    const int64_t bm = 16 * (WARPS / ks);
    if (slots * ceil_div(out_rows, bm) >= target) break;
    ks *= 2;
  }
  return ks;
}

// MOEX_CUDA_FP8_DECODE_KS_UP=n (A/B): decode_up's k slices per m16 tile forced to n (1, 2, 4 or 8; halved
// while n > k_blocks, so that every warp keeps at least one k block), else `chosen`. Built to test whether, at
// T = 1 on the qwen shapes, ks = 1 (decode_up on 96 SMs, one block each, so that every decode_down block is
// resident early) pays: on an H100 (fifty-first session, docs/PERF.md) it is 1.4-1.8 µs slower — each warp's
// 16 k blocks of arithmetic after the wait outweigh the early down blocks. The k slices are summed in
// another grouping: not bit-identical to the default split.
int forced_ks(const char* env, int64_t k_blocks, int chosen) {
  const char* v = decode_env(env);
  if (!v) return chosen;
  int ks = std::atoi(v);
  MOEX_CHECK(ks == 1 || ks == 2 || ks == 4 || ks == 8, "{}={}: expected 1, 2, 4 or 8 k slices", env, v);
  while (ks > 1 && k_blocks < ks) ks /= 2;  // every warp keeps at least one k block
  return ks;
}

struct Carved {
  uint8_t* xq;
  float* xs;
  void* h;
  uint8_t* hq;
  float* hs;
  float* y;
  int* plan;  // n_hit, hit_expert, slot_off, pairs, counters
};

int64_t plan_ints(int64_t S, int64_t slots, int64_t gI, int64_t H) {
  return 1 + slots + (slots + 1) + 2 * S + slots * gI;
}

Carved carve(void* base, size_t capacity, int64_t T, int64_t S, int64_t slots, int64_t H, int64_t I, size_t esz) {
  WorkspaceCarver ws(base, capacity);
  Carved c;
  c.xq = static_cast<uint8_t*>(ws.take_bytes(size_t(T * padded_k(int(H)))));
  c.xs = ws.take<float>(size_t(T * quant_groups(H)));
  c.h = ws.take_bytes(size_t(S * I) * esz);
  c.hq = static_cast<uint8_t*>(ws.take_bytes(size_t(S * padded_k(int(I)))));
  c.hs = ws.take<float>(size_t(S * quant_groups(I)));
  c.y = ws.take<float>(size_t(S * H));
  c.plan = ws.take<int>(size_t(plan_ints(S, slots, quant_groups(I), H)));
  return c;
}

// Largest staged activation tile per block: 2 blocks per SM at NT = 1 (each keeps < 100 KB), one
// at NT = 4. MOEX_CUDA_FP8_DECODE_STAGE=0 never stages (A/B measurement).
size_t staged_limit(int nt) {
  const bool on = !decode_env_is("MOEX_CUDA_FP8_DECODE_STAGE", "0");
  return on ? (nt == 1 ? size_t(72) << 10 : size_t(160) << 10) : 0;
}

// Dynamic shared memory: the kernels' attribute, and what leaves two blocks per SM (NT = 1).
constexpr size_t kDecodeSmemMax = size_t(160) << 10, kDecodeSmemTwoBlocks = size_t(104) << 10;

// The deepest ring of at most n stages beside act_bytes of staged rows within the kernels' 160 KB of
// dynamic shared memory (0: none fits).
int ring_stages_within(size_t act_bytes, int n) {
  while (n > 2 && act_bytes + ring_smem_bytes(n) > kDecodeSmemMax) --n;
  return act_bytes + ring_smem_bytes(n) <= kDecodeSmemMax ? n : 0;
}

// The TMA ring's stages for a kernel with act_bytes of staged rows, `grid` blocks and k slices of up
// to k_blocks 128-k blocks per warp; 0 = the register ring. MOEX_CUDA_FP8_DECODE_TMA: "0" always the
// register ring; "1" the TMA ring wherever it can run (tests, A/B); unset: where most of each warp's
// weights are requested before pdl_wait — a k slice of at most twice the stages, every block
// resident while the previous kernel runs (one wave of two blocks per SM) — with 4 stages. Measured
// on an H100 (2026-12-06, forty-eighth session, docs/PERF.md): T = 1 on the qwen shapes (8 / 6 k
// blocks per warp) 4-11 % faster than the register ring; slower where it streams long k slices
// (mixtral's down projection at T = 1, 28 per warp: +2-5 %), runs several waves (T = 8: +5-7 %) or
// has more stages (5-8: +2 %); 3 stages about the same as 4. MOEX_CUDA_FP8_DECODE_TMA_STAGES=n sets n (2-8).
int tma_ring_stages(size_t act_bytes, dim3 grid, int k_blocks) {
  const bool forced = decode_env("MOEX_CUDA_FP8_DECODE_TMA") != nullptr;  // "1" ("0" never gets here: launch_typed)
  const char* stages = decode_env("MOEX_CUDA_FP8_DECODE_TMA_STAGES");
  int n = stages ? std::clamp(std::atoi(stages), 2, kRingMaxStages) : 4;
  if (!forced) {
    const bool one_wave = int64_t(grid.x) * grid.y <= 2 * int64_t(sm_count());
    return one_wave && k_blocks <= 2 * n && act_bytes + ring_smem_bytes(n) <= kDecodeSmemTwoBlocks ? n : 0;
  }
  return ring_stages_within(act_bytes, n);
}

// The tensor map of a weight tensor's codes for the TMA ring: [E, N, K] bytes (rows K bytes apart,
// experts data_stride apart), box 128 codes × 8 rows × 1 expert; zeros past K and past N. False where
// the driver cannot encode it (the path then keeps the register ring instead of failing).
bool ring_map(const QuantWeights& w, int64_t E, CUtensorMap& map, int kbs = 1) {
  const cuuint64_t dims[3] = {cuuint64_t(w.K), cuuint64_t(w.N), cuuint64_t(E)};
  const cuuint64_t strides[2] = {cuuint64_t(w.K), cuuint64_t(w.data_stride)};
  const cuuint32_t box[3] = {cuuint32_t(kQuantGroup * kbs), 8u, 1u};
  return tma::try_make_map(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, w.data, 3, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_NONE) ==
         CUDA_SUCCESS;
}

// The 160 KB dynamic shared-memory attribute of one kernel (called once per kernel).
template <class Kernel>
bool check_attr(Kernel kernel) {
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kDecodeSmemMax)), "decode kernel attribute");
  return true;
}

// One GEMV kernel of the path: the staged instantiation where the pass' activation rows fit in
// shared memory, else the plain one; each with the TMA ring (tma and tma_ring_stages > 0, or
// force_stages > 0: that many stages where they fit; the tensor map of w encoded only then) or the
// register ring. The attribute for > 48 KB of dynamic shared memory is set once per kernel.
template <auto kPlain, auto kStaged, auto kPlainTma, auto kStagedTma>
void launch_gemv(const char* what, int nt, size_t smem, dim3 grid, const DecodeParams& p, int ks, int k_blocks,
                 const QuantWeights& w, bool tma, cudaStream_t stream, int force_stages = 0) {
  static const bool attr_set = check_attr(kStaged) && check_attr(kPlainTma) && check_attr(kStagedTma);
  (void)attr_set;
  const bool staged = smem <= staged_limit(nt);
  const size_t act_bytes = staged ? smem : 0;
  const int stages = !tma ? 0
                     : force_stages > 0 ? ring_stages_within(act_bytes, force_stages)
                                        : tma_ring_stages(act_bytes, grid, int(ceil_div(k_blocks, ks)));
  CUtensorMap map{};  // the register-ring kernels do not read theirs
  // Stages of two k blocks: 8-row × 256-byte boxes, the same bytes in flight as twice the stages of one
  // block. Measured on an H100 (2026-12-06, forty-ninth session, calls 3-4, CUDA-graph replay): T = 1
  // qwen3_30b_a3b 0.0237-0.0240 ms against 0.0245-0.0250, qwen15_moe_a2_7b 0.0237-0.0239 against 0.0246-0.0251;
  // T = 8 unchanged. MOEX_CUDA_FP8_DECODE_TMA_BOX=128: stages of one k block (A/B).
  const int kbs = decode_env_is("MOEX_CUDA_FP8_DECODE_TMA_BOX", "128") ? 1 : 2;
  if (stages > 0 && ring_map(w, p.E, map, kbs)) {
    DecodeParams q = p;
    q.ring_stages = std::max(1, stages / kbs);
    q.ring_kbs = kbs;
    // The warps' block scales staged before pdl_wait, where they fit (with the 256-byte boxes: qwen15 T = 1
    // 0.0233 ms against 0.0237, qwen3 0.0239 against 0.0240, H100, same session, call 4; alone 0-4 % in calls
    // 2-3). MOEX_CUDA_FP8_DECODE_TMA_SCALES=0: loaded in the k loop, one block ahead (A/B).
    const int slice = int(ceil_div(k_blocks, ks));
    const size_t ring = act_bytes + ring_smem_bytes(q.ring_stages * kbs);
    // (within the 104 KB that keep two blocks per SM where the ring's rule chose it; 160 KB where forced)
    const size_t limit = decode_env("MOEX_CUDA_FP8_DECODE_TMA") || force_stages > 0 ? kDecodeSmemMax : kDecodeSmemTwoBlocks;
    q.ring_scale_steps = !decode_env_is("MOEX_CUDA_FP8_DECODE_TMA_SCALES", "0") && ring + ring_scale_bytes(slice) <= limit ? slice : 0;
    launch_pdl(what, staged ? kStagedTma : kPlainTma, grid, dim3(THREADS), ring + ring_scale_bytes(q.ring_scale_steps), stream, q,
               ks, map);
    return;
  }
  launch_pdl(what, staged ? kStaged : kPlain, grid, dim3(THREADS), act_bytes, stream, p, ks, map);
}

// MOEX_CUDA_FP8_DECODE_TMA_WIDE=1 (A/B, NT = 1 with the TMA ring): decode_up with every weight byte
// requested before pdl_wait — k slices of at most 4 blocks (the ring's depth: more, shorter slices),
// activations unstaged, three blocks per SM (a 4-stage ring of 64 KB each), where the grid is one
// wave of those; ks = 0 where it does not apply. Why: what the TMA ring buys at T = 1 is the bytes
// requested before the wait, half of decode_up's at two blocks per SM. Measured on an H100 (2026-12-06,
// forty-eighth session, call 5): qwen15_moe_a2_7b T = 1 0.0231 ms against the default's 0.0244, qwen3_30b_a3b
// 0.0236 against 0.0236; other slices sum in another grouping (not bit-identical to the default), so it
// stays opt-in until timed on the H200.
struct WideUp {
  int ks = 0;
  dim3 grid;
};
WideUp wide_up(const DecodeParams& p, bool gated) {
  WideUp w;
  if (!decode_env_is("MOEX_CUDA_FP8_DECODE_TMA_WIDE", "1")) return w;
  int ks = 1;
  while (ks < WARPS && ceil_div(p.gH, ks) > 4) ks *= 2;
  if (ceil_div(p.gH, ks) > 4 || p.gH < ks) return w;
  const int bm = 16 * (WARPS / ks), bi = gated ? bm / 2 : bm;
  const dim3 grid(unsigned(ceil_div(p.I, bi)), unsigned(p.slots));
  if (int64_t(grid.x) * grid.y > 3 * int64_t(sm_count())) return w;
  w.ks = ks;
  w.grid = grid;
  return w;
}

template <class T>
void launch_typed(const DecodeParams& p, DType dtype, int nt, int ks_up, int ks_down, cudaStream_t stream) {
  const int64_t prep_blocks = 1 + ceil_div(int64_t(p.T) * p.gH, WARPS);
  MOEX_CHECK(prep_blocks < (int64_t(1) << 31), "FP8 decode path: {} tokens are too many", p.T);
  launch_pdl("decode_prep", decode_prep<T>, dim3(unsigned(prep_blocks)), dim3(THREADS), 0, stream, p);
  const bool gated = p.up_epi != Epi::up_plain;
  const int bm_up = 16 * (WARPS / ks_up), bi = gated ? bm_up / 2 : bm_up;
  const dim3 g_up(unsigned(ceil_div(p.I, bi)), unsigned(p.slots));
  const dim3 g_down(unsigned(ceil_div(p.H, 16 * (WARPS / ks_down))), unsigned(p.slots));
  const size_t smem_up = staged_smem_bytes(nt, p.H);
  const size_t smem_down = p.h_quant_in_down ? staged_h_smem_bytes(nt, p.I, sizeof(T)) : staged_smem_bytes(nt, p.I);
  if (nt == 1) {
    // the TMA ring: compute capability 9.0 with the driver's tensor-map encoder, not switched off
    const bool tma_ok = current_device_cc() == 90 && tma::encode_fn() != nullptr && !decode_env_is("MOEX_CUDA_FP8_DECODE_TMA", "0");
    const WideUp wide = tma_ok ? wide_up(p, gated) : WideUp{};
    CUtensorMap up_map{};
    if (wide.ks > 0 && ring_map(p.up, p.E, up_map)) {
      static const bool attr_set = check_attr(decode_up<T, 1, false, true, true>);
      (void)attr_set;
      DecodeParams q = p;
      q.ring_stages = 4;
      q.ring_kbs = 1;
      launch_pdl("decode_up", decode_up<T, 1, false, true, true>, wide.grid, dim3(THREADS), ring_smem_bytes(4), stream, q,
                 wide.ks, up_map);
    } else {
      launch_gemv<decode_up<T, 1, false, false>, decode_up<T, 1, true, false>, decode_up<T, 1, false, true>,
                  decode_up<T, 1, true, true>>("decode_up", 1, smem_up, g_up, p, ks_up, p.gH, p.up, tma_ok, stream);
    }
    // the wide form: decode_down's ring as deep as its k slice (<= 8 stages) where its grid is one
    // wave of one block per SM
    const int down_slice = int(ceil_div(p.gI, ks_down));
    const bool down_wide = wide.ks > 0 && int64_t(g_down.x) * g_down.y <= int64_t(sm_count());
    launch_gemv<decode_down<T, 1, false, false>, decode_down<T, 1, true, false>, decode_down<T, 1, false, true>,
                decode_down<T, 1, true, true>>("decode_down", 1, smem_down, g_down, p, ks_down, p.gI, p.down, tma_ok, stream,
                                               down_wide ? std::clamp(down_slice, 4, kRingMaxStages) : 0);
  } else {
    launch_gemv<decode_up<T, 4, false, false>, decode_up<T, 4, true, false>, decode_up<T, 4, false, false>,
                decode_up<T, 4, true, false>>("decode_up", 4, smem_up, g_up, p, ks_up, p.gH, p.up, false, stream);
    launch_gemv<decode_down<T, 4, false, false>, decode_down<T, 4, true, false>, decode_down<T, 4, false, false>,
                decode_down<T, 4, true, false>>("decode_down", 4, smem_down, g_down, p, ks_down, p.gI, p.down, false, stream);
  }
  // 4. the slot-order sum: combine.cu's kernel, y rows indexed by pair (pair_row), as a PDL link
  CombineArgs c{};
  c.y = p.y;
  c.pair_to_row = p.pair_row;
  c.idx = p.idx;
  c.idx64 = p.idx64;
  c.topw = p.topw;
  c.topw_code = p.topw_code;
  c.down_bias = nullptr;  // added by decode_down
  c.T = p.T;
  c.K = p.K;
  c.H = p.H;
  c.out = p.out;
  launch_combine(c, dtype, stream, /*pdl=*/true);
}

}  // namespace

// MOEX_CUDA_FP8_DECODE: "0" never takes this path, "1" takes it at any T (tests), unset: T <= 64.
int quant_decode_mode() {
  const char* s = std::getenv("MOEX_CUDA_FP8_DECODE");
  if (s && *s) return std::strcmp(s, "0") == 0 ? 0 : 1;
  return -1;
}

bool quant_decode_shape_ok(const ExpertsSpec& s, int64_t T, int64_t K, bool tensor_core_alternative) {
  const QuantSpec& q = s.quant;
  if (q.kind != QuantKind::fp8_block || q.block_k != kQuantGroup || s.transposed) return false;
  if (s.hidden % 16 != 0 || s.intermediate % 16 != 0 || s.num_experts > kDecodeMaxExperts) return false;
  const int mode = quant_decode_mode();
  if (mode == 0) return false;
  if (mode == 1) return true;
  return T <= kDecodeMaxTokens && !(tensor_core_alternative && decode_many_pairs(T, K, s.num_experts));
}

size_t quant_decode_workspace(int64_t T, int64_t K, int64_t E, int64_t H, int64_t I, size_t esz) {
  const int64_t S = T * K, slots = std::min(S, E);
  return bytes_of(T * padded_k(int(H)), 1) + bytes_of(T * quant_groups(H), 4) + bytes_of(S * I, esz) +
         bytes_of(S * padded_k(int(I)), 1) +
         bytes_of(S * quant_groups(I), 4) + bytes_of(S * H, 4) + bytes_of(plan_ints(S, slots, quant_groups(I), H), 4);
}

bool quant_decode_usable(const QuantDecodeArgs& a) {
  return a.T > 0 && aligned16(a.up.data) && aligned16(a.down.data) && a.up.data_stride % 16 == 0 &&
         a.down.data_stride % 16 == 0 && current_device_cc() >= 89 && a.T * a.K < (int64_t(1) << 30) &&
         a.ws_bytes >= quant_decode_workspace(a.T, a.K, a.E, a.H, a.I, dtype_size(a.dtype));
}

void launch_quant_decode(const QuantDecodeArgs& a, cudaStream_t stream) {
  if (a.T == 0) return;
  const int64_t S = a.T * a.K, slots = std::min<int64_t>(S, a.E);
  const Carved c = carve(a.ws, a.ws_bytes, a.T, S, slots, a.H, a.I, dtype_size(a.dtype));
  DecodeParams p{};
  p.hidden = a.hidden;
  p.idx = a.idx;
  p.idx64 = a.idx64;
  p.topw = a.topw;
  p.topw_code = a.topw_code;
  p.up = a.up;
  p.down = a.down;
  p.up_bias = a.up_bias;
  p.down_bias = a.down_bias;
  p.up_epi = a.up_epi;
  p.act = a.act;
  p.T = int(a.T);
  p.K = int(a.K);
  p.E = int(a.E);
  p.H = int(a.H);
  p.I = int(a.I);
  p.R = int(a.up.N);
  p.S = int(S);
  p.slots = int(slots);
  p.gH = int(quant_groups(a.H));
  p.gI = int(quant_groups(a.I));
  p.Hp = padded_k(p.H);
  p.Ip = padded_k(p.I);
  p.xq = c.xq;
  p.xs = c.xs;
  p.h = c.h;
  p.hq = c.hq;
  p.hs = c.hs;
  p.y = c.y;
  p.n_hit = c.plan;
  p.hit_expert = p.n_hit + 1;
  p.slot_off = p.hit_expert + slots;
  p.pairs = p.slot_off + slots + 1;
  p.pair_row = p.pairs + S;
  p.up_ctr = p.pair_row + S;
  p.n_ctr = int(slots * p.gI);
  p.out = a.out;
  MOEX_CHECK(slots <= 65535, "FP8 decode path: {} expert slots exceed the grid limit", slots);
  // Rows per pass: 8 (one n8 tile) when T <= 8 (an expert gets at most one row per token with
  // distinct top-k experts) or when the hit experts average <= 5 rows (deepseek / qwen shapes at
  // T = 64: few experts need a second pass, and the NT = 1 kernel runs 2 blocks per SM, 64 KB of
  // loads in flight); else 32 rows (mixtral at T = 64: ~16 rows per expert).
  const int nt = a.T <= 8 || S <= 5 * slots ? 1 : 4;
  const int ks_up = forced_ks("MOEX_CUDA_FP8_DECODE_KS_UP", p.gH, choose_ks(slots, a.up.N, nt, p.gH));
  const int ks_down = choose_ks(slots, a.H, nt, p.gI);
  // Who quantizes h: decode_down while staging it at T <= 8 (decode_up then has no counters and
  // no last-block work: its one or two waves would end on that tail), decode_up's last blocks
  // above (every down column block of a slot would quantize the same rows again: at T = 64 that
  // cost 3-4 % on the H200, 2026-12-01). Only where the raw rows fit beside the staged codes.
  // MOEX_CUDA_FP8_DECODE_HQ=up|down forces one (A/B measurement, tests).
  const char* hq = decode_env("MOEX_CUDA_FP8_DECODE_HQ");
  const bool hq_fits = staged_h_smem_bytes(nt, p.I, dtype_size(a.dtype)) <= staged_limit(nt);
  const bool hq_down = hq && std::strcmp(hq, "up") == 0 ? false : hq && std::strcmp(hq, "down") == 0 ? true : a.T <= 8;
  p.h_quant_in_down = hq_fits && hq_down;
  // decode_up and decode_down read the routing / the plan before pdl_wait (both written at least
  // two kernels back; measured 2-9 % faster at T = 1 on the H200, 2026-12-01).
  // MOEX_CUDA_FP8_DECODE_EARLY=0 reads them after it (A/B measurement, debugging).
  p.early_plan = !decode_env_is("MOEX_CUDA_FP8_DECODE_EARLY", "0");
  switch (a.dtype) {
    case DType::f32: launch_typed<float>(p, a.dtype, nt, ks_up, ks_down, stream); break;
    case DType::f16: launch_typed<__half>(p, a.dtype, nt, ks_up, ks_down, stream); break;
    case DType::bf16: launch_typed<__nv_bfloat16>(p, a.dtype, nt, ks_up, ks_down, stream); break;
    default: detail::fail(ErrorCode::internal, "FP8 decode path: unexpected dtype {}", dtype_name(a.dtype));
  }
}

}  // namespace moex::cuda
