// What the text API (text_api.cpp) needs of the model and session handles (model_api.cpp):
// internal C++, not exported (only ep_* symbols leave the library).
#pragma once

#include <expertpack/expertpack.h>

#include "engine/generate.hpp"

namespace ep::engine {
class Engine;
class Session;
}  // namespace ep::engine

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

}  // namespace ep::capi
