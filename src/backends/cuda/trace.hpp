// backends/cuda/trace.hpp — a per-block timeline of the decode kernels, for measurement only.
//
// Why: inside a CUDA graph with programmatic dependent launch, ncu can only time each kernel alone
// and Nsight Systems does not run on the device machine; neither shows how long a kernel of the
// chain waits for its predecessor, when its blocks became resident, or how its blocks' ends spread.
// A build configured with -DMOEX_CUDA_TRACE=ON has each traced kernel's block record, from its
// thread 0: its SM, the SM clock at block entry, after `pdl_wait` and at exit, and the global timer
// at entry and exit (trace.cuh). `bench/trace_report.py` turns the records into a per-kernel
// timeline. In an ordinary build the hooks compile to nothing and `compiled()` is false.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace moex::cuda::trace {

// The traced kernels (a kernel's launches are told apart by grid size and order).
enum Kernel : uint32_t {
  k_embed = 1,
  k_rmsnorm = 2,
  k_gemv = 3,
  k_gemv_router = 4,
  k_decode_attention = 5,
  k_batched_up = 6,
  k_batched_down = 7,
  k_combine = 8,
  k_argmax = 9,
};

// One block of one launch. Clocks are the SM's clock64 (c_*; per SM, not synchronised across SMs:
// see SmAnchor), g_* the device's %globaltimer in ns. c_wait is 0 where the block never called
// pdl_wait; c_mark[i] is 0 unless the kernel marks points of its own (MOEX_CUDA_TRACE_MARK(i); the
// decode attention marks 0 q ready, 1 its key loop done, 2 its partial published (the ticket taken)
// or the cluster barrier passed, 3 the merge weights computed).
constexpr int kMarks = 4;
struct Record {
  uint32_t kernel, block, grid, smid;
  uint64_t c_start, c_wait, c_end;
  uint64_t g_start, g_end;
  uint64_t c_mark[kMarks];
};

// A global-timer tick seen on an SM together with that SM's clock64: two anchors per SM (before and
// after the traced work) map its clocks onto the global timer.
struct SmAnchor {
  uint32_t smid;
  uint64_t g, c;
};

// Whether this build has the hooks (MOEX_CUDA_TRACE).
bool compiled();
// Starts recording into a device buffer of `capacity` records (every traced kernel launched after
// this on any stream). Throws when the build has no hooks.
void start(size_t capacity);
// Waits for the device, stops recording and returns the records (at most `capacity`; `dropped` is
// set to how many did not fit).
std::vector<Record> stop(size_t* dropped = nullptr);
// One global-timer tick observed on each SM (a few blocks per SM spin until the timer changes).
std::vector<SmAnchor> anchors();

}  // namespace moex::cuda::trace
