// Formatting helpers that throw ep::Error (core/status.hpp). Not for .cu files (no fmt there).
#pragma once

#include "core/status.hpp"

#include <fmt/format.h>

#include <string>
#include <utility>

namespace ep {

/// Throws Error(status, fmt::format(format, args...)).
template <typename... Args>
[[noreturn]] void fail(Status status, fmt::format_string<Args...> format, Args &&...args) {
  throw Error(status, fmt::format(format, std::forward<Args>(args)...));
}

/// Throws Error(Status::io, "<what>: <strerror(errno_value)>").
[[noreturn]] void fail_errno(int errno_value, const std::string &what);

}  // namespace ep
