// core/device.cpp — device names and the CPU's facts.
#include "moex/device.hpp"

#include <omp.h>

#include <string>

#include "backends/cpu/kernels.hpp"
#include "core/check.hpp"

namespace moex {

std::string to_string(Device d) {
  if (d.is_cpu()) return "cpu";
  return "cuda:" + std::to_string(d.index);
}

Device parse_device(std::string_view s) {
  if (s == "cpu") return Device::cpu();
  if (s == "cuda" || s == "gpu") return Device::cuda(0);
  if (s.rfind("cuda:", 0) == 0) {
    std::string rest(s.substr(5));
    char* end = nullptr;
    long i = std::strtol(rest.c_str(), &end, 10);
    if (!rest.empty() && end && *end == '\0' && i >= 0 && i < 1024) return Device::cuda(int(i));
  }
  detail::fail(ErrorCode::invalid_argument, "unknown device '{}' (valid: cpu, cuda, cuda:N)", s);
}

CpuInfo cpu_info() {
  CpuInfo info;
  info.isa = cpu::kernels().isa;
  info.hardware_threads = omp_get_num_procs();
#if defined(MOEX_X86)
  __builtin_cpu_init();
  info.avx512_bf16 = __builtin_cpu_supports("avx512bf16");
  info.amx = cpu::uses_amx(cpu::kernels());
  info.amx_quant = info.amx && cpu::amx_quant_enabled();
#endif
  return info;
}

}  // namespace moex
