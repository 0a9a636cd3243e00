// Sequential file output behind a small interface: the pack builder and the GGUF writer write
// through it, and tests wrap it to inject ENOSPC/EIO at a chosen byte.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace ep::format {

class OutputFile {
 public:
  virtual ~OutputFile() = default;
  /// Appends @p n bytes; throws ep::Error(Status::io) naming the file and offset on failure.
  virtual void write(const void *data, size_t n) = 0;
  /// Overwrites bytes already written (headers patched at the end); does not move offset().
  virtual void write_at(uint64_t offset, const void *data, size_t n) = 0;
  /// fsync(); throws ep::Error(Status::io) on failure.
  virtual void sync() = 0;
  /// Bytes written so far.
  virtual uint64_t offset() const = 0;
  virtual const std::string &path() const = 0;
  /// Appends @p n zero bytes.
  void write_zeros(uint64_t n);
};

/// Creates (O_CREAT | O_TRUNC, or O_EXCL when @p exclusive) a regular file for writing.
std::unique_ptr<OutputFile> create_output_file(const std::string &path, bool exclusive = false);

/// Wraps an OutputFile (tests inject faults by returning a decorator).
using OutputWrapper = std::function<std::unique_ptr<OutputFile>(std::unique_ptr<OutputFile>)>;

/// fsync() of a directory, so a rename in it is durable.
void sync_directory(const std::string &dir);

}  // namespace ep::format
