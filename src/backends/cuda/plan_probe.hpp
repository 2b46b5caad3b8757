// backends/cuda/plan_probe.hpp — the device routing plan's M-tile table read back to the host, for
// the tests (plain C++: no CUDA headers, so test files compiled by the host compiler include it).
#pragma once
#include <array>
#include <cstdint>
#include <vector>

namespace moex::cuda {

// Builds the device routing plan of top_k_index [S] (int32 on the host; values outside [0, E)
// are dropped pairs) with `tile_m`-row tiles in the plain or the paired tile order
// (DevicePlan::pair_aligned) on the current CUDA device, and returns its tile table, every entry
// {expert, row_begin, row_end} (expert -1: no tile), the expert offsets [E + 1], the sorted rows'
// pairs [offsets[E]] and each pair's sorted row [S] (-1: dropped).
struct PlanProbe {
  std::vector<std::array<int, 3>> tiles;
  std::vector<int> offsets;
  std::vector<int> sorted_pairs;
  std::vector<int> pair_to_row;
};
PlanProbe probe_device_plan(const std::vector<int32_t>& top_k_index, int64_t E, int64_t tile_m, bool paired);

}  // namespace moex::cuda
