// C API: status strings, last error, version, logging, build facts.
#include <expertpack/expertpack.h>

#include "capi/guard.hpp"
#include "core/log.hpp"
#include "expertpack/build_config.h"

#include "engine/engine.hpp"

namespace ep::capi {
const char *last_error() noexcept;
}

extern "C" {

EP_API const char *ep_status_str(ep_status status) {
  return ep::status_name(static_cast<ep::Status>(status));
}

EP_API const char *ep_last_error(void) { return ep::capi::last_error(); }

EP_API uint32_t ep_version_number(void) {
  return EP_BUILD_VERSION_MAJOR * 10000u + EP_BUILD_VERSION_MINOR * 100u + EP_BUILD_VERSION_PATCH;
}

EP_API const char *ep_version_string(void) { return EP_BUILD_VERSION; }

EP_API void ep_log_options_init(ep_log_options *options) {
  if (!options) return;
  *options = ep_log_options{};
  options->struct_size = sizeof(ep_log_options);
  options->min_level = ep::log::level_from_environment();
}

EP_API ep_status ep_log_configure(const ep_log_options *options) {
  return ep::capi::guard(__func__, [&](const char *fn) {
    ep::capi::require_arg(options, fn, "options");
    ep::capi::check_struct_size(options->struct_size, sizeof(ep_log_options),
                                sizeof(ep_log_options), "ep_log_options");
    if (options->min_level < EP_LOG_TRACE || options->min_level > EP_LOG_OFF)
      ep::fail(ep::Status::invalid_argument, "{}: min_level {} is not an ep_log_level", fn,
               static_cast<int>(options->min_level));
    ep::log::configure(options->min_level, options->callback, options->payload);
  });
}

EP_API void ep_set_log_callback(ep_log_fn callback, void *payload) {
  ep::log::set_callback(callback, payload);
}

EP_API ep_status ep_set_log_level(ep_log_level min_level) {
  return ep::capi::guard(__func__, [&](const char *fn) {
    if (min_level < EP_LOG_TRACE || min_level > EP_LOG_OFF)
      ep::fail(ep::Status::invalid_argument, "{}: {} is not an ep_log_level", fn,
               static_cast<int>(min_level));
    ep::log::set_level(min_level);
  });
}

EP_API uint32_t ep_build_features(void) {
  uint32_t features = 0;
#ifdef EP_HAVE_CUDA
  features |= EP_FEATURE_CUDA;
#endif
#ifdef EP_HAVE_URING
  features |= EP_FEATURE_IO_URING;
#endif
  return features;
}

EP_API ep_status ep_cuda_device_count(int32_t *out_count) {
  return ep::capi::guard(__func__, [&](const char *fn) {
    ep::capi::require_arg(out_count, fn, "out_count");
    *out_count = 0;
    std::string why;
    *out_count = ep::engine::cuda_device_count(&why);
    if (*out_count == 0) ep::capi::set_error(EP_OK, std::string(fn) + ": " + why);
  });
}

}  // extern "C"
