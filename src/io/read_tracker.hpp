// Internal: the bookkeeping both reader backends share — requests split into aligned parts,
// and what to do with each raw result (resubmit the remainder, retry, fail, switch to
// buffered). Not thread-safe: the pread backend guards it with its mutex.
#pragma once

#include "io/reader.hpp"

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

namespace ep::io::detail {

uint64_t now_ns();

struct Part {
  uint32_t request = 0;
  uint64_t pos = 0;       ///< next byte to read, relative to the request
  uint64_t end = 0;       ///< end of this part (aligned in direct mode)
  uint64_t need_end = 0;  ///< bytes that must be read (EOF after this is fine)
  uint32_t eio = 0;       ///< EIO attempts so far
  uint32_t resubmits = 0;
  bool live = false;
};

struct Request {
  ReadRequest read;
  uint32_t parts_left = 0;
  bool failed = false;
  int error = 0;
  std::string message;
  uint64_t start_ns = 0;
  bool live = false;
};

enum class Action { finished, resubmit, switch_buffered };

class ReadTracker {
 public:
  ReadTracker(std::vector<std::string> paths, const ReaderOptions &options, ReaderCounters &counters)
      : paths_(std::move(paths)), options_(options), counters_(counters), direct_(paths_.size(), 0) {}

  /// Splits @p request into parts and appends them to ready().
  void add(const ReadRequest &request);
  /// Acts on the (seam-filtered) result of reading part @p part_id.
  Action on_result(uint32_t part_id, int64_t result);
  /// Whether file @p file is read with O_DIRECT (set at open, cleared after a switch to buffered).
  void set_direct(uint32_t file, bool direct) { direct_.at(file) = direct ? 1 : 0; }
  bool direct(uint32_t file) const { return direct_.at(file) != 0; }
  /// True when every file is read with O_DIRECT.
  bool all_direct() const;
  /// The file part @p part_id reads from.
  uint32_t file(uint32_t part_id) const { return requests_[parts_[part_id].request].read.file; }

  const Part &part(uint32_t id) const { return parts_[id]; }
  const Request &request_of(uint32_t part_id) const { return requests_[parts_[part_id].request]; }
  uint64_t file_offset(uint32_t part_id) const;
  void *dst(uint32_t part_id) const;
  uint64_t length(uint32_t part_id) const;

  std::deque<uint32_t> &ready() { return ready_; }
  std::vector<ReadCompletion> &completed() { return completed_; }
  std::size_t outstanding() const { return outstanding_; }
  /// Called when completions are handed out by wait().
  void handed_out(std::size_t n) { outstanding_ -= n; }

 private:
  void finish_part(uint32_t part_id);
  void fail_part(uint32_t part_id, int error, const std::string &why);
  uint32_t new_part();
  uint32_t new_request();

  std::vector<std::string> paths_;
  ReaderOptions options_;
  ReaderCounters &counters_;
  std::vector<char> direct_;
  std::vector<Part> parts_;
  std::vector<uint32_t> free_parts_;
  std::vector<Request> requests_;
  std::vector<uint32_t> free_requests_;
  std::deque<uint32_t> ready_;
  std::vector<ReadCompletion> completed_;
  std::size_t outstanding_ = 0;
};

}  // namespace ep::io::detail
