// The error type used everywhere inside the library. The C API (capi/) turns it into an
// ep_status and a thread-local one-line message; nothing else crosses the boundary.
// Free of fmt so that .cu files may include it.
#pragma once

#include <expertpack/status.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

namespace ep {

/// Status codes, the same numbers as the C ::ep_status.
enum class Status : int32_t {
  ok = EP_OK,
  invalid_argument = EP_ERR_INVALID_ARGUMENT,
  out_of_memory = EP_ERR_OUT_OF_MEMORY,
  io = EP_ERR_IO,
  not_found = EP_ERR_NOT_FOUND,
  format = EP_ERR_FORMAT,
  corrupt = EP_ERR_CORRUPT,
  unsupported = EP_ERR_UNSUPPORTED,
  version = EP_ERR_VERSION,
  struct_size = EP_ERR_STRUCT_SIZE,
  shape = EP_ERR_SHAPE,
  cuda = EP_ERR_CUDA,
  no_device = EP_ERR_NO_DEVICE,
  budget = EP_ERR_BUDGET,
  cancelled = EP_ERR_CANCELLED,
  busy = EP_ERR_BUSY,
  stale = EP_ERR_STALE,
  internal = EP_ERR_INTERNAL,
};

/// The static name of a status ("EP_ERR_FORMAT").
const char *status_name(Status status) noexcept;

/// An exception carrying a Status and a one-line message that names the file, offset or
/// tensor involved, what was expected and what was found.
class Error : public std::runtime_error {
 public:
  Error(Status status, std::string message)
      : std::runtime_error(std::move(message)), status_(status) {}
  /// The status the C API reports for this error.
  Status status() const noexcept { return status_; }

 private:
  Status status_;
};

}  // namespace ep
