// The C API of constrained sampling (grammar.h): grammars over a tokenizer's vocabulary and the
// states that follow one sequence each.
#include <expertpack/expertpack.h>

#include "capi/guard.hpp"
#include "capi/model_internal.hpp"
#include "engine/text.hpp"
#include "grammar/token_mask.hpp"

#include <memory>
#include <string>

struct ep_grammar {
  std::shared_ptr<const ep::grammar::TokenGrammar> g;
};

struct ep_grammar_state {
  explicit ep_grammar_state(std::shared_ptr<const ep::grammar::TokenGrammar> g) : matcher(std::move(g)) {}
  ep::grammar::Matcher matcher;
};

namespace ep::capi {
ep::grammar::Matcher &matcher_of(ep_grammar_state &state) { return state.matcher; }
}  // namespace ep::capi

extern "C" {

EP_API ep_status ep_grammar_json_object(ep_grammar **out_grammar, const ep_tokenizer *tokenizer) {
  return ep::capi::guard(__func__, [&](const char *fn) {
    ep::capi::require_arg(out_grammar, fn, "out_grammar");
    *out_grammar = nullptr;
    ep::capi::require_arg(tokenizer, fn, "tokenizer");
    auto g = std::make_unique<ep_grammar>();
    g->g = ep::engine::json_grammar(ep::capi::chat_tokenizer_of(*tokenizer), nullptr);
    *out_grammar = g.release();
  });
}

EP_API ep_status ep_grammar_json_schema(ep_grammar **out_grammar, const ep_tokenizer *tokenizer, const char *schema,
                                        size_t schema_length) {
  return ep::capi::guard(__func__, [&](const char *fn) {
    ep::capi::require_arg(out_grammar, fn, "out_grammar");
    *out_grammar = nullptr;
    ep::capi::require_arg(tokenizer, fn, "tokenizer");
    ep::capi::require_arg(schema, fn, "schema");
    const std::string text(schema, schema_length);
    auto g = std::make_unique<ep_grammar>();
    g->g = ep::engine::json_grammar(ep::capi::chat_tokenizer_of(*tokenizer), &text);
    *out_grammar = g.release();
  });
}

EP_API void ep_grammar_close(ep_grammar *grammar) { delete grammar; }

EP_API ep_status ep_grammar_state_open(ep_grammar_state **out_state, const ep_grammar *grammar) {
  return ep::capi::guard(__func__, [&](const char *fn) {
    ep::capi::require_arg(out_state, fn, "out_state");
    *out_state = nullptr;
    ep::capi::require_arg(grammar, fn, "grammar");
    *out_state = new ep_grammar_state(grammar->g);
  });
}

EP_API void ep_grammar_state_close(ep_grammar_state *state) { delete state; }

EP_API ep_status ep_grammar_state_accept(ep_grammar_state *state, int32_t token) {
  return ep::capi::guard(__func__, [&](const char *fn) {
    ep::capi::require_arg(state, fn, "state");
    state->matcher.accept(token);
  });
}

EP_API ep_status ep_grammar_state_complete(int32_t *out_complete, const ep_grammar_state *state) {
  return ep::capi::guard(__func__, [&](const char *fn) {
    ep::capi::require_arg(out_complete, fn, "out_complete");
    ep::capi::require_arg(state, fn, "state");
    *out_complete = state->matcher.complete() || state->matcher.ended() ? 1 : 0;
  });
}

EP_API ep_status ep_grammar_state_allowed(uint32_t *out_mask, size_t capacity, size_t *out_words, const ep_grammar_state *state) {
  return ep::capi::guard(__func__, [&](const char *fn) {
    ep::capi::require_arg(out_words, fn, "out_words");
    ep::capi::require_arg(state, fn, "state");
    const auto mask = state->matcher.allowed();
    *out_words = mask->size();
    if (capacity >= mask->size() && out_mask) std::copy(mask->begin(), mask->end(), out_mask);
  });
}

}  // extern "C"
