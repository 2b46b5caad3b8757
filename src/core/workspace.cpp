// core/workspace.cpp — reusable scratch memory of one device.
#include "core/check.hpp"
#include "core/memory.hpp"
#include "moex/backend.hpp"

namespace moex {

Workspace::Workspace(Device dev) : device_(dev) {}
Workspace::~Workspace() { detail::device_free(device_, data_); }

void Workspace::reserve(size_t bytes) {
  if (bytes <= capacity_) return;
  if (frozen_)
    detail::fail(ErrorCode::invalid_argument,
                 "workspace on {} holds {} bytes but {} are needed and it is frozen (reserve before graph capture)",
                 to_string(device_), capacity_, bytes);
  void* p = detail::device_alloc(device_, bytes);
  detail::device_free(device_, data_);
  data_ = p;
  capacity_ = bytes;
}

void* WorkspaceCarver::take_bytes(size_t bytes) {
  size_t need = round_up(bytes);
  if (used_ + need > capacity_)
    detail::fail(ErrorCode::internal, "workspace overflow: {} + {} bytes > capacity {}", used_, need, capacity_);
  void* p = base_ + used_;
  used_ += need;
  return p;
}

}  // namespace moex
