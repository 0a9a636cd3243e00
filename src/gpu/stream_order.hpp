// Ordering one CUDA stream after another without the host waiting: an event recorded on the
// stream that finishes the work, waited on by the stream that needs it. Used where work queued
// on a stream the library does not own (a host engine's) meets the store's own streams.
// Interface free of CUDA types (streams cross it as void *, a cudaStream_t), so that host code
// built with or without CUDA can hold one; built only with CUDA (EP_HAVE_CUDA).
#pragma once

#include <memory>

namespace ep::gpu {

/// Makes the calling thread's current device @p device for its lifetime, then restores the
/// previous one (host engines call in with whatever device they work on).
class DeviceScope {
 public:
  explicit DeviceScope(int device);
  ~DeviceScope();
  DeviceScope(const DeviceScope &) = delete;
  DeviceScope &operator=(const DeviceScope &) = delete;

 private:
  int previous_ = -1;
};

/// One event of device @p device; not thread-safe (its owner serialises the calls).
class StreamOrder {
 public:
  explicit StreamOrder(int device);
  ~StreamOrder();
  StreamOrder(const StreamOrder &) = delete;
  StreamOrder &operator=(const StreamOrder &) = delete;
  /// Work queued on @p waiter after this call starts after the work queued on @p signaler before
  /// it (both cudaStream_t of the device; nullptr is the legacy default stream). The event is
  /// re-recorded on each call: a wait takes the record current when it was queued.
  void order(void *waiter, void *signaler);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ep::gpu
