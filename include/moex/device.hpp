// moex/device.hpp — where tensors live and what the machine offers.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace moex {

enum class DeviceType { cpu, cuda };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;

  static Device cpu() { return {DeviceType::cpu, 0}; }
  static Device cuda(int i = 0) { return {DeviceType::cuda, i}; }
  bool is_cpu() const { return type == DeviceType::cpu; }
  bool is_cuda() const { return type == DeviceType::cuda; }
  bool operator==(const Device&) const = default;
};

std::string to_string(Device d);
// "cpu", "cuda", "cuda:1"; throws moex::Error on anything else.
Device parse_device(std::string_view s);

// What a CUDA device is (filled from cudaGetDeviceProperties when moex was built with CUDA).
struct CudaDeviceInfo {
  int index = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;   // compute capability
  size_t total_memory = 0;          // bytes
  int multiprocessors = 0;
  int compute_capability() const { return cc_major * 10 + cc_minor; }
};

// True when this build of moex contains CUDA code.
bool built_with_cuda();
// The CUDA devices this process can use (empty without CUDA or without a GPU).
std::vector<CudaDeviceInfo> cuda_devices();
// Why no CUDA device is usable ("moex was built without CUDA", the driver's error, ...), or "".
std::string cuda_unavailable_reason();

// CPU facts used by the kernels and shown by `moex info`.
struct CpuInfo {
  // the kernel table the CPU backends use: "avx512_amx", "avx512_bf16", "avx512", "avx2" or "generic"
  std::string isa;
  bool avx512_bf16 = false;
  // the table runs bf16 products on AMX tiles (avx512_amx, or its tile model in tests); amx_quant:
  // FP8 / FP4 experts on them too, calls of >= 8 rows (MOEX_CPU_AMX_QUANT=1: every call; =0: none)
  bool amx = false;
  bool amx_quant = false;
  int hardware_threads = 1;
};
CpuInfo cpu_info();

}  // namespace moex
