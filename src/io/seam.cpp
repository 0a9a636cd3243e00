#include "io/seam.hpp"

#include <cerrno>
#include <chrono>
#include <thread>

namespace ep::io {

int64_t FaultInjector::on_read_result(uint64_t offset, uint64_t bytes, int64_t result) {
  return on_file_read_result(0, offset, bytes, result);
}

int64_t FaultInjector::on_file_read_result(uint32_t file, uint64_t offset, uint64_t bytes, int64_t result) {
  calls_.fetch_add(1);
  if (plan_.latency_ns) std::this_thread::sleep_for(std::chrono::nanoseconds(plan_.latency_ns));
  const bool in_file = plan_.bad_file < 0 || static_cast<uint64_t>(plan_.bad_file) == file;
  if (plan_.bad_bytes && in_file && offset < plan_.bad_offset + plan_.bad_bytes &&
      plan_.bad_offset < offset + bytes) {
    injected_eio_.fetch_add(1);
    return -EIO;
  }
  if (result <= 0) return result;
  double draw[4];
  uint64_t cut = 0;
  {
    std::lock_guard lock(mutex_);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    for (double &d : draw) d = u(rng_);
    if (result > 1) cut = std::uniform_int_distribution<uint64_t>(1, static_cast<uint64_t>(result) - 1)(rng_);
  }
  if (draw[0] < plan_.eio_probability) {
    injected_eio_.fetch_add(1);
    return -EIO;
  }
  if (draw[1] < plan_.eagain_probability) {
    injected_retry_.fetch_add(1);
    return -EAGAIN;
  }
  if (draw[2] < plan_.eintr_probability) {
    injected_retry_.fetch_add(1);
    return -EINTR;
  }
  if (cut && draw[3] < plan_.short_probability) {
    injected_short_.fetch_add(1);
    return static_cast<int64_t>(cut);
  }
  return result;
}

void FaultInjector::on_read_data(uint64_t offset, void *dst, int64_t result) {
  (void)offset;
  if (plan_.stale_probability <= 0.0 || result <= 0) return;
  double draw;
  uint64_t at;
  {
    std::lock_guard lock(mutex_);
    draw = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
    at = std::uniform_int_distribution<uint64_t>(0, static_cast<uint64_t>(result) - 1)(rng_);
  }
  if (draw >= plan_.stale_probability) return;
  injected_stale_.fetch_add(1);
  static_cast<unsigned char *>(dst)[at] ^= 0x5a;
}

}  // namespace ep::io
