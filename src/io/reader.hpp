// The expert reader: reads whole pack objects into caller memory (the staging ring), many in
// flight, and reports each request's completion as soon as it lands, so the store can start
// that expert's H2D copy at once (per-expert completion).
//
// Two backends behind one interface:
//  - io_uring (liburing): the pack registered as a fixed file, the staging ring as a fixed
//    buffer, queue_depth reads in flight, each request split into read_splits aligned parts;
//  - a pread thread pool, chosen explicitly or when io_uring cannot be set up (seccomp, old
//    kernel, a build without liburing) — with one log line and fallback_count incremented.
// Both handle short reads (the remainder is resubmitted), EINTR/EAGAIN (retried), EIO
// (retried eio_retries times, counted in io_errors, then the request fails with a message
// naming the pack, offset and length), and a filesystem that rejects O_DIRECT (EINVAL at open
// or at the first read: reopened buffered with a warning).
//
// A reader may span several files (a striped pack's parts): each request names its file.
//
// Threading: one Reader is used by one thread at a time (the store serialises acquires).
#pragma once

#include "io/busy_clock.hpp"
#include "io/file.hpp"
#include "io/seam.hpp"

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace ep::io {

enum class Backend { automatic, uring, pread };

/// "auto", "uring", "pread" → Backend (throws EP_ERR_INVALID_ARGUMENT otherwise).
Backend parse_backend(std::string_view name);

struct ReaderOptions {
  Backend backend = Backend::automatic;
  DirectMode direct = DirectMode::automatic;
  uint32_t queue_depth = 32;    ///< io_uring: reads in flight; pread: jobs queued
  uint32_t read_splits = 1;     ///< each request is split into this many aligned parts
  uint32_t pread_threads = 8;   ///< threads of the pread pool
  uint32_t eio_retries = 2;     ///< EIO retries per part before the request fails
  std::shared_ptr<IoSeam> seam; ///< fault injection for tests (null: none)
  /// Reads in flight that count as a full queue (Reader::busy_times' full_ns); 0, or more than
  /// the reader can have in flight: that most (io_uring: queue_depth; pread: pread_threads).
  uint32_t full_depth = 0;
  NanoClock clock;              ///< the busy times' clock (null: steady_now_ns; tests inject one)
};

/// Counters the reader adds to (shared with the store's stats; all atomic).
struct ReaderCounters {
  std::atomic<uint64_t> reads{0};           ///< requests completed successfully
  std::atomic<uint64_t> read_bytes{0};      ///< bytes of those requests
  std::atomic<uint64_t> io_errors{0};       ///< failed reads (each EIO attempt counts)
  std::atomic<uint64_t> retries{0};         ///< EINTR/EAGAIN resubmissions
  std::atomic<uint64_t> short_reads{0};     ///< short reads whose remainder was resubmitted
  std::atomic<uint64_t> fallback_count{0};  ///< io_uring → pread pool, O_DIRECT → buffered
};

/// One object to read. In O_DIRECT mode @p offset and @p dst must be 4096-aligned and @p dst
/// must have room for align_up(bytes, 4096) bytes.
struct ReadRequest {
  uint64_t offset = 0;
  uint64_t bytes = 0;
  void *dst = nullptr;
  uint64_t tag = 0;  ///< returned in the completion
  uint32_t file = 0;  ///< which of the reader's files (open_reader's paths) to read
};

struct ReadCompletion {
  uint64_t tag = 0;
  bool ok = false;
  int error = 0;        ///< errno of the failure
  std::string message;  ///< "<file>: read of N bytes at offset O failed after K attempts: ..."
  uint64_t latency_ns = 0;
};

class Reader {
 public:
  virtual ~Reader() = default;
  /// "io_uring" or "pread".
  virtual std::string_view backend_name() const = 0;
  /// True while reads of every file bypass the page cache.
  virtual bool direct() const = 0;
  /// Registers [base, base + bytes) as a fixed buffer (io_uring); reads into it then use
  /// read_fixed. Call before the first submit. A failure logs one warning and is not fatal.
  virtual void register_buffer(void *base, std::size_t bytes) = 0;
  /// Queues one request (never blocks on the disk).
  virtual void submit(const ReadRequest &request) = 0;
  /// Waits until at least @p min_count requests completed (fewer if fewer are outstanding),
  /// appends every completion available to @p out and returns how many were appended.
  virtual std::size_t wait(std::vector<ReadCompletion> &out, std::size_t min_count) = 0;
  /// Requests submitted and not yet returned by wait().
  virtual std::size_t outstanding() const = 0;
  /// The disk's busy time up to now, over the reader's life (BusyClock): the wall time with at
  /// least one read handed to the kernel (io_uring: from its submission until the reader reaps
  /// its completion, which it does in wait(); pread: while a pool thread is in the call), and
  /// with at least full_depth() of them. Reads of every kind count (demand and prefetch alike).
  virtual BusyTimes busy_times() const = 0;
  /// ReaderOptions::full_depth as it took effect.
  virtual uint32_t full_depth() const = 0;
  /// The first file (the only one of a single-file reader).
  const std::string &path() const { return paths_[0]; }
  const std::string &path(uint32_t file) const { return paths_.at(file); }
  const std::vector<std::string> &paths() const { return paths_; }

 protected:
  explicit Reader(std::vector<std::string> paths) : paths_(std::move(paths)) {}

 private:
  std::vector<std::string> paths_;
};

/// Opens @p path with the backend @p options ask for (automatic: io_uring, else the pread pool
/// with a log line and counters.fallback_count + 1). @p counters must outlive the reader.
std::unique_ptr<Reader> open_reader(const std::string &path, const ReaderOptions &options,
                                    ReaderCounters &counters);
/// The same over several files (a striped pack's parts): ReadRequest::file picks one; every
/// read of every file shares the queue depth (io_uring: one ring, each file a fixed file). Each
/// file is opened as @p options say (DirectMode::direct: an error naming the file that refuses
/// O_DIRECT; automatic: that file is read buffered, with a warning and fallback_count + 1).
std::unique_ptr<Reader> open_reader(const std::vector<std::string> &paths, const ReaderOptions &options,
                                    ReaderCounters &counters);

/// True when this build has io_uring support (liburing).
bool uring_compiled();

}  // namespace ep::io
