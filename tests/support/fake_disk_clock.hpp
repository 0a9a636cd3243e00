// A clock a test drives and a seam that makes every raw read take a fixed time on it: the
// disk's busy time (io::BusyClock) and the store's times checked without wall-clock timing.
#pragma once

#include "io/busy_clock.hpp"
#include "io/seam.hpp"

#include <atomic>
#include <cstdint>

namespace ep::test {

// It moves only when a read "takes" time in SlowDevice, or by one per reading when `tick`.
struct FakeClock {
  std::atomic<uint64_t> t{1000};
  std::atomic<uint64_t> reads{0};  ///< how often the clock was read
  bool tick = false;
  io::NanoClock clock() {
    return [this] {
      reads.fetch_add(1);
      return tick ? t.fetch_add(1) : t.load();
    };
  }
};

// Every raw read result takes @p ns on the fake clock (the seam stands for the device).
class SlowDevice final : public io::IoSeam {
 public:
  SlowDevice(FakeClock &clock, uint64_t ns) : clock_(clock), ns_(ns) {}
  int64_t on_read_result(uint64_t, uint64_t, int64_t result) override {
    calls.fetch_add(1);
    clock_.t.fetch_add(ns_);
    return result;
  }
  std::atomic<uint64_t> calls{0};

 private:
  FakeClock &clock_;
  uint64_t ns_;
};

}  // namespace ep::test
