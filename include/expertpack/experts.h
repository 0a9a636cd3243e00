/**
 * @file experts.h
 * @brief The expert store alone: routed expert weights made resident on request, for engines
 *        that run their own kernels.
 *
 * An engine with its own attention, router and MoE kernels (llama.cpp, vLLM, SGLang, a Rust
 * engine) asks the store "make these (layer, expert) weights resident and give me their
 * addresses". The store is the one ep_model_open() uses inside: an Expert Pack read with one
 * aligned read per missing expert (or the source files' own byte ranges without a pack), a cache
 * of whole experts in VRAM (or in host memory), an optional host-RAM tier below it, a pinned
 * staging ring between the disk and the device, and a placement policy.
 *
 * The sequence of one MoE layer:
 * 1. ep_experts_acquire() with the layer's routed ids (any number of tokens' picks, repeats
 *    allowed: the store reads each distinct expert once) on the engine's CUDA stream;
 * 2. ep_experts_lease_info() gives, per id, the address of its expert object and of each role
 *    (gate, up, down) inside it, laid out as ep_experts_layout() describes (ggml types and
 *    shapes, byte offsets); the engine's kernels read them on that stream;
 * 3. ep_experts_release() on the same stream once those kernels are queued: the store records
 *    the slots' last use there and may overwrite them only after that work ran;
 * 4. optionally ep_experts_hint() with the ids the next layer will likely ask for.
 *
 * Devices. With #EP_DEVICE_CUDA the experts live in the memory of CUDA device
 * ep_experts_options::device_index and the addresses are device addresses, ready in the order of
 * the stream passed to ep_experts_acquire(): the stream waits (on the device, through events) for
 * the copies of the experts that were missing, and when every id hits the host does not
 * synchronise at all. Missing experts are read from the disk before the acquire returns (the
 * host waits for the reads, not for the copies to the device). With #EP_DEVICE_CPU the experts
 * live in host memory, the stream argument must be NULL and the bytes are in place when the
 * acquire returns.
 *
 * The bytes of each role are the source tensor's slice for that expert, byte for byte (an FP4
 * role stored with separate E8M0 scales, as in DeepSeek-V4's and Kimi-K3's releases, is re-laid
 * into ggml's MXFP4 blocks, as the pack builder does): the store never converts, prunes or
 * requantizes.
 *
 * Thread safety: an ::ep_experts may be used from any number of threads at once (the store
 * serialises its acquires, releases and hints internally; an acquire waiting for reads holds
 * the others back). A lease may be released from any thread, exactly once; it must not be
 * used by two threads at once.
 *
 * Lifetimes: a lease's addresses (and the arrays ep_experts_lease_info() returns) are valid
 * until ep_experts_release(). An unreleased lease pins its experts: they are never evicted, so
 * a store whose every slot is pinned fails the next acquire that misses with #EP_ERR_BUDGET.
 * ep_experts_close() frees the store with its memory; a lease still held then is only good for
 * ep_experts_release(), which frees it and reports #EP_ERR_INVALID_ARGUMENT.
 */
#ifndef EXPERTPACK_EXPERTS_H
#define EXPERTPACK_EXPERTS_H

#include "expertpack/expertpack.h"
#include "expertpack/model.h"
#include "expertpack/store.h"

#ifdef __cplusplus
extern "C" {
#endif

/** @defgroup experts The expert store for other engines
 *  @{ */

/** An open expert store (opaque). Free it with ep_experts_close(). */
typedef struct ep_experts ep_experts;
/** One acquire's experts, pinned until ep_experts_release() (opaque). */
typedef struct ep_experts_lease ep_experts_lease;

/** The matrices of one routed expert, in the order they lie in its object. Pinned to 32 bits. */
typedef enum ep_expert_role {
  EP_EXPERT_ROLE_GATE = 0, /**< The gate projection: ne = [hidden, expert width]. */
  EP_EXPERT_ROLE_UP = 1,   /**< The up projection: ne = [hidden, expert width]. */
  EP_EXPERT_ROLE_DOWN = 2, /**< The down projection: ne = [expert width, hidden]. */
  EP_EXPERT_ROLE_FORCE_32BIT = 0x7fffffff /**< Not a role: pins the enum to 32 bits. */
} ep_expert_role;

/** Roles per expert (gate, up, down). */
#define EP_EXPERT_ROLES 3

/** Options of ep_experts_open(); fill with ep_experts_options_init(). Fields are only appended.
 *  The fields ::ep_model_options has too carry its names and meanings. */
typedef struct ep_experts_options {
  size_t struct_size;          /**< Must be `sizeof(ep_experts_options)`; set by the init function. */
  ep_device_kind device;       /**< Where the experts live: #EP_DEVICE_CUDA (device memory of @c device_index;
                                    #EP_ERR_NO_DEVICE without one, or in a build without CUDA), #EP_DEVICE_CPU (host
                                    memory), #EP_DEVICE_AUTO (CUDA when device @c device_index exists, else host memory;
                                    ep_experts_info() says which). Default: #EP_DEVICE_AUTO. */
  int32_t device_index;        /**< CUDA device ordinal. Default: 0. */
  uint64_t cache_budget_bytes; /**< Bytes of the expert cache (whole slots of the largest expert; at least the largest set
                                    one acquire may ask for, else #EP_ERR_BUDGET naming the sizes); 0 = room for every
                                    expert, at most half the physical memory (CUDA: the free GPU memory less 2 GiB).
                                    Default: 0. */
  uint32_t staging_slots;      /**< Staging slots for expert reads; 0 = automatic. Default: 0. */
  uint32_t queue_depth;        /**< I/O queue depth; 0 = automatic. Default: 0. */
  uint32_t read_splits;        /**< Reads each expert object in this many parts; 0 = automatic. Default: 0. */
  int32_t direct_io;           /**< 1 = O_DIRECT reads, 0 = buffered, -1 = automatic. Default: -1. */
  const char *pack_dir;        /**< Directory of packs (and source indexes) made for sources (UTF-8); NULL =
                                    `$XDG_CACHE_HOME/expertpack` (else `$HOME/.cache/expertpack`). Default: NULL. */
  int32_t pack_build;          /**< 1 = build a missing pack (or source index) and rebuild a stale pack; 0 = never
                                    (#EP_ERR_NOT_FOUND / #EP_ERR_STALE instead). Default: 1. */
  int32_t no_pack;             /**< 1 = no Expert Pack: the experts are read from the source files themselves through
                                    a source index in @c pack_dir, as ep_model_options::no_pack (a pack as the path:
                                    #EP_ERR_INVALID_ARGUMENT); 0 = a pack (given, or found / built for a source). Default: 0. */
  ep_model_progress_fn progress; /**< NULL, or called while a pack or a source index is built. Default: NULL. */
  void *progress_payload;      /**< Passed to @c progress unchanged. Default: NULL. */
  uint64_t host_cache_bytes;   /**< Host-RAM tier below the expert cache, in bytes (whole experts; pinned with CUDA), as
                                    ep_model_options::host_cache_bytes; 0 = no tier. Default: 0. */
  int32_t prefetch;            /**< 1 = ep_experts_hint() loads the experts it names into spare I/O capacity (never
                                    evicting one of the last acquires); 0 = ep_experts_hint() is refused. Default: 0. */
  const char *cache_policy;    /**< Eviction policy of the cache and the host tier: "decay", "decay-bypass", "lru",
                                    "sglang-lfu"; NULL = "decay". Default: NULL. */
  uint32_t tokens_per_acquire; /**< Tokens one acquire may cover: it may ask for at most
                                    min(top_k × tokens_per_acquire, num_experts) distinct experts, and the cache must
                                    hold that many (#EP_ERR_BUDGET). 0 = as many tokens as the budget holds top_k
                                    experts for. ep_experts_info() gives the result. Default: 1. */
  const char *stats_path;      /**< NULL, or a JSON file the store writes its counters to (atomically; read it with
                                    ep_store_stats_read_file()): every @c stats_every acquires and at close.
                                    Default: NULL. */
  uint32_t stats_every;        /**< With @c stats_path: write it every this many acquires; 0 = only at close.
                                    Without @c stats_path it must be 0. Default: 0. */
  uint32_t top_k;              /**< Experts per token, for sizing (tokens_per_acquire) and ep_experts_info(); 0 = as the
                                    source records it (#EP_ERR_INVALID_ARGUMENT naming the pack when it records none, as
                                    a safetensors checkpoint without config.json). Default: 0. */
} ep_experts_options;

/**
 * @brief Fills @p options with the defaults.
 * @param options Struct to fill; NULL is ignored.
 */
EP_API void ep_experts_options_init(ep_experts_options *options);

/**
 * @brief Opens an expert store.
 * @param[out] out_experts Receives the handle on success, NULL on failure.
 * @param path    An Expert Pack (.epk) with its manifest (`PACK.json`), a source index (.epx) with
 *                its manifest, or a source: a .gguf file (first shard of a set) or a safetensors
 *                checkpoint (a directory with config.json), whose pack is found or built in
 *                ep_experts_options::pack_dir as ep_model_open() does (with
 *                ep_experts_options::no_pack, its source index) (UTF-8).
 * @param options NULL for the defaults, or filled by ep_experts_options_init().
 * @return #EP_OK; #EP_ERR_INVALID_ARGUMENT (NULL argument, a bad option value, named);
 *         #EP_ERR_STRUCT_SIZE; #EP_ERR_NOT_FOUND (no such file, a pack without its manifest or
 *         source, no pack while pack_build is 0); #EP_ERR_STALE (the source changed since the
 *         pack or index was made); #EP_ERR_BUDGET (cache budget below the largest acquire, a host
 *         tier larger than the memory left); #EP_ERR_BUSY (another process builds the same pack);
 *         #EP_ERR_IO; #EP_ERR_FORMAT (a malformed file); #EP_ERR_CORRUPT (a payload hash);
 *         #EP_ERR_UNSUPPORTED (experts of one layer laid out differently, a role that is not a
 *         matrix); #EP_ERR_NO_DEVICE; #EP_ERR_CUDA; #EP_ERR_OUT_OF_MEMORY.
 */
EP_API ep_status ep_experts_open(ep_experts **out_experts, const char *path, const ep_experts_options *options);

/**
 * @brief Closes a store and frees its memory (waiting for its own copies first).
 *
 * The caller's work that reads the store's addresses must have completed (the store cannot see
 * the caller's streams once nothing is released on them). Leases still held become orphans:
 * ep_experts_release() frees them and returns #EP_ERR_INVALID_ARGUMENT.
 * @param experts Handle from ep_experts_open(); NULL is a no-op.
 */
EP_API void ep_experts_close(ep_experts *experts);

/**
 * @brief The Expert Pack (or, with ep_experts_options::no_pack, the source index) the store reads.
 * @param experts Open store; NULL gives NULL.
 * @return Its absolute path, valid while the store is open.
 */
EP_API const char *ep_experts_pack_path(const ep_experts *experts);

/** What a store holds and how it was sized, filled by ep_experts_info(). */
typedef struct ep_experts_properties {
  size_t struct_size;               /**< Set by the caller to `sizeof(ep_experts_properties)` (or use ep_experts_properties_init()). */
  uint32_t num_layers;              /**< MoE layers; the layer arguments of this API run 0 .. num_layers-1. */
  uint32_t first_layer;             /**< The model block of layer 0 (Kimi's leading dense blocks have no experts). */
  uint32_t num_experts;             /**< Routed experts per layer; ids run 0 .. num_experts-1. */
  uint32_t num_roles;               /**< Matrices per expert: #EP_EXPERT_ROLES. */
  uint32_t top_k;                   /**< Experts per token: ep_experts_options::top_k, or as the source records it. */
  uint32_t max_experts_per_acquire; /**< Distinct experts one acquire may ask for: min(top_k × tokens_per_acquire, num_experts). */
  uint32_t max_table_ids;           /**< Ids (repeats counted) up to which an acquire publishes a device table
                                         (ep_experts_lease_properties::device_table): top_k × tokens_per_acquire. */
  uint32_t tokens_per_acquire;      /**< ep_experts_options::tokens_per_acquire, or what 0 resolved to. */
  uint64_t slot_bytes;              /**< Bytes of one cache slot: the largest expert object, 4096-aligned. */
  uint64_t cache_slots;             /**< Experts the cache holds. */
  uint64_t host_slots;              /**< Experts the host-RAM tier holds (0: no tier). */
  ep_device_kind device;            /**< Where the experts live: #EP_DEVICE_CPU (host memory) or #EP_DEVICE_CUDA. */
  int32_t device_index;             /**< The CUDA device's ordinal with #EP_DEVICE_CUDA; -1 in host memory. */
  uint64_t slots_address;           /**< Address of the cache's slot 0 (device memory with #EP_DEVICE_CUDA): slot s lies at
                                         slots_address + s × slot_bytes, so kernels that index one stacked tensor of
                                         experts (llama.cpp's mul_mat_id, an expert_map of vLLM's fused MoE) can view
                                         the cache as cache_slots experts of slot_bytes each, with a lease's slot
                                         indices (ep_experts_lease_properties::slots) as the expert ids. Valid while
                                         the store is open. */
} ep_experts_properties;

/**
 * @brief Fills @p properties with zeros and sets its struct_size.
 * @param properties Struct to fill; NULL is ignored.
 */
EP_API void ep_experts_properties_init(ep_experts_properties *properties);

/**
 * @brief Describes an open store.
 * @param[out] out_properties Filled up to its struct_size.
 * @param experts Open store.
 * @return #EP_OK; #EP_ERR_INVALID_ARGUMENT (NULL argument); #EP_ERR_STRUCT_SIZE.
 */
EP_API ep_status ep_experts_info(ep_experts_properties *out_properties, const ep_experts *experts);

/** One role of the experts of a layer: where it lies inside an expert object and what it is. */
typedef struct ep_expert_role_layout {
  uint32_t ggml_type;  /**< ggml type id (GGML_TYPE_*: 0 F32, 1 F16, 8 Q8_0, 10 Q2_K, 12 Q4_K, 30 BF16, 39 MXFP4, ...). */
  uint32_t n_dims;     /**< 2: every role is a matrix. */
  uint64_t ne[2];      /**< Shape in ggml order: ne[0] elements per row (the input width), ne[1] rows (the output width). */
  uint64_t offset;     /**< Bytes from the start of the expert object to the role (a multiple of 256). */
  uint64_t row_bytes;  /**< Bytes of one row of ne[0] elements in ggml_type (whole quantization blocks). */
  uint64_t bytes;      /**< Bytes of the role: row_bytes × ne[1]. */
} ep_expert_role_layout;

/** The layout of every expert object of one layer, filled by ep_experts_layout(). */
typedef struct ep_experts_layer_layout {
  size_t struct_size;       /**< Set by the caller to `sizeof(ep_experts_layer_layout)` (or use ep_experts_layer_layout_init()). */
  uint32_t layer;           /**< The layer described (0 .. num_layers-1). */
  uint32_t model_layer;     /**< Its model block: first_layer + layer. */
  uint32_t num_experts;     /**< Experts of the layer. */
  uint32_t num_roles;       /**< #EP_EXPERT_ROLES. */
  uint64_t object_bytes;    /**< Bytes of one expert object: the end of its last role (<= ep_experts_properties::slot_bytes). */
  ep_expert_role_layout roles[EP_EXPERT_ROLES]; /**< Indexed by ::ep_expert_role. */
} ep_experts_layer_layout;

/**
 * @brief Fills @p layout with zeros and sets its struct_size.
 * @param layout Struct to fill; NULL is ignored.
 */
EP_API void ep_experts_layer_layout_init(ep_experts_layer_layout *layout);

/**
 * @brief Describes the expert objects of one layer (every expert of a layer has the same layout).
 * @param[out] out_layout Filled up to its struct_size.
 * @param experts Open store.
 * @param layer   Layer, 0 .. num_layers-1.
 * @return #EP_OK; #EP_ERR_INVALID_ARGUMENT (NULL argument, a layer out of range, named);
 *         #EP_ERR_STRUCT_SIZE.
 */
EP_API ep_status ep_experts_layout(ep_experts_layer_layout *out_layout, const ep_experts *experts, uint32_t layer);

/**
 * @brief Makes the experts @p ids of @p layer resident and pins them until ep_experts_release().
 *
 * The store dedups @p ids (repeats are welcome: pass every token's picks as they are), counts a
 * hit or a miss per distinct expert, reads the missing ones (a host-tier hit is one copy instead),
 * evicting unpinned experts whose last use is done, and orders the work after @p cuda_stream's
 * view: kernels queued on @p cuda_stream after this call see every expert's bytes. When every id
 * hits, neither the disk nor the host's waiting is involved.
 * @param[out] out_lease Receives the lease on success, NULL on failure; read it with
 *        ep_experts_lease_info(), give it back with ep_experts_release().
 * @param experts Open store.
 * @param layer   Layer, 0 .. num_layers-1.
 * @param ids     @p n_ids expert ids, each 0 .. num_experts-1.
 * @param n_ids   Number of ids (>= 1); at most max_experts_per_acquire of them distinct.
 * @param cuda_stream With #EP_DEVICE_CUDA: the caller's `cudaStream_t` the experts are used on (NULL:
 *        the legacy default stream); in host memory it must be NULL.
 * @return #EP_OK; #EP_ERR_INVALID_ARGUMENT (NULL argument, n_ids 0, a layer or id out of range,
 *         more distinct ids than max_experts_per_acquire, a stream given in host memory: each
 *         named with the layer and position); #EP_ERR_BUDGET (every slot is pinned by unreleased
 *         leases: release some); #EP_ERR_BUSY (too many unreleased leases); #EP_ERR_IO (a read
 *         failed, naming the file and offset); #EP_ERR_CORRUPT (the bytes read do not match the
 *         pack's hashes, naming the layer, expert and role); #EP_ERR_CUDA. A failed acquire pins
 *         nothing.
 */
EP_API ep_status ep_experts_acquire(ep_experts_lease **out_lease, ep_experts *experts, uint32_t layer, const int32_t *ids,
                                    size_t n_ids, void *cuda_stream);

/** What a lease holds, filled by ep_experts_lease_info(). The arrays belong to the lease. */
typedef struct ep_experts_lease_properties {
  size_t struct_size;               /**< Set by the caller to `sizeof(ep_experts_lease_properties)` (or use ep_experts_lease_properties_init()). */
  uint32_t layer;                   /**< The layer acquired. */
  uint32_t n_ids;                   /**< Ids acquired (as given, repeats included). */
  const int32_t *ids;               /**< The @c n_ids ids as given (host memory). */
  const void *const *objects;       /**< Host array of @c n_ids addresses: id i's expert object (device memory with
                                         #EP_DEVICE_CUDA, host memory otherwise). */
  const void *const *roles;         /**< Host array of #EP_EXPERT_ROLES × @c n_ids addresses, role-major:
                                         `roles[r * n_ids + i]` = `objects[i]` + the layer's roles[r].offset. */
  const void *const *device_table;  /**< The same role-major table in the store's memory (device memory with
                                         #EP_DEVICE_CUDA, written in stream order), for kernels that read their
                                         pointers from there; NULL when n_ids exceeds max_table_ids. */
  uint32_t hits;                    /**< Distinct experts that were resident. */
  uint32_t misses;                  /**< Distinct experts that were not (read from the disk, or copied from the host tier). */
  uint32_t host_hits;               /**< Misses served from the host tier. */
  uint32_t reserved;                /**< Zero. */
  const uint32_t *slots;            /**< Host array of @c n_ids slot indices: id i's object is slot slots[i] of the cache
                                         (ep_experts_properties::slots_address + slots[i] × slot_bytes). */
} ep_experts_lease_properties;

/**
 * @brief Fills @p info with zeros and sets its struct_size.
 * @param info Struct to fill; NULL is ignored.
 */
EP_API void ep_experts_lease_properties_init(ep_experts_lease_properties *info);

/**
 * @brief Describes a lease: its ids and, per id, the addresses of its object and roles.
 * @param[out] out_info Filled up to its struct_size; its arrays are valid until the lease is released.
 * @param lease A lease from ep_experts_acquire(), not released.
 * @return #EP_OK; #EP_ERR_INVALID_ARGUMENT (NULL argument, a lease whose store was closed);
 *         #EP_ERR_STRUCT_SIZE.
 */
EP_API ep_status ep_experts_lease_info(ep_experts_lease_properties *out_info, const ep_experts_lease *lease);

/**
 * @brief Gives a lease back: the work queued on @p cuda_stream before this call is the last use of
 *        its experts, which the store may evict once that work ran. Frees the lease (also on failure).
 * @param lease A lease from ep_experts_acquire(); NULL is a no-op (#EP_OK).
 * @param cuda_stream With #EP_DEVICE_CUDA: the `cudaStream_t` the lease's experts were read on (NULL: the
 *        legacy default stream); in host memory it must be NULL (the experts are free to evict when this returns).
 * @return #EP_OK; #EP_ERR_INVALID_ARGUMENT (a stream given in host memory: the experts are
 *         released all the same; the lease's store was closed); #EP_ERR_CUDA (the store could not
 *         order itself after @p cuda_stream: the experts stay pinned, since kernels may still read them).
 */
EP_API ep_status ep_experts_release(ep_experts_lease *lease, void *cuda_stream);

/**
 * @brief Names experts of @p layer a later acquire will likely ask for (the next layer's router
 *        on this layer's input, a hash-routed layer's table): the store reads the missing ones into
 *        staging slots no demand read waits for and never evicts an expert one of the last
 *        num_layers acquires used. Returns without waiting for the reads.
 * @param experts Open store, opened with ep_experts_options::prefetch.
 * @param layer   Layer, 0 .. num_layers-1.
 * @param ids     @p n_ids expert ids, each 0 .. num_experts-1 (NULL when @p n_ids is 0).
 * @param n_ids   Number of ids.
 * @return #EP_OK; #EP_ERR_INVALID_ARGUMENT (NULL argument, a layer or id out of range, a store
 *         opened without prefetch).
 */
EP_API ep_status ep_experts_hint(ep_experts *experts, uint32_t layer, const int32_t *ids, size_t n_ids);

/**
 * @brief The store's counters (hits, misses, reads, evictions, host tier, prefetch).
 * @param[out] out_stats Filled up to its struct_size (ep_store_stats_init()).
 * @param experts Open store.
 * @return #EP_OK; #EP_ERR_INVALID_ARGUMENT (NULL argument); #EP_ERR_STRUCT_SIZE.
 */
EP_API ep_status ep_experts_stats(ep_store_stats *out_stats, const ep_experts *experts);

/** @} */

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* EXPERTPACK_EXPERTS_H */
