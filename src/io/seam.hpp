// The I/O seam: every raw read result passes through it before the reader acts on it, so
// tests can inject EIO, EAGAIN/EINTR, short reads and latency into both reader backends, and
// make io_uring setup fail to exercise the pread fallback.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <random>
#include <vector>

namespace ep::io {

class IoSeam {
 public:
  virtual ~IoSeam() = default;
  /// Called before io_uring is set up; a non-zero errno makes the setup fail with it.
  virtual int uring_setup_error() { return 0; }
  /// Called with the raw result of one read of [@p offset, @p offset + @p bytes): a byte count
  /// or -errno. Returns the result the reader acts on. May sleep to add latency. Called from
  /// the reader's completion thread(s): implementations must be thread-safe.
  virtual int64_t on_read_result(uint64_t offset, uint64_t bytes, int64_t result) {
    (void)offset;
    (void)bytes;
    return result;
  }
  /// The same for a reader over several files (a striped pack's parts): @p file is the index of
  /// the file read (ReadRequest::file). The reader calls this one; by default it forwards.
  virtual int64_t on_file_read_result(uint32_t file, uint64_t offset, uint64_t bytes, int64_t result) {
    (void)file;
    return on_read_result(offset, bytes, result);
  }
  /// Called after on_read_result() when the result it returned is a byte count > 0, with the
  /// bytes the read delivered ([@p dst, @p dst + @p result) for file offset @p offset). May
  /// change them: tests use it to return wrong ("stale") bytes. Same threading as above.
  virtual void on_read_data(uint64_t offset, void *dst, int64_t result) {
    (void)offset;
    (void)dst;
    (void)result;
  }
};

/// A seeded fault injector for tests.
struct FaultPlan {
  uint64_t seed = 1;
  double eio_probability = 0.0;     ///< a read returns -EIO
  double short_probability = 0.0;   ///< a read returns fewer bytes than it read
  double eagain_probability = 0.0;  ///< a read returns -EAGAIN
  double eintr_probability = 0.0;   ///< a read returns -EINTR
  double stale_probability = 0.0;   ///< a successful read delivers one wrong byte (silent corruption)
  uint64_t latency_ns = 0;          ///< added to every read
  int uring_setup_errno = 0;        ///< e.g. EPERM (seccomp) or ENOSYS (old kernel)
  /// Reads overlapping [bad_offset, bad_offset + bad_bytes) always fail with -EIO (of file
  /// bad_file only, when it is >= 0).
  uint64_t bad_offset = 0;
  uint64_t bad_bytes = 0;
  int64_t bad_file = -1;
};

class FaultInjector final : public IoSeam {
 public:
  explicit FaultInjector(const FaultPlan &plan) : plan_(plan), rng_(plan.seed) {}
  int uring_setup_error() override { return plan_.uring_setup_errno; }
  int64_t on_read_result(uint64_t offset, uint64_t bytes, int64_t result) override;
  int64_t on_file_read_result(uint32_t file, uint64_t offset, uint64_t bytes, int64_t result) override;
  void on_read_data(uint64_t offset, void *dst, int64_t result) override;

  uint64_t injected_eio() const { return injected_eio_.load(); }
  uint64_t injected_short() const { return injected_short_.load(); }
  uint64_t injected_retry() const { return injected_retry_.load(); }
  uint64_t injected_stale() const { return injected_stale_.load(); }
  uint64_t calls() const { return calls_.load(); }

 private:
  FaultPlan plan_;
  std::mutex mutex_;
  std::mt19937_64 rng_;
  std::atomic<uint64_t> injected_eio_{0}, injected_short_{0}, injected_retry_{0}, injected_stale_{0}, calls_{0};
};

}  // namespace ep::io
