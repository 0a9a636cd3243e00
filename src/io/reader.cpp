#include "io/reader.hpp"

#include "core/error.hpp"
#include "core/log.hpp"
#include "io/read_tracker.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#ifdef EP_HAVE_URING
#include <liburing.h>
#endif

namespace ep::io {
namespace {

using detail::Action;
using detail::ReadTracker;

int64_t filter(const std::shared_ptr<IoSeam> &seam, uint32_t file, uint64_t offset, uint64_t bytes, int64_t result, void *dst) {
  if (!seam) return result;
  result = seam->on_file_read_result(file, offset, bytes, result);
  if (result > 0) seam->on_read_data(offset, dst, result);
  return result;
}

/// ReaderOptions::full_depth for a reader that can have @p most reads in flight.
uint32_t full_depth_of(const ReaderOptions &options, uint32_t most) {
  return options.full_depth == 0 ? most : std::min(options.full_depth, most);
}

void warn_switch_buffered(const std::string &path, ReaderCounters &counters) {
  counters.fallback_count.fetch_add(1);
  log::warn("{}: the filesystem rejects O_DIRECT reads (EINVAL): reopened buffered; reads now go "
            "through the page cache and throughput will not reflect the disk",
            path);
}

// ---- pread thread pool ---------------------------------------------------------------------
class PreadReader final : public Reader {
 public:
  PreadReader(const std::vector<std::string> &paths, const ReaderOptions &options, ReaderCounters &counters)
      : Reader(paths), options_(options), counters_(counters), tracker_(paths, options, counters),
        busy_(options.clock, full_depth_of(options, std::max<uint32_t>(1, options.pread_threads))), files_(paths.size()),
        buffered_(paths.size()), fds_(paths.size(), -1) {
    for (uint32_t f = 0; f < paths.size(); ++f) {
      bool direct = false;
      files_[f] = open_for_read(paths[f], options.direct, direct);
      if (!direct && options.direct == DirectMode::automatic) counters_.fallback_count.fetch_add(1);
      tracker_.set_direct(f, direct);
      fds_[f] = files_[f].get();
    }
    const uint32_t threads = std::max<uint32_t>(1, options.pread_threads);
    for (uint32_t i = 0; i < threads; ++i) threads_.emplace_back([this] { worker(); });
  }

  ~PreadReader() override {
    {
      std::unique_lock lock(mutex_);
      // Never leave a thread writing into memory the caller is about to free.
      done_cv_.wait(lock, [&] { return running_ == 0 && tracker_.ready().empty(); });
      stop_ = true;
    }
    work_cv_.notify_all();
    for (auto &t : threads_) t.join();
  }

  std::string_view backend_name() const override { return "pread"; }
  bool direct() const override {
    std::lock_guard lock(mutex_);
    return tracker_.all_direct();
  }
  void register_buffer(void *, std::size_t) override {}

  void submit(const ReadRequest &request) override {
    {
      std::lock_guard lock(mutex_);
      tracker_.add(request);
    }
    work_cv_.notify_all();
  }

  std::size_t wait(std::vector<ReadCompletion> &out, std::size_t min_count) override {
    std::unique_lock lock(mutex_);
    min_count = std::min(min_count, tracker_.outstanding());
    done_cv_.wait(lock, [&] { return tracker_.completed().size() >= min_count; });
    auto &done = tracker_.completed();
    const std::size_t n = done.size();
    for (auto &c : done) out.push_back(std::move(c));
    done.clear();
    tracker_.handed_out(n);
    return n;
  }

  std::size_t outstanding() const override {
    std::lock_guard lock(mutex_);
    return tracker_.outstanding();
  }

  BusyTimes busy_times() const override {
    std::lock_guard lock(mutex_);
    return busy_.until_now();
  }
  uint32_t full_depth() const override { return busy_.full_depth(); }

 private:
  void worker() {
    std::unique_lock lock(mutex_);
    for (;;) {
      work_cv_.wait(lock, [&] { return stop_ || !tracker_.ready().empty(); });
      if (stop_) return;
      const uint32_t pid = tracker_.ready().front();
      tracker_.ready().pop_front();
      ++running_;
      // In flight from this thread's first pread of the part until its last one returned
      // (retries and resubmitted remainders continue the same read).
      busy_.started();
      for (;;) {
        const uint64_t offset = tracker_.file_offset(pid);
        void *dst = tracker_.dst(pid);
        const uint64_t length = tracker_.length(pid);
        const uint32_t file = tracker_.file(pid);
        const int fd = fds_[file];
        lock.unlock();
        ssize_t got = ::pread(fd, dst, length, static_cast<off_t>(offset));
        int64_t result = got < 0 ? -static_cast<int64_t>(errno) : static_cast<int64_t>(got);
        result = filter(options_.seam, file, offset, length, result, dst);
        lock.lock();
        const Action action = tracker_.on_result(pid, result);
        if (action == Action::finished) break;
        if (action == Action::switch_buffered && tracker_.direct(file)) {
          buffered_[file] = open_buffered(path(file));
          fds_[file] = buffered_[file].get();
          tracker_.set_direct(file, false);
          warn_switch_buffered(path(file), counters_);
        }
      }
      busy_.finished();
      --running_;
      done_cv_.notify_all();
    }
  }

  ReaderOptions options_;
  ReaderCounters &counters_;
  mutable std::mutex mutex_;
  std::condition_variable work_cv_, done_cv_;
  ReadTracker tracker_;
  BusyClock busy_;
  std::vector<FileHandle> files_, buffered_;  // per file; buffered_ after a switch away from O_DIRECT
  std::vector<int> fds_;
  uint32_t running_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

#ifdef EP_HAVE_URING
// ---- io_uring ------------------------------------------------------------------------------
struct UringSetupError {
  int error;
  std::string what;
};

class UringReader final : public Reader {
 public:
  UringReader(const std::vector<std::string> &paths, const ReaderOptions &options, ReaderCounters &counters)
      : Reader(paths), options_(options), counters_(counters), tracker_(paths, options, counters), files_(paths.size()),
        buffered_(paths.size()), depth_(std::clamp<uint32_t>(options.queue_depth, 1, 4096)),
        busy_(options.clock, full_depth_of(options, depth_)) {
    if (options.seam) {
      if (const int e = options.seam->uring_setup_error())
        throw UringSetupError{e, fmt::format("io_uring_queue_init: {} (errno {}, injected)", std::strerror(e), e)};
    }
    std::vector<int> fds;
    for (uint32_t f = 0; f < paths.size(); ++f) {
      bool direct = false;
      files_[f] = open_for_read(paths[f], options.direct, direct);
      if (!direct && options.direct == DirectMode::automatic) counters_.fallback_count.fetch_add(1);
      tracker_.set_direct(f, direct);
      fds.push_back(files_[f].get());
    }
    if (const int r = io_uring_queue_init(depth_, &ring_, 0); r < 0)
      throw UringSetupError{-r, fmt::format("io_uring_queue_init({}): {} (errno {})", depth_, std::strerror(-r), -r)};
    if (const int r = io_uring_register_files(&ring_, fds.data(), static_cast<unsigned>(fds.size())); r == 0) {
      fixed_files_ = true;
    } else {
      log::warn("{}: io_uring cannot register the pack's {} file(s) as fixed files ({}): using plain fds", path(),
                fds.size(), std::strerror(-r));
    }
  }

  ~UringReader() override {
    // Drain what is still in flight: the kernel may be writing into caller memory.
    try {
      std::vector<ReadCompletion> sink;
      while (tracker_.outstanding() > 0) wait(sink, tracker_.outstanding());
    } catch (...) {
    }
    io_uring_queue_exit(&ring_);
  }

  std::string_view backend_name() const override { return "io_uring"; }
  bool direct() const override { return tracker_.all_direct(); }

  void register_buffer(void *base, std::size_t bytes) override {
    if (inflight_ > 0 || fixed_buffer_)
      fail(Status::invalid_argument, "{}: register_buffer must be called once, before any read", path());
    iovec iov{base, bytes};
    if (const int r = io_uring_register_buffers(&ring_, &iov, 1); r == 0) {
      fixed_buffer_ = true;
      buffer_base_ = static_cast<std::byte *>(base);
      buffer_bytes_ = bytes;
    } else {
      log::warn("{}: io_uring cannot register the staging ring ({} bytes) as a fixed buffer ({}): "
                "using unregistered reads",
                path(), bytes, std::strerror(-r));
    }
  }

  void submit(const ReadRequest &request) override {
    tracker_.add(request);
    pump();
  }

  std::size_t wait(std::vector<ReadCompletion> &out, std::size_t min_count) override {
    min_count = std::min(min_count, tracker_.outstanding());
    pump();
    // What already finished, without blocking (all a caller polling with min_count 0 gets).
    for (io_uring_cqe *cqe = nullptr; inflight_ > 0 && io_uring_peek_cqe(&ring_, &cqe) == 0;) handle(cqe);
    pump();
    while (tracker_.completed().size() < min_count) {
      io_uring_cqe *cqe = nullptr;
      const int r = io_uring_wait_cqe(&ring_, &cqe);
      if (r == -EINTR) continue;
      if (r < 0) fail_errno(-r, "io_uring_wait_cqe on " + path());
      do {
        handle(cqe);
      } while (io_uring_peek_cqe(&ring_, &cqe) == 0);
      pump();
    }
    auto &done = tracker_.completed();
    const std::size_t n = done.size();
    for (auto &c : done) out.push_back(std::move(c));
    done.clear();
    tracker_.handed_out(n);
    return n;
  }

  std::size_t outstanding() const override { return tracker_.outstanding(); }
  BusyTimes busy_times() const override { return busy_.until_now(); }
  uint32_t full_depth() const override { return busy_.full_depth(); }

 private:
  void pump() {
    unsigned queued = 0;
    auto &ready = tracker_.ready();
    while (inflight_ < depth_ && !ready.empty()) {
      io_uring_sqe *sqe = io_uring_get_sqe(&ring_);
      if (!sqe) break;
      const uint32_t pid = ready.front();
      ready.pop_front();
      auto *dst = static_cast<std::byte *>(tracker_.dst(pid));
      const auto length = static_cast<unsigned>(tracker_.length(pid));
      const uint64_t offset = tracker_.file_offset(pid);
      const uint32_t file = tracker_.file(pid);
      const int fd = fixed_files_ ? static_cast<int>(file) : file_fd(file);
      if (fixed_buffer_ && dst >= buffer_base_ && dst + length <= buffer_base_ + buffer_bytes_) {
        io_uring_prep_read_fixed(sqe, fd, dst, length, offset, 0);
      } else {
        io_uring_prep_read(sqe, fd, dst, length, offset);
      }
      if (fixed_files_) sqe->flags |= IOSQE_FIXED_FILE;
      io_uring_sqe_set_data64(sqe, pid);
      ++inflight_;
      ++queued;
    }
    if (queued) {
      busy_.started(queued);
      int r;
      do {
        r = io_uring_submit(&ring_);
      } while (r == -EINTR || r == -EAGAIN);
      if (r < 0) fail_errno(-r, "io_uring_submit on " + path());
    }
  }

  int file_fd(uint32_t file) const { return buffered_[file] ? buffered_[file].get() : files_[file].get(); }

  void handle(io_uring_cqe *cqe) {
    const auto pid = static_cast<uint32_t>(io_uring_cqe_get_data64(cqe));
    int64_t result = cqe->res;
    io_uring_cqe_seen(&ring_, cqe);
    --inflight_;
    result = filter(options_.seam, tracker_.file(pid), tracker_.file_offset(pid), tracker_.length(pid), result, tracker_.dst(pid));
    busy_.finished();  // after the seam, which stands for the device in tests (its latency counts)
    switch (tracker_.on_result(pid, result)) {
      case Action::finished:
        break;
      case Action::switch_buffered:
        if (const uint32_t file = tracker_.file(pid); tracker_.direct(file)) {
          buffered_[file] = open_buffered(path(file));
          if (fixed_files_) {
            int fd = buffered_[file].get();
            if (const int r = io_uring_register_files_update(&ring_, file, &fd, 1); r < 0) {
              fixed_files_ = false;  // fall back to the plain fds (the buffered one for this file)
            }
          }
          tracker_.set_direct(file, false);
          warn_switch_buffered(path(file), counters_);
        }
        tracker_.ready().push_front(pid);
        break;
      case Action::resubmit:
        tracker_.ready().push_front(pid);
        break;
    }
  }

  ReaderOptions options_;
  ReaderCounters &counters_;
  ReadTracker tracker_;
  std::vector<FileHandle> files_, buffered_;  // per file; buffered_ after a switch away from O_DIRECT
  io_uring ring_{};
  uint32_t depth_;
  // Declared after depth_: initialised from it. A completion counts when it is reaped (io_uring
  // tells no completion time), which the store does whenever it is called and while it waits.
  BusyClock busy_;
  uint32_t inflight_ = 0;
  bool fixed_files_ = false;
  bool fixed_buffer_ = false;
  std::byte *buffer_base_ = nullptr;
  std::size_t buffer_bytes_ = 0;
};
#endif

}  // namespace

Backend parse_backend(std::string_view name) {
  if (name == "auto" || name == "automatic") return Backend::automatic;
  if (name == "uring" || name == "io_uring") return Backend::uring;
  if (name == "pread") return Backend::pread;
  fail(Status::invalid_argument, "reader backend '{}' is not one of auto, uring, pread", name);
}

bool uring_compiled() {
#ifdef EP_HAVE_URING
  return true;
#else
  return false;
#endif
}

std::unique_ptr<Reader> open_reader(const std::string &path, const ReaderOptions &options,
                                    ReaderCounters &counters) {
  return open_reader(std::vector<std::string>{path}, options, counters);
}

std::unique_ptr<Reader> open_reader(const std::vector<std::string> &paths, const ReaderOptions &options,
                                    ReaderCounters &counters) {
  if (paths.empty()) fail(Status::invalid_argument, "open_reader: no file to read");
  const std::string &path = paths[0];
  if (options.backend == Backend::pread) {
    log::info("{}: reading with the pread thread pool ({} threads), as configured", path,
              options.pread_threads);
    return std::make_unique<PreadReader>(paths, options, counters);
  }
#ifdef EP_HAVE_URING
  try {
    return std::make_unique<UringReader>(paths, options, counters);
  } catch (const UringSetupError &e) {
    if (options.backend == Backend::uring)
      fail(Status::unsupported, "{}: io_uring was required but cannot be set up: {}", path, e.what);
    counters.fallback_count.fetch_add(1);
    log::warn("{}: io_uring cannot be set up ({}): falling back to the pread thread pool ({} threads)",
              path, e.what, options.pread_threads);
  }
#else
  if (options.backend == Backend::uring)
    fail(Status::unsupported, "{}: io_uring was required but this build has no liburing", path);
  counters.fallback_count.fetch_add(1);
  log::info("{}: this build has no io_uring (liburing not found): using the pread thread pool ({} threads)",
            path, options.pread_threads);
#endif
  return std::make_unique<PreadReader>(paths, options, counters);
}

}  // namespace ep::io
