// One generation request as the scheduler runs it: what to generate (JobRequest), and the
// output the HTTP side reads while it is produced (text deltas, then the result).
#pragma once

#include <expertpack/expertpack.h>

#include "handles.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace ep_server {

/// Where a generated token's text goes.
enum class Channel { content, reasoning, markup };

struct JobRequest {
  std::vector<int32_t> prompt;       ///< token ids to append before generating (at least one)
  size_t snapshot_at = 0;            ///< prompt position where a later request (the conversation's next turn) parts from this
                                     ///< prompt (0: the prompt's end): the prefix cache keeps the last block boundary before it
  ep_generate_options sampling{};    ///< temperature, top_k, top_p, min_p, seed, repetition penalty (read by ep_session_sample)
  uint32_t max_tokens = 16;          ///< tokens to generate at most (>= 1; 0 from the parser when the request gives none,
                                     ///< until KvAdmission::admit fills in the default)
  std::vector<std::string> stop;     ///< stop strings of the content
  bool ignore_eos = false;           ///< do not stop at EOS / end of turn
  bool split_reasoning = false;      ///< route thinking-marker spans to the reasoning channel (chat)
  bool start_in_reasoning = false;   ///< the prompt opened a thinking block (thinking on)
  bool tool_markup = false;          ///< the content keeps the tool-call format's markup tokens as text (tools offered)
  bool start_in_tool_calls = false;  ///< the prompt began a tool call (Kimi-K3: its response is closed)
  uint32_t n = 1;                    ///< answers (choices): the prompt runs once, answer i is a fork sampled with seed + i
  int32_t logprobs = -1;             ///< -1: none; else each token's log-probability and this many alternatives (0..20)
  std::vector<ep_logit_bias> logit_bias;  ///< added to the logits before sampling (the scheduler points sampling at it)
  GrammarPtr grammar;                ///< null, or response_format's grammar: each answer samples with a state of its own
};

/// A generated token's log-probability and its alternatives, as text (the model's raw
/// distribution: ep_token_logprobs).
struct TokenLogprob {
  struct Alternative {
    std::string token;
    float logprob = 0;
  };
  std::string token;
  float logprob = 0;
  std::vector<Alternative> top;
};

enum class FinishReason { stop, length, cancelled, error };
const char *finish_reason_name(FinishReason r);

/// Token counts and costs of one finished request.
struct Usage {
  uint32_t prompt_tokens = 0;
  uint32_t cached_tokens = 0;       ///< prompt tokens continued from a kept prefix state (not run again)
  uint32_t completion_tokens = 0;   ///< sampled tokens, a final stop token included
  uint32_t reasoning_tokens = 0;    ///< of those, in the reasoning channel
  uint64_t prefill_expert_bytes = 0;  ///< pack bytes read by the steps that ran this prompt (shared with the sequences batched with it)
  uint64_t decode_expert_bytes = 0;   ///< the same for the steps that ran its generated tokens
  double queue_ms = 0, prefill_ms = 0, decode_ms = 0;
};

struct JobResult {
  FinishReason finish = FinishReason::error;  ///< error, or the first answer's reason
  std::vector<FinishReason> choices;          ///< each answer's reason (without an error)
  int error_status = 0;             ///< HTTP status of an error
  std::string error_message;
  Usage usage;
};

/// Shared by the HTTP handler that made it and the scheduler that runs it.
class Job {
 public:
  explicit Job(JobRequest request)
      : request_(std::move(request)), created_(std::chrono::steady_clock::now()), pending_(request_.n), finished_(request_.n) {}
  Job(const Job &) = delete;
  Job &operator=(const Job &) = delete;

  const JobRequest &request() const { return request_; }
  std::chrono::steady_clock::time_point created() const { return created_; }

  /// Asks the scheduler to stop this request (the client went away); it notices at its next step.
  void cancel() { cancelled_.store(true, std::memory_order_relaxed); }
  bool cancelled() const { return cancelled_.load(std::memory_order_relaxed); }
  /// True once the job failed: its other answers stop.
  bool failed() const { return failed_.load(std::memory_order_relaxed); }

  /// One answer's output since the last take.
  struct Delta {
    std::string content, reasoning;
    std::vector<TokenLogprob> logprobs;  ///< the tokens sampled meanwhile (with JobRequest::logprobs)
    bool empty() const { return content.empty() && reasoning.empty() && logprobs.empty(); }
  };
  /// Waits up to @p timeout for output, appends what there is to @p deltas (one per answer,
  /// resized to JobRequest::n); true once the job is done and everything was taken.
  bool wait_take(std::chrono::milliseconds timeout, std::vector<Delta> &deltas);
  /// The result; only meaningful after wait_take() returned true.
  JobResult result() const;

  // Scheduler side; @p choice is the answer's index.
  void emit(size_t choice, Channel channel, std::string_view text);
  void emit_logprob(size_t choice, TokenLogprob entry);
  /// One answer ended; the job is done when every answer has. The usage counts the prompt once
  /// and the answers' tokens together.
  void finish(size_t choice, FinishReason reason, const Usage &usage);
  void fail(int http_status, std::string message, const Usage &usage);

 private:
  const JobRequest request_;
  const std::chrono::steady_clock::time_point created_;
  std::atomic<bool> cancelled_{false}, failed_{false};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Delta> pending_;
  std::vector<bool> finished_;
  size_t n_finished_ = 0;
  bool done_ = false;
  JobResult result_;
};

}  // namespace ep_server
