/**
 * @file pack.h
 * @brief Read-only inspection of an Expert Pack (docs/pack-format.md).
 *
 * A host engine opens a pack to check that it is valid and to learn its geometry: how many
 * layers and experts it holds, where each expert's object lies in the file, and the identity
 * digests that tie it to its source model. Reading expert payloads is the job of the expert
 * store; this API only describes the file.
 *
 * Thread safety: an ::ep_pack is immutable after ep_pack_open(); every function below may be
 * called on it from any thread concurrently.
 */
#ifndef EXPERTPACK_PACK_H
#define EXPERTPACK_PACK_H

#include "expertpack/expertpack.h"

#ifdef __cplusplus
extern "C" {
#endif

/** @defgroup pack Expert Pack inspection
 *  @{ */

/** An open, validated Expert Pack (opaque). Free it with ep_pack_close(). */
typedef struct ep_pack ep_pack;

/** How much ep_pack_open() checks. Pinned to 32 bits. */
typedef enum ep_pack_validation {
  /** Header, struct sizes, counts, alignment, index digest and every index entry. */
  EP_PACK_VALIDATE_STRUCTURE = 0,
  /** Structure plus the payload hashes of a deterministic sample of objects (the default). */
  EP_PACK_VALIDATE_SAMPLED = 1,
  /** Structure plus the hash of every payload (reads the whole file). */
  EP_PACK_VALIDATE_FULL = 2,
  EP_PACK_VALIDATE_FORCE_32BIT = 0x7fffffff /**< Not a level: pins the enum to 32 bits. */
} ep_pack_validation;

/** Options of ep_pack_open(); fill with ep_pack_open_options_init(). */
typedef struct ep_pack_open_options {
  size_t struct_size;             /**< Must be `sizeof(ep_pack_open_options)`; set by the init function. */
  ep_pack_validation validation;  /**< Default: #EP_PACK_VALIDATE_SAMPLED. */
} ep_pack_open_options;

/**
 * @brief Fills @p options with the defaults.
 * @param options Struct to fill; NULL is ignored.
 */
EP_API void ep_pack_open_options_init(ep_pack_open_options *options);

/**
 * @brief Opens and validates a pack file.
 * @param[out] out_pack Receives the handle on success, NULL on failure.
 * @param path    Path of the pack file (UTF-8).
 * @param options NULL for the defaults, or filled by ep_pack_open_options_init().
 * @return #EP_OK; #EP_ERR_INVALID_ARGUMENT (NULL argument, unknown validation level);
 *         #EP_ERR_STRUCT_SIZE; #EP_ERR_NOT_FOUND (no such file); #EP_ERR_IO;
 *         #EP_ERR_FORMAT (bad magic, truncated file, misaligned offset, bad field);
 *         #EP_ERR_VERSION (unsupported pack version); #EP_ERR_CORRUPT (header checksum, index
 *         digest or payload hash mismatch); #EP_ERR_UNSUPPORTED (unknown dtype or flags);
 *         #EP_ERR_SHAPE (an entry's shape does not match its size). ep_last_error() names the
 *         file and offset.
 */
EP_API ep_status ep_pack_open(ep_pack **out_pack, const char *path, const ep_pack_open_options *options);

/** Geometry and identity of an open pack, filled by ep_pack_info(). */
typedef struct ep_pack_properties {
  size_t struct_size;            /**< Set by the caller to `sizeof(ep_pack_properties)` (or use ep_pack_properties_init()). */
  uint32_t format_version;       /**< Expert Pack format version (1). */
  uint32_t num_layers;           /**< MoE layers in the pack. */
  uint32_t num_experts;          /**< Routed experts per layer. */
  uint32_t num_roles;            /**< Matrices per expert (3: gate, up, down). */
  uint32_t top_k;                /**< Experts used per token, as recorded from the source. */
  uint32_t first_layer;          /**< Model block index of pack layer 0. */
  uint64_t alignment;            /**< Object alignment in bytes (4096 by default). */
  uint64_t data_start;           /**< File offset of object (0, 0). */
  uint64_t object_stride;        /**< Bytes between consecutive objects. */
  uint64_t max_object_bytes;     /**< Largest number of bytes used by one object (<= object_stride). */
  uint64_t file_size;            /**< Size of the pack file in bytes. */
  uint8_t source_files_sha256[32];   /**< Identity digest of the source files. */
  uint8_t model_identity_sha256[32]; /**< Identity digest of the expert weights. */
  uint8_t config_sha256[32];         /**< Identity digest of the build configuration. */
} ep_pack_properties;

/**
 * @brief Sets `struct_size` and zeroes the rest.
 * @param properties Struct to prepare; NULL is ignored.
 */
EP_API void ep_pack_properties_init(ep_pack_properties *properties);

/**
 * @brief Describes an open pack.
 * @param[out] out_properties Filled up to its `struct_size`, which the caller sets first.
 * @param pack An open pack.
 * @return #EP_OK; #EP_ERR_INVALID_ARGUMENT for a NULL argument; #EP_ERR_STRUCT_SIZE.
 */
EP_API ep_status ep_pack_info(ep_pack_properties *out_properties, const ep_pack *pack);

/** Where one expert's object lies in the pack, filled by ep_pack_object(). */
typedef struct ep_pack_object_info {
  uint64_t offset;           /**< Absolute file offset of the object (a multiple of the alignment). */
  uint64_t bytes;            /**< Bytes used by the object (gate, up and down with padding). */
  uint64_t role_offset[3];   /**< Absolute file offset of gate, up and down. */
  uint64_t role_bytes[3];    /**< Bytes of gate, up and down. */
  uint32_t role_ggml_type[3];/**< ggml type id of gate, up and down. */
  uint32_t reserved;         /**< Zero. */
} ep_pack_object_info;

/**
 * @brief Locates the object of one (layer, expert).
 * @param[out] out_object Receives the object's placement.
 * @param pack   An open pack.
 * @param layer  Pack layer, 0 .. num_layers-1.
 * @param expert Expert, 0 .. num_experts-1.
 * @return #EP_OK; #EP_ERR_INVALID_ARGUMENT for a NULL argument or an out-of-range index.
 */
EP_API ep_status ep_pack_object(ep_pack_object_info *out_object, const ep_pack *pack, uint32_t layer, uint32_t expert);

/**
 * @brief Closes a pack. NULL is a no-op.
 * @param pack The handle from ep_pack_open(), or NULL.
 */
EP_API void ep_pack_close(ep_pack *pack);

/** @} */

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* EXPERTPACK_PACK_H */
