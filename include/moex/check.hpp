// moex/check.hpp — the f64 reference and the equivalence harness that runs every registered
// backend against it (used by the tests and by `moex check`). SPEC §8, DESIGN habits 3–7.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "moex/backend.hpp"

namespace moex::check {

// How the generator routes tokens to experts.
enum class Routing {
  random,         // K distinct experts per token, uniformly
  one_expert,     // every token's slots go to experts {0..K-1}: expert 0 gets every token
  skewed,         // most pairs on a few experts, many experts with no tokens
  empty_experts,  // only the first half of the experts are ever chosen
  dropped,        // like random, with ~20% of slots set to -1 or >= E (dropped)
};
const char* routing_name(Routing r);

struct Case {
  uint64_t seed = 0;
  ExpertsSpec spec;
  int64_t tokens = 1, top_k = 1;
  DType index_dtype = DType::i32;
  DType weights_dtype = DType::f32;  // of top_k_weights
  Routing routing = Routing::random;
  bool integer_valued = false;  // small integers everywhere: the result must be exact
  // FP8 block-scaled experts with f32 scales only: about a third of the weight blocks (of every expert,
  // both projections) are zero, with scale 0 (checkpoints may store a zero block so; moex's quantizer
  // writes 1): every path must add nothing for them rather than divide by the scale.
  bool zero_weight_blocks = false;
  std::string describe() const;
};

struct Tolerance {
  double rel_l2;
  const char* reason;
};
// SPEC §8: f32 1e-5, f16 2e-3, bf16 1e-2; integer-valued cases 0 (exact); quantized experts 2e-3
// against the reference that applies the same quantization (and FP8 8e-2 against the unquantized one).
Tolerance tolerance_for(const Case& c);

// Host tensors of one generated problem.
struct Instance {
  Case c;
  Tensor gate_up, down, gate_up_bias, down_bias, hidden, top_k_index, top_k_weights;
  // Quantized cases: gate_up / down hold the codes, these the scales, and *_plain the weights in
  // the activation dtype they were quantized from (for the comparison with the unquantized reference).
  Tensor gate_up_scale, down_scale, gate_up_plain, down_plain;
  Experts experts() const;
  Experts plain_experts() const;  // the unquantized experts (== experts() when not quantized)
  ExpertsCall call(const TensorView& out) const;
  // The same tensors on another device.
  Instance to(Device dev) const;
};
Instance make_instance(const Case& c);

// out[T*H] in f64 from CPU tensors, with no intermediate rounding; dropped slots contribute 0.
std::vector<double> reference_forward(const Experts& ex, const ExpertsCall& call);

struct Result {
  enum class Status { passed, failed, skipped } status = Status::passed;
  double rel_l2 = 0.0;     // ‖out − ref‖ / ‖ref‖ (0 when both are 0)
  double tolerance = 0.0;
  std::string message;     // the reason of a skip or a failure
};
const char* status_name(Result::Status s);

// Runs `backend` on case c on device dev: inputs generated, out poisoned and surrounded by guard
// elements, the call made through experts_forward, then: guards intact, every element written,
// no NaN/Inf where the reference is finite, relative L2 error within the tolerance.
// An unsupported backend gives `skipped` with its reason.
Result run_case(const std::string& backend, const Case& c, Device dev = Device::cpu(), const RunOptions& opts = {});
// The same for several backends, sharing one generated instance and one reference.
std::vector<Result> run_case(const std::vector<std::string>& backends, const Case& c, Device dev = Device::cpu(),
                             const RunOptions& opts = {});

// One case generated once, on the host and on dev, with its f64 references computed once: run() checks
// a backend against them as run_case does (a fresh poisoned output each time), so that a test running
// the same case under many settings (environment switches) pays for the reference once.
class PreparedCase {
 public:
  PreparedCase(const Case& c, Device dev);
  Result run(const std::string& backend, const RunOptions& opts = {}) const;
  const Case& spec() const { return host_.c; }

 private:
  Instance host_, on_dev_;
  Device dev_;
  std::vector<double> ref_, plain_ref_;  // plain_ref_: FP8 cases' unquantized reference (SPEC §8: 8e-2)
  double ref_norm2_ = 0.0;
};

// `count` seeded random cases of one dtype: first the fixed edge cases (T = 0, T = 1, K = 1,
// K = E, all tokens on one expert, empty experts, dropped slots, sizes off every tile, every
// layout variant and activation, integer-valued exact cases), then random shapes.
std::vector<Case> generate_cases(uint64_t seed, int count, DType dtype);

}  // namespace moex::check
