// Opening an Expert Pack for reading: O_DIRECT where the filesystem allows it, buffered
// (page cache) otherwise, with a warning — never silently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ep::io {

/// O_DIRECT needs the file offset, the length and the memory address aligned to this.
inline constexpr std::size_t kDirectAlignment = 4096;

inline constexpr uint64_t align_up(uint64_t value, uint64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}
inline constexpr uint64_t align_down(uint64_t value, uint64_t alignment) {
  return value / alignment * alignment;
}

/// How a pack is opened.
enum class DirectMode {
  automatic,  ///< O_DIRECT; buffered with one warning if the filesystem rejects it (EINVAL)
  direct,     ///< O_DIRECT or fail
  buffered,   ///< page cache (tests, filesystems without O_DIRECT)
};

/// An owned read-only file descriptor (RAII).
class FileHandle {
 public:
  FileHandle() = default;
  explicit FileHandle(int fd) : fd_(fd) {}
  FileHandle(FileHandle &&other) noexcept : fd_(other.release()) {}
  FileHandle &operator=(FileHandle &&other) noexcept;
  FileHandle(const FileHandle &) = delete;
  FileHandle &operator=(const FileHandle &) = delete;
  ~FileHandle();

  int get() const noexcept { return fd_; }
  int release() noexcept;
  explicit operator bool() const noexcept { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

/// Opens @p path read-only. With DirectMode::automatic a filesystem that rejects O_DIRECT at
/// open (EINVAL: tmpfs, some overlay mounts) gives a buffered descriptor and one warning.
/// @p direct_out tells which one was opened. Throws ep::Error (EP_ERR_NOT_FOUND / EP_ERR_IO).
FileHandle open_for_read(const std::string &path, DirectMode mode, bool &direct_out);

/// Opens @p path buffered (used when O_DIRECT fails at the first read).
FileHandle open_buffered(const std::string &path);

/// The size of @p path in bytes (throws on error).
uint64_t file_size_bytes(const std::string &path);

/// Memory aligned to kDirectAlignment (or more), freed on destruction.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  AlignedBuffer(std::size_t bytes, std::size_t alignment = kDirectAlignment);
  AlignedBuffer(AlignedBuffer &&other) noexcept;
  AlignedBuffer &operator=(AlignedBuffer &&other) noexcept;
  AlignedBuffer(const AlignedBuffer &) = delete;
  AlignedBuffer &operator=(const AlignedBuffer &) = delete;
  ~AlignedBuffer();

  std::byte *data() const noexcept { return data_; }
  std::size_t size() const noexcept { return bytes_; }

 private:
  std::byte *data_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace ep::io
