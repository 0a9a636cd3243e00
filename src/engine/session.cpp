#include "engine/session.hpp"

#include "core/error.hpp"
#include "engine/engine.hpp"

#include <fmt/format.h>

#include <mutex>

namespace ep::engine {

using backend::GgmlType;
using backend::Tensor;

Session::Session(Engine &engine) : engine_(engine) {
  std::lock_guard<std::mutex> lock(engine_.mutex());
  const uint64_t bytes = engine_.session_bytes(0);
  engine_.kv_check(0, bytes, "a new session");
  state_ = engine_.lm().new_state();
  logits_ = engine_.backend().allocate(static_cast<uint64_t>(engine_.info().vocab) * sizeof(float));
  engine_.kv_apply(0, bytes, 1);
  kv_bytes_ = bytes;
}

void Session::copy_state_from(const Session &other) {
  std::lock_guard<std::mutex> lock(engine_.mutex());
  backend::Backend &be = engine_.backend();
  engine_.kv_check(kv_bytes_, other.kv_bytes_, fmt::format("a copy of a session of {} tokens", other.tokens_.size()));
  state_ = other.state_->clone();
  engine_.kv_apply(kv_bytes_, other.kv_bytes_);
  kv_bytes_ = other.kv_bytes_;
  const int64_t vocab = engine_.info().vocab;
  be.copy(Tensor::make(other.logits_, GgmlType::f32, be.device(), {vocab}), Tensor::make(logits_, GgmlType::f32, be.device(), {vocab}));
  tokens_ = other.tokens_;
}

std::unique_ptr<Session> Session::fork() const {
  auto copy = std::make_unique<Session>(engine_);
  copy->copy_state_from(*this);
  copy->sample_counter_ = sample_counter_;
  return copy;
}

void Session::keep_snapshot() { snapshot_ = fork(); }

std::span<const int32_t> Session::snapshot_tokens() const {
  return snapshot_ ? std::span<const int32_t>(snapshot_->tokens_) : std::span<const int32_t>();
}

void Session::restore_snapshot() {
  if (!snapshot_) fail(Status::internal, "Session: no snapshot to restore");
  copy_state_from(*snapshot_);
}

Session::~Session() {
  std::lock_guard<std::mutex> lock(engine_.mutex());  // the state holds backend memory
  state_.reset();
  engine_.backend().deallocate(logits_);
  engine_.kv_apply(kv_bytes_, 0, -1);
}

int64_t Session::length() const { return state_->n_past(); }

uint64_t Session::state_bytes() const {
  std::lock_guard<std::mutex> lock(engine_.mutex());
  const uint64_t own = state_->state_bytes() + static_cast<uint64_t>(engine_.info().vocab) * sizeof(float);
  return own + (snapshot_ ? snapshot_->state_->state_bytes() + static_cast<uint64_t>(engine_.info().vocab) * sizeof(float) : 0);
}

void Session::reset() {
  snapshot_.reset();
  std::lock_guard<std::mutex> lock(engine_.mutex());
  state_ = engine_.lm().new_state();
  const uint64_t bytes = engine_.session_bytes(0);
  engine_.kv_apply(kv_bytes_, bytes);
  kv_bytes_ = bytes;
  tokens_.clear();
  sample_counter_ = 0;
}

void Session::check_context(int64_t n, const char *what) const {
  const int64_t limit = engine_.context_length(), held = length();
  if (limit > 0 && held + n > limit)
    fail(Status::invalid_argument, "{}: {} tokens after the {} the session holds make {}, over the model's context length of {} tokens",
         what, n, held, held + n, limit);
}

void Session::check_tokens(std::span<const int32_t> tokens, const char *what) const {
  const int64_t vocab = engine_.info().vocab;
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= vocab)
      fail(Status::invalid_argument, "{}: token {} at index {} is outside 0..{}", what, tokens[i], i, vocab - 1);
}

void Session::run(std::span<const int32_t> tokens, model::LogitRows rows, std::vector<float> *all) {
  if (tokens.empty()) fail(Status::invalid_argument, "Session: no tokens to append");
  const int64_t n = static_cast<int64_t>(tokens.size()), vocab = engine_.info().vocab;
  {
    std::lock_guard<std::mutex> lock(engine_.mutex());
    backend::Backend &be = engine_.backend();
    check_context(n, "tokens");
    const uint64_t bytes = engine_.session_bytes(length() + n);
    engine_.kv_check(kv_bytes_, bytes, fmt::format("{} tokens after the {} the session holds", n, length()));
    const Tensor out = engine_.lm().forward(tokens.data(), n, *state_, rows);
    engine_.kv_apply(kv_bytes_, bytes);
    kv_bytes_ = bytes;
    // The last row stays on the device for the sampler; a device copy, ordered on the stream.
    const auto *last = out.as<float>() + (rows == model::LogitRows::all ? (n - 1) * vocab : 0);
    be.copy(Tensor::make(last, GgmlType::f32, be.device(), {vocab}), Tensor::make(logits_, GgmlType::f32, be.device(), {vocab}));
    if (all) {
      all->resize(static_cast<size_t>(n * vocab));
      be.download(all->data(), out.data, out.n_bytes());
    }
  }
  tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
}

void Session::append(std::span<const int32_t> tokens) { run(tokens, model::LogitRows::last, nullptr); }

std::vector<float> Session::append_scored(std::span<const int32_t> tokens) {
  std::vector<float> all;
  run(tokens, model::LogitRows::all, &all);
  return all;
}

int32_t Session::sample(const backend::SamplingParams &params, backend::TokenLogprobs *logprobs) {
  if (!has_logits()) fail(Status::invalid_argument, "Session: no logits to sample from (append a token first)");
  const int64_t vocab = engine_.info().vocab;
  for (const backend::TokenBias &b : params.logit_bias)
    if (b.token < 0 || b.token >= vocab)
      fail(Status::invalid_argument, "logit_bias: token {} is outside the vocabulary 0..{}", b.token, vocab - 1);
  std::lock_guard<std::mutex> lock(engine_.mutex());
  backend::Backend &be = engine_.backend();
  const Tensor z = Tensor::make(logits_, GgmlType::f32, be.device(), {vocab});
  // The counter advances only for a draw that happened: a refused request leaves it as it was.
  const int32_t token = be.sample(z, params, sample_counter_, logprobs);
  ++sample_counter_;
  return token;
}

backend::SamplingParams Session::windowed(backend::SamplingParams params, uint32_t repetition_window) const {
  if (params.repetition_penalty != 1.0f) {
    const size_t n = tokens_.size();
    const size_t w = repetition_window && repetition_window < n ? repetition_window : n;
    params.penalty_tokens = std::span<const int32_t>(tokens_.data() + (n - w), w);
  }
  return params;
}

int32_t Session::sample(backend::SamplingParams params, uint32_t repetition_window, backend::TokenLogprobs *logprobs) {
  return sample(windowed(std::move(params), repetition_window), logprobs);
}

void sample_batch(std::span<BatchDraw> draws) {
  if (draws.empty()) fail(Status::invalid_argument, "no sessions to sample");
  for (size_t i = 0; i < draws.size(); ++i) {
    Session *s = draws[i].session;
    if (!s) fail(Status::invalid_argument, "sessions[{}] is NULL", i);
    if (&s->engine() != &draws[0].session->engine())
      fail(Status::invalid_argument, "sessions[{}] belongs to another model than sessions[0]", i);
    for (size_t j = 0; j < i; ++j)
      if (draws[j].session == s) fail(Status::invalid_argument, "sessions[{}] and sessions[{}] are the same session", j, i);
    if (!s->has_logits()) fail(Status::invalid_argument, "sessions[{}] has no logits to sample from (append a token first)", i);
  }
  Engine &engine = draws[0].session->engine();
  const int64_t vocab = engine.info().vocab;
  std::vector<backend::SamplingParams> params;
  params.reserve(draws.size());
  for (size_t i = 0; i < draws.size(); ++i) {
    params.push_back(draws[i].session->windowed(draws[i].params, draws[i].repetition_window));
    try {
      backend::check_logit_bias(params[i], vocab);
      backend::check_token_mask(params[i], vocab);
      if (const backend::TokenLogprobs *lp = draws[i].logprobs; lp && (lp->top_n < 0 || lp->top_n > backend::kMaxTopLogprobs))
        fail(Status::invalid_argument, "top_n {} of the log-probabilities (expected 0..{})", lp->top_n, backend::kMaxTopLogprobs);
    } catch (const Error &e) {
      fail(e.status(), "sessions[{}]: {}", i, e.what());
    }
  }
  std::vector<int32_t> tokens(draws.size(), -1);
  {
    std::lock_guard<std::mutex> lock(engine.mutex());
    backend::Backend &be = engine.backend();
    std::vector<backend::SampleRow> rows(draws.size());
    for (size_t i = 0; i < draws.size(); ++i) {
      rows[i].logits = Tensor::make(draws[i].session->logits_, GgmlType::f32, be.device(), {vocab});
      rows[i].params = &params[i];
      rows[i].counter = draws[i].session->sample_counter_;
      rows[i].logprobs = draws[i].logprobs;
    }
    be.sample_rows(rows, tokens);
  }
  // The counters advance only for draws that happened: a refused call leaves them as they were.
  for (size_t i = 0; i < draws.size(); ++i) {
    draws[i].token = tokens[i];
    ++draws[i].session->sample_counter_;
  }
}

void append_batch(std::span<Session *const> sessions, std::span<const std::span<const int32_t>> tokens) {
  if (sessions.empty()) fail(Status::invalid_argument, "no sessions to append to");
  if (tokens.size() != sessions.size())
    fail(Status::invalid_argument, "{} token lists for {} sessions", tokens.size(), sessions.size());
  for (size_t i = 0; i < sessions.size(); ++i) {
    if (!sessions[i]) fail(Status::invalid_argument, "sessions[{}] is NULL", i);
    if (&sessions[i]->engine() != &sessions[0]->engine())
      fail(Status::invalid_argument, "sessions[{}] belongs to another model than sessions[0]", i);
    for (size_t j = 0; j < i; ++j)
      if (sessions[j] == sessions[i]) fail(Status::invalid_argument, "sessions[{}] and sessions[{}] are the same session", j, i);
    if (tokens[i].empty()) fail(Status::invalid_argument, "no tokens for sessions[{}]", i);
    sessions[i]->check_tokens(tokens[i], "tokens");
  }
  // One forward pass for every session (their tokens back to back); each session's last row of
  // logits goes to its own buffer, on the device.
  std::vector<int32_t> all;
  std::vector<int64_t> offsets{0};
  std::vector<model::LmState *> states;
  for (size_t i = 0; i < sessions.size(); ++i) {
    all.insert(all.end(), tokens[i].begin(), tokens[i].end());
    offsets.push_back(static_cast<int64_t>(all.size()));
    states.push_back(sessions[i]->state_.get());
  }
  Engine &engine = sessions[0]->engine();
  {
    std::lock_guard<std::mutex> lock(engine.mutex());
    backend::Backend &be = engine.backend();
    const int64_t vocab = engine.info().vocab;
    // The limits before anything runs, so that a refused call leaves every session as it was.
    std::vector<uint64_t> bytes(sessions.size());
    uint64_t release = 0, take = 0;
    for (size_t i = 0; i < sessions.size(); ++i) {
      const int64_t n = static_cast<int64_t>(tokens[i].size());
      sessions[i]->check_context(n, fmt::format("tokens[{}]", i).c_str());
      bytes[i] = engine.session_bytes(sessions[i]->length() + n);
      release += sessions[i]->kv_bytes_;
      take += bytes[i];
    }
    engine.kv_check(release, take,
                    sessions.size() == 1 ? fmt::format("{} tokens after the {} the session holds", tokens[0].size(), sessions[0]->length())
                                         : fmt::format("{} tokens for {} sessions", all.size(), sessions.size()));
    const Tensor out = engine.lm().forward_batch(all, offsets, states, model::LogitRows::last);
    for (size_t i = 0; i < sessions.size(); ++i) {
      engine.kv_apply(sessions[i]->kv_bytes_, bytes[i]);
      sessions[i]->kv_bytes_ = bytes[i];
    }
    for (size_t i = 0; i < sessions.size(); ++i)
      be.copy(Tensor::make(out.as<float>() + static_cast<int64_t>(i) * vocab, GgmlType::f32, be.device(), {vocab}),
              Tensor::make(sessions[i]->logits_, GgmlType::f32, be.device(), {vocab}));
  }
  for (size_t i = 0; i < sessions.size(); ++i)
    sessions[i]->tokens_.insert(sessions[i]->tokens_.end(), tokens[i].begin(), tokens[i].end());
}

}  // namespace ep::engine
