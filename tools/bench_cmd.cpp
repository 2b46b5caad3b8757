// tools/bench_cmd.cpp — `moex bench`: backends × shapes × token counts, timed after warm-up with
// rotated inputs, the median reported beside the floor of each case (SPEC §9, DESIGN habit 10).
//
//   moex bench --device cpu --backends eager,batched_mm,grouped_mm --shapes qwen3_30b_a3b
//              --tokens 1,16,256 --dtype bf16 --threads N --format table|csv|json
//
// The floor of a case is max(bytes / copy bandwidth, FLOPs / peak rate), where bytes are the
// distinct experts' weights that must be read plus the input and output, and both ceilings are
// measured on this machine at the start of the run (on CUDA: a device copy, and a cuBLAS 8192^3
// GEMM on random data). On CUDA each case also times the dense cuBLAS GEMMs of the same FLOPs
// (dense_ms: [S, H] x [H, 2I] and [S, I] x [I, H], S the routed pairs; --no-dense skips them).
#include <fmt/format.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

#include "bench/bench_support.hpp"
#include "moex/check.hpp"
#include "moex/moex.hpp"
#include "moex/quant.hpp"
#include "tools/commands.hpp"

namespace moex::cli {

namespace {

struct Shape {
  std::string name;
  int64_t H, I, E, K;
};

// SPEC §9 shapes, the CPU anchor's small MoE, and a tiny one for --check.
const std::vector<Shape> kShapes = {
    {"qwen3_30b_a3b", 2048, 768, 128, 8}, {"qwen15_moe_a2_7b", 2048, 1408, 60, 4}, {"mixtral_8x7b", 4096, 14336, 8, 2},
    {"deepseek_v3", 7168, 2048, 256, 8},  {"small_moe", 1024, 512, 16, 2},         {"tiny", 64, 32, 8, 2},
};

struct BenchOptions {
  std::string device = "cpu";
  std::string backends;
  std::string shapes = "qwen3_30b_a3b";
  std::string shape;  // H,I,E,K
  std::string tokens = "1,16,256";
  std::string dtype = "bf16";
  int threads = 0;
  std::string format = "table";
  double min_time_ms = 300;
  int max_iters = 50;
  int warmup = 2;
  uint64_t seed = 0;
  bool check = false;
  std::string quant = "none";  // none | fp8 | fp8-ue8m0 | fp4
  bool dense = true;            // CUDA bf16/f16: time the dense cuBLAS GEMMs of each case's FLOPs
};


Shape parse_custom_shape(const std::string& s) {
  auto parts = split_list(s);
  if (parts.size() != 4) throw Error(ErrorCode::invalid_argument, "--shape must be H,I,E,K (got '" + s + "')");
  int64_t v[4];
  for (int i = 0; i < 4; ++i) {
    char* end = nullptr;
    v[i] = std::strtoll(parts[size_t(i)].c_str(), &end, 10);
    if (!end || *end || v[i] < 1) throw Error(ErrorCode::invalid_argument, "--shape must be four positive integers H,I,E,K (got '" + s + "')");
  }
  if (v[3] > v[2]) throw Error(ErrorCode::invalid_argument, "--shape: K must be <= E (got '" + s + "')");
  return {fmt::format("custom_{}x{}x{}x{}", v[0], v[1], v[2], v[3]), v[0], v[1], v[2], v[3]};
}

Shape find_shape(const std::string& name) {
  std::string valid;
  for (const auto& s : kShapes) {
    if (s.name == name) return s;
    valid += (valid.empty() ? "" : ", ") + s.name;
  }
  throw Error(ErrorCode::not_found, "unknown shape '" + name + "' (valid: " + valid + "; or --shape H,I,E,K)");
}

uint64_t mix(uint64_t x) {  // splitmix64: a fast counter-based generator for filling large tensors in parallel
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform values with standard deviation `stddev` (like the anchors' N(0, 0.02) weights).
Tensor random_tensor(DType dt, std::initializer_list<int64_t> shape, double stddev, uint64_t seed, Device dev) {
  Tensor host = Tensor::empty(dt, shape);
  const int64_t n = host.numel();
  const float a = float(stddev * std::sqrt(3.0));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float u = float(mix(seed * 0x100000001b3ull + uint64_t(i)) >> 40) / float(1 << 24) * 2.0f - 1.0f;
    const float v = a * u;
    if (dt == DType::f32) host.ptr<float>()[i] = v;
    else if (dt == DType::bf16) host.ptr<uint16_t>()[i] = float_to_bf16(v);
    else host.ptr<uint16_t>()[i] = float_to_f16(v);
  }
  return dev.is_cpu() ? host : host.to(dev);
}

QuantSpec parse_quant(const std::string& q) {
  if (q == "none") return QuantSpec::none();
  if (q == "fp8") return QuantSpec::fp8_block(128, 128, ScaleFormat::f32);
  if (q == "fp8-ue8m0") return QuantSpec::fp8_block(128, 128, ScaleFormat::ue8m0);
  if (q == "fp4") return QuantSpec::fp4_group(32);
  throw Error(ErrorCode::invalid_argument, "--quant must be none, fp8, fp8-ue8m0 or fp4 (got '" + q + "')");
}

// Random experts quantized one expert at a time (no full f32 copy): codes [E, out, in] (fp8) or
// [E, out, ceil(in/2)] (fp4) and their scales, on `dev`.
void random_quantized(const QuantSpec& q, int64_t E, int64_t out, int64_t in, uint64_t seed, Device dev, Tensor& codes,
                      Tensor& scales) {
  const bool fp8 = q.kind == QuantKind::fp8_block;
  const int64_t row_bytes = fp8 ? in : (in + 1) / 2;
  const int64_t sr = fp8 ? (out + q.block_n - 1) / q.block_n : out, sc = (in + q.block_k - 1) / q.block_k;
  Tensor hc = Tensor::empty(fp8 ? DType::fp8_e4m3 : DType::u8, {E, out, row_bytes});
  Tensor hs = Tensor::empty(fp8 && q.scale_format == ScaleFormat::f32 ? DType::f32 : DType::u8, {E, sr, sc});
  const float a = float(0.02 * std::sqrt(3.0));
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t e = 0; e < E; ++e) {
    std::vector<float> w(static_cast<size_t>(out * in));
    for (int64_t i = 0; i < out * in; ++i)
      w[size_t(i)] = a * (float(mix((seed + uint64_t(e)) * 0x100000001b3ull + uint64_t(i)) >> 40) / float(1 << 24) * 2.0f - 1.0f);
    uint8_t* c = hc.ptr<uint8_t>() + e * out * row_bytes;
    char* s = static_cast<char*>(hs.data()) + size_t(e * sr * sc) * dtype_size(hs.dtype());
    if (fp8)
      quantize_fp8_blocks(w.data(), out, in, q.block_n, q.block_k, q.scale_format, c, s);
    else
      quantize_fp4_groups(w.data(), out, in, q.block_k, c, reinterpret_cast<uint8_t*>(s));
  }
  codes = dev.is_cpu() ? hc : hc.to(dev);
  scales = dev.is_cpu() ? hs : hs.to(dev);
}

struct InputSet {
  Tensor hidden, idx, weights;
  int64_t distinct = 0;  // experts that received tokens
  int64_t valid_pairs = 0;
};

InputSet make_inputs(const Shape& sh, int64_t T, DType dt, uint64_t seed, Device dev) {
  InputSet in;
  in.hidden = random_tensor(dt, {T, sh.H}, 1.0, seed, dev);
  // routing as in the anchors: top-K of a softmax over random logits, renormalised
  Tensor logits = random_tensor(DType::f32, {std::max<int64_t>(T, 1), sh.E}, 1.0, seed + 7, Device::cpu());
  Tensor idx = Tensor::empty(DType::i32, {T, sh.K}), w = Tensor::empty(DType::f32, {T, sh.K});
  RouterConfig rc;
  rc.kind = RouterKind::qwen3_moe;
  rc.num_experts = sh.E;
  rc.top_k = sh.K;
  rc.norm_topk_prob = true;
  route(rc, logits.ptr<float>(), T, idx.ptr<int32_t>(), w.ptr<float>());
  std::set<int32_t> hit(idx.ptr<int32_t>(), idx.ptr<int32_t>() + T * sh.K);
  in.distinct = int64_t(hit.size());
  in.valid_pairs = T * sh.K;
  in.idx = dev.is_cpu() ? idx : idx.to(dev);
  in.weights = dev.is_cpu() ? w : w.to(dev);
  return in;
}

size_t available_host_bytes() {
  const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? size_t(pages) * size_t(page) : size_t(-1);
}

struct Row {
  std::string backend, shape, dtype, device, skipped, quant = "none";
  int64_t T = 0, distinct = 0;
  int threads = 0;
  double ms = 0, tflops = 0, gbps = 0, extra_mb = 0, floor_ms = 0, pct_floor = 0, rel_err = -1;
  double dense_ms = 0, dense_tflops = 0;  // the dense cuBLAS GEMMs of the same FLOPs (0: not measured)
  // CUDA: median host time inside experts_forward (checks, dispatch, kernel launches; the call
  // returns before the GPU is done). The GPU idles for about this long at the start of each timed
  // call, which a CUDA graph or a queue of calls would hide. -1: not measured (CPU).
  double host_us = -1;
};

nlohmann::json to_json(const Row& r) {
  nlohmann::json j{{"backend", r.backend}, {"shape", r.shape}, {"T", r.T}, {"dtype", r.dtype}, {"device", r.device},
                   {"threads", r.threads}, {"quant", r.quant}};
  if (!r.skipped.empty()) {
    j["skipped"] = r.skipped;
    return j;
  }
  auto round3 = [](double v) { return std::round(v * 1e4) / 1e4; };
  j.update({{"ms", round3(r.ms)}, {"tflops", round3(r.tflops)}, {"gbps", round3(r.gbps)}, {"extra_mb", round3(r.extra_mb)},
            {"floor_ms", round3(r.floor_ms)}, {"pct_floor", round3(r.pct_floor)}, {"distinct_experts", r.distinct}});
  if (r.rel_err >= 0) j["rel_err"] = r.rel_err;
  if (r.host_us >= 0) j["host_us"] = std::round(r.host_us * 10) / 10;
  if (r.dense_ms > 0) j.update({{"dense_ms", round3(r.dense_ms)}, {"dense_tflops", round3(r.dense_tflops)}});
  return j;
}

int run_bench(BenchOptions o) {
  const Device dev = parse_device(o.device);
  const DType dt = parse_dtype(o.dtype);
  if (!is_float_activation(dt)) throw Error(ErrorCode::invalid_argument, "--dtype must be f32, f16 or bf16");
  if (o.format != "table" && o.format != "csv" && o.format != "json")
    throw Error(ErrorCode::invalid_argument, "--format must be table, csv or json (got '" + o.format + "')");
  std::vector<Shape> shapes;
  if (o.check) {  // quick self-test: tiny sizes, every backend verified against the reference
    shapes = {find_shape("tiny")};
    o.tokens = "1,7,33";
    o.min_time_ms = 1;
    o.max_iters = 3;
    o.warmup = 1;
  } else {
    if (!o.shape.empty()) shapes.push_back(parse_custom_shape(o.shape));
    if (o.shape.empty() || o.shapes != "qwen3_30b_a3b")
      for (const auto& n : split_list(o.shapes)) shapes.push_back(find_shape(n));
  }
  std::vector<int64_t> tokens;
  for (const auto& t : split_list(o.tokens)) {
    char* end = nullptr;
    const long long v = std::strtoll(t.c_str(), &end, 10);
    if (!end || *end || v < 0) throw Error(ErrorCode::invalid_argument, "--tokens must be non-negative integers (got '" + t + "')");
    tokens.push_back(v);
  }
  auto& reg = ExpertsInterface::global();
  std::vector<std::string> backends = o.backends.empty() ? reg.names() : split_list(o.backends);
  for (const auto& b : backends) reg.get(b);
  const int threads = o.threads > 0 ? o.threads : omp_get_max_threads();
  omp_set_num_threads(threads);

  const bool progress = progress_enabled() && !o.check;
  if (progress) fmt::print(stderr, "measuring the machine's copy bandwidth and peak rate...\r");
  const double bw = o.check ? 1e10 : bench::copy_bandwidth(dev, threads);
  const double peak = o.check ? 1e11 : bench::peak_flops(dev, dt, threads);
  const double read_bw = o.check ? 0.0 : bench::read_bandwidth(dev, threads);
  const std::string devname = dev.is_cpu() ? fmt::format("cpu ({}, {} threads)", cpu_info().isa, threads) : to_string(dev);
  const std::string peak_what = bench::peak_what(dev, dt);
  if (o.format == "table")
    fmt::print("# {}: copy bandwidth {:.1f} GB/s{}, peak {:.1f} GFLOP/s ({}){}\n", devname, bw / 1e9,
               read_bw > 0 ? fmt::format(" (streaming read {:.1f} GB/s)", read_bw / 1e9) : std::string(), peak / 1e9, peak_what,
               o.check ? " [--check: probes skipped]" : "");
  else if (o.format == "json")
    fmt::print("{}\n", nlohmann::json{{"machine", devname}, {"copy_gbps", bw / 1e9}, {"read_gbps", read_bw / 1e9},
                                      {"peak_gflops", peak / 1e9}, {"peak_what", peak_what}}.dump());
  else
    fmt::print("backend,shape,T,dtype,device,threads,ms,tflops,gbps,extra_mb,floor_ms,pct_floor,skipped\n");
  if (o.format == "table")
    fmt::print("{:<16} {:>6} {:<12} {:>10} {:>9} {:>9} {:>10} {:>7} {:>9}\n", "shape", "T", "backend", "ms", "TFLOP/s", "GB/s",
               "floor ms", "%floor", "extra MB");

  const size_t esz = dtype_size(dt);
  const QuantSpec quant = parse_quant(o.quant);
  // bytes per weight element as stored (the floor counts what must be read)
  const double wbytes = quant.kind == QuantKind::fp8_block ? 1.0 : quant.kind == QuantKind::fp4_group ? 0.5 : double(esz);
  int failures = 0;
  Workspace ws(dev);
  RunOptions ro;
  ro.num_threads = threads;
  ro.workspace = &ws;
  for (const Shape& sh : shapes) {
    const int64_t R = 2 * sh.I;
    const size_t weight_bytes = size_t(double(sh.E) * double(R * sh.H + sh.H * sh.I) * wbytes);
    if (dev.is_cpu() && weight_bytes + (size_t(1) << 30) > available_host_bytes()) {
      for (int64_t T : tokens)
        for (const auto& b : backends) {
          Row r{b, sh.name, std::string(dtype_name(dt)), to_string(dev),
                fmt::format("the weights need {:.1f} GB and this machine has {:.1f} GB free", weight_bytes / 1e9,
                            available_host_bytes() / 1e9)};
          r.T = T;
          r.threads = threads;
          if (o.format == "json") fmt::print("{}\n", to_json(r).dump());
          else if (o.format == "table") fmt::print("{:<16} {:>6} {:<12} skipped: {}\n", sh.name, T, b, r.skipped);
        }
      continue;
    }
    if (progress) fmt::print(stderr, "{:60}\rgenerating {} weights ({:.1f} GB)...\r", "", sh.name, weight_bytes / 1e9);
    Experts ex;
    ex.spec.num_experts = sh.E;
    ex.spec.hidden = sh.H;
    ex.spec.intermediate = sh.I;
    ex.spec.dtype = dt;
    ex.spec.quant = quant;
    Tensor gate_up, down, gate_up_scale, down_scale;
    if (quant.quantized()) {
      random_quantized(quant, sh.E, R, sh.H, o.seed * 31 + 1, dev, gate_up, gate_up_scale);
      random_quantized(quant, sh.E, sh.H, sh.I, o.seed * 31 + 2, dev, down, down_scale);
      ex.gate_up_scale = gate_up_scale;
      ex.down_scale = down_scale;
    } else {
      gate_up = random_tensor(dt, {sh.E, R, sh.H}, 0.02, o.seed * 31 + 1, dev);
      down = random_tensor(dt, {sh.E, sh.H, sh.I}, 0.02, o.seed * 31 + 2, dev);
    }
    ex.gate_up = gate_up;
    ex.down = down;
    for (int64_t T : tokens) {
      // rotate several input sets so that repeated calls do not just re-read cached inputs
      const int sets = T * sh.H * int64_t(esz) > (int64_t(64) << 20) ? 2 : 4;
      std::vector<InputSet> inputs;
      for (int s = 0; s < sets; ++s) inputs.push_back(make_inputs(sh, T, dt, o.seed * 1000 + uint64_t(T) * 10 + uint64_t(s), dev));
      Tensor out = Tensor::empty(dt, {T, sh.H}, dev);
      const double flops = 2.0 * double(inputs[0].valid_pairs) * double(R * sh.H + sh.I * sh.H);
      const double bytes = double(inputs[0].distinct) * double(R * sh.H + sh.H * sh.I) * wbytes + 2.0 * double(T * sh.H) * double(esz);
      const double floor_ms = std::max(bytes / bw, flops / peak) * 1e3;
      // the dense cuBLAS GEMMs of the same FLOPs on random data, as if one expert held every routed
      // pair: [S, H] x [H, R] then [S, I] x [I, H] (the rate a grouped GEMM is measured against)
      double dense_ms = 0;
      if (o.dense && dev.is_cuda() && !o.check && dt != DType::f32 && inputs[0].valid_pairs > 0) {
        if (progress) fmt::print(stderr, "{:60}\r{} T={} dense cuBLAS GEMMs...\r", "", sh.name, T);
        dense_ms = bench::cuda_dense_pair_ms(dev.index, dt, inputs[0].valid_pairs, R, sh.H, sh.H, sh.I);
      }
      std::vector<double> ref;
      for (const auto& b : backends) {
        Row r{b, sh.name, std::string(dtype_name(dt)), to_string(dev), ""};
        r.quant = o.quant;
        r.T = T;
        r.threads = threads;
        r.distinct = inputs[0].distinct;
        r.dense_ms = dense_ms;
        r.dense_tflops = dense_ms > 0 ? flops / (dense_ms * 1e-3) / 1e12 : 0;
        auto call_of = [&](int s) { return ExpertsCall{inputs[size_t(s)].hidden, inputs[size_t(s)].idx, inputs[size_t(s)].weights, out}; };
        Problem p = Problem::from(ex, call_of(0));
        p.cpu_threads = threads;
        const auto backend = reg.get(b);
        const Support sup = backend->supports(p);
        if (!sup.ok) {
          r.skipped = sup.reason;
        } else {
          if (progress) fmt::print(stderr, "{:60}\r{} T={} {}...\r", "", sh.name, T, b);
          try {
            for (int i = 0; i < o.warmup; ++i) experts_forward(b, ex, call_of(i % sets), ro);
            bench::synchronize(dev);
            bench::Timer timer(dev);
            std::vector<double> times, host_us;
            double spent = 0;
            while (int(times.size()) < 3 || (spent < o.min_time_ms && int(times.size()) < o.max_iters)) {
              const int s = int(times.size()) % sets;
              timer.start();
              const auto h0 = std::chrono::steady_clock::now();
              experts_forward(b, ex, call_of(s), ro);
              host_us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - h0).count());
              times.push_back(timer.stop_ms());
              spent += times.back();
            }
            const auto median = [](std::vector<double> v) {
              std::sort(v.begin(), v.end());
              return v[v.size() / 2];
            };
            r.ms = median(times);
            if (dev.is_cuda()) r.host_us = median(host_us);
            r.tflops = flops / (r.ms * 1e-3) / 1e12;
            r.gbps = bytes / (r.ms * 1e-3) / 1e9;
            r.extra_mb = double(backend->workspace_bytes(p)) / 1e6;
            r.floor_ms = floor_ms;
            r.pct_floor = r.ms > 0 ? floor_ms / r.ms * 100.0 : 0;
            if (o.check) {  // verify the last output (input set of the last iteration) against the f64 reference
              const int s = (int(times.size()) - 1) % sets;
              Experts hex = ex;
              Tensor hgu = gate_up.to(Device::cpu()), hdown = down.to(Device::cpu());
              hex.gate_up = hgu;
              hex.down = hdown;
              Tensor hgs, hds;
              if (quant.quantized()) {
                hgs = gate_up_scale.to(Device::cpu());
                hds = down_scale.to(Device::cpu());
                hex.gate_up_scale = hgs;
                hex.down_scale = hds;
              }
              Tensor hx = inputs[size_t(s)].hidden.to(Device::cpu()), hi = inputs[size_t(s)].idx.to(Device::cpu()),
                     hw = inputs[size_t(s)].weights.to(Device::cpu()), ho = out.to(Device::cpu());
              ref = check::reference_forward(hex, ExpertsCall{hx, hi, hw, ho});
              double e2 = 0, r2 = 0;
              for (int64_t i = 0; i < T * sh.H; ++i) {
                double v = dt == DType::f32 ? double(ho.ptr<float>()[i])
                           : dt == DType::bf16 ? double(bf16_to_float(ho.ptr<uint16_t>()[i]))
                                               : double(f16_to_float(ho.ptr<uint16_t>()[i]));
                e2 += (v - ref[size_t(i)]) * (v - ref[size_t(i)]);
                r2 += ref[size_t(i)] * ref[size_t(i)];
              }
              r.rel_err = r2 > 0 ? std::sqrt(e2 / r2) : std::sqrt(e2);
              const double tol = quant.quantized() ? 1e-2 : dt == DType::f32 ? 1e-5 : dt == DType::f16 ? 2e-3 : 1e-2;
              if (!(r.rel_err <= tol)) {
                ++failures;
                fmt::print(stderr, "bench --check: {} {} T={} rel_err {:.3e} > {:.0e}\n", b, sh.name, T, r.rel_err, tol);
              }
            }
          } catch (const Error& e) {
            r.skipped = std::string("error: ") + e.what();
            if (e.code() != ErrorCode::out_of_memory) ++failures;
          }
        }
        if (progress) fmt::print(stderr, "{:60}\r", "");
        if (o.format == "json") {
          fmt::print("{}\n", to_json(r).dump());
        } else if (o.format == "csv") {
          fmt::print("{},{},{},{},{},{},{:.4f},{:.4f},{:.2f},{:.2f},{:.4f},{:.1f},\"{}\"\n", r.backend, r.shape, r.T, r.dtype, r.device,
                     r.threads, r.ms, r.tflops, r.gbps, r.extra_mb, r.floor_ms, r.pct_floor, r.skipped);
        } else if (!r.skipped.empty()) {
          fmt::print("{:<16} {:>6} {:<12} skipped: {}\n", sh.name, T, b, r.skipped);
        } else {
          fmt::print("{:<16} {:>6} {:<12} {:>10.3f} {:>9.3f} {:>9.1f} {:>10.3f} {:>6.1f}% {:>9.1f}{}\n", sh.name, T, b, r.ms, r.tflops,
                     r.gbps, r.floor_ms, r.pct_floor, r.extra_mb,
                     (r.rel_err >= 0 ? fmt::format("  rel_err {:.1e}", r.rel_err) : std::string()) +
                         (r.dense_ms > 0 ? fmt::format("  dense cuBLAS {:.3f} ms ({:.0f} TF)", r.dense_ms, r.dense_tflops) : std::string()));
        }
        std::fflush(stdout);
      }
    }
  }
  if (o.check) fmt::print("bench --check: {}\n", failures == 0 ? "all backends verified" : "FAILED");
  return failures == 0 ? 0 : 1;
}

}  // namespace

void add_bench(CLI::App& app, std::function<int()>& run) {
  auto o = std::make_shared<BenchOptions>();
  auto* cmd = app.add_subcommand("bench", "Time backends over shapes and token counts, beside the floor of each case");
  cmd->add_option("--device", o->device, "cpu, cuda or cuda:N")->capture_default_str();
  cmd->add_option("--backends", o->backends, "comma-separated backends (default: all registered; unsupported ones are listed as skipped)");
  cmd->add_option("--shapes", o->shapes, "comma-separated named shapes: qwen3_30b_a3b, qwen15_moe_a2_7b, mixtral_8x7b, deepseek_v3, small_moe, tiny")
      ->capture_default_str();
  cmd->add_option("--shape", o->shape, "a custom shape H,I,E,K (added to --shapes when both are given)");
  cmd->add_option("--tokens", o->tokens, "comma-separated token counts T")->capture_default_str();
  cmd->add_option("--dtype", o->dtype, "f32, f16 or bf16")->capture_default_str();
  cmd->add_option("--threads", o->threads, "CPU threads (0 = all)")->capture_default_str()->check(CLI::Range(0, 4096));
  cmd->add_option("--format", o->format, "table, csv or json (one object per line)")->capture_default_str();
  cmd->add_option("--min-time-ms", o->min_time_ms, "keep timing a case until this much time is spent")->capture_default_str();
  cmd->add_option("--max-iters", o->max_iters, "at most this many timed calls per case")->capture_default_str();
  cmd->add_option("--warmup", o->warmup, "untimed calls first")->capture_default_str();
  cmd->add_option("--seed", o->seed, "seed of the random weights and inputs")->capture_default_str();
  cmd->add_flag("!--no-dense", o->dense,
                "CUDA: skip the dense cuBLAS GEMMs of each case's FLOPs (timed by default, reported as dense_ms / dense_tflops)");
  cmd->add_option("--quant", o->quant, "expert weights: none, fp8 (128x128 blocks, f32 scales), fp8-ue8m0, fp4 (1x32 UE8M0 groups)")
      ->capture_default_str();
  cmd->add_flag("--check", o->check, "quick self-test on tiny sizes: every backend runs and matches the f64 reference");
  cmd->callback([&run, o] { run = [o] { return run_bench(*o); }; });
}

}  // namespace moex::cli
