/**
 * @file status.h
 * @brief The base of the C API: version macros, the export macro, status codes, the
 *        thread-local last error, and log levels.
 *
 * Every other public header includes this one. It is also the only public header the
 * library's lowest layer (src/core: errors, logging) sees, so internal code does not depend on
 * the whole ABI.
 */
#ifndef EXPERTPACK_STATUS_H
#define EXPERTPACK_STATUS_H

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
#define EP_VERSION_MINOR 6
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

/** @defgroup loglevel Log levels
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

/** @} */

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* EXPERTPACK_STATUS_H */
