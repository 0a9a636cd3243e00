/**
 * @file grammar.h
 * @brief Constrained sampling: JSON, or the values of a JSON Schema, over a tokenizer's vocabulary.
 *
 * A grammar (ep_grammar) is made for a tokenizer from "any JSON object" (OpenAI's
 * `response_format` `json_object`) or from a JSON Schema (`json_schema`: the subset OpenAI's
 * structured outputs accept — type (a name or a list of names), object properties / required /
 * additionalProperties, array items / minItems / maxItems, enum, const, anyOf, $defs / $ref with
 * recursion; docs/grammar.md). A schema keyword outside the subset is an error that names the
 * keyword and its JSON pointer; nothing is silently ignored.
 *
 * A grammar state (ep_grammar_state) follows one generated sequence. Set it as
 * ep_generate_options::grammar: each draw of ep_session_sample(), ep_generate(),
 * ep_generate_text() or ep_generate_chat() is then from the tokens whose bytes continue a value of
 * the grammar (the other tokens' logits are −∞; special tokens are never allowed), and once the
 * value is complete only the tokenizer's end tokens (EOS and the end-of-turn token) are. The
 * drawn token advances the state. The text generated is then one JSON value of the grammar,
 * without whitespace before it beyond 16 bytes in a row anywhere, and nothing after it. Every
 * drawn token is constrained: a chat rendered with thinking on would have its thinking
 * constrained too (the thinking markers are special tokens, never allowed), so render with
 * thinking off for JSON answers.
 *
 * Thread safety: a grammar is immutable and may be shared by any number of states and threads; a
 * state is used by one thread at a time.
 */
#ifndef EXPERTPACK_GRAMMAR_H
#define EXPERTPACK_GRAMMAR_H

#include "expertpack/expertpack.h"
#include "expertpack/text.h"

#ifdef __cplusplus
extern "C" {
#endif

/** @defgroup grammar Constrained sampling (JSON and JSON Schema)
 *  @{ */

/** A JSON grammar over a tokenizer's vocabulary (opaque, immutable). Free it with ep_grammar_close(). */
typedef struct ep_grammar ep_grammar;
/** One sequence's position in a grammar (opaque). Free it with ep_grammar_state_close(). */
typedef struct ep_grammar_state ep_grammar_state;

/**
 * @brief A grammar of any JSON object for @p tokenizer's vocabulary.
 * @param[out] out_grammar The new grammar; the caller owns it.
 * @param tokenizer Open tokenizer (it may be closed while the grammar lives).
 * @return #EP_OK; #EP_ERR_INVALID_ARGUMENT (NULL argument); #EP_ERR_UNSUPPORTED when the
 *         tokenizer has neither an EOS nor an end-of-turn token.
 */
EP_API ep_status ep_grammar_json_object(ep_grammar **out_grammar, const ep_tokenizer *tokenizer);

/**
 * @brief A grammar of the values of a JSON Schema for @p tokenizer's vocabulary.
 * @param[out] out_grammar The new grammar; the caller owns it.
 * @param tokenizer Open tokenizer.
 * @param schema The schema as JSON text (UTF-8; not NUL-terminated necessarily).
 * @param schema_length Bytes of @p schema.
 * @return #EP_OK; #EP_ERR_INVALID_ARGUMENT for a NULL argument, text that is no JSON, a keyword
 *         outside the subset, a value of the wrong kind, a $ref that does not resolve, or a schema
 *         no value satisfies — ep_last_error() names the JSON pointer and the keyword (e.g.
 *         "JSON schema /properties/age/minimum: keyword \"minimum\" is outside the supported
 *         subset"); #EP_ERR_UNSUPPORTED as ep_grammar_json_object().
 */
EP_API ep_status ep_grammar_json_schema(ep_grammar **out_grammar, const ep_tokenizer *tokenizer, const char *schema,
                                        size_t schema_length);

/**
 * @brief Frees a grammar (the states made from it keep what they need). NULL is a no-op.
 * @param grammar Grammar to free.
 */
EP_API void ep_grammar_close(ep_grammar *grammar);

/**
 * @brief A state at the start of @p grammar (nothing generated yet).
 * @param[out] out_state The new state; the caller owns it.
 * @param grammar Open grammar (it may be closed while the state lives).
 * @return #EP_OK; #EP_ERR_INVALID_ARGUMENT (NULL argument).
 */
EP_API ep_status ep_grammar_state_open(ep_grammar_state **out_state, const ep_grammar *grammar);

/**
 * @brief Frees a state. NULL is a no-op.
 * @param state State to free.
 */
EP_API void ep_grammar_state_close(ep_grammar_state *state);

/**
 * @brief Advances @p state by @p token, as sampling with it does (for a host that draws tokens
 *        itself, or that appends forced tokens).
 * @param state Open state.
 * @param token A token id of the tokenizer's vocabulary.
 * @return #EP_OK; #EP_ERR_INVALID_ARGUMENT for a NULL argument or a token the state does not
 *         allow (named, with its bytes); the state is then unchanged.
 */
EP_API ep_status ep_grammar_state_accept(ep_grammar_state *state, int32_t token);

/**
 * @brief Whether the text so far is one complete value (the end tokens are allowed).
 * @param[out] out_complete 1 complete, 0 not yet.
 * @param state Open state.
 * @return #EP_OK; #EP_ERR_INVALID_ARGUMENT (NULL argument).
 */
EP_API ep_status ep_grammar_state_complete(int32_t *out_complete, const ep_grammar_state *state);

/**
 * @brief The tokens @p state allows next, as a bit mask: bit t % 32 of word t / 32 for token t
 *        (the tokenizer's vocabulary size, rounded up to 32 bits, words in all).
 * @param[out] out_mask NULL (to measure), or @p capacity words to fill.
 * @param capacity Words of @p out_mask.
 * @param[out] out_words The words the mask has (always set).
 * @param state Open state.
 * @return #EP_OK (nothing written when @p capacity is too small); #EP_ERR_INVALID_ARGUMENT (NULL
 *         state or out_words).
 */
EP_API ep_status ep_grammar_state_allowed(uint32_t *out_mask, size_t capacity, size_t *out_words, const ep_grammar_state *state);

/** @} */

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* EXPERTPACK_GRAMMAR_H */
