/**
 * @file expertpack.h
 * @brief libexpertpack: the stable C API.
 *
 * libexpertpack runs Mixture-of-Experts language models whose weights are larger than GPU
 * memory and host memory together. Dense weights live in VRAM; the routed experts live on an
 * NVMe SSD in an *Expert Pack* and only the experts the router selects are read.
 *
 * The umbrella header: it includes status.h (version, export macro, status codes, log levels)
 * and every area header (pack, model, store, text, experts).
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

#include "expertpack/status.h"

#ifdef __cplusplus
extern "C" {
#endif

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
 * `debug`, `trace`) sets the initial level; ep_log_configure() overrides both. The levels (::ep_log_level) and the callback type (::ep_log_fn) are in
 * status.h.
 *  @{ */

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
#include "expertpack/grammar.h"
#include "expertpack/experts.h"

#endif /* EXPERTPACK_H */
