#include "io/busy_clock.hpp"

#include "core/error.hpp"

#include <algorithm>
#include <chrono>

namespace ep::io {

uint64_t steady_now_ns() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
}

BusyClock::BusyClock(NanoClock clock, uint32_t full_depth)
    : clock_(clock ? std::move(clock) : NanoClock(steady_now_ns)), full_depth_(std::max<uint32_t>(1, full_depth)) {}

void BusyClock::started(uint32_t n) {
  if (n == 0) return;
  const uint32_t before = in_flight_;
  in_flight_ += n;
  const bool opens_busy = before == 0;
  const bool opens_full = before < full_depth_ && in_flight_ >= full_depth_;
  if (!opens_busy && !opens_full) return;
  const uint64_t t = clock_();
  if (opens_busy) busy_since_ = t;
  if (opens_full) full_since_ = t;
}

void BusyClock::finished(uint32_t n) {
  if (n == 0) return;
  if (n > in_flight_) fail(Status::internal, "BusyClock: {} reads finished with {} in flight", n, in_flight_);
  const uint32_t before = in_flight_;
  in_flight_ -= n;
  const bool closes_busy = in_flight_ == 0;
  const bool closes_full = before >= full_depth_ && in_flight_ < full_depth_;
  if (!closes_busy && !closes_full) return;
  const uint64_t t = clock_();
  // A clock that stood still (or an injected one set back) closes an empty interval, never a negative one.
  if (closes_busy) busy_ns_ += t - std::min(t, busy_since_);
  if (closes_full) full_ns_ += t - std::min(t, full_since_);
}

BusyTimes BusyClock::until_now() const {
  BusyTimes b;
  b.now_ns = clock_();
  b.busy_ns = busy_ns_ + (in_flight_ > 0 ? b.now_ns - std::min(b.now_ns, busy_since_) : 0);
  b.full_ns = full_ns_ + (in_flight_ >= full_depth_ ? b.now_ns - std::min(b.now_ns, full_since_) : 0);
  return b;
}

}  // namespace ep::io
