// Admission by memory: what a request's sessions may come to hold (its prompt and every token it
// may generate, in each of its n answers) against the model's context length and KV budget. A request that could never
// fit is refused before it is queued (HTTP 400, `context_length_exceeded`); one that fits the
// budget but not what is free now waits in the queue (Scheduler) until running requests finish
// or kept sessions are dropped.
#pragma once

#include <expertpack/expertpack.h>

#include "job.hpp"

#include <cstdint>

namespace ep_server {

class KvAdmission {
 public:
  /// Reads the context length and the KV budget of @p model (which must outlive this).
  explicit KvAdmission(const ep_model *model);

  uint64_t context_length() const { return context_length_; }  ///< 0: the model states none
  uint64_t budget_bytes() const { return budget_bytes_; }
  /// Tokens @p request's session holds at most: its prompt and its generated tokens but the last
  /// (a sampled token is appended only when another is asked for).
  static uint64_t max_session_tokens(const JobRequest &request);
  /// What a session of @p tokens tokens counts against the budget (ep_model_state_bytes).
  uint64_t session_bytes(uint64_t tokens) const;
  /// What one answer's session of @p request may come to count: session_bytes(max_session_tokens(request)).
  uint64_t answer_bytes(const JobRequest &request) const { return session_bytes(max_session_tokens(request)); }
  /// What @p request's sessions (one per answer, JobRequest::n) may come to count together.
  uint64_t request_bytes(const JobRequest &request) const { return request.n * answer_bytes(request); }
  /// The max_tokens of a request that gives none, as OpenAI's: what remains of the context length
  /// after @p request's prompt, at most @p cap (0: no cap) and at most what the KV budget can hold
  /// of its answers' sessions; 0 when not one token fits.
  uint32_t default_max_tokens(const JobRequest &request, uint32_t cap) const;
  /// Fills in @p request's max_tokens when it is 0 (the request gives none: default_max_tokens
  /// with @p cap), then throws ApiError 400 `context_length_exceeded` naming the limit and the
  /// request's tokens when its prompt and max_tokens exceed the context length, or when its
  /// sessions could outgrow the whole budget; @p prompt_param names the prompt's field
  /// ("messages", "prompt"), the `param` when the prompt alone is too long or max_tokens was not given.
  void admit(JobRequest &request, const char *prompt_param, uint32_t cap) const;

 private:
  const ep_model *model_;
  uint64_t context_length_ = 0, budget_bytes_ = 0;
};

}  // namespace ep_server
