#include "capi/guard.hpp"

#include <string_view>

namespace ep::capi {
namespace {
thread_local std::string last_error_message;
}

ep_status set_error(ep_status status, const std::string &message) noexcept {
  try {
    last_error_message = message;
  } catch (...) {
    // Keeping the status is more important than the text when even that allocation fails.
  }
  return status;
}

void clear_error() noexcept { last_error_message.clear(); }

std::string message_of(const char *function, const char *message) {
  const std::string_view m(message), f(function);
  if (m.substr(0, f.size()) == f) return std::string(m);
  return std::string(f) + ": " + std::string(m);
}

const char *last_error() noexcept { return last_error_message.c_str(); }

void require_arg(const void *pointer, const char *function, const char *name) {
  if (!pointer) fail(Status::invalid_argument, "{}: argument '{}' is NULL", function, name);
}

void check_struct_size(std::size_t struct_size, std::size_t min_size, std::size_t known_size,
                       const char *struct_name) {
  if (struct_size < min_size || struct_size > known_size) {
    fail(Status::struct_size,
         "{}.struct_size is {} but this library (expertpack {}) accepts {}..{}: "
         "fill the struct with its _init() function",
         struct_name, struct_size, ep_version_string(), min_size, known_size);
  }
}

}  // namespace ep::capi
