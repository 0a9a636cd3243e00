#include "io/file.hpp"

#include "core/error.hpp"
#include "core/log.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

namespace ep::io {

FileHandle &FileHandle::operator=(FileHandle &&other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.release();
  }
  return *this;
}

FileHandle::~FileHandle() {
  if (fd_ >= 0) ::close(fd_);
}

int FileHandle::release() noexcept { return std::exchange(fd_, -1); }

FileHandle open_buffered(const std::string &path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail_errno(errno, "open pack " + path);
  return FileHandle(fd);
}

FileHandle open_for_read(const std::string &path, DirectMode mode, bool &direct_out) {
  direct_out = false;
  if (mode == DirectMode::buffered) return open_buffered(path);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
  if (fd >= 0) {
    direct_out = true;
    return FileHandle(fd);
  }
  const int err = errno;
  if (err == EINVAL && mode == DirectMode::automatic) {
    log::warn("{}: the filesystem rejects O_DIRECT (EINVAL at open): reading buffered through the "
              "page cache; read throughput will not reflect the disk",
              path);
    return open_buffered(path);
  }
  fail_errno(err, "open pack " + path + " with O_DIRECT");
}

uint64_t file_size_bytes(const std::string &path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) fail_errno(errno, "stat " + path);
  return static_cast<uint64_t>(st.st_size);
}

AlignedBuffer::AlignedBuffer(std::size_t bytes, std::size_t alignment) {
  if (bytes == 0) return;
  const std::size_t rounded = align_up(bytes, alignment);
  void *p = nullptr;
  if (::posix_memalign(&p, alignment, rounded) != 0) throw std::bad_alloc();
  data_ = static_cast<std::byte *>(p);
  bytes_ = rounded;
}

AlignedBuffer::AlignedBuffer(AlignedBuffer &&other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

AlignedBuffer &AlignedBuffer::operator=(AlignedBuffer &&other) noexcept {
  if (this != &other) {
    std::free(data_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

AlignedBuffer::~AlignedBuffer() { std::free(data_); }

}  // namespace ep::io
