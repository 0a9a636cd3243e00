// What the text API (text_api.cpp) needs of the model and session handles (model_api.cpp), and
// the grammar API (grammar_api.cpp) of the tokenizer handles and the generate options of its states:
// internal C++, not exported (only ep_* symbols leave the library).
#pragma once

#include <expertpack/expertpack.h>

#include "engine/generate.hpp"

namespace ep::engine {
class Engine;
class Session;
struct ChatTokenizer;
}  // namespace ep::engine

namespace ep::grammar {
class Matcher;
}

namespace ep::capi {

/// The generate options of @p options merged over the defaults (struct_size checked) with the
/// C-level checks (NULL arrays, flags); the values are checked by the engine.
ep_generate_options read_generate_options(const ep_generate_options *options, const char *fn);
/// The engine's parameters for @p options.
ep::engine::GenerateParams generate_params(const ep_generate_options &options);
/// Copies @p stats into @p out up to out->struct_size (checked); NULL is ignored.
void write_generate_stats(ep_generate_stats *out, const ep::engine::GenerateStats &stats);
/// Checks out->struct_size before any work; NULL is fine.
void check_generate_stats(const ep_generate_stats *out);

/// The engine behind a model handle.
ep::engine::Engine &model_engine(const ep_model &model);
/// The engine session behind a session handle.
ep::engine::Session &session_of(ep_session &session);
/// The tokenizer behind a tokenizer handle (text_api.cpp).
const ep::engine::ChatTokenizer &chat_tokenizer_of(const ep_tokenizer &tokenizer);
/// The matcher behind a grammar state handle (grammar_api.cpp).
ep::grammar::Matcher &matcher_of(ep_grammar_state &state);

}  // namespace ep::capi
