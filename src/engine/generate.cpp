#include "engine/generate.hpp"

#include "core/error.hpp"
#include "engine/engine.hpp"
#include "engine/session.hpp"
#include "grammar/token_mask.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>

namespace ep::engine {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

void check_generate_params(const GenerateParams &p) {
  const backend::SamplingParams &s = p.sampling;
  if (s.top_k < 0 || !(s.top_p > 0.0f && s.top_p <= 1.0f))
    fail(Status::invalid_argument, "top_k {} / top_p {} out of range", s.top_k, s.top_p);
  if (!(s.min_p >= 0.0f && s.min_p <= 1.0f)) fail(Status::invalid_argument, "min_p {} out of range (expected 0..1)", s.min_p);
  if (!(s.repetition_penalty > 0.0f) || !std::isfinite(s.repetition_penalty))
    fail(Status::invalid_argument, "repetition_penalty {} (expected > 0; 1 = off)", s.repetition_penalty);
  if (std::isnan(s.temperature)) fail(Status::invalid_argument, "temperature is NaN");
  std::vector<int32_t> biased;
  for (const backend::TokenBias &b : s.logit_bias) {
    if (!(b.bias >= -100.0f && b.bias <= 100.0f))
      fail(Status::invalid_argument, "logit_bias: bias {} for token {} is outside -100..100", b.bias, b.token);
    biased.push_back(b.token);
  }
  std::sort(biased.begin(), biased.end());
  if (const auto twice = std::adjacent_find(biased.begin(), biased.end()); twice != biased.end())
    fail(Status::invalid_argument, "logit_bias: token {} is given more than once", *twice);
  for (size_t i = 0; i < p.stop_tokens.size(); ++i)
    if (p.stop_tokens[i] < 0) fail(Status::invalid_argument, "stop_tokens[{}] is {}", i, p.stop_tokens[i]);
  for (size_t i = 0; i < p.stop_strings.size(); ++i)
    if (p.stop_strings[i].empty()) fail(Status::invalid_argument, "stop_strings[{}] is empty", i);
}

int32_t sample_next(Session &session, const GenerateParams &params, backend::TokenLogprobs *logprobs) {
  if (!params.grammar) return session.sample(params.sampling, params.repetition_window, logprobs);
  // The mask is computed on the host (cached per grammar state) and applied by the backend with
  // the logit bias; the drawn token then moves the grammar on.
  const std::shared_ptr<const std::vector<uint32_t>> mask = params.grammar->allowed();
  backend::SamplingParams sp = params.sampling;
  sp.allowed = *mask;
  const int32_t token = session.sample(std::move(sp), params.repetition_window, logprobs);
  params.grammar->accept(token);
  return token;
}

void sample_next_batch(std::span<Session *const> sessions, std::span<const GenerateParams *const> params,
                       std::span<backend::TokenLogprobs *const> logprobs, std::span<int32_t> tokens) {
  const size_t n = sessions.size();
  if (params.size() != n || tokens.size() != n || (!logprobs.empty() && logprobs.size() != n))
    fail(Status::invalid_argument, "{} sessions with {} sampling settings, {} log-probability slots and {} token slots", n,
         params.size(), logprobs.size(), tokens.size());
  std::vector<BatchDraw> draws(n);
  // The masks stay alive until the draws are done (each grammar state caches its own).
  std::vector<std::shared_ptr<const std::vector<uint32_t>>> masks(n);
  for (size_t i = 0; i < n; ++i) {
    if (!params[i]) fail(Status::invalid_argument, "no sampling settings for sessions[{}]", i);
    const GenerateParams &p = *params[i];
    if (p.grammar)
      for (size_t j = 0; j < i; ++j)
        if (params[j] && params[j]->grammar == p.grammar)
          fail(Status::invalid_argument, "sessions[{}] and sessions[{}] share one grammar state (one state per sequence)", j, i);
    draws[i].session = sessions[i];
    draws[i].params = p.sampling;
    draws[i].repetition_window = p.repetition_window;
    draws[i].logprobs = logprobs.empty() ? nullptr : logprobs[i];
    if (p.grammar) {
      masks[i] = p.grammar->allowed();
      draws[i].params.allowed = *masks[i];
    }
  }
  sample_batch(draws);
  for (size_t i = 0; i < n; ++i) {
    tokens[i] = draws[i].token;
    if (params[i]->grammar) params[i]->grammar->accept(draws[i].token);
  }
}

void generate(Session &session, std::span<const int32_t> prompt, const GenerateParams &params, const TokenHook &hook,
              GenerateStats &st) {
  if (prompt.empty() && !session.has_logits()) fail(Status::invalid_argument, "empty prompt on an empty session");
  session.check_tokens(prompt, "prompt");
  check_generate_params(params);
  Engine &engine = session.engine();
  st.stop_reason = StopReason::length;
  auto t0 = std::chrono::steady_clock::now();
  const uint64_t read0 = engine.expert_read_bytes();
  if (!prompt.empty()) session.append(prompt);
  st.prompt_tokens = static_cast<uint32_t>(prompt.size());
  st.prefill_seconds = seconds_since(t0);
  // One snapshot of the store at the split: the decode window's times are the differences. The
  // window's clock starts before it and stops after the last one, so the store's times lie
  // inside decode_seconds.
  t0 = std::chrono::steady_clock::now();
  const store::StoreStats split = engine.store_stats();
  const uint64_t read1 = split.pack_read_bytes;
  st.prefill_expert_bytes = read1 - read0;
  auto finish = [&] {
    const store::StoreStats end = engine.store_stats();
    st.decode_seconds = seconds_since(t0);
    st.prefill_tokens_per_second = st.prefill_seconds > 0 ? st.prompt_tokens / st.prefill_seconds : 0.0;
    st.decode_tokens_per_second = st.decode_seconds > 0 ? st.generated_tokens / st.decode_seconds : 0.0;
    st.session_tokens = session.tokens().size();
    st.decode_expert_bytes = end.pack_read_bytes - read1;
    st.decode_read_busy_ns = end.pack_read_ns - split.pack_read_ns;
    st.decode_read_full_ns = end.pack_read_full_ns - split.pack_read_full_ns;
    st.decode_expert_wait_ns = end.expert_wait_ns - split.expert_wait_ns;
    st.decode_store_idle_ns = end.store_disk_idle_ns - split.store_disk_idle_ns;
  };
  bool cancelled = false;
  try {
    for (uint32_t i = 0; i < params.max_new_tokens; ++i) {
      const int32_t tok = sample_next(session, params);
      session.append(std::span<const int32_t>(&tok, 1));
      ++st.generated_tokens;
      StopReason reason = StopReason::length;
      const int h = hook ? hook(tok, i, reason) : 0;
      if (h < 0) {
        st.stop_reason = StopReason::cancelled;
        cancelled = true;
        break;
      }
      if (h > 0) {
        st.stop_reason = reason;
        break;
      }
      if (std::find(params.stop_tokens.begin(), params.stop_tokens.end(), tok) != params.stop_tokens.end()) {
        st.stop_reason = StopReason::token;
        break;
      }
    }
  } catch (...) {
    finish();
    throw;
  }
  finish();
  if (cancelled) fail(Status::cancelled, "the callback stopped generation after {} tokens", st.generated_tokens);
}

}  // namespace ep::engine
