// model/cuda_forward.cu — see cuda_forward.hpp.
#include "model/cuda_forward.hpp"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <utility>

#include "backends/cuda/cuda_common.cuh"
#include "model/cuda_attention.cuh"
#include "model/cuda_kernels.cuh"
#include "model/reference_forward.hpp"
#include "moex/backend.hpp"
#include "moex/safetensors.hpp"

namespace moex::model {

namespace {

namespace kern = ::moex::model::cuda;
using ::moex::cuda::check;
using ::moex::cuda::DeviceGuard;

void blas_check(cublasStatus_t st, const char* what) {
  if (st == CUBLAS_STATUS_SUCCESS) return;
  if (st == CUBLAS_STATUS_ALLOC_FAILED) detail::fail(ErrorCode::out_of_memory, "out of GPU memory in {}", what);
  detail::fail(ErrorCode::internal, "cuBLAS error in {}: {}", what, cublasGetStatusString(st));
}

int code_of(DType dt) {
  MOEX_CHECK(dt == DType::f32 || dt == DType::f16 || dt == DType::bf16, "CUDA model runtime: unsupported dtype {}",
             dtype_name(dt));
  return ::moex::cuda::dtype_code(dt);
}
cudaDataType blas_type(DType dt) { return dt == DType::f32 ? CUDA_R_32F : dt == DType::f16 ? CUDA_R_16F : CUDA_R_16BF; }

// A dense linear on the device: y = x · Wᵀ + b; W [out, in] in the model dtype, b f32 [out] or null.
struct DLinear {
  const void* w = nullptr;
  DType dt = DType::f32;
  int64_t out = 0, in = 0;
  const float* bias = nullptr;
  bool defined() const { return w != nullptr; }
  size_t bytes() const { return size_t(out * in) * dtype_size(dt); }
};

struct DLayer {
  const float *input_norm = nullptr, *post_norm = nullptr;
  // GQA: q, k, v fused as one [(nh + 2 nkv) hd, H] projection
  DLinear qkv, o;
  const float *q_norm = nullptr, *k_norm = nullptr;
  const float* sinks = nullptr;
  int window = 0;
  // MLA
  DLinear q_a, q_b, q, kv_a, kv_b;
  const float *q_a_norm = nullptr, *kv_a_norm = nullptr;
  // MLP
  bool is_moe = false;
  DLinear gate_up, down;  // dense MLP, gate and up fused [2I, H]
  DLinear router;
  const float* correction_bias = nullptr;
  Experts experts;
  DLinear shared_gate_up, shared_down, shared_gate;
};

// The rows of one sequence in a prefill step (positions 0 .. n-1, cache slot `slot`).
struct Segment {
  int64_t row0 = 0, n = 0, slot = 0;
};

// Smallest prefill length (rows of every sequence) that takes the GEMM attention path on bf16/f16
// models; MOEX_CUDA_ATTENTION_GEMM_MIN_ROWS overrides (0 = never). Sequences longer than
// kGemmAttentionMaxRows keep the kernel (the scores of a kv-head group are materialised).
constexpr int64_t kGemmAttentionMaxRows = 4096;
int64_t gemm_attention_min_rows() {
  const char* e = std::getenv("MOEX_CUDA_ATTENTION_GEMM_MIN_ROWS");
  return e ? std::atoll(e) : 64;
}
// The fused attention kernels (cuda_attention.cuh): flash-decoding for one-row tiles, flash
// attention for the bf16/f16 prefill. MOEX_CUDA_ATTENTION_FLASH=0 selects the previous paths
// (attention_kernel; cuBLAS + softmax_rows). Read per step, so tests can switch it per call.
bool flash_attention_enabled() {
  const char* e = std::getenv("MOEX_CUDA_ATTENTION_FLASH");
  return !e || std::string(e) != "0";
}

struct Buffers {
  Tensor qb, kb, vb, scores, probs;  // GEMM attention: q/k/v in the model dtype, S f32 and P per kv-head group
  Tensor x, h, split, gout, lm_g, qkv, q, attn, qa, ckv, kvn, kvb, rlogits, idx, wts, xout, gu, act, sgate;
  Tensor ids, pos, slot, tiles, out_rows, fin, logits, next;
  // zero-initialised counters/partials of the kernels that finish in their last block: the router
  // ticket (u32, 16 bytes), then the argmax scratch; every kernel leaves its counters at zero
  Tensor sync;
  Tensor dec_partial, dec_counters;  // flash-decoding: per-chunk partials, merge tickets (kept zero)
  std::vector<Tensor> k_cache, v_cache;
};

}  // namespace

struct CudaModel::Impl {
  TextConfig t;
  Device dev;
  DType dt = DType::f32;
  int dtc = 0;
  // The KV cache's elements: 2 (bf16) for bf16 models whose head dims are multiples of 8 — the
  // reference library's cache is in the model dtype, and the prefill attention reads bf16 keys and
  // values anyway — else 0 (f32; f16 models too). MOEX_CUDA_KV_CACHE=f32 keeps it f32.
  int kv_dtype = 0;
  bool mla = false;
  int64_t H = 0, V = 0, nh = 0, nkv = 0, hd = 0, dq = 0, dv = 0, kv_heads = 0;
  std::vector<Tensor> owned;  // device storage of everything uploaded
  const void* embed = nullptr;
  DLinear lm_head;
  const float* final_norm = nullptr;
  std::vector<DLayer> layers;
  kern::RopeParams rope;
  double attn_scaling = 1.0;
  int64_t max_in = 1, max_out = 1, max_mlp = 1;
  bool any_f32_linear = false;  // an f32 linear reads its f32 input itself (no split terms)

  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  Tensor blas_ws;
  std::unique_ptr<Workspace> ws;
  int64_t cap_batch = 0, cap_len = 0, cap_rows = 0, cap_out = 0;
  Buffers b;
  void* host_stage = nullptr;  // pinned: ids, pos, slot, tiles, out_rows of one step
  size_t host_stage_bytes = 0;
  std::map<std::pair<int64_t, std::string>, cudaGraphExec_t> graphs;
  std::set<std::pair<int64_t, std::string>> warmed;
  void* graphs_ws = nullptr;  // the experts workspace the graphs were captured with
  CudaGenerateStats stats;
  // the skinny-linear kernel for steps of at most kGemvMaxRows rows (MOEX_CUDA_GEMV=0: cuBLAS always)
  bool gemv_enabled = true;
  // decode steps: q/k norm, RoPE and the KV-cache write done by the decode attention kernel
  // (MOEX_CUDA_FUSE_QKV_POST=0: by qkv_post_kernel first)
  bool fuse_qkv_post = true;
  // decode attention: chunks that end before pos request their first tile (and the RoPE table is
  // computed) before waiting for the qkv GEMV (MOEX_CUDA_DECODE_EARLY=0: after it; H200, 2026-12-03:
  // batch 1 -0.07 ms / step, batch 8 -0.14, docs/PERF.md twenty-seventh session)
  bool decode_early = true;
  // the norms and the decode attention's q/k norm read their (constant) weights before their PDL
  // wait instead of after their reduction (MOEX_CUDA_WEIGHTS_EARLY=0: after it; H200, 2026-12-04:
  // batch 1 -0.16 ms / step, batch 8 -0.14, docs/PERF.md thirty-fourth session)
  bool weights_early = true;
  // batch-1 decode steps: the post-attention RMSNorm inside the router's cluster kernel — one kernel
  // fewer per MoE layer on the step's latency chain, the same bits (MOEX_CUDA_FUSE_POST_NORM=0: the
  // separate RMSNorm kernel; =all: at every step of <= 8 rows). H100, 2026-12-06 (docs/PERF.md,
  // forty-seventh session): batch 1 -0.05 ms / step; at batch 8, where each of the 8 CTAs normalises
  // the 8 rows one after the other, +0.49 ms. (H200, twenty-sixth session, older kernels: +0.04 ms at
  // batch 1 — to be A/B'd there again.) The input norm inside the qkv GEMV the same way: +0.63 ms at
  // batch 1, removed.
  int fuse_post_norm = 1;  // 0: never, 1: one-row steps, 2: steps of <= kGemvMaxRows rows
  // batch-1 decode steps: the input RMSNorm of a layer after an MoE layer done by the qkv GEMV itself — every warp
  // reads the whole row anyway, so it adds the experts' output, sums the squares and scales its dot product
  // (kern::GemvFuse; not the RMSNorm kernel's bits, the same values to f32 rounding) — and the residual add by the
  // o projection: one kernel and one hand-off fewer per layer. Unlike the forty-seventh session's form (every
  // block normalising the row bit for bit before its dot products: +0.63 ms), nothing waits for a block-wide
  // reduction — and still slower: the 48-layer model's batch-1 step 3.62–3.63 ms against 3.57–3.58 (H100,
  // 2026-12-07, three interleaved rounds; docs/PERF.md, fifty-eighth session; not traced — presumably the GEMV's
  // extra loads and the bounded kernel's spills cost more than the hand-off). Opt-in (MOEX_CUDA_FUSE_IN_NORM=1).
  bool fuse_in_norm = false;
  // the q/k/v post-processing issues every load of a head before its arithmetic
  // (MOEX_CUDA_POST_LOADS_FIRST=0: the loop form)
  bool post_loads_first = true;
  // the warp routers scan 16 values per lane whatever the expert count (MOEX_CUDA_ROUTE_WIDE=1; the
  // layout before the thirty-fourth session: A/B measurement)
  bool route_wide = false;
  // decode attention: a row's key chunks as one thread-block cluster merged through distributed
  // shared memory (MOEX_CUDA_DECODE_CLUSTER): 0 never; 1 (default) where the split bound is at most 7
  // (short KV capacities: one cluster of `splits` CTAs per row); 2 at every split count, rounded down
  // to whole clusters of 8, rows of more than 8 chunks by ticket. H200, 2026-12-03 (docs/PERF.md,
  // twenty-eighth session): clusters of 7 gain 0.06-0.08 ms / step at batch 1 and tie at batch 8;
  // clusters of 8 (mode 2 at a 2 113-key capacity) gain 0.01-0.04 ms at batch 1 but lose 0.38-0.44
  // ms at batch 8, not understood yet
  int decode_cluster = 1;
  // Terms of x in the cuBLAS linears of bf16/f16 models (MOEX_CUDA_LINEAR_TERMS): 1 = bf16(x) only
  // (the default: the reference library's rounding; half the FLOPs, and no finishing kernel without
  // bias/gate), 2 = x ≈ hi + lo (~16 mantissa bits, the CPU runtime's split; a GEMM of 2T columns).
  // H200, 2026-11-29: one term ran the 48-layer Qwen3-30B-A3B prefill of 2048 tokens in 46.9 ms
  // instead of 54.7, and every fixture's bf16 logits stay within SPEC §8's bound (worst 1.13e-2
  // against a bound of 3e-2: CudaModelLinear.OneTermLinearsWithinTheSpecBound).
  int linear_terms = 1;
  int num_sms = 1;
  // Measurement only (MOEX_CUDA_DEBUG_SKIP=norm,qkv,qkvpost,attn,o,experts,lmhead, separated by ','
  // or '+'): steps of at most kGemvMaxRows rows leave those kernels out, so that a decode step's time
  // without them gives their cost inside the graph (docs/PERF.md, sixth session). The results are
  // wrong with any of them set.
  unsigned debug_skip = 0;
  enum SkipBits : unsigned { kSkipNorm = 1, kSkipQkv = 2, kSkipQkvPost = 4, kSkipAttn = 8, kSkipO = 16, kSkipExperts = 32,
                             kSkipLmHead = 64 };
  bool skip(int64_t T, unsigned bit) const { return (debug_skip & bit) && T <= kern::kGemvMaxRows; }

  ~Impl() {
    drop_graphs();
    if (host_stage) cudaFreeHost(host_stage);
    if (blas) cublasDestroy(blas);
    if (stream) cudaStreamDestroy(stream);
  }

  void drop_graphs() {
    for (auto& [k, g] : graphs) cudaGraphExecDestroy(g);
    graphs.clear();
    warmed.clear();
  }

  // ---- upload ------------------------------------------------------------------------------------

  Tensor on_device(const Tensor& src) {
    if (src.view().device == dev) return src;
    return src.to(dev);
  }
  const void* keep(Tensor t) {
    owned.push_back(std::move(t));
    return owned.back().data();
  }
  // An f32 copy on the device (norm weights, biases, sinks, correction biases).
  const float* upload_f32(const Tensor& src) {
    if (src.numel() == 0) return nullptr;
    if (src.view().device == dev) {
      MOEX_CHECK(src.dtype() == DType::f32, "CUDA model runtime: device-resident small tensors must be f32 (got {})",
                 dtype_name(src.dtype()));
      return static_cast<const float*>(keep(src));
    }
    const Tensor f = src.dtype() == DType::f32 ? src : convert_tensor(src.view(), DType::f32);
    return static_cast<const float*>(keep(f.to(dev)));
  }
  // Several linears of the same input fused by rows (q, k, v; gate, up): one [sum out, in] weight.
  DLinear upload_linear(std::vector<const Linear*> parts) {
    DLinear d;
    d.in = parts[0]->weight.size(1);
    d.dt = parts[0]->weight.dtype();
    bool any_bias = false;
    for (const Linear* p : parts) {
      MOEX_CHECK(p->defined() && p->weight.view().rank == 2 && p->weight.size(1) == d.in && p->weight.dtype() == d.dt,
                 "CUDA model runtime: linears fused by rows must share their input size and dtype");
      d.out += p->weight.size(0);
      any_bias = any_bias || p->has_bias();
    }
    code_of(d.dt);
    any_f32_linear = any_f32_linear || d.dt == DType::f32;
    MOEX_CHECK(d.out < (int64_t(1) << 31) && d.in < (int64_t(1) << 31), "linear of [{}, {}] is too large for cuBLAS", d.out, d.in);
    if (parts.size() == 1) {
      d.w = keep(on_device(parts[0]->weight));
    } else {
      Tensor fused = Tensor::empty(d.dt, {d.out, d.in}, dev);
      size_t off = 0;
      for (const Linear* p : parts) {
        copy_bytes(static_cast<char*>(fused.data()) + off, dev, p->weight.data(), p->weight.view().device, p->weight.nbytes());
        off += p->weight.nbytes();
      }
      d.w = keep(fused);
    }
    if (any_bias) {
      Tensor bias = Tensor::empty(DType::f32, {d.out});
      std::fill(bias.ptr<float>(), bias.ptr<float>() + d.out, 0.0f);
      int64_t row = 0;
      for (const Linear* p : parts) {
        if (p->has_bias()) {
          const Tensor hb = p->bias.view().device.is_cpu() ? p->bias : p->bias.to(Device::cpu());
          const Tensor f = convert_tensor(hb.view(), DType::f32);
          std::copy(f.ptr<float>(), f.ptr<float>() + p->weight.size(0), bias.ptr<float>() + row);
        }
        row += p->weight.size(0);
      }
      d.bias = upload_f32(bias);
    }
    max_in = std::max(max_in, d.in);
    return d;
  }
  void note_out(const DLinear& l) {
    if (l.defined()) max_out = std::max(max_out, l.out);
  }

  void upload(const ModelWeights& w) {
    embed = keep(on_device(w.embed));
    final_norm = upload_f32(w.final_norm);
    {
      Linear head;
      head.weight = w.lm_head;
      if (w.tied && w.lm_head.data() == w.embed.data()) {
        lm_head.w = embed;
        lm_head.dt = w.embed.dtype();
        lm_head.out = V;
        lm_head.in = H;
      } else {
        lm_head = upload_linear({&head});
      }
    }
    layers.resize(w.layers.size());
    for (size_t l = 0; l < w.layers.size(); ++l) {
      const LayerWeights& lw = w.layers[l];
      DLayer& d = layers[l];
      d.input_norm = upload_f32(lw.input_norm);
      d.post_norm = upload_f32(lw.post_attention_norm);
      const AttentionWeights& a = lw.attn;
      if (mla) {
        if (a.q_a.defined()) {
          d.q_a = upload_linear({&a.q_a});
          d.q_a_norm = upload_f32(a.q_a_norm);
          d.q_b = upload_linear({&a.q_b});
        } else {
          d.q = upload_linear({&a.q});
        }
        d.kv_a = upload_linear({&a.kv_a});
        d.kv_a_norm = upload_f32(a.kv_a_norm);
        d.kv_b = upload_linear({&a.kv_b});
        for (const DLinear* x : {&d.q_a, &d.q_b, &d.q, &d.kv_a, &d.kv_b}) note_out(*x);
      } else {
        d.qkv = upload_linear({&a.q, &a.k, &a.v});
        note_out(d.qkv);
        d.q_norm = upload_f32(a.q_norm);
        d.k_norm = upload_f32(a.k_norm);
        d.sinks = upload_f32(a.sinks);
        d.window = int(t.attention_window(int64_t(l)));
      }
      d.o = upload_linear({&a.o});
      note_out(d.o);
      d.is_moe = lw.is_moe;
      if (lw.is_moe) {
        const MoeWeights& m = lw.moe;
        d.router = upload_linear({&m.router});
        note_out(d.router);
        d.correction_bias = upload_f32(m.e_score_correction_bias);
        d.experts.spec = m.experts.spec;
        auto view_of = [&](const Tensor& src, const TensorView& host_view) {
          if (!host_view.defined()) return TensorView();
          Tensor dt_ = on_device(src);
          TensorView v = dt_.view();
          keep(dt_);
          // the descriptor's shape (e.g. transposed experts) over the same contiguous bytes
          v.rank = host_view.rank;
          v.shape = host_view.shape;
          v.strides = host_view.strides;
          return v;
        };
        d.experts.gate_up = view_of(m.gate_up, m.experts.gate_up);
        d.experts.down = view_of(m.down, m.experts.down);
        d.experts.gate_up_bias = view_of(m.gate_up_bias, m.experts.gate_up_bias);
        d.experts.down_bias = view_of(m.down_bias, m.experts.down_bias);
        d.experts.gate_up_scale = view_of(m.gate_up_scale, m.experts.gate_up_scale);  // FP8 experts: block scales
        d.experts.down_scale = view_of(m.down_scale, m.experts.down_scale);
        if (m.shared.defined()) {
          d.shared_gate_up = upload_linear({&m.shared.gate, &m.shared.up});
          d.shared_down = upload_linear({&m.shared.down});
          note_out(d.shared_gate_up);
          note_out(d.shared_down);
          max_mlp = std::max(max_mlp, d.shared_down.in);
        }
        if (m.shared_gate.defined()) d.shared_gate = upload_linear({&m.shared_gate});
      } else {
        d.gate_up = upload_linear({&lw.mlp.gate, &lw.mlp.up});
        d.down = upload_linear({&lw.mlp.down});
        note_out(d.gate_up);
        note_out(d.down);
        max_mlp = std::max(max_mlp, d.down.in);
      }
    }
  }

  // ---- buffers -----------------------------------------------------------------------------------

  void reserve(int64_t batch, int64_t len, int64_t rows, int64_t outs) {
    MOEX_CHECK(batch >= 1 && len >= 1 && rows >= 1 && outs >= 1, "CUDA model runtime: bad capacity ({} x {}, {} rows)", batch,
               len, rows);
    if (batch <= cap_batch && len <= cap_len && rows <= cap_rows && outs <= cap_out) return;
    const int64_t B = std::max(batch, cap_batch), L = std::max(len, cap_len), R = std::max(rows, cap_rows),
                  O = std::max(outs, cap_out);
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (reserve)");
    drop_graphs();
    b = Buffers{};  // free first: growth does not need both generations at once
    // No capacity until every buffer below exists: when an allocation fails (out of GPU memory: a
    // batch or length too large for the card), the partial buffers are freed and the next call
    // allocates afresh, so the model stays usable at sizes that fit.
    cap_batch = cap_len = cap_rows = cap_out = 0;
    try {
      allocate(B, L, R, O);
    } catch (...) {
      b = Buffers{};
      throw;
    }
    cap_batch = B;
    cap_len = L;
    cap_rows = R;
    cap_out = O;
  }
  // The buffers of reserve() for B sequences of up to L positions, R rows per step and O output rows.
  void allocate(int64_t B, int64_t L, int64_t R, int64_t O) {
    const int64_t E = std::max<int64_t>(t.num_experts, 1), K = std::max<int64_t>(t.num_experts_per_tok, 1);
    auto f32 = [&](int64_t r, int64_t c) { return Tensor::empty(DType::f32, {std::max<int64_t>(r * c, 1)}, dev); };
    auto i32 = [&](int64_t n) { return Tensor::empty(DType::i32, {std::max<int64_t>(n, 1)}, dev); };
    b.x = f32(R, H);
    b.h = f32(R, H);
    b.split = Tensor::empty(dt == DType::f32 ? DType::f32 : dt, {std::max<int64_t>(2 * R * std::max(max_in, H), 1)}, dev);
    b.gout = f32(2 * R, max_out);
    b.lm_g = f32(2 * O, V);
    b.attn = f32(R, nh * dv);
    b.q = f32(R, nh * dq);
    if (dtc != 0) {
      b.qb = Tensor::empty(dt, {R * nh * dq}, dev);
      if (kv_dtype != dtc) {  // the prefill attention's keys and values in the model dtype (else: the cache itself)
        b.kb = Tensor::empty(dt, {R * kv_heads * dq}, dev);
        b.vb = Tensor::empty(dt, {R * kv_heads * dv}, dev);
      }
    }
    if (mla) {
      b.qa = f32(R, std::max<int64_t>(t.q_lora_rank, 1));
      b.ckv = f32(R, t.kv_lora_rank + t.qk_rope_head_dim);
      b.kvn = f32(R, t.kv_lora_rank);
      b.kvb = f32(R, nh * (t.qk_nope_head_dim + t.v_head_dim));
    } else {
      b.qkv = f32(R, (nh + 2 * nkv) * hd);
    }
    b.rlogits = f32(R, E);
    b.idx = i32(R * K);
    b.wts = f32(R, K);
    b.xout = Tensor::empty(dt, {std::max<int64_t>(R * H, 1)}, dev);
    b.gu = f32(R, 2 * max_mlp);
    b.act = f32(R, max_mlp);
    b.sgate = f32(R, 1);
    b.ids = i32(R);
    b.pos = i32(R);
    b.slot = i32(R);
    b.tiles = i32(2 * R);
    b.out_rows = i32(O);
    b.fin = f32(O, H);
    b.logits = f32(O, V);
    b.next = i32(O);
    b.sync = Tensor::empty(DType::u8, {int64_t(16 + kern::argmax_scratch_bytes(O))}, dev);
    check(cudaMemsetAsync(b.sync.data(), 0, b.sync.nbytes(), stream), "cudaMemsetAsync (kernel counters)");
    {
      // flash-decoding scratch for steps of up to B one-row tiles (decode steps, single-token prompts)
      size_t most = 1;
      for (int64_t r = 1; r <= B; ++r)
        most = std::max(most, kern::decode_attention_partial_floats(
                                  r, int(nh), int(dv), kern::decode_attention_splits(r, int(nh), int(kv_heads), L, num_sms)));
      b.dec_partial = Tensor::empty(DType::f32, {int64_t(most)}, dev);
      b.dec_counters = i32(kern::decode_attention_counters(B, int(nh), int(kv_heads)));
      check(cudaMemsetAsync(b.dec_counters.data(), 0, b.dec_counters.nbytes(), stream), "cudaMemsetAsync (counters)");
    }
    const DType kv_type = kv_dtype == 2 ? DType::bf16 : DType::f32;
    for (size_t l = 0; l < layers.size(); ++l) {
      b.k_cache.push_back(Tensor::empty(kv_type, {B * L, kv_heads * dq}, dev));
      b.v_cache.push_back(Tensor::empty(kv_type, {B * L, kv_heads * dv}, dev));
    }
    if (host_stage) cudaFreeHost(host_stage);
    host_stage = nullptr;
    host_stage_bytes = 0;
    void* staged = nullptr;
    const size_t stage_bytes = size_t(5 * R + 2 * O) * sizeof(int32_t);
    check(cudaHostAlloc(&staged, stage_bytes, cudaHostAllocDefault), "cudaHostAlloc");
    host_stage = staged;
    host_stage_bytes = stage_bytes;
    // The experts workspace is reserved for the largest step of every CUDA backend now, so that it
    // never moves under a captured graph.
    size_t need = 0;
    for (const char* name : {"grouped_mm", "batched_mm", "eager"}) {
      if (!ExpertsInterface::global().contains(name)) continue;
      for (int64_t T : {R, B}) {
        Problem p;
        p.spec = layers.empty() ? ExpertsSpec{} : first_moe_spec();
        if (p.spec.num_experts == 0) continue;
        p.tokens = T;
        p.top_k = K;
        p.index_dtype = DType::i32;
        p.weights_dtype = DType::f32;
        p.device = dev;
        auto be = ExpertsInterface::global().get(name);
        if (be->supports(p)) need = std::max(need, be->workspace_bytes(p));
      }
    }
    ws->reserve(need);
  }
  ExpertsSpec first_moe_spec() const {
    for (const auto& l : layers)
      if (l.is_moe) return l.experts.spec;
    return {};
  }

  // Copies a step's row metadata (host vectors) to the device buffers, through pinned memory.
  void upload_rows(const std::vector<int32_t>& ids, const std::vector<int32_t>& pos, const std::vector<int32_t>& slot,
                   const std::vector<kern::AttnTile>& tiles, const std::vector<int32_t>& out_rows) {
    char* p = static_cast<char*>(host_stage);
    size_t off = 0;
    auto put = [&](const void* src, size_t bytes, const Tensor& dst) {
      MOEX_ASSERT(off + bytes <= host_stage_bytes && bytes <= dst.nbytes());
      std::memcpy(p + off, src, bytes);
      check(cudaMemcpyAsync(dst.data(), p + off, bytes, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync (step rows)");
      off += bytes;
    };
    put(ids.data(), ids.size() * 4, b.ids);
    put(pos.data(), pos.size() * 4, b.pos);
    put(slot.data(), slot.size() * 4, b.slot);
    put(tiles.data(), tiles.size() * sizeof(kern::AttnTile), b.tiles);
    put(out_rows.data(), out_rows.size() * 4, b.out_rows);
  }

  // ---- the step ----------------------------------------------------------------------------------

  // rows × out of y (pitch ypitch) (+)= x · Wᵀ (+ b); x [rows, in] f32 (pitch xpitch). `presplit`:
  // b.split already holds x's two terms (written by the RMSNorm before). `gate`: sigmoid row gate.
  void linear(const DLinear& l, const float* x, int64_t xpitch, int64_t T, float* y, int64_t ypitch, bool acc,
              bool presplit = false, const float* gate = nullptr, float* gbuf = nullptr) {
    if (T == 0) return;
    if (!gbuf) gbuf = b.gout.ptr<float>();
    const float one = 1.0f, zero = 0.0f;
    if (l.dt == DType::f32) {
      blas_check(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, int(l.out), int(T), int(l.in), &one, l.w, CUDA_R_32F,
                              int(l.in), x, CUDA_R_32F, int(xpitch), &zero, gbuf, CUDA_R_32F, int(l.out), CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT),
                 "cublasGemmEx (f32 linear)");
      kern::launch_finish_linear(gbuf, false, l.bias, gate, T, l.out, y, ypitch, acc, stream);
      return;
    }
    if (T <= kern::kGemvMaxRows && gemv_enabled && kern::gemv_ok(l.w, l.in, x, xpitch, T)) {
      // decode steps: one kernel reading the weights once, exact f32 inputs, bias/gate/residual fused
      kern::launch_gemv(l.w, code_of(l.dt), l.out, l.in, x, xpitch, T, l.bias, gate, y, ypitch, acc, stream);
      return;
    }
    if (linear_terms == 1) {
      // one term: bf16(x) = rows [0, T) of the split buffer (the RMSNorm's hi term when presplit)
      if (!presplit) {
        if (xpitch == l.in) kern::launch_to_dtype(x, T, l.in, b.split.data(), dtc, stream);
        else kern::launch_split(x, xpitch, T, l.in, b.split.data(), dtc, stream);
      }
      const bool direct = !l.bias && !gate;  // cuBLAS writes (or adds into, beta = 1) y itself
      const float beta = direct && acc ? 1.0f : 0.0f;
      blas_check(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, int(l.out), int(T), int(l.in), &one, l.w, blas_type(l.dt),
                              int(l.in), b.split.data(), blas_type(l.dt), int(l.in), &beta, direct ? y : gbuf, CUDA_R_32F,
                              int(direct ? ypitch : l.out), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 "cublasGemmEx (linear)");
      if (!direct) kern::launch_finish_linear(gbuf, false, l.bias, gate, T, l.out, y, ypitch, acc, stream);
      return;
    }
    if (!presplit) kern::launch_split(x, xpitch, T, l.in, b.split.data(), dtc, stream);
    blas_check(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, int(l.out), int(2 * T), int(l.in), &one, l.w, blas_type(l.dt),
                            int(l.in), b.split.data(), blas_type(l.dt), int(l.in), &zero, gbuf, CUDA_R_32F, int(l.out),
                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx (linear)");
    kern::launch_finish_linear(gbuf, true, l.bias, gate, T, l.out, y, ypitch, acc, stream);
  }
  // RMSNorm rows of x into out, also writing the split terms for the next linear (bf16/f16 models).
  // `add`: the experts' output [T, n] (model dtype) added into x first (see mlp_layer).
  void norm(float* x, int64_t xp, const float* w, int64_t T, int64_t n, float* out, int64_t op, const void* add = nullptr) {
    kern::RmsNormParams p = norm_params(x, xp, w, T, n, out, op);
    p.add = add;
    p.add_dtype = dtc;
    kern::launch_rmsnorm(p, stream);
  }

  kern::RmsNormParams norm_params(float* x, int64_t xp, const float* w, int64_t T, int64_t n, float* out, int64_t op) {
    kern::RmsNormParams p;
    p.x = x;
    p.x_pitch = xp;
    p.w = w;
    p.eps = float(t.rms_norm_eps);
    p.T = T;
    p.n = n;
    p.out = out;
    p.out_pitch = op;
    p.split = dtc == 0 ? nullptr : b.split.data();
    p.split_dtype = dtc;
    p.w_early = weights_early;
    return p;
  }
  unsigned* router_ticket() { return static_cast<unsigned*>(b.sync.data()); }

  // The sequence's keys and values [n, kv_heads, dq | dv] in the model dtype, for the tensor-core
  // prefill attention: its rows of the cache itself when the cache is in the model dtype, else
  // rounded from the f32 cache into b.kb / b.vb.
  std::pair<const void*, const void*> prefill_keys_values(size_t l, const Segment& sg) {
    const size_t kesz = dtype_size(b.k_cache[l].dtype());
    const char* kc = static_cast<const char*>(b.k_cache[l].data()) + size_t(sg.slot * cap_len * kv_heads * dq) * kesz;
    const char* vc = static_cast<const char*>(b.v_cache[l].data()) + size_t(sg.slot * cap_len * kv_heads * dv) * kesz;
    if (kv_dtype == dtc) return {kc, vc};
    kern::launch_to_dtype(reinterpret_cast<const float*>(kc), sg.n, kv_heads * dq, b.kb.data(), dtc, stream);
    kern::launch_to_dtype(reinterpret_cast<const float*>(vc), sg.n, kv_heads * dv, b.vb.data(), dtc, stream);
    return {b.kb.data(), b.vb.data()};
  }

  // Prefill attention on the tensor cores for bf16/f16 models: per sequence and kv-head group,
  // S = Q·Kᵀ (cuBLAS, f32 out), P = softmax rows (kernel, model dtype), O = P·V (cuBLAS, f32 out).
  // Q, K, V are rounded to the model dtype (as the reference's bf16 attention).
  void gemm_attention(size_t l, int64_t T, const std::vector<Segment>& segs, int window, const float* sinks) {
    const int64_t group = nh / kv_heads;
    const size_t esz = dtype_size(dt);
    kern::launch_to_dtype(b.q.ptr<float>(), T, nh * dq, b.qb.data(), dtc, stream);
    const float one = 1.0f, zero = 0.0f;
    for (const Segment& sg : segs) {
      const int64_t n = sg.n;
      const size_t nn = size_t(group * n * n);
      if (b.scores.numel() < int64_t(nn)) {
        check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (attention scores)");
        b.scores = Tensor::empty(DType::f32, {int64_t(nn)}, dev);
        b.probs = Tensor::empty(dt, {int64_t(nn)}, dev);
      }
      const auto [kd, vd] = prefill_keys_values(l, sg);
      const cudaDataType ty = blas_type(dt);
      for (int64_t g = 0; g < kv_heads; ++g) {
        const char* kg = static_cast<const char*>(kd) + size_t(g * dq) * esz;
        const char* vg = static_cast<const char*>(vd) + size_t(g * dv) * esz;
        const char* qg = static_cast<const char*>(b.qb.data()) + size_t((sg.row0 * nh + g * group) * dq) * esz;
        // S_h [n, n] row-major = Q_h · K_gᵀ for the group's heads h (K shared: stride 0)
        blas_check(cublasGemmStridedBatchedEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(n), int(dq), &one, kg, ty,
                                              int(kv_heads * dq), 0, qg, ty, int(nh * dq), dq, &zero, b.scores.data(),
                                              CUDA_R_32F, int(n), n * n, int(group), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                   "cublasGemmStridedBatchedEx (attention scores)");
        kern::launch_softmax_rows(b.scores.ptr<float>(), group, n, float(attn_scaling), window, sinks, int(g * group),
                                  b.probs.data(), dtc, stream);
        // O_h [n, dv] (row pitch nh·dv) = P_h · V_g
        float* og = b.attn.ptr<float>() + (sg.row0 * nh + g * group) * dv;
        blas_check(cublasGemmStridedBatchedEx(blas, CUBLAS_OP_N, CUBLAS_OP_N, int(dv), int(n), int(n), &one, vg, ty,
                                              int(kv_heads * dv), 0, b.probs.data(), ty, int(n), n * n, &zero, og,
                                              CUDA_R_32F, int(nh * dv), dv, int(group), CUBLAS_COMPUTE_32F,
                                              CUBLAS_GEMM_DEFAULT),
                   "cublasGemmStridedBatchedEx (attention values)");
      }
    }
  }
  // Prefill attention on the tensor cores, fused: per sequence, K and V in the model dtype (as
  // gemm_attention), then one flash-attention kernel (Q rounded inside) writing b.attn.
  void flash_attention(size_t l, const std::vector<Segment>& segs, int window, const float* sinks) {
    for (const Segment& sg : segs) {
      const auto [kd, vd] = prefill_keys_values(l, sg);
      kern::FlashPrefillParams fp{};
      fp.q = b.q.ptr<float>();
      fp.k = kd;
      fp.v = vd;
      fp.row0 = sg.row0;
      fp.n = sg.n;
      fp.nh = int(nh);
      fp.nkv = int(kv_heads);
      fp.d = int(dq);
      fp.dtype = dtc;
      fp.scaling = float(attn_scaling);
      fp.window = window;
      fp.sinks = sinks;
      fp.out = b.attn.ptr<float>();
      kern::launch_flash_prefill(fp, stream);
    }
  }
  bool use_flash_prefill() const {
    return flash_attention_enabled() && kern::flash_prefill_ok(int(dq), int(dv), int(nh), int(kv_heads));
  }
  // Whether a prefill takes the tensor-core path (flash kernel, or cuBLAS + softmax_rows).
  bool use_gemm_attention(const std::vector<Segment>* segs) const {
    // MLA (DeepSeek-V3) stays on the f32 kernel: on the H200 its GEMM path differed from the
    // kernel by 8.9e-2 rel. L2 on the fixture (others 2e-3..3e-2), cause not established.
    if (mla) return false;
    if (!segs || dtc == 0 || segs->empty()) return false;
    const int64_t min_rows = gemm_attention_min_rows();
    if (min_rows <= 0) return false;
    const bool flash = use_flash_prefill();  // no n × n scores: no length limit
    for (const Segment& sg : *segs)
      if (sg.n < min_rows || (!flash && sg.n > kGemmAttentionMaxRows)) return false;
    return true;
  }

  // Whether the attention of this step runs the flash-decoding kernel: one-row tiles (decode steps).
  bool decode_flash(int64_t T, int64_t n_tiles, const std::vector<Segment>* segs) const {
    return !use_gemm_attention(segs) && n_tiles == T && T <= cap_batch && flash_attention_enabled() &&
           kern::decode_attention_ok(int(dq), int(dv));
  }

  // in_norm_fused (in_norm_fuses): this layer's input RMSNorm was not run; the qkv GEMV normalises x + the
  // previous experts' output itself and the o projection makes the residual add.
  void attention_layer(const DLayer& d, size_t l, int64_t T, int64_t n_tiles, const std::vector<Segment>* segs,
                       bool in_norm_fused = false) {
    float* h = b.h.ptr<float>();
    const bool pre = dtc != 0;
    kern::AttentionParams ap{};
    kern::QkvPostParams qp{};
    const bool flash_decode = decode_flash(T, n_tiles, segs);
    bool post_fused = false;  // q, k, v post-processed by the decode attention kernel
    if (mla) {
      const int64_t nope = t.qk_nope_head_dim, rd = t.qk_rope_head_dim, vd = t.v_head_dim, lora = t.kv_lora_rank;
      const int64_t cw = lora + rd;
      if (d.q_a.defined()) {
        linear(d.q_a, h, H, T, b.qa.ptr<float>(), t.q_lora_rank, false, pre);
        linear(d.kv_a, h, H, T, b.ckv.ptr<float>(), cw, false, pre);
        norm(b.qa.ptr<float>(), t.q_lora_rank, d.q_a_norm, T, t.q_lora_rank, b.qa.ptr<float>(), t.q_lora_rank);
        linear(d.q_b, b.qa.ptr<float>(), t.q_lora_rank, T, b.q.ptr<float>(), nh * dq, false, pre);
      } else {
        linear(d.q, h, H, T, b.q.ptr<float>(), nh * dq, false, pre);
        linear(d.kv_a, h, H, T, b.ckv.ptr<float>(), cw, false, pre);
      }
      norm(b.ckv.ptr<float>(), cw, d.kv_a_norm, T, lora, b.kvn.ptr<float>(), lora);
      linear(d.kv_b, b.kvn.ptr<float>(), lora, T, b.kvb.ptr<float>(), nh * (nope + vd), false, pre);
      kern::MlaPostParams mp{};
      mp.q = b.q.ptr<float>();
      mp.kvb = b.kvb.ptr<float>();
      mp.ckv = b.ckv.ptr<float>();
      mp.ckv_pitch = cw;
      mp.kv_lora = lora;
      mp.T = T;
      mp.nh = int(nh);
      mp.nope = int(nope);
      mp.rd = int(rd);
      mp.vd = int(vd);
      mp.rope = rope;
      mp.pos = b.pos.ptr<int32_t>();
      mp.slot = b.slot.ptr<int32_t>();
      mp.k_cache = b.k_cache[l].data();
      mp.v_cache = b.v_cache[l].data();
      mp.kv_dtype = kv_dtype;
      mp.max_len = cap_len;
      kern::launch_mla_post(mp, stream);
    } else {
      const int64_t width = (nh + 2 * nkv) * hd;
      if (in_norm_fused) {
        const kern::GemvFuse fz = in_norm_fuse(d);
        kern::launch_gemv(d.qkv.w, code_of(d.qkv.dt), d.qkv.out, d.qkv.in, b.x.ptr<float>(), H, T, d.qkv.bias, nullptr,
                          b.qkv.ptr<float>(), width, false, stream, fz);
      } else if (!skip(T, kSkipQkv)) {
        linear(d.qkv, h, H, T, b.qkv.ptr<float>(), width, false, pre);
      }
      qp.qkv = b.qkv.ptr<float>();
      qp.T = T;
      qp.nh = int(nh);
      qp.nkv = int(nkv);
      qp.hd = int(hd);
      qp.norm_mode = t.qk_norm ? (t.family == ModelFamily::qwen3_moe ? 1 : 2) : 0;
      qp.q_norm = d.q_norm;
      qp.k_norm = d.k_norm;
      qp.eps = float(t.rms_norm_eps);
      qp.clip = t.clip_qkv ? float(*t.clip_qkv) : 0.0f;
      qp.rope = rope;
      qp.pos = b.pos.ptr<int32_t>();
      qp.slot = b.slot.ptr<int32_t>();
      qp.q_out = b.q.ptr<float>();
      qp.k_cache = b.k_cache[l].data();
      qp.v_cache = b.v_cache[l].data();
      qp.kv_dtype = kv_dtype;
      qp.max_len = cap_len;
      qp.loads_first = post_loads_first;
      // decode steps: the decode attention kernel post-processes q, k, v itself (one kernel less)
      post_fused = fuse_qkv_post && !skip(T, kSkipQkvPost) && flash_decode &&
                   kern::decode_attention_fuses_post(qp, int(nh), int(nkv), int(dq), int(dv));
      if (!skip(T, kSkipQkvPost) && !post_fused) kern::launch_qkv_post(qp, stream);
      ap.window = d.window;
      ap.sinks = d.sinks;
    }
    if (use_gemm_attention(segs)) {
      if (use_flash_prefill()) flash_attention(l, *segs, ap.window, ap.sinks);
      else gemm_attention(l, T, *segs, ap.window, ap.sinks);
      o_projection(d, T, in_norm_fused);
      return;
    }
    if (flash_decode) {
      // one-row tiles (decode steps): flash-decoding, key chunks sized from static bounds (graph-safe)
      kern::DecodeAttentionParams dp{};
      dp.post_fused = post_fused;
      dp.post = qp;
      dp.early = decode_early;
      dp.norm_w_early = weights_early;
      dp.q = b.q.ptr<float>();
      dp.k_cache = b.k_cache[l].data();
      dp.v_cache = b.v_cache[l].data();
      dp.kv_dtype = kv_dtype;
      dp.max_len = cap_len;
      dp.T = T;
      dp.nh = int(nh);
      dp.nkv = int(kv_heads);
      dp.dq = int(dq);
      dp.dv = int(dv);
      dp.scaling = float(attn_scaling);
      dp.window = ap.window;
      dp.sinks = ap.sinks;
      dp.pos = b.pos.ptr<int32_t>();
      dp.slot = b.slot.ptr<int32_t>();
      dp.splits = kern::decode_attention_splits(T, int(nh), int(kv_heads), cap_len, num_sms);
      const int cluster_splits =
          decode_cluster == 2 ? kern::decode_attention_cluster_splits(dp.splits)
          : decode_cluster == 1 && dp.splits < kern::kDecodeClusterMax ? dp.splits
                                                                        : 0;
      if (cluster_splits > 0 && kern::decode_attention_cluster_ok(cluster_splits, dp.dq, dp.dv)) {
        dp.splits = cluster_splits;
        dp.cluster = true;
      }
      dp.partial = b.dec_partial.ptr<float>();
      dp.counters = b.dec_counters.ptr<int32_t>();
      dp.out = b.attn.ptr<float>();
      if (!skip(T, kSkipAttn)) kern::launch_decode_attention(dp, stream);
      if (!skip(T, kSkipO)) o_projection(d, T, in_norm_fused);
      return;
    }
    ap.q = b.q.ptr<float>();
    ap.k_cache = b.k_cache[l].data();
    ap.v_cache = b.v_cache[l].data();
    ap.kv_dtype = kv_dtype;
    ap.max_len = cap_len;
    ap.nh = int(nh);
    ap.nkv = int(kv_heads);
    ap.dq = int(dq);
    ap.dv = int(dv);
    ap.scaling = float(attn_scaling);
    ap.tiles = reinterpret_cast<const kern::AttnTile*>(b.tiles.data());
    ap.num_tiles = int(n_tiles);
    ap.heads_per_block = n_tiles == T && nh / kv_heads <= kern::kAttnRows;  // one-row tiles (decode)
    ap.pos = b.pos.ptr<int32_t>();
    ap.slot = b.slot.ptr<int32_t>();
    ap.out = b.attn.ptr<float>();
    kern::launch_attention(ap, stream);
    o_projection(d, T, in_norm_fused);
  }

  // x += attn · Woᵀ; where the input norm was fused into the qkv GEMV, x += experts' output first (the
  // residual add that norm would have made: (x + add) + o, the same order of additions).
  void o_projection(const DLayer& d, int64_t T, bool in_norm_fused) {
    if (!in_norm_fused) {
      linear(d.o, b.attn.ptr<float>(), nh * dv, T, b.x.ptr<float>(), H, true);
      return;
    }
    kern::GemvFuse fz;
    fz.acc_add = b.xout.data();
    fz.acc_add_dtype = dtc;
    kern::launch_gemv(d.o.w, code_of(d.o.dt), d.o.out, d.o.in, b.attn.ptr<float>(), nh * dv, T, d.o.bias, nullptr,
                      b.x.ptr<float>(), H, true, stream, fz);
  }
  kern::GemvFuse in_norm_fuse(const DLayer& d) const {
    kern::GemvFuse fz;
    fz.norm_add = b.xout.data();
    fz.norm_add_dtype = dtc;
    fz.norm_w = d.input_norm;
    fz.norm_eps = float(t.rms_norm_eps);
    return fz;
  }
  // Whether layer d's input RMSNorm runs inside its qkv GEMV at this step (fuse_in_norm): one-row steps after an
  // MoE layer (pending_add), the one-GEMV qkv projection (not MLA), both attention projections by the GEMV.
  bool in_norm_fuses(const DLayer& d, int64_t T, bool pending_add) const {
    if (!fuse_in_norm || T != 1 || !pending_add || mla || !gemv_enabled || debug_skip != 0) return false;
    if (!d.qkv.defined() || !d.o.defined() || d.o.dt == DType::f32 || d.qkv.in != H || d.o.out != H || !d.input_norm)
      return false;
    // gemv_norm_ok: qkv weights bf16/f16 of the experts output's dtype (the model's), aligned rows
    return kern::gemv_norm_ok(d.qkv.w, code_of(d.qkv.dt), H, b.x.ptr<float>(), T, in_norm_fuse(d)) &&
           kern::gemv_ok(d.o.w, d.o.in, b.attn.ptr<float>(), nh * dv, T);
  }

  // post_norm: the post-attention norm to run inside the router kernel (post_norm_fused), else null.
  void mlp_layer(const DLayer& d, int64_t T, const std::string& backend, const kern::RmsNormParams* post_norm = nullptr) {
    float* h = b.h.ptr<float>();
    float* x = b.x.ptr<float>();
    const bool pre = dtc != 0;
    if (!d.is_moe) {
      const int64_t I = d.down.in;
      linear(d.gate_up, h, H, T, b.gu.ptr<float>(), 2 * I, false, pre);
      kern::launch_gated_act(b.gu.ptr<float>(), T, I, int(parse_activation(t.hidden_act)), b.act.ptr<float>(), stream);
      linear(d.down, b.act.ptr<float>(), I, T, x, H, true);
      return;
    }
    const int64_t E = t.num_experts, K = t.num_experts_per_tok;
    kern::RouterParams rp{};
    rp.wide = route_wide;
    rp.logits = b.rlogits.ptr<float>();
    rp.T = T;
    rp.E = int(E);
    rp.K = int(K);
    rp.kind = t.family == ModelFamily::deepseek_v3 ? 1 : t.family == ModelFamily::gpt_oss ? 2 : 0;
    rp.renorm = t.family == ModelFamily::mixtral || t.norm_topk_prob;
    rp.correction_bias = d.correction_bias;
    rp.n_group = int(t.n_group);
    rp.topk_group = int(t.topk_group);
    rp.scaling = float(t.routed_scaling_factor);
    rp.idx = b.idx.ptr<int32_t>();
    rp.w = b.wts.ptr<float>();
    if (router_gemv(d, T)) {
      // decode steps: the router GEMV and the routing in one kernel (its last block routes), with the
      // post-attention norm where post_norm_fused
      kern::launch_gemv_router(d.router.w, code_of(d.router.dt), d.router.in, h, H, d.router.bias, rp, router_ticket(),
                               stream, kern::RouterKernel::automatic, post_norm);
    } else {
      linear(d.router, h, H, T, b.rlogits.ptr<float>(), E, false, pre);
      kern::launch_router(rp, stream);
    }
    // the experts in the model dtype: the normed hidden rounded once — for bf16/f16 models that is
    // the hi term the RMSNorm wrote into rows [0, T) of the split buffer (intact until shared_down)
    const void* xin = dtc != 0 ? b.split.data() : static_cast<const void*>(h);
    ExpertsCall call;
    call.hidden = TensorView(xin, dt, {T, H}, dev);
    call.top_k_index = TensorView(b.idx.data(), DType::i32, {T, K}, dev);
    call.top_k_weights = TensorView(b.wts.data(), DType::f32, {T, K}, dev);
    call.out = TensorView(b.xout.data(), dt, {T, H}, dev);
    RunOptions ro;
    ro.stream = stream;
    ro.workspace = ws.get();
    if (!skip(T, kSkipExperts)) experts_forward(backend, d.experts, call, ro);
    if (d.shared_gate.defined()) linear(d.shared_gate, h, H, T, b.sgate.ptr<float>(), 1, false, pre);
    if (d.shared_gate_up.defined()) {
      const int64_t I = d.shared_down.in;
      linear(d.shared_gate_up, h, H, T, b.gu.ptr<float>(), 2 * I, false, pre);
      kern::launch_gated_act(b.gu.ptr<float>(), T, I, int(parse_activation(t.hidden_act)), b.act.ptr<float>(), stream);
      linear(d.shared_down, b.act.ptr<float>(), I, T, x, H, true, false,
             d.shared_gate.defined() ? b.sgate.ptr<float>() : nullptr);
    }
    // x += xout is left to the next RMSNorm (fused; `pending_add`)
  }

  // Whether the router of MoE layer d runs as the fused GEMV + routing kernel at T rows (mlp_layer).
  bool router_gemv(const DLayer& d, int64_t T) {
    return t.family != ModelFamily::deepseek_v3 && d.router.dt != DType::f32 && T <= kern::kGemvMaxRows &&
           gemv_enabled && kern::gemv_ok(d.router.w, d.router.in, b.h.ptr<float>(), H, T);
  }
  // Whether this step's post-attention norm np of layer d runs inside the router's cluster kernel
  // (fuse_post_norm): MoE layers whose router takes the fused kernel.
  bool post_norm_fused(const DLayer& d, int64_t T, const kern::RmsNormParams& np) {
    return fuse_post_norm && d.is_moe && !skip(T, kSkipNorm) && T <= (fuse_post_norm == 2 ? kern::kGemvMaxRows : 1) &&
           d.router.in == H && router_gemv(d, T) && kern::router_fuses_norm_ok(T, np);
  }

  // One forward over T rows whose metadata is on the device: the logits of the n_out rows listed
  // in out_rows, and their argmax when `argmax`. Launches only (no host synchronisation).
  // `segs`: the sequences of a prefill from position 0 (enables the GEMM attention path); null for decode steps.
  void step(int64_t T, int64_t n_tiles, int64_t n_out, const std::string& backend, bool argmax,
            const std::vector<Segment>* segs = nullptr) {
    bool pending_add = false;  // the previous MoE layer's experts output still to be added to x
    // The normed rows h in f32 are read only by the GEMV (decode) and f32 linears: bf16/f16 cuBLAS
    // linears and the experts take the split terms the norm writes as well (16 MB less per norm
    // at 2048 rows of 2048).
    float* h = dtc == 0 || any_f32_linear || (T <= kern::kGemvMaxRows && gemv_enabled) ? b.h.ptr<float>() : nullptr;
    for (size_t l = 0; l < layers.size(); ++l) {
      const DLayer& d = layers[l];
      const bool in_norm_fused = in_norm_fuses(d, T, pending_add);  // never at layer 0: nothing is pending there
      if (l == 0) {  // the embedding lookup fused into the first norm: x = embed[ids], h = norm(x)
        kern::RmsNormParams p = norm_params(b.x.ptr<float>(), H, d.input_norm, T, H, h, H);
        p.ids = b.ids.ptr<int32_t>();
        p.embed = embed;
        p.embed_dtype = code_of(dt);
        kern::launch_rmsnorm(p, stream);
      } else if (!in_norm_fused && !skip(T, kSkipNorm)) {
        norm(b.x.ptr<float>(), H, d.input_norm, T, H, h, H, pending_add ? b.xout.data() : nullptr);
      }
      attention_layer(d, l, T, n_tiles, segs, in_norm_fused);
      const kern::RmsNormParams post = norm_params(b.x.ptr<float>(), H, d.post_norm, T, H, h, H);
      const bool post_fused = post_norm_fused(d, T, post);
      if (!skip(T, kSkipNorm) && !post_fused) kern::launch_rmsnorm(post, stream);
      mlp_layer(d, T, backend, post_fused ? &post : nullptr);
      pending_add = d.is_moe;
    }
    if (layers.empty()) kern::launch_embed(b.ids.ptr<int32_t>(), embed, code_of(dt), T, H, b.x.ptr<float>(), stream);
    // one kernel: the output rows of x gathered, the last experts output added (to those rows
    // only: x is not read afterwards), the final norm into fin (+ its split for the lm head)
    kern::RmsNormParams p = norm_params(b.x.ptr<float>(), H, final_norm, n_out, H, b.fin.ptr<float>(), H);
    p.rows = b.out_rows.ptr<int32_t>();
    if (pending_add) {
      p.add = b.xout.data();
      p.add_dtype = dtc;
    }
    kern::launch_rmsnorm(p, stream);
    if (!skip(T, kSkipLmHead))
      linear(lm_head, b.fin.ptr<float>(), H, n_out, b.logits.ptr<float>(), V, false, dtc != 0, nullptr, b.lm_g.ptr<float>());
    if (argmax)
      kern::launch_argmax(b.logits.ptr<float>(), n_out, V, b.next.ptr<int32_t>(),
                          static_cast<char*>(b.sync.data()) + 16, stream);
  }

  // A decode step: replayed from a CUDA graph when the backend allows it (captured at the second
  // step of a batch size, after an eager warm-up that sizes cuBLAS and the workspace).
  void decode_step(int64_t T, const std::string& backend, bool argmax, bool use_graphs) {
    const auto key = std::make_pair(T, backend + (argmax ? "" : "/logits"));
    const bool capturable = use_graphs && ExpertsInterface::global().get(backend)->graph_capturable();
    if (graphs_ws != ws->data()) {
      drop_graphs();
      graphs_ws = ws->data();
    }
    if (!capturable) {
      step(T, T, T, backend, argmax);
      return;
    }
    auto it = graphs.find(key);
    if (it == graphs.end() && !warmed.count(key)) {
      step(T, T, T, backend, argmax);
      warmed.insert(key);
      return;
    }
    if (it == graphs.end()) {
      cudaGraph_t g = nullptr;
      ws->set_frozen(true);
      check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
      try {
        step(T, T, T, backend, argmax);
      } catch (...) {
        cudaStreamEndCapture(stream, &g);
        if (g) cudaGraphDestroy(g);
        cudaGetLastError();
        ws->set_frozen(false);
        throw;
      }
      ws->set_frozen(false);
      check(cudaStreamEndCapture(stream, &g), "cudaStreamEndCapture");
      cudaGraphExec_t exec = nullptr;
      const cudaError_t e = cudaGraphInstantiate(&exec, g, 0);
      cudaGraphDestroy(g);
      check(e, "cudaGraphInstantiate");
      it = graphs.emplace(key, exec).first;
      ++stats.graph_captures;
    } else {
      ++stats.graph_replays;
    }
    check(cudaGraphLaunch(it->second, stream), "cudaGraphLaunch");
  }

  void check_ids(const std::vector<std::vector<int64_t>>& seqs) const {
    for (const auto& s : seqs) {
      MOEX_CHECK(!s.empty(), "CUDA model runtime: empty sequence");
      for (int64_t id : s) MOEX_CHECK(id >= 0 && id < V, "token id {} is outside the vocabulary [0, {})", id, V);
    }
  }
};

CudaModel::CudaModel(const ModelWeights& w, const TextConfig& t, Device dev) : impl_(std::make_unique<Impl>()) {
  MOEX_CHECK(dev.is_cuda(), "CudaModel needs a CUDA device (got {})", to_string(dev));
  const std::string why = cuda_unavailable_reason();
  if (!why.empty()) detail::fail(ErrorCode::unsupported, "the model runtime cannot use {}: {}", to_string(dev), why);
  const auto devices = cuda_devices();
  MOEX_CHECK(dev.index >= 0 && dev.index < int(devices.size()), "CUDA device {} does not exist ({} found)", dev.index,
             devices.size());
  DeviceGuard guard(dev.index);
  Impl& m = *impl_;
  m.t = t;
  m.dev = dev;
  m.dt = w.dtype;
  m.dtc = code_of(w.dtype);
  m.mla = t.family == ModelFamily::deepseek_v3;
  m.H = t.hidden_size;
  m.V = t.vocab_size;
  m.nh = t.num_attention_heads;
  m.nkv = m.mla ? t.num_attention_heads : t.num_key_value_heads;
  m.kv_heads = m.nkv;
  m.hd = t.head_dim;
  m.dq = m.mla ? t.qk_nope_head_dim + t.qk_rope_head_dim : t.head_dim;
  m.dv = m.mla ? t.v_head_dim : t.head_dim;
  MOEX_CHECK(m.nkv >= 1 && m.nh % m.nkv == 0, "attention heads {} are not a multiple of the key/value heads {}", m.nh, m.nkv);
  MOEX_CHECK(m.dq <= kern::kAttnMaxDim && m.dv <= kern::kAttnMaxDim,
             "CUDA model runtime: attention head dims {}/{} exceed the kernel's limit {}", m.dq, m.dv, kern::kAttnMaxDim);
  MOEX_CHECK(t.num_experts <= kern::kRouterMaxExperts && t.num_experts_per_tok <= kern::kRouterMaxK,
             "CUDA model runtime: the router kernel handles up to {} experts and top-{} (got {} / {})",
             kern::kRouterMaxExperts, kern::kRouterMaxK, t.num_experts, t.num_experts_per_tok);
  MOEX_CHECK(int64_t(w.layers.size()) == t.num_hidden_layers, "weights have {} layers, the config {}", w.layers.size(),
             t.num_hidden_layers);
  // RoPE tables (f64) and the attention scaling, as the CPU runtime
  {
    const int64_t rd = m.mla ? t.qk_rope_head_dim : t.head_dim;
    std::vector<double> inv;
    double factor = 1.0;
    rope_inv_freq(t.rope, rd, t.max_position_embeddings, inv, factor);
    Tensor host = Tensor::empty(DType::f64, {int64_t(inv.size())});
    std::copy(inv.begin(), inv.end(), host.ptr<double>());
    m.rope.inv_freq = static_cast<const double*>(m.keep(host.to(dev)));
    m.rope.factor = factor;
    m.rope.dim = int(rd);
    m.rope.interleave = m.mla && t.rope_interleave;
    m.attn_scaling = 1.0 / std::sqrt(double(m.dq));
    if (m.mla && t.rope.type != "default" && t.rope.mscale_all_dim && *t.rope.mscale_all_dim != 0.0 && t.rope.factor > 1) {
      const double ms = 0.1 * *t.rope.mscale_all_dim * std::log(t.rope.factor) + 1.0;
      m.attn_scaling *= ms * ms;
    }
  }
  {  // the KV cache's type, checked before the weights are uploaded (a bad value costs no upload)
    const char* e = std::getenv("MOEX_CUDA_KV_CACHE");
    const bool f32_asked = e && std::string(e) == "f32";
    MOEX_CHECK(!e || f32_asked || std::string(e) == "model", "MOEX_CUDA_KV_CACHE must be 'f32' or 'model', not '{}'", e);
    m.kv_dtype = m.dtc == 2 && !f32_asked && m.dq % 8 == 0 && m.dv % 8 == 0 ? 2 : 0;
  }
  m.upload(w);
  if (const char* e = std::getenv("MOEX_CUDA_GEMV")) m.gemv_enabled = std::string(e) != "0";
  if (const char* e = std::getenv("MOEX_CUDA_FUSE_QKV_POST")) m.fuse_qkv_post = std::string(e) != "0";
  if (const char* e = std::getenv("MOEX_CUDA_DECODE_EARLY")) m.decode_early = std::string(e) != "0";
  if (const char* e = std::getenv("MOEX_CUDA_WEIGHTS_EARLY")) m.weights_early = std::string(e) != "0";
  if (const char* e = std::getenv("MOEX_CUDA_POST_LOADS_FIRST")) m.post_loads_first = std::string(e) != "0";
  if (const char* e = std::getenv("MOEX_CUDA_FUSE_POST_NORM"))
    m.fuse_post_norm = std::string(e) == "0" ? 0 : std::string(e) == "all" ? 2 : 1;
  if (const char* e = std::getenv("MOEX_CUDA_FUSE_IN_NORM")) m.fuse_in_norm = std::string(e) == "1";
  if (const char* e = std::getenv("MOEX_CUDA_ROUTE_WIDE")) m.route_wide = std::string(e) == "1";
  if (const char* e = std::getenv("MOEX_CUDA_DECODE_CLUSTER")) m.decode_cluster = std::clamp(std::atoi(e), 0, 2);
  if (const char* e = std::getenv("MOEX_CUDA_LINEAR_TERMS")) m.linear_terms = std::string(e) == "2" ? 2 : 1;
  if (const char* e = std::getenv("MOEX_CUDA_DEBUG_SKIP")) {
    std::string v = std::string(",") + e + ",";  // names separated by ',' or '+'
    std::replace(v.begin(), v.end(), '+', ',');
    const std::pair<const char*, unsigned> names[] = {
        {"norm", Impl::kSkipNorm}, {"qkv", Impl::kSkipQkv}, {"qkvpost", Impl::kSkipQkvPost}, {"attn", Impl::kSkipAttn},
        {"o", Impl::kSkipO},       {"experts", Impl::kSkipExperts}, {"lmhead", Impl::kSkipLmHead}};
    for (const auto& [n, bit] : names)
      if (v.find(std::string(",") + n + ",") != std::string::npos) m.debug_skip |= bit;
  }
  check(cudaDeviceGetAttribute(&m.num_sms, cudaDevAttrMultiProcessorCount, dev.index), "cudaDeviceGetAttribute (SMs)");
  check(cudaStreamCreateWithFlags(&m.stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  blas_check(cublasCreate(&m.blas), "cublasCreate");
  blas_check(cublasSetStream(m.blas, m.stream), "cublasSetStream");
  blas_check(cublasSetMathMode(m.blas, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");  // no TF32
  // a fixed cuBLAS workspace: no allocation inside a graph capture
  m.blas_ws = Tensor::empty(DType::u8, {int64_t(64) << 20}, dev);
  blas_check(cublasSetWorkspace(m.blas, m.blas_ws.data(), m.blas_ws.nbytes()), "cublasSetWorkspace");
  m.ws = std::make_unique<Workspace>(dev);
  check(cudaDeviceSynchronize(), "upload of the model weights");
}

CudaModel::~CudaModel() = default;

void CudaModel::reserve(int64_t max_batch, int64_t max_len, int64_t max_rows) {
  DeviceGuard guard(impl_->dev.index);
  impl_->reserve(max_batch, max_len, max_rows, max_batch);  // generate's logits: one row per sequence
}

const CudaGenerateStats& CudaModel::last_stats() const { return impl_->stats; }

DType CudaModel::kv_cache_dtype() const { return impl_->kv_dtype == 2 ? DType::bf16 : DType::f32; }

size_t CudaModel::kv_cache_bytes() const {
  size_t bytes = 0;
  for (const Tensor& t : impl_->b.k_cache) bytes += t.nbytes();
  for (const Tensor& t : impl_->b.v_cache) bytes += t.nbytes();
  return bytes;
}

std::vector<float> CudaModel::forward(const std::vector<std::vector<int64_t>>& ids, const std::string& backend) {
  Impl& m = *impl_;
  DeviceGuard guard(m.dev.index);
  MOEX_CHECK(!ids.empty(), "forward: no sequences");
  m.check_ids(ids);
  int64_t T = 0, L = 0;
  for (const auto& s : ids) {
    T += int64_t(s.size());
    L = std::max(L, int64_t(s.size()));
  }
  m.reserve(int64_t(ids.size()), L, T, T);
  std::vector<int32_t> rid, pos, slot, out_rows;
  std::vector<kern::AttnTile> tiles;
  std::vector<Segment> segs;
  for (size_t b = 0; b < ids.size(); ++b) {
    const int32_t row0 = int32_t(rid.size());
    segs.push_back({row0, int64_t(ids[b].size()), int64_t(b)});
    for (size_t i = 0; i < ids[b].size(); ++i) {
      rid.push_back(int32_t(ids[b][i]));
      pos.push_back(int32_t(i));
      slot.push_back(int32_t(b));
      out_rows.push_back(int32_t(rid.size() - 1));
    }
    for (int32_t r = 0; r < int32_t(ids[b].size()); r += kern::kAttnRows)
      tiles.push_back({row0 + r, std::min<int32_t>(kern::kAttnRows, int32_t(ids[b].size()) - r)});
  }
  m.upload_rows(rid, pos, slot, tiles, out_rows);
  m.step(T, int64_t(tiles.size()), T, backend, false, &segs);
  std::vector<float> logits(size_t(T * m.V));
  check(cudaMemcpyAsync(logits.data(), m.b.logits.data(), logits.size() * sizeof(float), cudaMemcpyDeviceToHost, m.stream),
        "cudaMemcpyAsync (logits)");
  check(cudaStreamSynchronize(m.stream), "forward");
  return logits;
}

std::vector<std::vector<int64_t>> CudaModel::generate(const std::vector<std::vector<int64_t>>& prompts,
                                                      const CudaGenerateOptions& opts) {
  Impl& m = *impl_;
  DeviceGuard guard(m.dev.index);
  m.stats = {};
  std::vector<std::vector<int64_t>> out(prompts.begin(), prompts.end());
  if (opts.max_new_tokens <= 0 || prompts.empty()) return out;
  m.check_ids(prompts);
  const size_t B = prompts.size();
  int64_t T = 0, P = 0;
  for (const auto& p : prompts) {
    T += int64_t(p.size());
    P = std::max(P, int64_t(p.size()));
  }
  MOEX_CHECK(P + opts.max_new_tokens < (int64_t(1) << 31), "generate: {} + {} tokens are too many", P, opts.max_new_tokens);
  m.reserve(int64_t(B), P + opts.max_new_tokens, T, int64_t(B));
  const bool greedy = !opts.pick;

  std::vector<int32_t> rid, pos, slot, out_rows;
  std::vector<kern::AttnTile> tiles;
  std::vector<Segment> segs;
  for (size_t b = 0; b < B; ++b) {
    const int32_t row0 = int32_t(rid.size()), n = int32_t(prompts[b].size());
    segs.push_back({row0, n, int64_t(b)});
    for (int32_t i = 0; i < n; ++i) {
      rid.push_back(int32_t(prompts[b][size_t(i)]));
      pos.push_back(i);
      slot.push_back(int32_t(b));
    }
    out_rows.push_back(row0 + n - 1);
    for (int32_t r = 0; r < n; r += kern::kAttnRows) tiles.push_back({row0 + r, std::min<int32_t>(kern::kAttnRows, n - r)});
  }
  m.upload_rows(rid, pos, slot, tiles, out_rows);
  m.step(T, int64_t(tiles.size()), int64_t(B), opts.prefill_backend, greedy, &segs);

  std::vector<size_t> active(B);
  for (size_t b = 0; b < B; ++b) active[b] = b;
  std::vector<int32_t> next(B);
  std::vector<float> rows;
  for (int64_t n = 0; n < opts.max_new_tokens && !active.empty(); ++n) {
    const size_t A = active.size();
    // the only host synchronisation of a step: its tokens (or, when sampling, its logits rows)
    if (greedy) {
      check(cudaMemcpyAsync(next.data(), m.b.next.data(), A * sizeof(int32_t), cudaMemcpyDeviceToHost, m.stream),
            "cudaMemcpyAsync (tokens)");
      check(cudaStreamSynchronize(m.stream), "generate step");
    } else {
      rows.resize(A * size_t(m.V));
      check(cudaMemcpyAsync(rows.data(), m.b.logits.data(), rows.size() * sizeof(float), cudaMemcpyDeviceToHost, m.stream),
            "cudaMemcpyAsync (logits)");
      check(cudaStreamSynchronize(m.stream), "generate step");
      for (size_t i = 0; i < A; ++i) next[i] = int32_t(opts.pick(rows.data() + i * size_t(m.V), m.V));
    }
    std::vector<size_t> still;
    for (size_t i = 0; i < A; ++i) {
      const size_t b = active[i];
      out[b].push_back(next[i]);
      if (std::find(opts.eos.begin(), opts.eos.end(), int64_t(next[i])) == opts.eos.end()) still.push_back(b);
    }
    active = std::move(still);
    if (n + 1 == opts.max_new_tokens || active.empty()) break;
    const size_t A2 = active.size();
    rid.assign(A2, 0);
    pos.assign(A2, 0);
    slot.assign(A2, 0);
    out_rows.assign(A2, 0);
    tiles.assign(A2, {});
    for (size_t i = 0; i < A2; ++i) {
      const size_t b = active[i];
      rid[i] = int32_t(out[b].back());
      pos[i] = int32_t(out[b].size() - 1);
      slot[i] = int32_t(b);
      out_rows[i] = int32_t(i);
      tiles[i] = {int32_t(i), 1};
    }
    m.upload_rows(rid, pos, slot, tiles, out_rows);
    m.decode_step(int64_t(A2), opts.decode_backend, greedy, opts.cuda_graphs);
    ++m.stats.decode_steps;
  }
  check(cudaStreamSynchronize(m.stream), "generate");
  return out;
}

size_t CudaModel::decode_step_weight_bytes() const {
  const Impl& m = *impl_;
  size_t bytes = size_t(m.H) * dtype_size(m.dt) + m.lm_head.bytes() + size_t(m.H) * 4;
  for (const DLayer& d : m.layers) {
    bytes += size_t(2 * m.H) * 4;
    for (const DLinear* l : {&d.qkv, &d.o, &d.q_a, &d.q_b, &d.q, &d.kv_a, &d.kv_b, &d.gate_up, &d.down, &d.router,
                             &d.shared_gate_up, &d.shared_down, &d.shared_gate})
      if (l->defined()) bytes += l->bytes() + (l->bias ? size_t(l->out) * 4 : 0);
    if (d.is_moe) {
      const ExpertsSpec& s = d.experts.spec;
      const size_t wsz = s.quant.quantized() ? 1 : dtype_size(s.dtype);  // FP8 experts: one byte (+ scales, small)
      const size_t per_expert = size_t(s.gate_up_rows() * s.hidden + s.hidden * s.intermediate) * wsz +
                                (s.has_bias ? size_t(s.gate_up_rows() + s.hidden) * dtype_size(s.dtype) : 0);
      bytes += per_expert * size_t(std::min<int64_t>(m.t.num_experts_per_tok, s.num_experts));
    }
  }
  return bytes;
}

ModelWeights CudaModel::random_weights(const TextConfig& t, DType dtype, Device dev, uint64_t seed) {
  MOEX_CHECK(t.family == ModelFamily::qwen2_moe || t.family == ModelFamily::qwen3_moe || t.family == ModelFamily::olmoe ||
                 t.family == ModelFamily::mixtral,
             "random weights are built for qwen2_moe, qwen3_moe, olmoe and mixtral (got {})", family_name(t.family));
  MOEX_CHECK(dev.is_cuda(), "random weights are built on a CUDA device");
  const std::string why = cuda_unavailable_reason();
  if (!why.empty()) detail::fail(ErrorCode::unsupported, "random weights need a CUDA device: {}", why);
  DeviceGuard guard(dev.index);
  const int dc = code_of(dtype);
  uint64_t counter = seed * 1000003ull;
  auto rand_dev = [&](std::initializer_list<int64_t> shape, float scale) {
    Tensor x = Tensor::empty(dtype, shape, dev);
    kern::launch_fill_random(x.data(), dc, x.numel(), ++counter, scale, 0.0f, nullptr);
    return x;
  };
  auto ones = [&](int64_t n) {
    Tensor x = Tensor::empty(DType::f32, {n});
    std::fill(x.ptr<float>(), x.ptr<float>() + n, 1.0f);
    return x;
  };
  auto lin = [&](int64_t out, int64_t in, bool bias) {
    Linear l;
    l.weight = rand_dev({out, in}, 0.02f * std::sqrt(3.0f));  // uniform with std 0.02
    if (bias) {
      l.bias = Tensor::empty(DType::f32, {out});
      std::fill(l.bias.ptr<float>(), l.bias.ptr<float>() + out, 0.0f);
    }
    return l;
  };
  const int64_t H = t.hidden_size, nh = t.num_attention_heads, nkv = t.num_key_value_heads, hd = t.head_dim;
  const int64_t E = t.num_experts, I = t.moe_intermediate_size;
  ModelWeights w;
  w.dtype = dtype;
  w.prefix = "model.";
  w.embed = rand_dev({t.vocab_size, H}, 0.02f * std::sqrt(3.0f));
  w.final_norm = ones(H);
  w.tied = t.tie_word_embeddings;
  w.lm_head = w.tied ? w.embed : rand_dev({t.vocab_size, H}, 0.02f * std::sqrt(3.0f));
  w.layers.resize(size_t(t.num_hidden_layers));
  for (int64_t l = 0; l < t.num_hidden_layers; ++l) {
    LayerWeights& lw = w.layers[size_t(l)];
    lw.input_norm = ones(H);
    lw.post_attention_norm = ones(H);
    lw.attn.q = lin(nh * hd, H, t.qkv_bias);
    lw.attn.k = lin(nkv * hd, H, t.qkv_bias);
    lw.attn.v = lin(nkv * hd, H, t.qkv_bias);
    lw.attn.o = lin(H, nh * hd, t.o_bias);
    if (t.qk_norm) {
      const bool per_head = t.family == ModelFamily::qwen3_moe;
      lw.attn.q_norm = ones(per_head ? hd : nh * hd);
      lw.attn.k_norm = ones(per_head ? hd : nkv * hd);
    }
    lw.is_moe = t.is_moe_layer(l);
    if (lw.is_moe) {
      MoeWeights& m = lw.moe;
      m.router = lin(E, H, false);
      m.gate_up = rand_dev({E, 2 * I, H}, 0.02f * std::sqrt(3.0f));
      m.down = rand_dev({E, H, I}, 0.02f * std::sqrt(3.0f));
      m.experts.spec = experts_spec(t, dtype);
      m.experts.gate_up = m.gate_up.view();
      m.experts.down = m.down.view();
      if (t.shared_expert_intermediate_size > 0) {
        const int64_t S = t.shared_expert_intermediate_size;
        m.shared.gate = lin(S, H, false);
        m.shared.up = lin(S, H, false);
        m.shared.down = lin(H, S, false);
        m.shared_gate = lin(1, H, false);
      }
    } else {
      const int64_t Id = t.intermediate_size;
      lw.mlp.gate = lin(Id, H, false);
      lw.mlp.up = lin(Id, H, false);
      lw.mlp.down = lin(H, Id, false);
    }
  }
  check(cudaDeviceSynchronize(), "random weights");
  return w;
}

double measure_copy_bandwidth(Device dev) {
  MOEX_CHECK(dev.is_cuda(), "measure_copy_bandwidth needs a CUDA device");
  DeviceGuard guard(dev.index);
  const size_t bytes = size_t(1) << 30;
  Tensor a = Tensor::empty(DType::u8, {int64_t(bytes)}, dev), c = Tensor::empty(DType::u8, {int64_t(bytes)}, dev);
  check(cudaMemset(a.data(), 1, bytes), "cudaMemset");
  cudaEvent_t e0, e1;
  check(cudaEventCreate(&e0), "cudaEventCreate");
  check(cudaEventCreate(&e1), "cudaEventCreate");
  check(cudaMemcpy(c.data(), a.data(), bytes, cudaMemcpyDeviceToDevice), "cudaMemcpy (warm-up)");
  const int reps = 10;
  check(cudaEventRecord(e0), "cudaEventRecord");
  for (int i = 0; i < reps; ++i) check(cudaMemcpyAsync(c.data(), a.data(), bytes, cudaMemcpyDeviceToDevice), "cudaMemcpyAsync");
  check(cudaEventRecord(e1), "cudaEventRecord");
  check(cudaEventSynchronize(e1), "cudaEventSynchronize");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime");
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return 2.0 * double(bytes) * reps / (double(ms) * 1e-3);
}

}  // namespace moex::model
