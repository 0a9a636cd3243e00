#include "core/error.hpp"

#include <cstring>

namespace ep {

const char *status_name(Status status) noexcept {
  switch (status) {
    case Status::ok: return "EP_OK";
    case Status::invalid_argument: return "EP_ERR_INVALID_ARGUMENT";
    case Status::out_of_memory: return "EP_ERR_OUT_OF_MEMORY";
    case Status::io: return "EP_ERR_IO";
    case Status::not_found: return "EP_ERR_NOT_FOUND";
    case Status::format: return "EP_ERR_FORMAT";
    case Status::corrupt: return "EP_ERR_CORRUPT";
    case Status::unsupported: return "EP_ERR_UNSUPPORTED";
    case Status::version: return "EP_ERR_VERSION";
    case Status::struct_size: return "EP_ERR_STRUCT_SIZE";
    case Status::shape: return "EP_ERR_SHAPE";
    case Status::cuda: return "EP_ERR_CUDA";
    case Status::no_device: return "EP_ERR_NO_DEVICE";
    case Status::budget: return "EP_ERR_BUDGET";
    case Status::cancelled: return "EP_ERR_CANCELLED";
    case Status::busy: return "EP_ERR_BUSY";
    case Status::stale: return "EP_ERR_STALE";
    case Status::internal: return "EP_ERR_INTERNAL";
  }
  return "unknown status";
}

void fail_errno(int errno_value, const std::string &what) {
  const Status status = (errno_value == ENOENT) ? Status::not_found
                        : (errno_value == ENOMEM) ? Status::out_of_memory
                                                  : Status::io;
  throw Error(status, fmt::format("{}: {} (errno {})", what, std::strerror(errno_value), errno_value));
}

}  // namespace ep
