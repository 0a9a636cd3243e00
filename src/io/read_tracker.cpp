#include "io/read_tracker.hpp"

#include "core/error.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

namespace ep::io::detail {

namespace {
// A part that makes no progress after this many resubmissions fails instead of spinning.
constexpr uint32_t kMaxResubmits = 10000;
}  // namespace

uint64_t now_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

uint32_t ReadTracker::new_part() {
  if (!free_parts_.empty()) {
    const uint32_t id = free_parts_.back();
    free_parts_.pop_back();
    return id;
  }
  parts_.emplace_back();
  return static_cast<uint32_t>(parts_.size() - 1);
}

uint32_t ReadTracker::new_request() {
  if (!free_requests_.empty()) {
    const uint32_t id = free_requests_.back();
    free_requests_.pop_back();
    return id;
  }
  requests_.emplace_back();
  return static_cast<uint32_t>(requests_.size() - 1);
}

bool ReadTracker::all_direct() const {
  return std::all_of(direct_.begin(), direct_.end(), [](char d) { return d != 0; });
}

void ReadTracker::add(const ReadRequest &read) {
  if (read.file >= paths_.size())
    fail(Status::invalid_argument, "{}: read request for file {} of {}", paths_[0], read.file, paths_.size());
  const std::string &path = paths_[read.file];
  if (read.bytes == 0 || read.dst == nullptr)
    fail(Status::invalid_argument, "{}: read request at offset {} has {} bytes and dst {}", path,
         read.offset, read.bytes, read.dst);
  const bool aligned = read.offset % kDirectAlignment == 0 &&
                       reinterpret_cast<uintptr_t>(read.dst) % kDirectAlignment == 0;
  const bool direct = direct_[read.file] != 0;
  if (direct && !aligned)
    fail(Status::invalid_argument,
         "{}: O_DIRECT read at offset {} into {} is not {}-aligned (offset and buffer must be)",
         path, read.offset, read.dst, kDirectAlignment);
  const uint32_t rid = new_request();
  Request &r = requests_[rid];
  r = Request{};
  r.read = read;
  r.start_ns = now_ns();
  r.live = true;
  // Parts are whole 4096-byte units so that each one is a valid O_DIRECT read.
  const uint64_t total = align_up(read.bytes, kDirectAlignment);
  const uint32_t splits = std::max<uint32_t>(1, options_.read_splits);
  const uint64_t part_bytes = align_up((total + splits - 1) / splits, kDirectAlignment);
  uint32_t count = 0;
  for (uint64_t start = 0; start < total; start += part_bytes) {
    const uint32_t pid = new_part();
    Part &p = parts_[pid];
    p = Part{};
    p.request = rid;
    p.pos = start;
    p.end = std::min(total, start + part_bytes);
    // Buffered reads stop at the object's end; direct ones read the padded tail too.
    if (!direct) p.end = std::min<uint64_t>(p.end, read.bytes);
    p.need_end = std::min<uint64_t>(p.end, read.bytes);
    p.live = true;
    if (p.pos >= p.end) {  // nothing left for this part in buffered mode
      p.live = false;
      free_parts_.push_back(pid);
      continue;
    }
    ready_.push_back(pid);
    ++count;
  }
  r.parts_left = count;
  ++outstanding_;
}

uint64_t ReadTracker::file_offset(uint32_t part_id) const {
  const Part &p = parts_[part_id];
  return requests_[p.request].read.offset + p.pos;
}

void *ReadTracker::dst(uint32_t part_id) const {
  const Part &p = parts_[part_id];
  return static_cast<std::byte *>(requests_[p.request].read.dst) + p.pos;
}

uint64_t ReadTracker::length(uint32_t part_id) const {
  const Part &p = parts_[part_id];
  return p.end - p.pos;
}

void ReadTracker::finish_part(uint32_t part_id) {
  Part &p = parts_[part_id];
  Request &r = requests_[p.request];
  p.live = false;
  free_parts_.push_back(part_id);
  if (--r.parts_left > 0) return;
  ReadCompletion c;
  c.tag = r.read.tag;
  c.ok = !r.failed;
  c.error = r.error;
  c.message = std::move(r.message);
  c.latency_ns = now_ns() - r.start_ns;
  if (c.ok) {
    counters_.reads.fetch_add(1, std::memory_order_relaxed);
    counters_.read_bytes.fetch_add(r.read.bytes, std::memory_order_relaxed);
  }
  completed_.push_back(std::move(c));
  r.live = false;
  free_requests_.push_back(static_cast<uint32_t>(&r - requests_.data()));
}

void ReadTracker::fail_part(uint32_t part_id, int error, const std::string &why) {
  Part &p = parts_[part_id];
  Request &r = requests_[p.request];
  if (!r.failed) {
    r.failed = true;
    r.error = error;
    r.message = fmt::format("{}: read of {} bytes at offset {} failed at offset {}: {}", paths_[r.read.file],
                            r.read.bytes, r.read.offset, r.read.offset + p.pos, why);
  }
  finish_part(part_id);
}

Action ReadTracker::on_result(uint32_t part_id, int64_t result) {
  Part &p = parts_[part_id];
  const bool direct = direct_[file(part_id)] != 0;
  if (result == -EINTR || result == -EAGAIN) {
    counters_.retries.fetch_add(1, std::memory_order_relaxed);
    if (++p.resubmits > kMaxResubmits) {
      fail_part(part_id, static_cast<int>(-result), "no progress after repeated EINTR/EAGAIN");
      return Action::finished;
    }
    return Action::resubmit;
  }
  if (result == -EINVAL && direct && options_.direct == DirectMode::automatic) {
    return Action::switch_buffered;
  }
  if (result < 0) {
    const int err = static_cast<int>(-result);
    counters_.io_errors.fetch_add(1, std::memory_order_relaxed);
    if (err == EIO && ++p.eio <= options_.eio_retries) return Action::resubmit;
    fail_part(part_id, err,
              fmt::format("{} (errno {}) after {} attempt(s)", std::strerror(err), err,
                          err == EIO ? p.eio : 1));
    return Action::finished;
  }
  if (result == 0) {
    if (p.pos >= p.need_end) {
      finish_part(part_id);
      return Action::finished;
    }
    counters_.io_errors.fetch_add(1, std::memory_order_relaxed);
    fail_part(part_id, EIO,
              fmt::format("unexpected end of file ({} of {} bytes of the object read)", p.pos,
                          requests_[p.request].read.bytes));
    return Action::finished;
  }
  const uint64_t asked = p.end - p.pos;
  const uint64_t got = std::min<uint64_t>(static_cast<uint64_t>(result), asked);
  p.pos += got;
  if (p.pos >= p.end || (got < asked && p.pos >= p.need_end)) {
    finish_part(part_id);
    return Action::finished;
  }
  // Short read: resubmit the remainder. O_DIRECT needs the restart aligned, so re-read from
  // the last 4096 boundary (the buffer start is aligned, so the address stays aligned too).
  counters_.short_reads.fetch_add(1, std::memory_order_relaxed);
  if (direct) p.pos = align_down(p.pos, kDirectAlignment);
  if (++p.resubmits > kMaxResubmits) {
    fail_part(part_id, EIO, "no progress after repeated short reads");
    return Action::finished;
  }
  return Action::resubmit;
}

}  // namespace ep::io::detail
