// moex/backend.hpp — experts backends and their registry (`ExpertsInterface`). One table drives
// dispatch, `moex info`, the equivalence harness and the benchmark (SPEC §2).
#pragma once
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "moex/experts.hpp"

namespace moex {

// A backend's answer to "can you run this?": ok, or the human-readable reason why not.
struct Support {
  bool ok = true;
  std::string reason;
  static Support yes() { return {}; }
  static Support no(std::string why) { return {false, std::move(why)}; }
  explicit operator bool() const { return ok; }
};

// Everything a backend needs to decide whether it can run a problem, without the buffers.
struct Problem {
  ExpertsSpec spec;
  int64_t tokens = 0;  // T
  int64_t top_k = 1;   // K
  DType index_dtype = DType::i32;
  DType weights_dtype = DType::f32;
  Device device{};
  // Compute capability as major*10+minor; -1 asks the CUDA device. Tests inject values here
  // to check requirement messages for hardware this machine does not have.
  int compute_capability = -1;
  int cpu_threads = 0;  // CPU threads the call will use (0 = the OpenMP default); sizes per-thread scratch

  static Problem from(const Experts& ex, const ExpertsCall& call);
  // The capability to decide on: the injected one, or the device's (0 when there is none).
  int effective_compute_capability() const;
};

// Scratch memory of one device, reserved up front and reused across calls. Backends carve their
// buffers out of it (see `WorkspaceCarver`) so that a forward after warm-up allocates nothing.
class Workspace {
 public:
  explicit Workspace(Device dev = Device::cpu());
  ~Workspace();
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  // Makes sure at least `bytes` are available (allocates only when growing).
  void reserve(size_t bytes);
  void* data() const { return data_; }
  size_t capacity() const { return capacity_; }
  Device device() const { return device_; }
  // Reserving during CUDA graph capture would allocate; forbid growth when set.
  void set_frozen(bool frozen) { frozen_ = frozen; }

 private:
  Device device_;
  void* data_ = nullptr;
  size_t capacity_ = 0;
  bool frozen_ = false;
};

// Hands out 256-byte aligned pieces of a workspace, front to back.
class WorkspaceCarver {
 public:
  WorkspaceCarver(void* base, size_t capacity) : base_(static_cast<char*>(base)), capacity_(capacity) {}
  template <class T>
  T* take(size_t count) { return static_cast<T*>(take_bytes(count * sizeof(T))); }
  void* take_bytes(size_t bytes);
  size_t used() const { return used_; }
  static size_t round_up(size_t bytes) { return (bytes + 255) & ~size_t(255); }

 private:
  char* base_;
  size_t capacity_;
  size_t used_ = 0;
};

struct RunOptions {
  int num_threads = 0;          // CPU threads; 0 = the OpenMP default
  bool strict_indices = false;  // reject dropped slots (index < 0 or >= E) instead of skipping them
  void* stream = nullptr;       // cudaStream_t for CUDA backends; nullptr = the default stream
  Workspace* workspace = nullptr;  // nullptr = a per-thread workspace of the device, grown as needed
};

struct RunContext {
  const RunOptions& options;
  Workspace& workspace;  // holds at least backend.workspace_bytes(problem) bytes
  int num_threads;       // resolved CPU thread count (>= 1)
};

class ExpertsBackend {
 public:
  virtual ~ExpertsBackend() = default;
  virtual std::string name() const = 0;
  virtual std::string summary() const { return {}; }
  // OK, or why not (names the unmet requirement and what to use instead).
  virtual Support supports(const Problem& p) const = 0;
  // Scratch bytes a call needs (its extra memory), known from the problem alone.
  virtual size_t workspace_bytes(const Problem&) const { return 0; }
  // True when a forward makes no host synchronisation and no allocation (CUDA graph capture).
  virtual bool graph_capturable() const { return false; }
  // Called by experts_forward after validation, supports() and the workspace reservation, with T > 0.
  virtual void run(const Experts& ex, const ExpertsCall& call, const RunContext& ctx) const = 0;
};

using SupportsFn = std::function<Support(const Problem&)>;
using RunFn = std::function<void(const Experts&, const ExpertsCall&, const RunContext&)>;
using WorkspaceFn = std::function<size_t(const Problem&)>;

// The registry. Built-in names: eager, batched_mm, grouped_mm, deepgemm, deepgemm_megamoe, sonicmoe.
// Registering a name that exists replaces that backend (so a user can swap in their own `eager`).
class ExpertsInterface {
 public:
  static ExpertsInterface& global();

  void register_backend(std::shared_ptr<const ExpertsBackend> backend);
  // A backend from functions; `supports` defaults to "always", `workspace` to 0 bytes.
  void register_backend(const std::string& name, RunFn run, SupportsFn supports = {}, WorkspaceFn workspace = {});
  // Removes a name; returns false when it was not registered. `eager` cannot be removed.
  bool unregister_backend(std::string_view name);

  // Throws Error(not_found) naming the valid backends when `name` is unknown.
  std::shared_ptr<const ExpertsBackend> get(std::string_view name) const;
  bool contains(std::string_view name) const;
  std::vector<std::string> names() const;  // in registration order
  Support supports(std::string_view name, const Problem& p) const;

 private:
  ExpertsInterface();
  mutable std::mutex mu_;
  std::vector<std::shared_ptr<const ExpertsBackend>> backends_;
};

// Checks the buffers of a call against the descriptor (ranks, shapes, dtypes, devices,
// contiguity, K <= E, alignment); throws Error(invalid_argument) with the first problem found.
void validate_call(const Experts& ex, const ExpertsCall& call);

// The forward entry point: validate, look the backend up, check it supports the problem
// (Error(unsupported) with its reason otherwise), reserve the workspace, run. T = 0 is valid.
void experts_forward(std::string_view backend, const Experts& ex, const ExpertsCall& call, const RunOptions& opts = {});

}  // namespace moex
