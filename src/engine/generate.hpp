// The generation loop: a prompt appended to a session, then tokens sampled on the backend one
// by one (the logits stay in backend memory; only each token id comes to the host), stop rules,
// and the statistics of the run.
#pragma once

#include "backend/backend.hpp"

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace ep::grammar {
class Matcher;
}

namespace ep::engine {

class Session;

/// Why generation stopped (the numbers of the C API's ep_stop_reason).
enum class StopReason : int32_t { length = 0, token = 1, string = 2, cancelled = 3 };

struct GenerateParams {
  uint32_t max_new_tokens = 16;
  /// temperature, top_k, top_p, min_p, seed, repetition_penalty, logit_bias (penalty_tokens is
  /// filled from the session's last repetition_window tokens).
  backend::SamplingParams sampling;
  uint32_t repetition_window = 64;  ///< 0 = every token of the session
  std::vector<int32_t> stop_tokens; ///< generation stops after emitting one of these
  std::vector<std::string> stop_strings;  ///< text generation only (engine/text.hpp)
  bool ignore_eos = false;          ///< text generation: no stop at EOS / end of turn
  /// Null, or constrained sampling: each draw is from the tokens this grammar allows (its mask
  /// applied where the logit bias is), and the drawn token advances it. Not owned.
  grammar::Matcher *grammar = nullptr;
};

/// Draws @p session's next token with @p params: the repetition penalty over its window, and the
/// grammar's mask when params.grammar is set (which the token then advances).
int32_t sample_next(Session &session, const GenerateParams &params, backend::TokenLogprobs *logprobs = nullptr);

/// sample_next() for several sessions of one engine at once (sample_batch(): one sampling launch
/// and one download for all of them): @p tokens[i] is sample_next(*sessions[i], *params[i],
/// logprobs[i]) (@p logprobs empty: none for any; else a null entry: none for that session), and
/// each grammar advances by its session's token. Status::invalid_argument naming sessions[i]
/// for a grammar state given twice and for what sample_batch() refuses; a refused call changes
/// no draw counter and no grammar state.
void sample_next_batch(std::span<Session *const> sessions, std::span<const GenerateParams *const> params,
                       std::span<backend::TokenLogprobs *const> logprobs, std::span<int32_t> tokens);

/// Checks @p params (Status::invalid_argument naming the field and the value).
void check_generate_params(const GenerateParams &params);

struct GenerateStats {
  uint32_t prompt_tokens = 0;
  uint32_t generated_tokens = 0;  ///< including a stop token and the token a hook stopped at
  double prefill_seconds = 0, decode_seconds = 0;
  double prefill_tokens_per_second = 0, decode_tokens_per_second = 0;
  uint64_t session_tokens = 0;
  uint64_t prefill_expert_bytes = 0, decode_expert_bytes = 0;  ///< read from the pack meanwhile
  /// The generation steps' share of the expert store's times (store::StoreStats, summed over the
  /// devices' stores): the disk busy (pack_read_ns), its queue full (pack_read_full_ns), the
  /// model's thread blocked on reads (expert_wait_ns) and the store's own work with the disk idle
  /// (store_disk_idle_ns). All 0 with resident experts.
  uint64_t decode_read_busy_ns = 0, decode_read_full_ns = 0, decode_expert_wait_ns = 0, decode_store_idle_ns = 0;
  uint32_t reused_tokens = 0;  ///< chat: prompt tokens already in the session
  StopReason stop_reason = StopReason::length;
};

/// Called after each generated token (already in the session). Return 0 to continue, 1 to stop
/// with @p reason set, -1 to cancel (generate() then throws Status::cancelled).
using TokenHook = std::function<int(int32_t token, uint32_t index, StopReason &reason)>;

/// Appends @p prompt (may be empty when the session already has logits) and generates with
/// @p params: sampling on the backend, the hook, then the stop tokens. Fills @p stats, also when
/// it throws (Status::cancelled after the hook cancelled; a failed forward pass leaves the
/// session to be reset).
void generate(Session &session, std::span<const int32_t> prompt, const GenerateParams &params, const TokenHook &hook,
              GenerateStats &stats);

}  // namespace ep::engine
