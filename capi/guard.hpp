// The exception barrier of the C API: every extern "C" function body runs inside guard(),
// which turns any exception into an ep_status and the thread-local ep_last_error() text.
#pragma once

#include <expertpack/expertpack.h>

#include "core/error.hpp"

#include <cstddef>
#include <string>

namespace ep::capi {

/// Records @p message as this thread's ep_last_error() and returns @p status.
ep_status set_error(ep_status status, const std::string &message) noexcept;
/// Clears this thread's last error (called on success paths that must leave it empty).
void clear_error() noexcept;

/// @p message as the C function @p function reports it: prefixed with "function: " unless it
/// already starts with the name (messages of the engine and below do not know which C function
/// called them).
std::string message_of(const char *function, const char *message);

/// Runs @p body(function); returns EP_OK or the status of whatever it threw, with the message
/// recorded. The body receives the C function's name for its messages.
template <typename Body>
ep_status guard(const char *function, Body &&body) noexcept {
  try {
    body(function);
    return EP_OK;
  } catch (const ep::Error &e) {
    try {
      return set_error(static_cast<ep_status>(e.status()), message_of(function, e.what()));
    } catch (...) {
      return set_error(static_cast<ep_status>(e.status()), e.what());
    }
  } catch (const std::bad_alloc &) {
    return set_error(EP_ERR_OUT_OF_MEMORY, std::string(function) + ": out of host memory");
  } catch (const std::exception &e) {
    return set_error(EP_ERR_INTERNAL, std::string(function) + ": internal error: " + e.what());
  } catch (...) {
    return set_error(EP_ERR_INTERNAL, std::string(function) + ": internal error: unknown exception");
  }
}

/// Throws unless @p pointer is non-NULL; @p name is the parameter name for the message.
void require_arg(const void *pointer, const char *function, const char *name);

/// Checks an options struct's leading struct_size field: it must be at least the size of the
/// first published version of the struct (@p min_size) and at most the size this library knows
/// (@p known_size). Fields past struct_size take their defaults.
void check_struct_size(std::size_t struct_size, std::size_t min_size, std::size_t known_size,
                       const char *struct_name);

}  // namespace ep::capi
