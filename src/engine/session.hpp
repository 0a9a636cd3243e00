// One sequence on an Engine (what the C API's ep_session is): the model's decode state, the
// tokens it holds, and the logits after its last token, kept in backend memory for the sampler
// (only the sampled token id comes to the host). Every call takes the engine's lock, so
// sessions of one engine may be used from several threads; one session is used by one thread
// at a time.
#pragma once

#include "backend/backend.hpp"
#include "model/causal_lm.hpp"

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace ep::engine {

class Engine;
class Session;

/// Appends @p tokens[i] to @p sessions[i] (distinct sessions of one engine, every list non-empty)
/// in one forward pass; each keeps its last row of logits. Status::invalid_argument for a
/// session given twice, sessions of different engines, empty lists, tokens outside the
/// vocabulary or a session taken past the model's context length; Status::budget when the
/// sessions' state would outgrow the engine's KV budget (all checked before anything runs:
/// the sessions stay as they were). After another error every session must be reset.
void append_batch(std::span<Session *const> sessions, std::span<const std::span<const int32_t>> tokens);

/// One session's draw of sample_batch(): what Session::sample(params, repetition_window,
/// logprobs) takes, and the token it gives.
struct BatchDraw {
  Session *session = nullptr;
  /// Its settings (penalty_tokens is filled from the session's window when the penalty is on).
  backend::SamplingParams params;
  uint32_t repetition_window = 0;  ///< 0 = every token of the session
  backend::TokenLogprobs *logprobs = nullptr;  ///< null, or filled as Session::sample() fills it
  int32_t token = -1;              ///< out: the drawn token
};

/// Draws the next token of every session of @p draws (distinct sessions of one engine, each with
/// logits) in one Backend::sample_rows() call: each token, its log-probabilities and the draw
/// counter's advance are those of one Session::sample() per session. Status::invalid_argument
/// naming sessions[i] (i: the index in @p draws) for a null or repeated session, sessions of different engines, a session
/// with no logits or a bad logit bias, mask or top_n; checked before anything runs, so a refused
/// call changes no draw counter.
void sample_batch(std::span<BatchDraw> draws);

class Session {
 public:
  /// An empty session. Status::budget when the engine's KV budget has no room for its state at 0 tokens.
  explicit Session(Engine &engine);
  ~Session();
  /// A new session holding a copy of this one: its state (copied in backend memory), tokens,
  /// last logits and draw counter (not its kept snapshot). Appending to either leaves the other
  /// as it is. Status::budget when the copy does not fit the engine's KV budget.
  std::unique_ptr<Session> fork() const;
  /// Keeps a copy of this session as it is now (replacing an earlier one; it costs a second copy
  /// of the state): a later chat turn whose rendering parts from the session after these tokens
  /// continues from the copy (restore_snapshot) instead of processing the conversation again.
  void keep_snapshot();
  /// The kept copy's tokens (empty when none is kept).
  std::span<const int32_t> snapshot_tokens() const;
  /// Becomes the kept copy: its state, tokens and last logits (the draw counter goes on). The copy
  /// stays kept.
  void restore_snapshot();
  Session(const Session &) = delete;
  Session &operator=(const Session &) = delete;

  Engine &engine() const { return engine_; }
  /// Tokens run so far (the next position).
  int64_t length() const;
  /// Every token appended, in order.
  std::span<const int32_t> tokens() const { return tokens_; }
  /// Bytes of backend memory the session holds: its decode state (as allocated), its last logits
  /// and its kept snapshot's.
  uint64_t state_bytes() const;
  /// The sampler's draw counter: sample() calls so far (a fork's included).
  uint64_t draw_count() const { return sample_counter_; }
  /// Sets the draw counter: the next sample() is draw @p draws of its seed's sequence (0: as a
  /// new session's first).
  void set_draw_count(uint64_t draws) { sample_counter_ = draws; }
  /// True once a token was appended: sample() has logits to draw from.
  bool has_logits() const { return !tokens_.empty(); }
  /// Empties the session (a fresh state; the sampler's draw counter restarts; the kept snapshot
  /// is dropped).
  void reset();
  /// Checks that every token is inside the vocabulary (Status::invalid_argument naming @p what
  /// and the index).
  void check_tokens(std::span<const int32_t> tokens, const char *what) const;
  /// Throws Status::invalid_argument, naming @p what, the limit and the lengths, when @p n more
  /// tokens would take the session past the model's context length.
  void check_context(int64_t n, const char *what) const;
  /// Runs @p tokens (at least one) through the model; keeps the last row of logits in backend
  /// memory. The context length and the KV budget are checked first (as append_batch() does:
  /// a refused call leaves the session as it was); after another exception the session must be
  /// reset.
  void append(std::span<const int32_t> tokens);
  /// append() that also returns every row's logits in host memory (n × vocab; row t predicts
  /// token t + 1): ep_score().
  std::vector<float> append_scored(std::span<const int32_t> tokens);
  /// Draws the next token from the last logits (has_logits() must hold) with @p params; the
  /// draw counter advances. With @p logprobs, also its log-probabilities (backend::TokenLogprobs).
  int32_t sample(const backend::SamplingParams &params, backend::TokenLogprobs *logprobs = nullptr);
  /// sample() with the repetition penalty over the session's last @p repetition_window tokens
  /// (0 = all of them), as the generation loop applies it.
  int32_t sample(backend::SamplingParams params, uint32_t repetition_window, backend::TokenLogprobs *logprobs = nullptr);

 private:
  friend void append_batch(std::span<Session *const>, std::span<const std::span<const int32_t>>);
  friend void sample_batch(std::span<BatchDraw>);
  /// params with penalty_tokens set to the last @p repetition_window tokens (0 = all) when the
  /// repetition penalty is on.
  backend::SamplingParams windowed(backend::SamplingParams params, uint32_t repetition_window) const;
  void run(std::span<const int32_t> tokens, model::LogitRows rows, std::vector<float> *all);
  // Takes @p other's state, last logits and tokens (the draw counter stays).
  void copy_state_from(const Session &other);
  Engine &engine_;
  std::unique_ptr<model::LmState> state_;
  void *logits_ = nullptr;  // [vocab] f32 in backend memory
  uint64_t kv_bytes_ = 0;   // what this session counts against the engine's KV budget (Engine::session_bytes)
  std::vector<int32_t> tokens_;
  uint64_t sample_counter_ = 0;
  std::unique_ptr<Session> snapshot_;
};

}  // namespace ep::engine
