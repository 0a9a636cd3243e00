// Random-access byte sources for the parsers: a file read with pread, or a memory buffer
// (fuzzers, tests). Parsers read only through this interface, so every read is bounds-checked
// against size() in one place, and errors name the source and the offset.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace ep::format {

/// Adds two sizes; throws ep::Error(Status::format) naming @p what on overflow.
uint64_t checked_add(uint64_t a, uint64_t b, const char *what);
/// Multiplies two sizes; throws ep::Error(Status::format) naming @p what on overflow.
uint64_t checked_mul(uint64_t a, uint64_t b, const char *what);
/// Rounds @p value up to a multiple of @p alignment (a power of two); throws on overflow.
uint64_t align_up(uint64_t value, uint64_t alignment);

class ByteSource {
 public:
  virtual ~ByteSource() = default;
  /// Total bytes available.
  virtual uint64_t size() const = 0;
  /// A name for messages (the file path, or "<memory>").
  virtual const std::string &name() const = 0;
  /// Copies [offset, offset + n) into @p dst. Throws ep::Error(Status::format, "... truncated")
  /// when the range is past size(), ep::Error(Status::io) when the read fails.
  void read(uint64_t offset, void *dst, size_t n) const;
  /// Reads @p n bytes into a new vector (n is checked against size() before allocating).
  std::vector<uint8_t> read_vector(uint64_t offset, size_t n) const;

 protected:
  virtual void read_unchecked(uint64_t offset, void *dst, size_t n) const = 0;
};

/// A view of caller-owned memory; the memory must outlive the source.
class MemorySource final : public ByteSource {
 public:
  MemorySource(std::span<const uint8_t> bytes, std::string name = "<memory>")
      : bytes_(bytes), name_(std::move(name)) {}
  uint64_t size() const override { return bytes_.size(); }
  const std::string &name() const override { return name_; }

 protected:
  void read_unchecked(uint64_t offset, void *dst, size_t n) const override;

 private:
  std::span<const uint8_t> bytes_;
  std::string name_;
};

/// A read-only file, read with pread (thread-safe: no shared file position).
class FileSource final : public ByteSource {
 public:
  /// Opens @p path read-only; throws ep::Error(Status::not_found) when it does not exist,
  /// Status::io for other failures.
  explicit FileSource(std::string path);
  ~FileSource() override;
  FileSource(const FileSource &) = delete;
  FileSource &operator=(const FileSource &) = delete;
  uint64_t size() const override { return size_; }
  const std::string &name() const override { return path_; }
  int fd() const { return fd_; }
  /// st_mtime in nanoseconds since the epoch, as seen at open.
  int64_t mtime_ns() const { return mtime_ns_; }

 protected:
  void read_unchecked(uint64_t offset, void *dst, size_t n) const override;

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
  int64_t mtime_ns_ = 0;
};

/// A little-endian cursor over a ByteSource with a read-ahead buffer, for sequential parsing
/// of headers (GGUF metadata, pack index). Every read is bounds-checked.
class Cursor {
 public:
  Cursor(const ByteSource &source, uint64_t offset);
  uint64_t offset() const { return offset_; }
  uint64_t remaining() const { return source_.size() - offset_; }
  const ByteSource &source() const { return source_; }
  void read(void *dst, size_t n);
  void skip(uint64_t n);
  template <typename T>
  T get() {
    T value;
    read(&value, sizeof(T));
    return value;
  }
  uint8_t u8() { return get<uint8_t>(); }
  uint16_t u16() { return get<uint16_t>(); }
  uint32_t u32() { return get<uint32_t>(); }
  uint64_t u64() { return get<uint64_t>(); }

 private:
  const ByteSource &source_;
  uint64_t offset_;
  std::vector<uint8_t> buffer_;
  uint64_t buffer_offset_ = 0;  // source offset of buffer_[0]
};

}  // namespace ep::format
