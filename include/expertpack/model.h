/**
 * @file model.h
 * @brief Models: open a checkpoint, run sessions, generate tokens and score sequences.
 *
 * A model is opened from a source file: a GGUF file (first shard of a set) or a transformers
 * safetensors checkpoint (a directory with config.json). Supported architectures, chosen by the
 * GGUF's general.architecture (or config.json's model_type): DeepSeek-V4 (`deepseek4` GGUF /
 * `deepseek_v4` config.json), Kimi-Linear (`kimi-linear`, GGUF) and Kimi-K3 (`kimi-k3`, GGUF). A
 * session holds one sequence's decode state (DeepSeek-V4: window KV, compressor and indexer state;
 * Kimi: the KDA layers' recurrent and convolution state, the MLA layers' keys and values); tokens
 * appended to a session continue it.
 *
 * Routed experts are served from an Expert Pack through the expert store's bounded cache: a
 * source without a pack gets one built on first use (in ep_model_options::pack_dir, by default
 * `$XDG_CACHE_HOME/expertpack/`), reused afterwards while its manifest's source fingerprints
 * (size, mtime) match, and rebuilt when the source changed (or #EP_ERR_STALE when building is
 * disabled, or when the pack was given explicitly). Dense weights always come from the source.
 *
 * Devices: the CPU reference backend, or a CUDA GPU (dense weights in VRAM in their file types,
 * the expert cache's slots in VRAM, filled through pinned staging); #EP_DEVICE_AUTO takes the
 * GPU when there is one and the model's architecture runs there (DeepSeek-V4, Kimi-Linear and
 * Kimi-K3 all do).
 *
 * Thread safety: an ::ep_model may be shared by any number of sessions used from any number of
 * threads at once: the model serialises its forward passes (one at a time per model; sessions
 * on different models run in parallel), and the results do not depend on how calls interleave
 * (the same tokens as running the sessions one after another). A session must not be used from
 * two threads at once.
 */
#ifndef EXPERTPACK_MODEL_H
#define EXPERTPACK_MODEL_H

#include "expertpack/expertpack.h"
#include "expertpack/store.h"

#ifdef __cplusplus
extern "C" {
#endif

/** @defgroup model Models, sessions, generation and scoring
 *  @{ */

/** An open model (opaque). Free it with ep_model_close(). */
typedef struct ep_model ep_model;
/** One sequence's decode state on a model (opaque). Free it with ep_session_close(). */
typedef struct ep_session ep_session;

/** Where a model computes. Pinned to 32 bits. */
typedef enum ep_device_kind {
  EP_DEVICE_AUTO = 0,  /**< CUDA device ep_model_options::device_index when it exists and the architecture runs there, else the CPU. */
  EP_DEVICE_CPU = 1,   /**< The CPU reference backend. */
  EP_DEVICE_CUDA = 2,  /**< A CUDA GPU (#EP_ERR_NO_DEVICE when there is none, or in a build without CUDA; #EP_ERR_UNSUPPORTED
                            for an architecture without CUDA support). */
  EP_DEVICE_FORCE_32BIT = 0x7fffffff /**< Not a device: pins the enum to 32 bits. */
} ep_device_kind;

/**
 * @brief Called while ep_model_open() builds an Expert Pack.
 * @param done_bytes  Expert payload bytes copied so far.
 * @param total_bytes Expert payload bytes to copy.
 * @param payload     ep_model_options::progress_payload.
 */
typedef void (*ep_model_progress_fn)(uint64_t done_bytes, uint64_t total_bytes, void *payload);

/**
 * Options of ep_model_open(); fill with ep_model_options_init(). Fields are only appended. The
 * command-line flags of ep-run, ep-chat and ep-server and the bindings use these names and these
 * defaults (docs/c-api.md, "Model options"); ep_model_open() validates every value.
 */
typedef struct ep_model_options {
  size_t struct_size;          /**< Must be `sizeof(ep_model_options)`; set by the init function. */
  ep_device_kind device;       /**< Default: #EP_DEVICE_AUTO. */
  int32_t device_index;        /**< CUDA device ordinal. Default: 0. */
  uint64_t cache_budget_bytes; /**< Expert cache budget in bytes (whole slots of the largest expert; at least top_k of them,
                                    else #EP_ERR_BUDGET); 0 = room for every expert, at most half the physical memory (CUDA: the free GPU memory less
                                    2 GiB and the KV budget's room: an explicit kv_budget_bytes, or with kv_budget_bytes 0 a
                                    quarter of the memory free once the dense weights are in). On CUDA, a budget that holds
                                    every expert reads them all at open; steps then resolve their picks on the GPU (no host
                                    round trip) and the store's statistics stop at those reads. Default: 0. */
  uint32_t staging_slots;      /**< Staging slots for expert reads; 0 = automatic. Default: 0. */
  uint32_t queue_depth;        /**< I/O queue depth; 0 = automatic. Default: 0. */
  uint32_t read_splits;        /**< Reads each expert object in this many parts; 0 = automatic. Default: 0. */
  int32_t direct_io;           /**< 1 = O_DIRECT reads, 0 = buffered, -1 = automatic. Default: -1. */
  /* Appended after the first version: */
  const char *pack_dir;        /**< Directory of packs built from sources (UTF-8); NULL = `$XDG_CACHE_HOME/expertpack`
                                    (else `$HOME/.cache/expertpack`). Default: NULL. */
  int32_t pack_build;          /**< 1 = build a missing pack and rebuild a stale one; 0 = never (#EP_ERR_NOT_FOUND /
                                    #EP_ERR_STALE instead). Default: 1. */
  int32_t resident_experts;    /**< 1 = no pack: read every routed expert from the source into memory at open (the
                                    reference path); 0 = serve them from the pack through the cache. Default: 0. */
  ep_model_progress_fn progress; /**< NULL, or called while a pack is built. Default: NULL. */
  void *progress_payload;      /**< Passed to @c progress unchanged. Default: NULL. */
  int32_t cpu_threads;         /**< Threads of the CPU backend (#EP_DEVICE_CPU), 0 .. 4096; 0 = the EP_CPU_THREADS
                                    environment variable, else the hardware concurrency. Results are bitwise the same
                                    for any count. Default: 0. */
  uint64_t host_cache_bytes;   /**< Host-RAM tier below the expert cache, in bytes (whole experts; pinned host memory
                                    with CUDA): experts evicted from the cache are kept there (those asked for at least
                                    twice) and come back with one copy instead of a pack read. 0 = no tier. Larger than
                                    the memory the process may still take (MemAvailable, cgroup memory.max), or not
                                    pinnable: #EP_ERR_BUDGET naming the size. Results are bitwise the same with any size.
                                    Default: 0. */
  int32_t overlap_reads;       /**< 1 = a layer's routed experts are computed with the cached ones while its misses are
                                    still read, each missing expert as its read lands; 0 = every read completes first.
                                    Results are bitwise the same. Default: 1. */
  int32_t prefetch;            /**< 1 = each MoE layer predicts the next layer's experts (its router on this layer's
                                    input; exact for hash-routed layers) and reads the missing ones into spare I/O
                                    capacity, never evicting an expert of the current token; 0 = no prefetch. Results
                                    are bitwise the same. Default: 0. */
  const char *cache_policy;    /**< Eviction policy of the expert cache and the host tier: "decay" (a decaying
                                    frequency), "decay-bypass", "lru", "sglang-lfu" (SGLang's LFU with LRU tie-break);
                                    NULL = "decay". Default: NULL. */
  int32_t no_pack;             /**< 1 = no Expert Pack: the routed experts are read from the source files themselves
                                    (same reader, cache and host tier; bitwise the same results), through a small source
                                    index in @c pack_dir (`NAME-HASH.epx` and its manifest `NAME-HASH.epx.json`: the pack's
                                    header and index without its data, every expert's XXH3, the files' sizes and mtimes,
                                    built once by reading the experts, with @c progress). An index whose source changed
                                    (size, mtime, metadata or tensor inventory) is refused with #EP_ERR_STALE naming the
                                    file (remove the index to build it again); an expert whose bytes no longer match it
                                    fails with #EP_ERR_CORRUPT naming the file, layer, expert, role and offset. FP4
                                    experts with separate E8M0 scales (DeepSeek-V4's and Kimi-K3's releases) are read as
                                    values and scales and re-laid into MXFP4 as the pack builder does (no value changes).
                                    With an Expert Pack as @c path, or with @c resident_experts:
                                    #EP_ERR_INVALID_ARGUMENT. ep_model_pack_path() gives the index. 0 = the pack.
                                    Default: 0. */
  uint64_t kv_budget_bytes;    /**< Bytes the decode state of all the model's sessions may take together (forks and
                                    kept copies included): each session counts ep_model_state_bytes() at its length.
                                    An append, open or fork that would exceed it fails with #EP_ERR_BUDGET and changes
                                    nothing. 0 = automatic: on CUDA the free GPU memory once the weights and the expert
                                    cache are in, less 1 GiB for activations (a cache of every expert, cache_budget_bytes
                                    0, leaves it a quarter of the memory free after the dense weights, so the budget is at
                                    least that less 1 GiB; an explicit budget it leaves whole); on the CPU a quarter of the
                                    physical memory. Less than one
                                    session of one token: #EP_ERR_BUDGET at open. ep_model_info() gives the budget in
                                    effect. Default: 0. */
  const char *devices;         /**< Several devices of one kind, comma-separated (UTF-8): `"cuda:0,cuda:1"` (a GPU may be
                                    named twice), or `"cpu,cpu"` (CPU backends standing for devices, for tests). The dense
                                    weights and the attention run on the first device; each routed expert is owned by one
                                    device (a layer's experts spread evenly), whose own expert cache of
                                    @c cache_budget_bytes serves it (with @c resident_experts: whose memory holds it); the
                                    host tier is shared out equally. Each MoE layer's tokens go to the devices that own
                                    their picks and the results come back to the first: the logits are bitwise those of
                                    one device. NULL = the one device of @c device and @c device_index, which must keep
                                    their defaults when a list is given (#EP_ERR_INVALID_ARGUMENT naming both otherwise, or
                                    for an entry other than `cpu` or `cuda:N`, or two kinds). Default: NULL. */
} ep_model_options;

/**
 * @brief Fills @p options with the defaults.
 * @param options Struct to fill; NULL is ignored.
 */
EP_API void ep_model_options_init(ep_model_options *options);

/**
 * @brief Opens a model and loads its weights.
 * @param[out] out_model Receives the handle on success, NULL on failure.
 * @param path    A .gguf file (first shard of a set), a directory (or .safetensors file) with config.json beside it,
 *                or an Expert Pack (.epk) with its manifest (`PACK.json`, which names the source) (UTF-8).
 * @param options NULL for the defaults, or filled by ep_model_options_init().
 * @return #EP_OK; #EP_ERR_INVALID_ARGUMENT (NULL argument, bad option value); #EP_ERR_STRUCT_SIZE;
 *         #EP_ERR_NOT_FOUND (no such file, a pack without its manifest or source, no pack while
 *         pack_build is 0); #EP_ERR_STALE (the source changed since the pack was built, and the
 *         pack was given explicitly or pack_build is 0); #EP_ERR_BUDGET (cache budget below
 *         top_k experts); #EP_ERR_BUSY (another process is building the same pack); #EP_ERR_IO;
 *         #EP_ERR_FORMAT (malformed file, or missing / unmapped / unexpected tensors, all listed
 *         in ep_last_error(); a pack that does not fit the model); #EP_ERR_SHAPE (a tensor of the
 *         wrong shape); #EP_ERR_CORRUPT; #EP_ERR_UNSUPPORTED (an unknown architecture, named with
 *         the file; a dtype; #EP_DEVICE_CUDA for an architecture that runs only on the CPU);
 *         #EP_ERR_NO_DEVICE (#EP_DEVICE_CUDA without a GPU); #EP_ERR_CUDA; #EP_ERR_OUT_OF_MEMORY.
 */
EP_API ep_status ep_model_open(ep_model **out_model, const char *path, const ep_model_options *options);

/**
 * @brief Closes a model. Its sessions must be closed first.
 * @param model Handle from ep_model_open(); NULL is a no-op.
 */
EP_API void ep_model_close(ep_model *model);

/**
 * @brief The Expert Pack a model serves its routed experts from.
 * @param model Open model; NULL gives NULL.
 * @return The pack's absolute path (valid while the model is open; with
 *         ep_model_options::no_pack, the source index's), or NULL when the model holds its
 *         experts in memory (ep_model_options::resident_experts).
 */
EP_API const char *ep_model_pack_path(const ep_model *model);

/**
 * @brief Counters of the model's expert store (cache hits, misses, evictions, pack reads).
 * @param[out] out_stats Filled up to its struct_size (ep_store_stats_init()); all zeros when the
 *             model holds its experts in memory.
 * @param model Open model.
 * @return #EP_OK; #EP_ERR_INVALID_ARGUMENT (NULL argument); #EP_ERR_STRUCT_SIZE.
 */
EP_API ep_status ep_model_store_stats(ep_store_stats *out_stats, const ep_model *model);

/** What a model is, filled by ep_model_info(). */
typedef struct ep_model_properties {
  size_t struct_size;          /**< Set by the caller to `sizeof(ep_model_properties)` (or use ep_model_properties_init()). */
  char architecture[32];       /**< NUL-terminated architecture name ("deepseek4", "kimi-linear", "kimi-k3"). */
  uint32_t vocab_size;         /**< Logits per position. */
  uint32_t num_layers;         /**< Transformer blocks that run (MTP layers excluded). */
  uint32_t hidden_size;        /**< Model width. */
  uint32_t num_experts;        /**< Routed experts per MoE layer. */
  uint32_t experts_per_token;  /**< Routed experts used per token. */
  uint64_t weight_bytes;       /**< Bytes of weights held by the compute device. */
  ep_device_kind device;       /**< Where the model runs: #EP_DEVICE_CPU or #EP_DEVICE_CUDA (what #EP_DEVICE_AUTO chose). */
  int32_t device_index;        /**< The CUDA device's ordinal with #EP_DEVICE_CUDA; -1 on the CPU. */
  uint64_t context_length;     /**< Tokens one session may hold, as the model's file states it (an append past it
                                    fails with #EP_ERR_INVALID_ARGUMENT); 0 = the file states none. */
  uint64_t kv_budget_bytes;    /**< The KV budget in effect (ep_model_options::kv_budget_bytes, or what 0 resolved to). */
} ep_model_properties;

/**
 * @brief Fills @p properties with zeros and sets its struct_size.
 * @param properties Struct to fill; NULL is ignored.
 */
EP_API void ep_model_properties_init(ep_model_properties *properties);

/**
 * @brief Describes an open model.
 * @param[out] out_properties Filled up to its struct_size.
 * @param model Open model.
 * @return #EP_OK; #EP_ERR_INVALID_ARGUMENT (NULL argument); #EP_ERR_STRUCT_SIZE.
 */
EP_API ep_status ep_model_info(ep_model_properties *out_properties, const ep_model *model);

/**
 * @brief The bytes one session holding @p tokens tokens counts against the model's KV budget:
 *        its decode state at that length (DeepSeek-V4: the K=V window, the compressors' and the
 *        indexer's entries; Kimi: the MLA layers' f32 keys and values, the KDA layers' recurrent
 *        state) and its last row of logits. The state never holds more, whatever appends made it.
 * @param[out] out_bytes The bytes.
 * @param model  Open model.
 * @param tokens Tokens the session holds (0: an empty session).
 * @return #EP_OK; #EP_ERR_INVALID_ARGUMENT (NULL argument, @p tokens above 2^40).
 */
EP_API ep_status ep_model_state_bytes(uint64_t *out_bytes, const ep_model *model, uint64_t tokens);

/**
 * @brief The bytes the model's open sessions (forks and kept copies included) count against
 *        its KV budget now: the sum of ep_model_state_bytes() at each one's length.
 * @param[out] out_bytes The bytes.
 * @param model Open model.
 * @return #EP_OK; #EP_ERR_INVALID_ARGUMENT (NULL argument).
 */
EP_API ep_status ep_model_kv_in_use(uint64_t *out_bytes, const ep_model *model);

/**
 * @brief Starts an empty sequence on a model.
 * @param[out] out_session Receives the handle on success, NULL on failure.
 * @param model Open model; it must outlive the session.
 * @return #EP_OK; #EP_ERR_INVALID_ARGUMENT (NULL argument); #EP_ERR_BUDGET (the KV budget has no
 *         room for an empty session's state); #EP_ERR_OUT_OF_MEMORY.
 */
EP_API ep_status ep_session_open(ep_session **out_session, ep_model *model);

/**
 * @brief Closes a session.
 * @param session Handle from ep_session_open(); NULL is a no-op.
 */
EP_API void ep_session_close(ep_session *session);

/**
 * @brief Empties a session (position 0 again).
 * @param session Open session.
 * @return #EP_OK; #EP_ERR_INVALID_ARGUMENT (NULL argument).
 */
EP_API ep_status ep_session_reset(ep_session *session);

/**
 * @brief Tokens the session holds (its next position).
 * @param[out] out_length Number of tokens appended so far.
 * @param session Open session.
 * @return #EP_OK; #EP_ERR_INVALID_ARGUMENT (NULL argument).
 */
EP_API ep_status ep_session_length(uint64_t *out_length, const ep_session *session);

/**
 * @brief Called with each generated token. Return 0 to continue, non-zero to stop
 *        (ep_generate() then returns #EP_ERR_CANCELLED; the token is already in the session).
 */
typedef int (*ep_token_fn)(int32_t token, uint32_t index, void *payload);

/** One entry of ep_generate_options::logit_bias: @c bias is added to the logit of @c token. */
typedef struct ep_logit_bias {
  int32_t token; /**< A token id of the model's vocabulary. */
  float bias;    /**< -100 .. 100 (OpenAI's range): +100 in effect forces the token, -100 forbids it. */
} ep_logit_bias;

struct ep_grammar_state; /* grammar.h */

/** Options of ep_generate(); fill with ep_generate_options_init(). */
typedef struct ep_generate_options {
  size_t struct_size;       /**< Must be `sizeof(ep_generate_options)`; set by the init function. */
  uint32_t max_new_tokens;  /**< Tokens to generate at most. Default: 16. */
  float temperature;        /**< <= 0: greedy (first maximum). Default: 0. */
  int32_t top_k;            /**< Keep the k most likely tokens (0 = all). Default: 0. */
  float top_p;              /**< Nucleus probability (1 = all). Default: 1. */
  uint64_t seed;            /**< Seed of the sampler (deterministic per seed). Default: 0. */
  int32_t stop_token;       /**< Stop after emitting this token; -1 = never. Default: -1. */
  /* Appended after the first version: */
  float min_p;              /**< Drop tokens whose probability is below min_p × the most likely one's (after top_k/top_p); 0 = off. Default: 0. */
  float repetition_penalty; /**< Divide positive logits (multiply negative ones) of tokens seen in the last
                                 repetition_window tokens of the session by this (> 0); 1 = off. Default: 1. */
  uint32_t repetition_window; /**< Tokens of the session (prompt and generated) the penalty looks back over; 0 = all. Default: 64. */
  const int32_t *stop_tokens; /**< NULL, or n_stop_tokens more token ids to stop after (the stop token is emitted). Default: NULL. */
  size_t n_stop_tokens;     /**< Entries of stop_tokens. Default: 0. */
  const char *const *stop_strings; /**< NULL, or n_stop_strings UTF-8 strings that end text generation (ep_generate_text(),
                                        ep_generate_chat(); ep_generate() refuses them). Default: NULL. */
  size_t n_stop_strings;    /**< Entries of stop_strings. Default: 0. */
  int32_t ignore_eos;       /**< Text generation: 1 = do not stop at the tokenizer's EOS / end-of-turn tokens. Default: 0. */
  const ep_logit_bias *logit_bias; /**< NULL, or n_logit_bias entries, each added to its token's logit before sampling (after the
                                        repetition penalty, before the temperature and the top_k / top_p / min_p cuts; greedy
                                        decoding sees it too). Tokens distinct and inside the vocabulary, biases in -100 .. 100,
                                        else #EP_ERR_INVALID_ARGUMENT naming the token. Default: NULL. */
  size_t n_logit_bias;      /**< Entries of logit_bias. Default: 0. */
  /* Appended in 0.5: */
  struct ep_grammar_state *grammar; /**< NULL, or constrained sampling (grammar.h): every draw is from the tokens the grammar
                                         state allows (the others' logits are −∞ after the logit bias, so greedy and seeded
                                         draws pick from exactly the masked distribution), and the drawn token advances the
                                         state. Not owned; one state per generated sequence. Default: NULL. */
} ep_generate_options;

/**
 * @brief Fills @p options with the defaults.
 * @param options Struct to fill; NULL is ignored.
 */
EP_API void ep_generate_options_init(ep_generate_options *options);

/** Why a generation call stopped. Pinned to 32 bits. */
typedef enum ep_stop_reason {
  EP_STOP_LENGTH = 0,    /**< max_new_tokens were generated. */
  EP_STOP_TOKEN = 1,     /**< A stop token (or, for text generation, EOS / end of turn) was generated. */
  EP_STOP_STRING = 2,    /**< A stop string appeared in the generated text. */
  EP_STOP_CANCELLED = 3, /**< The callback asked to stop. */
  EP_STOP_REASON_FORCE_32BIT = 0x7fffffff /**< Not a reason: pins the enum to 32 bits. */
} ep_stop_reason;

/** Statistics of one ep_generate() call, filled up to its struct_size. */
typedef struct ep_generate_stats {
  size_t struct_size;          /**< Set by the caller to `sizeof(ep_generate_stats)` (or use ep_generate_stats_init()). */
  uint32_t prompt_tokens;      /**< Prompt tokens processed. */
  uint32_t generated_tokens;   /**< Tokens generated (including a stop token, and the token the callback stopped at). */
  double prefill_seconds;      /**< Wall time of the prompt pass. */
  double decode_seconds;       /**< Wall time of the generation steps. */
  /* Appended after the first version: */
  ep_stop_reason stop_reason;  /**< Why generation stopped. */
  uint32_t reused_tokens;      /**< ep_generate_chat(): prompt tokens already in the session (not processed again). */
  double prefill_tokens_per_second; /**< prompt_tokens / prefill_seconds (0 when nothing was processed). */
  double decode_tokens_per_second;  /**< generated_tokens / decode_seconds (0 when nothing was generated). */
  uint64_t session_tokens;     /**< Tokens the session holds afterwards. */
  uint64_t prefill_expert_bytes; /**< Routed-expert bytes read from the Expert Pack during the prompt pass (0 with resident
                                      experts). Reads by other sessions of the model in the same interval count too. */
  uint64_t decode_expert_bytes;  /**< The same during the generation steps: each generated token's forward pass. */
  /* Appended in 0.6 (ep_store_stats' times over the generation steps; 0 with resident experts;
     other sessions' work in the same interval counts too): */
  double decode_read_busy_seconds;    /**< Wall time with at least one expert read in flight (the disk busy). */
  double decode_read_full_seconds;    /**< Wall time with the read queue full (ep_store_stats::pack_read_full_depth). */
  double decode_expert_wait_seconds;  /**< Wall time the model's thread was blocked waiting for expert reads. */
  double decode_store_idle_seconds;   /**< Wall time the expert store's own work ran with no read in flight. */
} ep_generate_stats;

/**
 * @brief Fills @p stats with zeros and sets its struct_size.
 * @param stats Struct to fill; NULL is ignored.
 */
EP_API void ep_generate_stats_init(ep_generate_stats *stats);

/**
 * @brief Appends @p prompt to the session and generates up to max_new_tokens tokens after it.
 * @param[out] out_stats NULL, or statistics filled up to its struct_size.
 * @param session  Open session.
 * @param prompt   Token ids (may be NULL when @p n_prompt is 0 and the session is not empty).
 * @param n_prompt Number of prompt tokens.
 * @param options  NULL for the defaults, or filled by ep_generate_options_init().
 * @param callback NULL, or called with every generated token (it may stop the generation).
 * @param payload  Passed to @p callback unchanged.
 * Stops after max_new_tokens, or after emitting stop_token or one of stop_tokens.
 * @return #EP_OK; #EP_ERR_CANCELLED (the callback stopped it); #EP_ERR_INVALID_ARGUMENT (NULL
 *         argument, empty sequence, token id outside the vocabulary, stop_strings given, bad
 *         sampling value, an append past the model's context length); #EP_ERR_BUDGET (an append
 *         past the KV budget); #EP_ERR_STRUCT_SIZE. A refused append leaves the session with the
 *         tokens it had before it.
 */
EP_API ep_status ep_generate(ep_generate_stats *out_stats, ep_session *session, const int32_t *prompt, size_t n_prompt,
                             const ep_generate_options *options, ep_token_fn callback, void *payload);

/**
 * @brief Teacher-forced scoring: appends @p tokens to the session and returns, for each of them,
 *        the logits that predict the next token.
 * @param session  Open session (usually empty: then row i predicts token i+1 of @p tokens).
 * @param tokens   Token ids.
 * @param n_tokens Number of tokens (>= 1).
 * @param top_k    0: full logits; otherwise the k largest logits per position, descending.
 * @param[out] out_ids    With top_k > 0: n_tokens × top_k token ids (row-major); ignored (may be NULL) when top_k is 0.
 * @param[out] out_logits With top_k > 0: n_tokens × top_k logits; with top_k 0: n_tokens × vocab_size logits.
 * @return #EP_OK; #EP_ERR_INVALID_ARGUMENT (NULL argument, n_tokens 0, top_k > vocab_size,
 *         token id outside the vocabulary, past the model's context length); #EP_ERR_BUDGET (past
 *         the KV budget). A refused call leaves the session as it was.
 */
EP_API ep_status ep_score(ep_session *session, const int32_t *tokens, size_t n_tokens, uint32_t top_k, int32_t *out_ids,
                          float *out_logits);

/** @} */

/** @defgroup step Stepping several sessions together
 *
 * What a serving host needs for continuous batching: ep_sessions_append() runs the new tokens of
 * several sessions of one model in one forward pass (the routed experts of all of them are read
 * once per step: one acquire per MoE layer for the union of their picks), and
 * ep_session_sample() draws each session's next token from its own last logits, which stay on
 * the model's device (ep_sessions_sample() draws every session's at once: one sampling launch
 * and one download per step). A session's logits do not depend on what it was batched with (the same
 * bits as appending its tokens alone, on the CPU; within the CUDA tolerance on CUDA).
 *  @{ */

/**
 * @brief Appends tokens to several sessions of one model in one forward pass.
 * @param sessions   @p n_sessions distinct open sessions of the same model.
 * @param tokens     Per session, its new token ids (a prefill chunk or one decode token).
 * @param n_tokens   Per session, how many (>= 1).
 * @param n_sessions Number of sessions (>= 1).
 * @return #EP_OK; #EP_ERR_INVALID_ARGUMENT (NULL argument, zero counts, a session twice or of
 *         another model, token id outside the vocabulary, a session taken past the model's
 *         context length: the message names the limit and the lengths); #EP_ERR_BUDGET (the
 *         sessions' state would outgrow the KV budget: the message names the budget, what the
 *         call needs and what is in use). These leave every session as it was; after any other
 *         error every session of the call must be reset.
 */
EP_API ep_status ep_sessions_append(ep_session *const *sessions, const int32_t *const *tokens, const size_t *n_tokens,
                                    size_t n_sessions);

/**
 * @brief Draws the next token of a session from the logits after its last token (on the
 *        model's device; only the token id comes back), with ep_generate()'s sampling settings.
 * The token is not appended: pass it to ep_sessions_append() (or ep_generate()) next. The
 * sampler's draw counter of the session advances (not after a refusal), so a seeded sequence of
 * draws repeats.
 * @param[out] out_token The token.
 * @param session Open session holding at least one token.
 * @param options NULL for the defaults (greedy), or filled by ep_generate_options_init(); its
 *        temperature, top_k, top_p, min_p, seed, repetition_penalty, repetition_window and
 *        logit_bias apply.
 * @return #EP_OK; #EP_ERR_INVALID_ARGUMENT (NULL argument, an empty session, a bad sampling
 *         value or logit_bias entry, naming the token); #EP_ERR_STRUCT_SIZE.
 */
EP_API ep_status ep_session_sample(int32_t *out_token, ep_session *session, const ep_generate_options *options);

/** The most alternatives ep_session_sample_logprobs() reports per token (OpenAI's top_logprobs limit). */
#define EP_MAX_TOP_LOGPROBS 20

/**
 * A sampled token with its log-probability and the most likely alternatives, filled by
 * ep_session_sample_logprobs(). The log-probabilities are the model's own distribution: the
 * natural-log softmax of the raw logits, before the repetition penalty, the logit bias, the
 * temperature and the top_k / top_p / min_p cuts (vLLM's default), so they do not depend on the
 * sampling settings: log p(t) = z[t] − log Σ exp(z), the sum in double precision.
 */
typedef struct ep_token_logprobs {
  size_t struct_size;      /**< Set by the caller to `sizeof(ep_token_logprobs)` (or use ep_token_logprobs_init()). */
  int32_t token;           /**< The sampled token. */
  float logprob;           /**< Its log-probability (<= 0). */
  uint32_t n_top;          /**< Entries of top_tokens / top_logprobs: the count asked for (at most the vocabulary). */
  int32_t top_tokens[EP_MAX_TOP_LOGPROBS]; /**< The n_top most likely tokens, most likely first (ties: lower id first). */
  float top_logprobs[EP_MAX_TOP_LOGPROBS]; /**< Their log-probabilities, descending. */
} ep_token_logprobs;

/**
 * @brief Fills @p logprobs with zeros and sets its struct_size.
 * @param logprobs Struct to fill; NULL is ignored.
 */
EP_API void ep_token_logprobs_init(ep_token_logprobs *logprobs);

/**
 * @brief ep_session_sample(), and the log-probabilities of the distribution it drew from: the
 *        sampled token's and those of the @p top_logprobs most likely tokens (ep_token_logprobs
 *        says which distribution). The same token as ep_session_sample() with the same options
 *        and draw counter; the counter advances the same way.
 * @param[out] out_logprobs Filled (struct_size must be `sizeof(ep_token_logprobs)`).
 * @param session Open session holding at least one token.
 * @param options NULL for the defaults (greedy), or filled by ep_generate_options_init().
 * @param top_logprobs Alternatives wanted, 0 .. #EP_MAX_TOP_LOGPROBS.
 * @return #EP_OK; #EP_ERR_INVALID_ARGUMENT (NULL argument, an empty session, a bad sampling
 *         value, @p top_logprobs above #EP_MAX_TOP_LOGPROBS); #EP_ERR_STRUCT_SIZE.
 */
EP_API ep_status ep_session_sample_logprobs(ep_token_logprobs *out_logprobs, ep_session *session,
                                            const ep_generate_options *options, uint32_t top_logprobs);

/**
 * @brief Draws the next token of several sessions of one model at once: what
 *        ep_session_sample() (or ep_session_sample_logprobs()) gives for each session with its
 *        own options, in one sampling launch and one download for all of them (a serving host's
 *        decode step: one synchronisation instead of one per session).
 * Each session's token, log-probabilities and draw counter's advance are exactly those of one
 * ep_session_sample() / ep_session_sample_logprobs() call per session with the same options
 * (each grammar state, too, advances by its session's token). The tokens are not appended: pass
 * them to ep_sessions_append() next.
 * @param[out] out_tokens   @p n_sessions entries: sessions[i]'s token.
 * @param[out] out_logprobs NULL (no log-probabilities), or @p n_sessions pointers, each NULL (none
 *        for that session) or a struct filled as ep_session_sample_logprobs() fills it
 *        (struct_size must be `sizeof(ep_token_logprobs)`).
 * @param sessions     @p n_sessions distinct open sessions of the same model, each holding at
 *        least one token.
 * @param options      NULL (every session greedy with the defaults), or @p n_sessions pointers,
 *        each NULL (the defaults) or filled by ep_generate_options_init(): the fields
 *        ep_session_sample() reads. Two sessions may not share one grammar state.
 * @param top_logprobs NULL (0 alternatives for every session), or @p n_sessions counts
 *        0 .. #EP_MAX_TOP_LOGPROBS; a non-zero count needs the session's out_logprobs entry.
 * @param n_sessions   Number of sessions (>= 1).
 * @return #EP_OK; #EP_ERR_INVALID_ARGUMENT (a NULL array or session, zero sessions, a session
 *         twice, of another model or with no tokens, a bad sampling value, logit_bias entry or
 *         top_logprobs count, a grammar state given twice: the message names the session's
 *         index); #EP_ERR_STRUCT_SIZE (naming the index). A refused call changes no session's
 *         draw counter and no grammar state.
 */
EP_API ep_status ep_sessions_sample(int32_t *out_tokens, ep_token_logprobs *const *out_logprobs, ep_session *const *sessions,
                                    const ep_generate_options *const *options, const uint32_t *top_logprobs,
                                    size_t n_sessions);

/**
 * @brief Opens a copy of a session: the same tokens, decode state (copied on the model's
 *        device), last logits and sampler position. Appending to either leaves the other as it
 *        is: a host keeps a conversation's state after its prompt and continues from it later
 *        without running the prompt again.
 * @param[out] out_session The copy; the caller owns it (ep_session_close()).
 * @param session Open session.
 * @return #EP_OK; #EP_ERR_INVALID_ARGUMENT (NULL argument); #EP_ERR_BUDGET (the copy does not fit
 *         the KV budget); #EP_ERR_OUT_OF_MEMORY.
 */
EP_API ep_status ep_session_fork(ep_session **out_session, const ep_session *session);

/**
 * @brief The token ids a session holds, in order.
 * @param[out] out_tokens NULL, or room for @p capacity ids.
 * @param capacity  Entries of @p out_tokens.
 * @param[out] out_count The session's token count (also when it exceeds @p capacity: then
 *        nothing is copied).
 * @param session Open session.
 * @return #EP_OK; #EP_ERR_INVALID_ARGUMENT (NULL session or out_count, out_tokens NULL with a
 *         capacity).
 */
EP_API ep_status ep_session_tokens(int32_t *out_tokens, size_t capacity, size_t *out_count, const ep_session *session);

/**
 * @brief The bytes of the model's device memory a session holds: its decode state as allocated
 *        (KV, compressor and linear-attention state, with the room buffers that grow keep
 *        ahead), its last logits, and the chat snapshot ep_generate_chat() keeps in it. A fork
 *        (ep_session_fork()) holds as many. What a host that keeps sessions counts against its
 *        memory budget. Never more than the model's KV budget counts for it
 *        (ep_model_state_bytes() at its length, and its snapshot's).
 * @param[out] out_bytes The byte count.
 * @param session Open session.
 * @return #EP_OK; #EP_ERR_INVALID_ARGUMENT (NULL argument).
 */
EP_API ep_status ep_session_state_bytes(uint64_t *out_bytes, const ep_session *session);

/**
 * @brief Sets a session's sampler draw counter: the next ep_session_sample() makes draw
 *        @p draw_count of its seed's sequence. A fresh session starts at 0 and each
 *        ep_session_sample() (or generated token) advances it; ep_session_fork() copies it. A host
 *        that continues a kept session for a new request sets 0, so a seeded request draws as
 *        it would on a fresh session.
 * @param session Open session.
 * @param draw_count The counter's new value.
 * @return #EP_OK; #EP_ERR_INVALID_ARGUMENT (NULL argument).
 */
EP_API ep_status ep_session_set_draw_count(ep_session *session, uint64_t draw_count);

/** @} */

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* EXPERTPACK_MODEL_H */
