// moex/tensor.hpp — non-owning tensor views (what the experts API takes) and a small owning
// tensor (what tests, the CLI and the model runtime allocate).
#pragma once
#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>

#include "moex/device.hpp"
#include "moex/dtype.hpp"

namespace moex {

constexpr int kMaxRank = 4;

// A strided view of memory the caller owns. Strides are in elements. Backends require
// contiguous (row-major) views and say so with an error otherwise.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  int rank = 0;
  std::array<int64_t, kMaxRank> shape{};
  std::array<int64_t, kMaxRank> strides{};
  Device device{};

  TensorView() = default;
  // A contiguous row-major view.
  TensorView(const void* data, DType dt, std::initializer_list<int64_t> shape, Device dev = Device::cpu());
  static TensorView contiguous(const void* data, DType dt, const int64_t* shape, int rank, Device dev = Device::cpu());

  bool defined() const { return rank > 0; }
  int64_t size(int d) const { return shape[size_t(d)]; }
  int64_t numel() const;
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }
  bool is_contiguous() const;
  template <class T>
  T* ptr() const { return static_cast<T*>(data); }
  // "[2, 3] bf16 cpu"
  std::string describe() const;
};

// Owning tensor: contiguous, allocated on the CPU (64-byte aligned) or on a CUDA device.
class Tensor {
 public:
  Tensor() = default;
  static Tensor empty(DType dt, std::initializer_list<int64_t> shape, Device dev = Device::cpu());
  static Tensor empty(DType dt, const int64_t* shape, int rank, Device dev = Device::cpu());
  const TensorView& view() const { return view_; }
  operator const TensorView&() const { return view_; }
  void* data() const { return view_.data; }
  template <class T>
  T* ptr() const { return static_cast<T*>(view_.data); }
  int64_t numel() const { return view_.numel(); }
  size_t nbytes() const { return view_.nbytes(); }
  DType dtype() const { return view_.dtype; }
  int64_t size(int d) const { return view_.size(d); }
  // Copies to another device (or the same one); shapes and dtype stay.
  Tensor to(Device dev) const;

 private:
  std::shared_ptr<void> storage_;
  TensorView view_;
};

// Copies bytes between host and device memory (either side may be CPU or CUDA).
void copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes);

}  // namespace moex
