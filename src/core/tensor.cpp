// core/tensor.cpp — tensor views, owning tensors, host/device memory.
#include "moex/tensor.hpp"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "core/check.hpp"
#include "core/memory.hpp"

namespace moex {

TensorView TensorView::contiguous(const void* data, DType dt, const int64_t* shape, int rank, Device dev) {
  MOEX_CHECK(rank >= 0 && rank <= kMaxRank, "tensor rank {} is outside 0..{}", rank, kMaxRank);
  TensorView v;
  v.data = const_cast<void*>(data);
  v.dtype = dt;
  v.rank = rank;
  v.device = dev;
  int64_t stride = 1;
  for (int d = rank - 1; d >= 0; --d) {
    MOEX_CHECK(shape[d] >= 0, "negative tensor dimension {}", shape[d]);
    v.shape[size_t(d)] = shape[d];
    v.strides[size_t(d)] = stride;
    stride *= shape[d];
  }
  return v;
}

TensorView::TensorView(const void* data, DType dt, std::initializer_list<int64_t> shp, Device dev) {
  *this = contiguous(data, dt, shp.begin(), int(shp.size()), dev);
}

int64_t TensorView::numel() const {
  if (rank == 0) return 0;
  int64_t n = 1;
  for (int d = 0; d < rank; ++d) n *= shape[size_t(d)];
  return n;
}

bool TensorView::is_contiguous() const {
  int64_t stride = 1;
  for (int d = rank - 1; d >= 0; --d) {
    if (shape[size_t(d)] != 1 && strides[size_t(d)] != stride) return false;
    stride *= shape[size_t(d)];
  }
  return true;
}

std::string TensorView::describe() const {
  std::string s = "[";
  for (int d = 0; d < rank; ++d) s += (d ? ", " : "") + std::to_string(shape[size_t(d)]);
  s += "] ";
  s += dtype_name(dtype);
  s += " " + to_string(device);
  return s;
}

Tensor Tensor::empty(DType dt, const int64_t* shape, int rank, Device dev) {
  Tensor t;
  t.view_ = TensorView::contiguous(nullptr, dt, shape, rank, dev);
  size_t bytes = t.view_.nbytes();
  void* p = detail::device_alloc(dev, bytes ? bytes : 1);
  t.storage_ = std::shared_ptr<void>(p, [dev](void* q) { detail::device_free(dev, q); });
  t.view_.data = p;
  return t;
}

Tensor Tensor::empty(DType dt, std::initializer_list<int64_t> shape, Device dev) {
  return empty(dt, shape.begin(), int(shape.size()), dev);
}

Tensor Tensor::to(Device dev) const {
  Tensor t = empty(view_.dtype, view_.shape.data(), view_.rank, dev);
  copy_bytes(t.data(), dev, data(), view_.device, nbytes());
  return t;
}

void copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes) {
  detail::device_copy(dst, dst_dev, src, src_dev, bytes);
}

namespace detail {

void* host_alloc(size_t bytes) noexcept {
  constexpr size_t kHugePage = size_t(2) << 20;
  static const bool huge_pages = [] {
    const char* e = std::getenv("MOEX_CPU_HUGE_PAGES");
    return !(e && std::strcmp(e, "0") == 0);
  }();
  if (bytes > SIZE_MAX - kHugePage) return nullptr;  // no such buffer; and the roundings below would wrap
  const size_t whole_pages = (bytes + kHugePage - 1) / kHugePage * kHugePage;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (huge_pages && bytes >= kHugePage && (whole_pages - bytes) * 8 <= bytes) {
    if (void* p = std::aligned_alloc(kHugePage, whole_pages)) {
      madvise(p, whole_pages, MADV_HUGEPAGE);  // a hint: where the kernel refuses, 4 KiB pages serve
      return p;
    }  // else: the plain allocation below (a 2 MiB-aligned block may be harder to find)
  }
#else
  (void)huge_pages;
  (void)whole_pages;
#endif
  const size_t rounded = (bytes + 63) & ~size_t(63);
  return std::aligned_alloc(64, rounded ? rounded : 64);
}

void* device_alloc(Device dev, size_t bytes) {
  if (dev.is_cuda()) return cuda_alloc(dev.index, bytes);
  void* p = host_alloc(bytes);
  if (!p) fail(ErrorCode::out_of_memory, "out of host memory allocating {} bytes", bytes);
  return p;
}

void device_free(Device dev, void* p) noexcept {
  if (!p) return;
  if (dev.is_cuda()) {
    cuda_free(dev.index, p);
  } else {
    std::free(p);
  }
}

void device_copy(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes) {
  if (bytes == 0) return;
  if (dst_dev.is_cpu() && src_dev.is_cpu()) {
    std::memcpy(dst, src, bytes);
  } else {
    cuda_copy(dst, src, bytes);
  }
}

}  // namespace detail
}  // namespace moex
