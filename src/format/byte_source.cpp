#include "format/byte_source.hpp"

#include "core/error.hpp"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace ep::format {

uint64_t checked_add(uint64_t a, uint64_t b, const char *what) {
  uint64_t r;
  if (__builtin_add_overflow(a, b, &r)) fail(Status::format, "{}: {} + {} overflows 64 bits", what, a, b);
  return r;
}

uint64_t checked_mul(uint64_t a, uint64_t b, const char *what) {
  uint64_t r;
  if (__builtin_mul_overflow(a, b, &r)) fail(Status::format, "{}: {} * {} overflows 64 bits", what, a, b);
  return r;
}

uint64_t align_up(uint64_t value, uint64_t alignment) {
  if (alignment == 0) return value;
  const uint64_t r = checked_add(value, alignment - 1, "align_up");
  return r / alignment * alignment;
}

void ByteSource::read(uint64_t offset, void *dst, size_t n) const {
  const uint64_t total = size();
  if (offset > total || n > total - offset) {
    fail(Status::format, "{}: truncated file: needs {} bytes at offset {} but the file has {} bytes",
         name(), n, offset, total);
  }
  if (n) read_unchecked(offset, dst, n);
}

std::vector<uint8_t> ByteSource::read_vector(uint64_t offset, size_t n) const {
  const uint64_t total = size();
  if (offset > total || n > total - offset) {
    fail(Status::format, "{}: truncated file: needs {} bytes at offset {} but the file has {} bytes",
         name(), n, offset, total);
  }
  std::vector<uint8_t> out(n);
  if (n) read_unchecked(offset, out.data(), n);
  return out;
}

void MemorySource::read_unchecked(uint64_t offset, void *dst, size_t n) const {
  std::memcpy(dst, bytes_.data() + offset, n);
}

FileSource::FileSource(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) {
    const int e = errno;
    if (e == ENOENT) fail(Status::not_found, "{}: no such file", path_);
    fail_errno(e, "open " + path_);
  }
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    const int e = errno;
    ::close(fd_);
    fd_ = -1;
    fail_errno(e, "stat " + path_);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd_);
    fd_ = -1;
    fail(Status::format, "{}: not a regular file", path_);
  }
  size_ = static_cast<uint64_t>(st.st_size);
  mtime_ns_ = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

FileSource::~FileSource() {
  if (fd_ >= 0) ::close(fd_);
}

void FileSource::read_unchecked(uint64_t offset, void *dst, size_t n) const {
  auto *p = static_cast<uint8_t *>(dst);
  while (n > 0) {
    const ssize_t got = ::pread(fd_, p, n, static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      fail_errno(errno, fmt::format("read {} at offset {}", path_, offset));
    }
    if (got == 0) {
      fail(Status::format, "{}: truncated file: unexpected end of file at offset {} (the file shrank?)",
           path_, offset);
    }
    p += got;
    n -= static_cast<size_t>(got);
    offset += static_cast<uint64_t>(got);
  }
}

Cursor::Cursor(const ByteSource &source, uint64_t offset) : source_(source), offset_(offset) {}

void Cursor::read(void *dst, size_t n) {
  constexpr size_t kWindow = 1 << 20;
  if (n == 0) return;  // dst may be the null data() of an empty vector
  const uint64_t total = source_.size();
  if (offset_ > total || n > total - offset_) {
    fail(Status::format, "{}: truncated file: needs {} bytes at offset {} but the file has {} bytes",
         source_.name(), n, offset_, total);
  }
  if (n >= kWindow) {
    source_.read(offset_, dst, n);
    offset_ += n;
    return;
  }
  if (offset_ < buffer_offset_ || offset_ + n > buffer_offset_ + buffer_.size()) {
    const uint64_t want = std::min<uint64_t>(kWindow, total - offset_);
    buffer_.resize(static_cast<size_t>(want));
    buffer_offset_ = offset_;
    source_.read(offset_, buffer_.data(), buffer_.size());
  }
  std::memcpy(dst, buffer_.data() + (offset_ - buffer_offset_), n);
  offset_ += n;
}

void Cursor::skip(uint64_t n) {
  const uint64_t total = source_.size();
  if (offset_ > total || n > total - offset_) {
    fail(Status::format, "{}: truncated file: needs {} bytes at offset {} but the file has {} bytes",
         source_.name(), n, offset_, total);
  }
  offset_ += n;
}

}  // namespace ep::format
