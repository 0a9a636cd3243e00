#include "format/file_writer.hpp"

#include "core/error.hpp"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <unistd.h>
#include <vector>

namespace ep::format {
namespace {

class FdOutputFile final : public OutputFile {
 public:
  FdOutputFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~FdOutputFile() override {
    if (fd_ >= 0) ::close(fd_);
  }
  void write(const void *data, size_t n) override {
    const auto *p = static_cast<const uint8_t *>(data);
    while (n > 0) {
      const ssize_t put = ::write(fd_, p, n);
      if (put < 0) {
        if (errno == EINTR) continue;
        fail_errno(errno, fmt::format("write {} at offset {}", path_, offset_));
      }
      p += put;
      n -= static_cast<size_t>(put);
      offset_ += static_cast<uint64_t>(put);
    }
  }
  void write_at(uint64_t at, const void *data, size_t n) override {
    const auto *p = static_cast<const uint8_t *>(data);
    while (n > 0) {
      const ssize_t put = ::pwrite(fd_, p, n, static_cast<off_t>(at));
      if (put < 0) {
        if (errno == EINTR) continue;
        fail_errno(errno, fmt::format("write {} at offset {}", path_, at));
      }
      p += put;
      n -= static_cast<size_t>(put);
      at += static_cast<uint64_t>(put);
    }
  }
  void sync() override {
    if (::fsync(fd_) != 0) fail_errno(errno, "fsync " + path_);
  }
  uint64_t offset() const override { return offset_; }
  const std::string &path() const override { return path_; }

 private:
  std::string path_;
  int fd_;
  uint64_t offset_ = 0;
};

}  // namespace

void OutputFile::write_zeros(uint64_t n) {
  static const std::vector<uint8_t> zeros(1 << 16, 0);
  while (n > 0) {
    const size_t k = static_cast<size_t>(std::min<uint64_t>(n, zeros.size()));
    write(zeros.data(), k);
    n -= k;
  }
}

std::unique_ptr<OutputFile> create_output_file(const std::string &path, bool exclusive) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | (exclusive ? O_EXCL : O_TRUNC), 0644);
  if (fd < 0) fail_errno(errno, "create " + path);
  return std::make_unique<FdOutputFile>(path, fd);
}

void sync_directory(const std::string &dir) {
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail_errno(errno, "open directory " + dir);
  const int rc = ::fsync(fd);
  const int e = errno;
  ::close(fd);
  if (rc != 0) fail_errno(e, "fsync directory " + dir);
}

}  // namespace ep::format
