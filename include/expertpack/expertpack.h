/**
 * @file expertpack.h
 * @brief libexpertpack: the stable C API.
 *
 * libexpertpack runs Mixture-of-Experts language models whose weights are larger than GPU
 * memory and host memory together. Dense weights live in VRAM; the routed experts live on an
 * NVMe SSD in an *Expert Pack* and only the experts the router selects are read.
 *
 * Conventions (docs/c-api.md has the full text):
 * - Every function that can fail returns an ::ep_status: #EP_OK (0) or a negative error code.
 *   On failure, ep_last_error() returns a one-line message for the calling thread that names
 *   the file, offset or tensor involved.
 * - Objects are opaque handles. A function that creates one writes it through its first
 *   (`**out`) parameter; the caller owns it and frees it with the matching `_close()`.
 *   Every `_close(NULL)` is a no-op.
 * - Options are passed by `const` pointer to a struct whose first field is `struct_size`.
 *   Call the struct's `_init()` function to fill in the defaults, then change fields.
 *   Fields are only ever appended, so a program built against an older header keeps working.
 * - Callbacks take a `void *payload` as their last parameter.
 * - No C++ exception, CUDA error or io_uring type ever crosses this boundary.
 *
 * Thread safety: functions on distinct objects may be called from any thread. The log
 * configuration is process-wide and may be changed at any time.
 */
#ifndef EXPERTPACK_H
#define EXPERTPACK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** @defgroup version Version
 *  @{ */

/** Major version: changes when the ABI breaks. */
#define EP_VERSION_MAJOR 0
/** Minor version: changes when symbols or struct fields are appended. */
#define EP_VERSION_MINOR 1
/** Patch version: changes for fixes that do not touch the API. */
#define EP_VERSION_PATCH 0
/** The version as one number: `major * 10000 + minor * 100 + patch`. */
#define EP_VERSION_NUMBER (EP_VERSION_MAJOR * 10000 + EP_VERSION_MINOR * 100 + EP_VERSION_PATCH)

/** @} */

/** @defgroup export Symbol export
 *  @{ */

/** Marks a function of the public C API. Only these symbols leave the shared library. */
#if defined(_WIN32)
#  if defined(EP_BUILDING_LIBRARY)
#    define EP_API __declspec(dllexport)
#  else
#    define EP_API __declspec(dllimport)
#  endif
#elif defined(__GNUC__)
#  define EP_API __attribute__((visibility("default")))
#else
#  define EP_API
#endif

/** @} */

/** @defgroup status Status codes and errors
 *  @{ */

/**
 * @brief Result of every fallible call. The numbers are stable and never reused.
 *
 * The enum is pinned to 32 bits (see ::EP_STATUS_FORCE_32BIT).
 */
typedef enum ep_status {
  EP_OK = 0,                     /**< Success. */
  EP_ERR_INVALID_ARGUMENT = -1,  /**< A NULL pointer, an out-of-range value or a bad combination. */
  EP_ERR_OUT_OF_MEMORY = -2,     /**< Host or device memory could not be allocated. */
  EP_ERR_IO = -3,                /**< A read, write, open or sync failed (errno is in the message). */
  EP_ERR_NOT_FOUND = -4,         /**< A file, tensor, key or shard does not exist. */
  EP_ERR_FORMAT = -5,            /**< A file is malformed: bad magic, truncated, out-of-bounds field. */
  EP_ERR_CORRUPT = -6,           /**< A checksum or digest does not match: the bytes changed. */
  EP_ERR_UNSUPPORTED = -7,       /**< Valid input this build cannot handle (dtype, architecture, feature). */
  EP_ERR_VERSION = -8,           /**< A file format or library version mismatch. */
  EP_ERR_STRUCT_SIZE = -9,       /**< An options struct's `struct_size` is not one this library knows. */
  EP_ERR_SHAPE = -10,            /**< A tensor has the wrong shape or dtype for its use. */
  EP_ERR_CUDA = -11,             /**< A CUDA runtime or library call failed. */
  EP_ERR_NO_DEVICE = -12,        /**< No usable GPU (for example no driver: cudaErrorInsufficientDriver). */
  EP_ERR_BUDGET = -13,           /**< A memory budget is too small for the work asked of it. */
  EP_ERR_CANCELLED = -14,        /**< The caller's callback asked to stop. */
  EP_ERR_BUSY = -15,             /**< A resource is locked by another user (for example a pack being built). */
  EP_ERR_STALE = -16,            /**< A source file changed since the pack was built from it. */
  EP_ERR_INTERNAL = -17,         /**< A bug in libexpertpack: please report the message. */
  EP_STATUS_FORCE_32BIT = 0x7fffffff /**< Not a status: pins the enum to 32 bits. */
} ep_status;

/**
 * @brief A static, human-readable name for a status code.
 * @param status Any value; unknown values give "unknown status".
 * @return A string with static storage duration; never NULL.
 */
EP_API const char *ep_status_str(ep_status status);

/**
 * @brief The message of the last failed call on this thread.
 *
 * One line, naming what failed and where (file, offset, tensor). It is overwritten by the next
 * failing call on the same thread and is empty ("") when no call has failed yet.
 * @return A thread-local string owned by the library; valid until the next API call on this
 *         thread. Never NULL.
 */
EP_API const char *ep_last_error(void);

/** @} */

/** @defgroup versionfn Runtime version
 *  @{ */

/**
 * @brief The version of the library actually loaded.
 * @return `major * 10000 + minor * 100 + patch`; compare with ::EP_VERSION_NUMBER.
 */
EP_API uint32_t ep_version_number(void);

/**
 * @brief The version of the library actually loaded, as text ("0.1.0").
 * @return A static string; never NULL.
 */
EP_API const char *ep_version_string(void);

/** @} */

/** @defgroup log Logging
 *
 * The library logs through one process-wide sink. By default messages at #EP_LOG_WARN and
 * above go to stderr. The environment variable `EP_LOG` (`off`, `error`, `warn`, `info`,
 * `debug`, `trace`) sets the initial level; ep_log_configure() overrides both.
 *  @{ */

/** Severity of a log message. Pinned to 32 bits. */
typedef enum ep_log_level {
  EP_LOG_TRACE = 0,   /**< Very detailed diagnostics (per read, per acquire). */
  EP_LOG_DEBUG = 1,   /**< Diagnostics for developers. */
  EP_LOG_INFO = 2,    /**< Progress and one-off facts (pack opened, backend chosen). */
  EP_LOG_WARN = 3,    /**< Something degraded but working (fallback reader, buffered I/O). */
  EP_LOG_ERROR = 4,   /**< An operation failed. */
  EP_LOG_OFF = 5,     /**< As a level: log nothing. */
  EP_LOG_LEVEL_FORCE_32BIT = 0x7fffffff /**< Not a level: pins the enum to 32 bits. */
} ep_log_level;

/**
 * @brief Receives one log message.
 * @param level   Severity of the message.
 * @param message One line without a trailing newline; valid only during the call.
 * @param payload The pointer given to ep_log_configure() or ep_set_log_callback().
 *
 * May be called from any thread of the library, concurrently; it must not call back into
 * the library.
 */
typedef void (*ep_log_fn)(ep_log_level level, const char *message, void *payload);

/**
 * @brief Options of the process-wide log sink (the options-struct pattern).
 *
 * Fill with ep_log_options_init(), change fields, pass to ep_log_configure().
 */
typedef struct ep_log_options {
  size_t struct_size;      /**< Must be `sizeof(ep_log_options)`; set by ep_log_options_init(). */
  ep_log_level min_level;  /**< Messages below this level are dropped. Default: #EP_LOG_WARN or `EP_LOG`. */
  ep_log_fn callback;      /**< Sink; NULL writes to stderr. Default: NULL. */
  void *payload;           /**< Passed to @p callback unchanged. Default: NULL. */
} ep_log_options;

/**
 * @brief Fills @p options with the defaults (including the level taken from `EP_LOG`).
 * @param options Struct to fill; NULL is ignored.
 */
EP_API void ep_log_options_init(ep_log_options *options);

/**
 * @brief Replaces the process-wide log configuration.
 * @param options Filled by ep_log_options_init() and then edited.
 * @return #EP_OK; #EP_ERR_INVALID_ARGUMENT if @p options is NULL or the level is out of range;
 *         #EP_ERR_STRUCT_SIZE if `struct_size` is not a size this library knows.
 */
EP_API ep_status ep_log_configure(const ep_log_options *options);

/**
 * @brief Shorthand: route log messages to @p callback, keeping the current level.
 * @param callback Sink, or NULL for stderr.
 * @param payload  Passed to @p callback unchanged.
 */
EP_API void ep_set_log_callback(ep_log_fn callback, void *payload);

/**
 * @brief Shorthand: change the minimum level, keeping the current sink.
 * @param min_level A value of ::ep_log_level.
 * @return #EP_OK or #EP_ERR_INVALID_ARGUMENT for an unknown level.
 */
EP_API ep_status ep_set_log_level(ep_log_level min_level);

/** @} */

/** @defgroup build Build facts
 *  @{ */

/** Features compiled into the loaded library; see ep_build_features(). */
typedef enum ep_feature {
  EP_FEATURE_CUDA = 1,     /**< The CUDA backend is compiled in. */
  EP_FEATURE_IO_URING = 2, /**< The io_uring reader is compiled in. */
  EP_FEATURE_FORCE_32BIT = 0x7fffffff /**< Not a feature: pins the enum to 32 bits. */
} ep_feature;

/**
 * @brief Which optional features the loaded library was built with.
 * @return A bitwise OR of ::ep_feature values.
 */
EP_API uint32_t ep_build_features(void);

/**
 * @brief Counts the CUDA devices this process can use.
 * @param[out] out_count Number of devices; 0 when built without CUDA or without a driver.
 * @return #EP_OK (also when there is no device: then @p out_count is 0 and ep_last_error()
 *         says why); #EP_ERR_INVALID_ARGUMENT if @p out_count is NULL.
 */
EP_API ep_status ep_cuda_device_count(int32_t *out_count);

/** @} */

#ifdef __cplusplus
} /* extern "C" */
#endif

/* Area headers, one line each: */
#include "expertpack/pack.h"
#include "expertpack/model.h"
#include "expertpack/store.h"
#include "expertpack/text.h"

#endif /* EXPERTPACK_H */
