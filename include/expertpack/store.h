/**
 * @file store.h
 * @brief Expert delivery statistics: what the expert store read, cached and copied.
 *
 * The expert store (the part of the library that turns routed expert ids into resident
 * expert weights: pack reads, the staging ring and the device expert cache) keeps the counters
 * of ::ep_store_stats. ep_model_store_stats() (model.h) fills the struct for an open model.
 * ep_store_stats_read_file() reads the same counters from the JSON file an expert store writes,
 * atomically, every N acquires when it is given one (an option of the store inside the library:
 * no field of ::ep_model_options asks an opened model for such a file).
 *
 * Thread safety: the functions here keep no state and may be called from any thread.
 */
#ifndef EXPERTPACK_STORE_H
#define EXPERTPACK_STORE_H

#include "expertpack/expertpack.h"

#ifdef __cplusplus
extern "C" {
#endif

/** @defgroup store Expert delivery statistics
 *  @{ */

/** Counters of one expert store. Fill struct_size with ep_store_stats_init(). */
typedef struct ep_store_stats {
  size_t struct_size;        /**< Set to `sizeof(ep_store_stats)` by ep_store_stats_init(). */
  uint64_t acquires;         /**< Calls that asked for one layer's routed experts. */
  uint64_t pack_reads;       /**< Reads of expert bytes: one per expert object from a pack; with ep_model_options::no_pack
                                  one per role (gate, up, down) from the source files, two for an FP4 role stored with
                                  separate scales (its values, its scales). */
  uint64_t pack_read_bytes;  /**< Bytes those reads transferred (each read a 4096-aligned range around its payload). */
  uint64_t pack_read_ns;     /**< Wall time with at least one pack read in flight (demand and prefetch alike: the disk
                                  busy), over the store's life. Several devices: their stores' times summed. */
  uint64_t cache_hits;       /**< Unique experts of an acquire already resident. */
  uint64_t cache_misses;     /**< Unique experts of an acquire that were read (hits + misses = unique experts asked for). */
  uint64_t cache_evictions;  /**< Resident experts replaced. */
  uint64_t resident_experts; /**< Experts resident now. */
  uint64_t resident_bytes;   /**< Payload bytes of the resident experts. */
  uint64_t h2d_bytes;        /**< Bytes copied from the staging ring into the expert cache. */
  uint64_t io_errors;        /**< Failed reads (each attempt of a retried EIO counts, and each read whose payload failed its check). */
  uint64_t fallback_count;   /**< Degradations: io_uring unavailable (pread pool used), O_DIRECT refused (buffered reads). */
  uint64_t cache_slots;      /**< Slots of the expert cache. */
  uint64_t slot_bytes;       /**< Bytes of one slot (the largest expert, 4096-aligned). */
  /* Appended after the first version: */
  uint64_t host_hits;        /**< Cache misses served from the host-RAM tier (one copy, no pack read). */
  uint64_t host_misses;      /**< Cache misses not in the host tier (read from the pack); 0 without a tier. */
  uint64_t demotions;        /**< Experts evicted from the cache and kept in the host tier. */
  uint64_t host_resident_bytes; /**< Payload bytes held by the host tier now. */
  uint64_t host_slots;       /**< Slots of the host tier (0: no tier). */
  uint64_t prefetch_issued;  /**< Experts loaded ahead of their layer from a prediction (ep_model_options::prefetch). */
  uint64_t prefetch_used;    /**< Prefetched experts their layer then asked for. */
  /* Appended in 0.6: */
  uint64_t pack_read_full_ns;    /**< Wall time with at least pack_read_full_depth reads in flight (the queue kept full). */
  uint64_t pack_read_full_depth; /**< Reads in flight that count as a full queue: staging slots x reads per expert x
                                      read splits, at most the I/O queue depth. A setting, not a count. */
  uint64_t expert_wait_ns;       /**< Wall time the model's thread was blocked waiting for expert reads to land (the
                                      disk busy meanwhile: never more than pack_read_ns). */
  uint64_t store_disk_idle_ns;   /**< Wall time the expert store's own work (deciding hits and misses, submitting reads,
                                      issuing copies, publishing tables, releasing) ran with no read in flight. */
} ep_store_stats;

/**
 * @brief Fills @p stats with zeros and sets its struct_size.
 * @param stats Struct to fill; NULL is ignored.
 */
EP_API void ep_store_stats_init(ep_store_stats *stats);

/**
 * @brief Reads a statistics file written by an expert store (a JSON object).
 * @param[out] out_stats Filled up to its struct_size; a counter missing from the file reads 0.
 * @param path Path of the JSON file (UTF-8).
 * @return #EP_OK; #EP_ERR_INVALID_ARGUMENT (NULL argument); #EP_ERR_STRUCT_SIZE;
 *         #EP_ERR_NOT_FOUND / #EP_ERR_IO (the file cannot be read); #EP_ERR_FORMAT (not a JSON
 *         object of unsigned counters).
 */
EP_API ep_status ep_store_stats_read_file(ep_store_stats *out_stats, const char *path);

/** @} */

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* EXPERTPACK_STORE_H */
