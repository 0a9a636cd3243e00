// DeviceBuffer: backend memory owned by RAII (Backend::allocate / deallocate).
#pragma once

#include "backend/backend.hpp"

#include <cstdint>

namespace ep::backend {

/// Backend memory owned by RAII: @p bytes from Backend::allocate(), freed on destruction.
/// Movable, not copyable; the backend must outlive it.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Backend &be, uint64_t bytes) : be_(&be), ptr_(bytes ? be.allocate(bytes) : nullptr), bytes_(bytes) {}
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer &&o) noexcept : be_(o.be_), ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; }
  DeviceBuffer &operator=(DeviceBuffer &&o) noexcept {
    if (this != &o) {
      reset();
      be_ = o.be_; ptr_ = o.ptr_; bytes_ = o.bytes_;
      o.ptr_ = nullptr;
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer &) = delete;
  DeviceBuffer &operator=(const DeviceBuffer &) = delete;
  void *get() const { return ptr_; }
  uint64_t bytes() const { return bytes_; }

 private:
  void reset() noexcept {
    if (ptr_ && be_) be_->deallocate(ptr_);
    ptr_ = nullptr;
  }
  Backend *be_ = nullptr;
  void *ptr_ = nullptr;
  uint64_t bytes_ = 0;
};

}  // namespace ep::backend
