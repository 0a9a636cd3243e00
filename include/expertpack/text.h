/**
 * @file text.h
 * @brief Text: tokenizers, chat templates, and generation from text prompts and chat messages.
 *
 * A tokenizer is opened from a file (a GGUF file's `tokenizer.ggml.*` metadata, a HF
 * `tokenizer.json`, or a tiktoken rank file) or from an open model (its GGUF metadata, or the
 * `tokenizer.json` beside a safetensors checkpoint). It turns UTF-8 text into token ids exactly
 * as HF `tokenizers` does, and ids back into text.
 *
 * Chat templates are rendered in C (no template engine), identically to transformers'
 * `apply_chat_template` with llama.cpp's template texts: DeepSeek-V4 (BOS, `<｜User｜>` /
 * `<｜Assistant｜>` markers, thinking on or off) and Kimi-K3 (`<|open|>message ...<|sep|>` tags,
 * thinking on by default).
 *
 * Generation from text streams UTF-8 pieces: every piece handed to the callback is complete
 * UTF-8 (bytes of a character split across tokens are held back until it is complete), and
 * text that may be the start of a stop string is held back until it is known not to be one.
 *
 * Buffers: the functions that fill a caller's buffer (ep_tokenize(), ep_detokenize(),
 * ep_chat_render()) always set the needed size; when the buffer is too small they write
 * nothing (text functions write an empty string when capacity > 0) and still return #EP_OK:
 * call again with a buffer of the reported size (a first call with capacity 0 just measures).
 *
 * Thread safety: a tokenizer is immutable; any number of threads may use one at once.
 */
#ifndef EXPERTPACK_TEXT_H
#define EXPERTPACK_TEXT_H

#include "expertpack/expertpack.h"
#include "expertpack/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/** @defgroup text Tokenizers, chat templates and text generation
 *  @{ */

/** An open tokenizer (opaque). Free it with ep_tokenizer_close(). */
typedef struct ep_tokenizer ep_tokenizer;

/** Chat template families. Pinned to 32 bits. */
typedef enum ep_chat_template {
  EP_CHAT_TEMPLATE_AUTO = 0,        /**< The tokenizer's own: from its GGUF `tokenizer.chat_template`, else from its special tokens. */
  EP_CHAT_TEMPLATE_DEEPSEEK_V4 = 1, /**< DeepSeek-V4 (llama.cpp `deepseek-ai-DeepSeek-V4.jinja`). Thinking off by default. */
  EP_CHAT_TEMPLATE_KIMI_K3 = 2,     /**< Kimi-K3 (llama.cpp `Kimi-K3.jinja`). Thinking on (effort `max`) by default. */
  EP_CHAT_TEMPLATE_NONE = 3,        /**< No template is known (ep_tokenizer_info() only; rendering with it fails). */
  EP_CHAT_TEMPLATE_FORCE_32BIT = 0x7fffffff /**< Not a template: pins the enum to 32 bits. */
} ep_chat_template;

/** Flags of ep_tokenize(). */
typedef enum ep_tokenize_flags {
  EP_TOKENIZE_ADD_SPECIAL = 1,   /**< Add BOS/EOS as the tokenizer's configuration says (HF add_special_tokens=True). */
  EP_TOKENIZE_SPECIAL_AS_TEXT = 2 /**< Do not match special tokens in the text: tokenize them as plain text. */
} ep_tokenize_flags;

/** Flags of ep_detokenize(). */
typedef enum ep_detokenize_flags {
  EP_DETOKENIZE_SKIP_SPECIAL = 1 /**< Leave special (control) tokens out of the text. */
} ep_detokenize_flags;

/**
 * @brief Opens a tokenizer file.
 * @param[out] out_tokenizer Receives the handle on success, NULL on failure.
 * @param path A .gguf file (its `tokenizer.ggml.*` keys), a HF `tokenizer.json` (a
 *             `tokenizer_config.json` beside it supplies BOS/EOS handling), a tiktoken rank
 *             file, or a directory holding `tokenizer.json` (UTF-8).
 * @return #EP_OK; #EP_ERR_INVALID_ARGUMENT (NULL argument); #EP_ERR_NOT_FOUND; #EP_ERR_IO;
 *         #EP_ERR_FORMAT; #EP_ERR_UNSUPPORTED (a tokenizer model other than byte-level BPE).
 */
EP_API ep_status ep_tokenizer_open(ep_tokenizer **out_tokenizer, const char *path);

/**
 * @brief Opens the tokenizer of an open model: the GGUF source's metadata, or the
 *        `tokenizer.json` beside a safetensors checkpoint (for a pack: its source's).
 * @param[out] out_tokenizer Receives the handle on success, NULL on failure. It is independent
 *             of the model and may outlive it.
 * @param model Open model.
 * @return #EP_OK; #EP_ERR_INVALID_ARGUMENT (NULL argument); #EP_ERR_NOT_FOUND (the source has
 *         no tokenizer); the errors of ep_tokenizer_open().
 */
EP_API ep_status ep_tokenizer_open_model(ep_tokenizer **out_tokenizer, const ep_model *model);

/**
 * @brief Closes a tokenizer.
 * @param tokenizer Handle from ep_tokenizer_open() or ep_tokenizer_open_model(); NULL is a no-op.
 */
EP_API void ep_tokenizer_close(ep_tokenizer *tokenizer);

/** What a tokenizer is, filled by ep_tokenizer_info(). */
typedef struct ep_tokenizer_properties {
  size_t struct_size;            /**< Set by the caller to `sizeof(ep_tokenizer_properties)` (or use ep_tokenizer_properties_init()). */
  uint32_t vocab_size;           /**< One more than the largest token id. */
  int32_t bos_id;                /**< Beginning-of-sequence token, or -1. */
  int32_t eos_id;                /**< End-of-sequence token, or -1. */
  int32_t end_of_turn_id;        /**< The token that ends an assistant turn in the chat template (DeepSeek: EOS; Kimi: `<|end_of_msg|>`), or -1. */
  ep_chat_template chat_template; /**< What #EP_CHAT_TEMPLATE_AUTO resolves to (#EP_CHAT_TEMPLATE_NONE when unknown). */
} ep_tokenizer_properties;

/**
 * @brief Fills @p properties with zeros and sets its struct_size.
 * @param properties Struct to fill; NULL is ignored.
 */
EP_API void ep_tokenizer_properties_init(ep_tokenizer_properties *properties);

/**
 * @brief Describes a tokenizer.
 * @param[out] out_properties Filled up to its struct_size.
 * @param tokenizer Open tokenizer.
 * @return #EP_OK; #EP_ERR_INVALID_ARGUMENT (NULL argument); #EP_ERR_STRUCT_SIZE.
 */
EP_API ep_status ep_tokenizer_info(ep_tokenizer_properties *out_properties, const ep_tokenizer *tokenizer);

/**
 * @brief The id of one token given by its text (for example `"<｜end▁of▁sentence｜>"`).
 * @param[out] out_id The id.
 * @param tokenizer Open tokenizer.
 * @param token The token's content (UTF-8, NUL-terminated): an added/special token's content,
 *              or a vocabulary entry's text.
 * @return #EP_OK; #EP_ERR_INVALID_ARGUMENT (NULL argument); #EP_ERR_NOT_FOUND (no such token).
 */
EP_API ep_status ep_tokenizer_token_id(int32_t *out_id, const ep_tokenizer *tokenizer, const char *token);

/**
 * @brief Token ids of a UTF-8 text.
 * @param[out] out_ids   Buffer of @p capacity ids (may be NULL when capacity is 0).
 * @param capacity       Ids the buffer holds.
 * @param[out] out_count The number of ids of the text (also when it exceeds @p capacity:
 *                       then nothing was written).
 * @param tokenizer      Open tokenizer.
 * @param text           UTF-8 text (need not be NUL-terminated; may be NULL when @p length is 0).
 * @param length         Bytes of @p text.
 * @param flags          Bitwise OR of ::ep_tokenize_flags (0: no BOS/EOS added, special tokens matched).
 * @return #EP_OK; #EP_ERR_INVALID_ARGUMENT (NULL argument, text that is not valid UTF-8, unknown flag).
 */
EP_API ep_status ep_tokenize(int32_t *out_ids, size_t capacity, size_t *out_count, const ep_tokenizer *tokenizer,
                             const char *text, size_t length, uint32_t flags);

/**
 * @brief Text of token ids (invalid UTF-8 becomes U+FFFD, as HF does).
 * @param[out] out_text   Buffer of @p capacity bytes, NUL-terminated on return (may be NULL when capacity is 0).
 * @param capacity        Bytes the buffer holds (the text needs *out_length + 1).
 * @param[out] out_length The text's length in bytes, without the NUL.
 * @param tokenizer       Open tokenizer.
 * @param ids             Token ids (ids outside the vocabulary are skipped).
 * @param n_ids           Number of ids.
 * @param flags           Bitwise OR of ::ep_detokenize_flags.
 * @return #EP_OK; #EP_ERR_INVALID_ARGUMENT (NULL argument, unknown flag).
 */
EP_API ep_status ep_detokenize(char *out_text, size_t capacity, size_t *out_length, const ep_tokenizer *tokenizer,
                               const int32_t *ids, size_t n_ids, uint32_t flags);

/** One chat message. All strings are UTF-8 and NUL-terminated. A message's tool fields
 *  (an assistant's tool calls, a tool message's tool_call_id and name) are in
 *  ep_chat_options::message_tools_json. */
typedef struct ep_chat_message {
  const char *role;              /**< "system", "user", "assistant", "tool" (DeepSeek-V4 also: "developer"). */
  const char *content;           /**< The text; NULL = empty. */
  const char *reasoning_content; /**< Assistant messages: the thinking text shown when thinking is on; NULL = none. */
} ep_chat_message;

/** Options of chat rendering; fill with ep_chat_options_init(). Fields are only appended. */
typedef struct ep_chat_options {
  size_t struct_size;              /**< Must be `sizeof(ep_chat_options)`; set by the init function. */
  ep_chat_template chat_template;  /**< Default: #EP_CHAT_TEMPLATE_AUTO. */
  int32_t thinking;                /**< 1 = thinking on, 0 = off, -1 = the template's default. Default: -1. */
  int32_t add_generation_prompt;   /**< 1 = end with the assistant's opening (and the thinking opener). Default: 1. */
  /** The tools offered, rendered in the template's own tool format: OpenAI's `tools` array as
   *  JSON text (`[{"type": "function", "function": {"name", "description", "parameters"}}]`).
   *  Default: NULL (none). */
  const char *tools_json;
  /** NULL, or one entry per message (as many as the messages passed): NULL, or a JSON object
   *  text with the message's tool fields as OpenAI's chat API spells them: an assistant's
   *  `tool_calls` (`[{"id", "type": "function", "function": {"name", "arguments"}}]`, the
   *  arguments a JSON object's text or an object), a tool message's `tool_call_id`, and `name`.
   *  Default: NULL. */
  const char *const *message_tools_json;
  /** OpenAI's tool_choice as the template sees it: NULL, "auto", "none" or "required" (Kimi-K3
   *  renders a note for "none" and "required"). Default: NULL (not passed). */
  const char *tool_choice;
} ep_chat_options;

/**
 * @brief Fills @p options with the defaults.
 * @param options Struct to fill; NULL is ignored.
 */
EP_API void ep_chat_options_init(ep_chat_options *options);

/**
 * @brief Text that, appended to a generation prompt ep_chat_render() made with @p options,
 *        starts the assistant's turn with a tool call in the template's own format (the
 *        call-section opener, and the call's opening with @p name when it is not NULL or
 *        empty; with thinking on, an empty thinking block first). This is how a host forces a
 *        call (OpenAI's tool_choice "required" or a named function) without a grammar: the
 *        arguments the model then writes are not constrained by the function's schema.
 * @param[out] out_text   Buffer of @p capacity bytes, NUL-terminated on return (may be NULL when capacity is 0).
 * @param capacity        Bytes the buffer holds (the text needs *out_length + 1).
 * @param[out] out_length The text's length in bytes, without the NUL.
 * @param tokenizer       Open tokenizer (the #EP_CHAT_TEMPLATE_AUTO choice).
 * @param name            The function to call, or NULL / "" for any.
 * @param options         NULL for the defaults, or filled by ep_chat_options_init() (its template and thinking are used).
 * @return #EP_OK; #EP_ERR_INVALID_ARGUMENT (NULL argument, @p name not valid UTF-8); #EP_ERR_STRUCT_SIZE;
 *         #EP_ERR_UNSUPPORTED (no template known for the tokenizer).
 */
EP_API ep_status ep_chat_tool_call_prefix(char *out_text, size_t capacity, size_t *out_length, const ep_tokenizer *tokenizer,
                                          const char *name, const ep_chat_options *options);

/**
 * @brief Renders a conversation with a chat template, exactly as transformers' apply_chat_template
 *        renders llama.cpp's template text, tool declarations, calls and results included
 *        (images are not supported).
 * @param[out] out_text   Buffer of @p capacity bytes, NUL-terminated on return (may be NULL when capacity is 0).
 * @param capacity        Bytes the buffer holds (the text needs *out_length + 1).
 * @param[out] out_length The rendered text's length in bytes, without the NUL.
 * @param tokenizer       Open tokenizer (supplies the BOS text and the #EP_CHAT_TEMPLATE_AUTO choice).
 * @param messages        The conversation (may be NULL when @p n_messages is 0).
 * @param n_messages      Number of messages.
 * @param options         NULL for the defaults, or filled by ep_chat_options_init().
 * @return #EP_OK; #EP_ERR_INVALID_ARGUMENT (NULL argument, unknown role, text that is not valid
 *         UTF-8, tools or tool fields that are not the JSON described in ::ep_chat_options, a
 *         tool message Kimi-K3 cannot name); #EP_ERR_STRUCT_SIZE; #EP_ERR_UNSUPPORTED (no
 *         template known for the tokenizer).
 */
EP_API ep_status ep_chat_render(char *out_text, size_t capacity, size_t *out_length, const ep_tokenizer *tokenizer,
                                const ep_chat_message *messages, size_t n_messages, const ep_chat_options *options);

/**
 * @brief Called with each piece of generated text. Return 0 to continue, non-zero to stop
 *        (the generation then returns #EP_ERR_CANCELLED).
 * @param piece   Complete UTF-8 (not NUL-terminated), never empty.
 * @param length  Bytes of @p piece.
 * @param payload The payload given to the generation call.
 */
typedef int (*ep_text_fn)(const char *piece, size_t length, void *payload);

/**
 * @brief Appends a text prompt to the session and generates text after it.
 *
 * The prompt is tokenized with special tokens matched; on an empty session BOS is added first
 * when the tokenizer adds one (HF add_special_tokens=True). Generation stops at max_new_tokens,
 * a stop token (ep_generate_options::stop_token, ep_generate_options::stop_tokens, and the
 * tokenizer's EOS and end-of-turn tokens unless ep_generate_options::ignore_eos), or a stop
 * string (ep_generate_options::stop_strings;
 * the stop string and anything after it are not passed to @p callback). Special tokens are not
 * passed to @p callback as text.
 * @param[out] out_stats NULL, or statistics filled up to its struct_size.
 * @param session   Open session of a model whose vocabulary the tokenizer's ids fit.
 * @param tokenizer Open tokenizer.
 * @param prompt    UTF-8, NUL-terminated (may be empty when the session is not).
 * @param options   NULL for the defaults, or filled by ep_generate_options_init().
 * @param callback  NULL, or called with every piece of text (it may stop the generation).
 * @param payload   Passed to @p callback unchanged.
 * @return #EP_OK; #EP_ERR_CANCELLED; #EP_ERR_INVALID_ARGUMENT (NULL argument, invalid UTF-8, a
 *         token id outside the model's vocabulary, bad option value, an append past the model's
 *         context length); #EP_ERR_BUDGET (an append past the KV budget); #EP_ERR_STRUCT_SIZE.
 */
EP_API ep_status ep_generate_text(ep_generate_stats *out_stats, ep_session *session, const ep_tokenizer *tokenizer,
                                  const char *prompt, const ep_generate_options *options, ep_text_fn callback,
                                  void *payload);

/**
 * @brief Renders the whole conversation (with the generation prompt) and generates the
 *        assistant's answer as text.
 *
 * Multi-turn use: keep the messages, append the answer as an "assistant" message and the next
 * "user" message, and call again on the same session. The session's tokens are reused when
 * they are a prefix of the new rendering (ep_generate_stats::reused_tokens). Where the template
 * renders an answered turn differently from the generation prompt (DeepSeek-V4 drops its
 * thinking markers), the session keeps a copy of its state at the point where the next turn's
 * rendering will part from this one (a second copy of the session's state, in the model's
 * memory), and the next turn continues from that copy. Otherwise (another conversation) the
 * session is reset and the whole conversation is processed. Stops as ep_generate_text() does.
 * @param[out] out_stats NULL, or statistics filled up to its struct_size.
 * @param session      Open session.
 * @param tokenizer    Open tokenizer.
 * @param messages     The conversation so far (at least one message).
 * @param n_messages   Number of messages.
 * @param chat_options NULL for the defaults, or filled by ep_chat_options_init() (add_generation_prompt is ignored: always on).
 * @param options      NULL for the defaults, or filled by ep_generate_options_init().
 * @param callback     NULL, or called with every piece of text (it may stop the generation).
 * @param payload      Passed to @p callback unchanged.
 * @return #EP_OK; #EP_ERR_CANCELLED; the errors of ep_chat_render() and ep_generate_text().
 */
EP_API ep_status ep_generate_chat(ep_generate_stats *out_stats, ep_session *session, const ep_tokenizer *tokenizer,
                                  const ep_chat_message *messages, size_t n_messages, const ep_chat_options *chat_options,
                                  const ep_generate_options *options, ep_text_fn callback, void *payload);

/** @} */

/** @defgroup textstream Incremental text of generated tokens
 *
 * For hosts that sample tokens themselves (ep_session_sample(), continuous batching): turns a
 * session's generated tokens into text as ep_generate_text() streams it — complete UTF-8 only,
 * special tokens left out, text that may begin a stop string held back until it is known not
 * to. One stream per generation; not thread-safe.
 *  @{ */

/** An incremental detokenizer with stop strings (opaque). Free it with ep_text_stream_close(). */
typedef struct ep_text_stream ep_text_stream;

/**
 * @brief Opens a text stream over @p tokenizer.
 * @param[out] out_stream The stream (the caller owns it).
 * @param tokenizer  Open tokenizer; it must outlive the stream.
 * @param stop_strings NULL, or @p n_stop_strings non-empty UTF-8 strings that end the text.
 * @param n_stop_strings Entries of @p stop_strings.
 * @return #EP_OK; #EP_ERR_INVALID_ARGUMENT (NULL argument, an empty or NULL stop string).
 */
EP_API ep_status ep_text_stream_open(ep_text_stream **out_stream, const ep_tokenizer *tokenizer,
                                     const char *const *stop_strings, size_t n_stop_strings);

/**
 * @brief Adds one generated token; the text it completes goes to @p callback.
 * @param stream Open stream.
 * @param token  The token id.
 * @param callback NULL, or receives the text (it may be called several times or not at all).
 * @param payload  Passed to @p callback unchanged.
 * @param[out] out_stopped NULL, or 1 when a stop string appeared (the text before it was
 *        delivered; later tokens add nothing), else 0.
 * @return #EP_OK; #EP_ERR_CANCELLED (the callback returned nonzero); #EP_ERR_INVALID_ARGUMENT.
 */
EP_API ep_status ep_text_stream_push(ep_text_stream *stream, int32_t token, ep_text_fn callback, void *payload,
                                     int32_t *out_stopped);

/**
 * @brief Ends the text: delivers what was held back (an incomplete UTF-8 sequence is dropped).
 * @param stream Open stream.
 * @param callback NULL, or receives the text.
 * @param payload  Passed to @p callback unchanged.
 * @param[out] out_stopped NULL, or 1 when a stop string ended the text, else 0.
 * @return #EP_OK; #EP_ERR_CANCELLED (the callback returned nonzero); #EP_ERR_INVALID_ARGUMENT.
 */
EP_API ep_status ep_text_stream_finish(ep_text_stream *stream, ep_text_fn callback, void *payload, int32_t *out_stopped);

/**
 * @brief Frees a stream.
 * @param stream NULL is a no-op.
 */
EP_API void ep_text_stream_close(ep_text_stream *stream);

/** @} */

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* EXPERTPACK_TEXT_H */
