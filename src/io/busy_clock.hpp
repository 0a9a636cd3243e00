// The disk's busy time as the reader sees it: the wall time with at least one read handed to the
// kernel (an io_uring submission, a pread call running), and the time with at least full_depth of
// them, summed over the reader's life. It reads the clock only when the count of reads in flight
// crosses 0 <-> 1 or full_depth - 1 <-> full_depth, never per read, so it costs nothing between
// those transitions. Not thread-safe: the reader calls it under the lock that guards its own
// bookkeeping. The clock is injected so that tests drive time.
#pragma once

#include <cstdint>
#include <functional>

namespace ep::io {

/// A clock in nanoseconds (steady: never goes back).
using NanoClock = std::function<uint64_t()>;

/// The steady clock in nanoseconds (what a reader and a store use unless a test injects one).
uint64_t steady_now_ns();

/// The busy times up to a moment (BusyClock::until).
struct BusyTimes {
  uint64_t now_ns = 0;   ///< the moment, on the clock the times are measured with
  uint64_t busy_ns = 0;  ///< wall time with at least one read in flight, up to now_ns
  uint64_t full_ns = 0;  ///< wall time with at least full_depth reads in flight, up to now_ns
};

class BusyClock {
 public:
  /// @p clock null: steady_now_ns. @p full_depth 0 is taken as 1.
  explicit BusyClock(NanoClock clock = nullptr, uint32_t full_depth = 1);

  /// @p n more reads in flight (handed to the kernel).
  void started(uint32_t n = 1);
  /// @p n reads came back from the kernel (finished, failed or to be resubmitted).
  void finished(uint32_t n = 1);
  uint32_t in_flight() const { return in_flight_; }
  uint32_t full_depth() const { return full_depth_; }
  /// The times up to now (one clock read): the closed intervals plus the open one.
  BusyTimes until_now() const;

 private:
  NanoClock clock_;
  uint32_t full_depth_;
  uint32_t in_flight_ = 0;
  uint64_t busy_since_ = 0, full_since_ = 0;  // start of the open interval (while in flight)
  uint64_t busy_ns_ = 0, full_ns_ = 0;        // closed intervals
};

}  // namespace ep::io
