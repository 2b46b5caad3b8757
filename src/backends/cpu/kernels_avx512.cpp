// backends/cpu/kernels_avx512.cpp — the kernels for AVX-512 (F/BW/VL/DQ), 16 f32 lanes.
#include "backends/cpu/simd_avx512.hpp"

namespace moex::cpu {

const KernelTable& avx512_kernels() {
  static const KernelTable table = impl::make_table<Avx512>("avx512");
  return table;
}

}  // namespace moex::cpu
