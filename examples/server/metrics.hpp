// The server's counters, rendered as Prometheus text for GET /metrics: HTTP requests, the
// scheduler's steps (sequences and tokens per step), requests' tokens, the prefix cache, the
// model's expert store (ep_model_store_stats, as the scheduler last read it), and the KV budget
// (ep_model_kv_in_use, the running requests' reservations).
#pragma once

#include <expertpack/expertpack.h>

#include "job.hpp"
#include "session_cache.hpp"

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

namespace ep_server {

/// One forward pass of the scheduler: ep_sessions_append over @c sequences sessions.
struct StepRecord {
  size_t sequences = 0;
  size_t prefill_tokens = 0, decode_tokens = 0;
  uint64_t expert_bytes = 0;  ///< pack bytes read during the step
  double seconds = 0;
};

class Metrics {
 public:
  Metrics();
  void http_request(const std::string &endpoint, int status);
  void step(const StepRecord &step);
  void job_admitted(uint32_t prompt_tokens, uint32_t cached_tokens);
  void job_finished(FinishReason reason, const Usage &usage);
  void set_load(size_t running, size_t waiting);
  void set_store(const ep_store_stats &stats);
  void set_prefix_cache(const PrefixCache::Stats &stats);
  /// The model's KV budget, what its sessions count now (ep_model_kv_in_use) and what the running
  /// requests may still grow into (reserved beyond what they hold).
  void set_kv(uint64_t budget_bytes, uint64_t in_use_bytes, uint64_t reserved_bytes);
  /// A queued request held back because its session would not fit what the budget has free.
  void memory_wait();
  /// A batched step failed and @p n of its requests were run again without the failing ones.
  void requests_recomputed(size_t n);
  /// A request the model failed on alone (an expert it routes to could not be read).
  void model_error();
  /// A connection refused because its client address held the most connections allowed.
  void connection_refused();
  /// A request whose headers or body (@p phase "header" / "body") missed their deadline.
  void connection_timed_out(const char *phase);

  /// What /health reports.
  struct Health {
    uint64_t store_io_errors = 0;  ///< the expert store's failed reads (ep_store_stats::io_errors)
    uint64_t model_errors = 0;     ///< requests failed by the model alone
  };
  Health health() const;
  std::string render() const;

  /// Bucket bounds of the sequences-per-step histogram.
  static constexpr std::array<size_t, 8> kSequenceBuckets = {1, 2, 4, 8, 16, 32, 64, 128};

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> http_;
  uint64_t steps_ = 0, batched_steps_ = 0, mixed_steps_ = 0, step_sequences_ = 0, step_prefill_tokens_ = 0, step_decode_tokens_ = 0;
  std::array<uint64_t, kSequenceBuckets.size()> sequence_buckets_{};
  uint64_t expert_bytes_prefill_ = 0, expert_bytes_decode_ = 0, expert_bytes_mixed_ = 0;
  double step_seconds_ = 0;
  size_t max_sequences_ = 0;
  uint64_t admitted_ = 0, prompt_tokens_ = 0, cached_tokens_ = 0, reused_requests_ = 0;
  std::map<std::string, uint64_t> finished_;
  uint64_t completion_tokens_ = 0, reasoning_tokens_ = 0;
  size_t running_ = 0, waiting_ = 0;
  ep_store_stats store_{};
  PrefixCache::Stats prefix_cache_;
  uint64_t kv_budget_ = 0, kv_in_use_ = 0, kv_reserved_ = 0, memory_waits_ = 0;
  uint64_t recomputed_ = 0, model_errors_ = 0, connections_refused_ = 0, header_timeouts_ = 0, body_timeouts_ = 0;
};

}  // namespace ep_server
