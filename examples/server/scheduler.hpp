// Continuous batching on one model, in one thread: every step samples the next token of each
// running request (one ep_sessions_sample over all of them, each with the request's own
// settings; each request by itself with ep_session_sample when the batched call refuses one of
// them, so that only that one ends), then runs one
// ep_sessions_append over all of them together with the next prompt chunk of each request
// still being prefilled. New requests join at the next step; finished ones leave at once.
//
// A request's tokens do not depend on what it was batched with: the engine appends each
// session as it would alone, every request samples from its own session with its own seed,
// and a prompt's chunk boundaries depend only on the prompt and the session it continues from
// (never on the other requests of a step).
//
// Prompts are prefilled in chunks aligned to multiples of prefill_chunk tokens, which are the
// prefix cache's blocks (session_cache.hpp): at the block boundaries the cache plans for a
// request (where its prompt parts from an earlier one, the last one before where its
// conversation's next turn will part from it) the session's state is offered to the cache, and a
// later prompt that starts with a kept prefix continues from a fork of it and runs only the rest
// (Usage::cached_tokens). Because the chunks are the same with the cache on or off, a continued
// request computes exactly what it would from the start.
//
// n answers of one request: the prompt runs once; when it is done its session is forked into
// one slot per further answer, answer i sampling with the request's seed + i.
//
// Admission by memory: a queued request starts only when the sessions it may come to hold (its
// answers' at its prompt and max_tokens: KvAdmission::request_bytes) fit the model's KV budget
// beside what the running requests hold and may still grow into and what the kept prefix states
// hold; kept states are dropped, least recently used first, to make room, and otherwise the
// request waits (first come, first served: the ones behind it wait too) until running requests
// finish. A prefix state is kept only in memory no running request may need.
#pragma once

#include <expertpack/expertpack.h>

#include "handles.hpp"
#include "job.hpp"
#include "kv_admission.hpp"
#include "metrics.hpp"
#include "reasoning.hpp"
#include "session_cache.hpp"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

namespace ep_server {

struct SchedulerOptions {
  uint32_t parallel = 4;        ///< requests decoding together at most
  uint32_t prefill_chunk = 64;  ///< prompt tokens of one request per step at most, and the prefix cache's block
  uint32_t step_tokens = 256;   ///< prompt tokens of all requests per step at most (the first chunk always runs)
  uint64_t prefix_cache_bytes = uint64_t(1024) << 20;  ///< the prefix cache's budget of kept state (0: no reuse)
};

class Scheduler {
 public:
  /// @p model, @p tokenizer and @p metrics must outlive the scheduler; the thread starts here.
  Scheduler(ep_model *model, const ep_tokenizer *tokenizer, const ThinkingMarkers &markers, const SchedulerOptions &options,
            Metrics &metrics);
  ~Scheduler();
  Scheduler(const Scheduler &) = delete;
  Scheduler &operator=(const Scheduler &) = delete;

  /// The model's context length and KV budget, and what a request may need of them.
  const KvAdmission &kv() const { return kv_; }
  /// Queues @p job; false when the scheduler is shutting down.
  bool submit(std::shared_ptr<Job> job);
  /// Ends every request (HTTP 503, the server is shutting down) and stops the thread. Idempotent.
  void shutdown();

 private:
  struct Slot {
    std::shared_ptr<Job> job;
    SessionPtr session;
    size_t pos = 0;       // prompt tokens the session holds
    size_t reused = 0;    // of those, continued from a kept state
    uint64_t draws = 0;   // the session's sampler draw counter (this request's draws)
    std::vector<size_t> keep_at;  // prompt positions (block boundaries) whose state goes to the cache
    size_t choice = 0;    // the answer this slot samples (JobRequest::n); answers after the first are forks
    bool decoding = false;
    int32_t next = -1;    // the token sampled this step
    const int32_t *feed = nullptr;
    size_t feed_count = 0;
    TextStreamPtr content, reasoning;
    GrammarStatePtr grammar;  // JobRequest::grammar's state for this answer
    std::optional<ReasoningSplitter> splitter;
    Channel last_channel = Channel::markup;
    Usage usage;
    uint64_t kv_reserved = 0;  // what its session may come to count (KvAdmission::session_bytes at its prompt and
                               // max_tokens); the first answer's holds the other answers' too until they are forked
    std::chrono::steady_clock::time_point admitted, prefilled;
  };

  void run();
  void start(std::shared_ptr<Job> job);
  /// Opens @p slot's text streams and reasoning splitter; false (the slot failed) when it cannot.
  bool open_streams(Slot &slot);
  /// Once the first answer's prompt is run: forks of its session for the other answers, each
  /// holding one answer's room in the KV budget of what @p first held for all of them.
  std::vector<std::unique_ptr<Slot>> fork_answers(Slot &first);
  /// ep_session_sample (or, with JobRequest::logprobs, ep_session_sample_logprobs) with the
  /// request's settings, its answer's seed and its logit bias; the log-probabilities go to the job.
  ep_status sample(Slot &slot, int32_t &token);
  /// The ep_generate_options @p slot samples with: the request's, its answer's seed, its logit
  /// bias and its grammar state.
  ep_generate_options sampling_options(const Slot &slot) const;
  /// The job's log-probability entry for a sampled token (none for the token that ends the answer).
  void emit_logprobs(Slot &slot, const ep_token_logprobs &lp);
  /// Every slot of @p slots samples its next token into @p tokens, in one ep_sessions_sample;
  /// when that refuses, each by itself (sample()). Per slot, its status.
  std::vector<ep_status> sample_all(const std::vector<Slot *> &slots, std::vector<int32_t> &tokens);
  void step();
  bool on_token(Slot &slot, int32_t token);
  void finish(Slot &slot, FinishReason reason);
  void fail(Slot &slot, int status, const std::string &message);
  /// Ends a request the model failed on (HTTP 500, a message without the server's paths).
  void fail_by_model(Slot &slot, ep_status status);
  /// Runs @p slot's session again by itself (a new session with its tokens, the step's own and
  /// its sampler's position) after a batched step failed; the model's status.
  ep_status recompute(Slot &slot);
  /// Bytes the running requests may still grow into: per request, what it may come to count less
  /// what its session counts now.
  uint64_t kv_growth() const;
  /// Bytes of the KV budget neither counted by a session nor held for a running request's growth.
  uint64_t kv_unreserved() const;
  /// Whether the queue's first request may start now (kept sessions dropped to make room for it);
  /// fails it when nothing else holds memory and it still does not fit. @p starting: the bytes
  /// held for requests admitted in this round.
  bool admit_by_memory(const Job &job, uint64_t starting);
  void publish_load();

  ep_model *model_;
  const ep_tokenizer *tokenizer_;
  KvAdmission kv_;
  const Job *memory_waiter_ = nullptr;  // the queued request last held back for memory (counted once)
  ThinkingMarkers markers_;
  SchedulerOptions options_;
  Metrics &metrics_;
  int32_t eos_ = -1, end_of_turn_ = -1;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> pending_;
  bool stopping_ = false;

  // The scheduler thread's own.
  std::vector<std::unique_ptr<Slot>> slots_;
  PrefixCache cache_;
  uint64_t last_read_bytes_ = 0;

  std::thread thread_;  // last: starts after everything above is built
};

}  // namespace ep_server
