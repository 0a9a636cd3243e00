// What the text API (text_api.cpp) needs of models and sessions (model_api.cpp): internal C++,
// not exported (only ep_* symbols leave the library).
#pragma once

#include <expertpack/expertpack.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>

namespace ep::capi {

/// The generate options of @p options merged over the defaults (struct_size checked), validated
/// (top_k, top_p, min_p, repetition_penalty, stop_tokens); stop_strings are allowed only when
/// @p allow_stop_strings.
ep_generate_options read_generate_options(const ep_generate_options *options, bool allow_stop_strings, const char *fn);

/// Called after each generated token (already in the session). Return 0 to continue, 1 to stop
/// with @p reason set, -1 to cancel (the generation then throws Status::cancelled).
using TokenHook = std::function<int(int32_t token, uint32_t index, ep_stop_reason &reason)>;

/// Appends @p prompt (may be empty when the session is not) and generates with @p opts:
/// sampling (penalty over the session's last repetition_window tokens), the hook, then
/// stop_token / stop_tokens. Fills @p stats (not struct_size). Throws Status::cancelled after
/// filling @p stats when the hook cancels.
void generate(ep_session &session, std::span<const int32_t> prompt, const ep_generate_options &opts, const TokenHook &hook,
              ep_generate_stats &stats, const char *fn);

/// Copies @p stats into @p out up to out->struct_size (checked); NULL is ignored.
void write_generate_stats(ep_generate_stats *out, const ep_generate_stats &stats);
/// Checks out->struct_size before any work; NULL is fine.
void check_generate_stats(const ep_generate_stats *out);

/// The file the model's dense weights (and tokenizer) come from.
const std::string &model_source_path(const ep_model &model);
/// Logits per position.
int64_t model_vocab_size(const ep_model &model);
/// The model's GGUF architecture name ("deepseek4", "kimi-linear", "kimi-k3").
const std::string &model_architecture(const ep_model &model);
const ep_model &session_model(const ep_session &session);
/// Every token the session holds, in order.
std::span<const int32_t> session_tokens(const ep_session &session);
/// Empties the session (ep_session_reset()).
void session_reset(ep_session &session);

}  // namespace ep::capi
