#include "metrics.hpp"

#include <cstdio>

namespace ep_server {

namespace {

void line(std::string &out, const char *name, const char *type, const char *help) {
  out += "# HELP ";
  out += name;
  out += ' ';
  out += help;
  out += "\n# TYPE ";
  out += name;
  out += ' ';
  out += type;
  out += '\n';
}

void value(std::string &out, const std::string &series, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, " %.17g\n", v);
  out += series;
  out += buf;
}

void value(std::string &out, const std::string &series, uint64_t v) {
  out += series;
  out += ' ';
  out += std::to_string(v);
  out += '\n';
}

void metric(std::string &out, const char *name, const char *type, const char *help, uint64_t v) {
  line(out, name, type, help);
  value(out, name, v);
}

}  // namespace

Metrics::Metrics() { ep_store_stats_init(&store_); }

void Metrics::http_request(const std::string &endpoint, int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++http_[{endpoint, status}];
}

void Metrics::step(const StepRecord &s) {
  std::lock_guard<std::mutex> lock(mu_);
  ++steps_;
  if (s.sequences > 1) ++batched_steps_;
  if (s.prefill_tokens && s.decode_tokens) ++mixed_steps_;
  step_sequences_ += s.sequences;
  step_prefill_tokens_ += s.prefill_tokens;
  step_decode_tokens_ += s.decode_tokens;
  step_seconds_ += s.seconds;
  if (s.sequences > max_sequences_) max_sequences_ = s.sequences;
  for (size_t i = 0; i < kSequenceBuckets.size(); ++i)
    if (s.sequences <= kSequenceBuckets[i]) ++sequence_buckets_[i];
  if (s.prefill_tokens && s.decode_tokens) expert_bytes_mixed_ += s.expert_bytes;
  else if (s.prefill_tokens) expert_bytes_prefill_ += s.expert_bytes;
  else expert_bytes_decode_ += s.expert_bytes;
}

void Metrics::job_admitted(uint32_t prompt_tokens, uint32_t cached_tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  ++admitted_;
  prompt_tokens_ += prompt_tokens;
  cached_tokens_ += cached_tokens;
  if (cached_tokens) ++reused_requests_;
}

void Metrics::job_finished(FinishReason reason, const Usage &usage) {
  std::lock_guard<std::mutex> lock(mu_);
  ++finished_[finish_reason_name(reason)];
  completion_tokens_ += usage.completion_tokens;
  reasoning_tokens_ += usage.reasoning_tokens;
}

void Metrics::set_load(size_t running, size_t waiting) {
  std::lock_guard<std::mutex> lock(mu_);
  running_ = running;
  waiting_ = waiting;
}

void Metrics::set_store(const ep_store_stats &stats) {
  std::lock_guard<std::mutex> lock(mu_);
  store_ = stats;
}

void Metrics::set_prefix_cache(const PrefixCache::Stats &stats) {
  std::lock_guard<std::mutex> lock(mu_);
  prefix_cache_ = stats;
}

void Metrics::set_kv(uint64_t budget_bytes, uint64_t in_use_bytes, uint64_t reserved_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  kv_budget_ = budget_bytes;
  kv_in_use_ = in_use_bytes;
  kv_reserved_ = reserved_bytes;
}

void Metrics::memory_wait() {
  std::lock_guard<std::mutex> lock(mu_);
  ++memory_waits_;
}

void Metrics::requests_recomputed(size_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  recomputed_ += n;
}

void Metrics::model_error() {
  std::lock_guard<std::mutex> lock(mu_);
  ++model_errors_;
}

void Metrics::connection_refused() {
  std::lock_guard<std::mutex> lock(mu_);
  ++connections_refused_;
}

void Metrics::connection_timed_out(const char *phase) {
  std::lock_guard<std::mutex> lock(mu_);
  ++(std::string(phase) == "header" ? header_timeouts_ : body_timeouts_);
}

Metrics::Health Metrics::health() const {
  std::lock_guard<std::mutex> lock(mu_);
  return Health{store_.io_errors, model_errors_};
}

std::string Metrics::render() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string o;
  line(o, "ep_server_http_requests_total", "counter", "HTTP requests answered, by endpoint and status.");
  for (const auto &[key, n] : http_)
    value(o, "ep_server_http_requests_total{endpoint=\"" + key.first + "\",status=\"" + std::to_string(key.second) + "\"}", n);

  metric(o, "ep_server_requests_running", "gauge", "Generation requests holding a batch slot.", running_);
  metric(o, "ep_server_requests_waiting", "gauge", "Generation requests waiting for a batch slot.", waiting_);
  metric(o, "ep_server_requests_admitted_total", "counter", "Generation requests that got a batch slot.", admitted_);
  line(o, "ep_server_requests_finished_total", "counter", "Generation requests finished, by reason (stop, length, cancelled, error).");
  for (const char *r : {"stop", "length", "cancelled", "error"}) {
    const auto it = finished_.find(r);
    value(o, std::string("ep_server_requests_finished_total{reason=\"") + r + "\"}", it == finished_.end() ? uint64_t{0} : it->second);
  }
  metric(o, "ep_server_prompt_tokens_total", "counter", "Prompt tokens of admitted requests.", prompt_tokens_);
  metric(o, "ep_server_prompt_tokens_cached_total", "counter", "Prompt tokens continued from kept prefix states instead of run again.", cached_tokens_);
  metric(o, "ep_server_requests_reused_total", "counter", "Requests that continued from a kept prefix state.", reused_requests_);
  metric(o, "ep_server_completion_tokens_total", "counter", "Tokens generated (sampled).", completion_tokens_);
  metric(o, "ep_server_reasoning_tokens_total", "counter", "Generated tokens in the reasoning channel.", reasoning_tokens_);

  metric(o, "ep_server_steps_total", "counter", "Forward passes of the scheduler (one ep_sessions_append each).", steps_);
  metric(o, "ep_server_steps_batched_total", "counter", "Steps that ran more than one sequence.", batched_steps_);
  metric(o, "ep_server_steps_mixed_total", "counter", "Steps that ran prompt chunks and decoded tokens together.", mixed_steps_);
  metric(o, "ep_server_step_sequences_max", "gauge", "The most sequences one step has run.", max_sequences_);
  line(o, "ep_server_step_sequences", "histogram", "Sequences per step.");
  for (size_t i = 0; i < kSequenceBuckets.size(); ++i)
    value(o, "ep_server_step_sequences_bucket{le=\"" + std::to_string(kSequenceBuckets[i]) + "\"}", sequence_buckets_[i]);
  value(o, "ep_server_step_sequences_bucket{le=\"+Inf\"}", steps_);
  value(o, "ep_server_step_sequences_sum", step_sequences_);
  value(o, "ep_server_step_sequences_count", steps_);
  line(o, "ep_server_step_tokens_total", "counter", "Tokens run by steps, by kind (prompt chunks, decoded tokens).");
  value(o, "ep_server_step_tokens_total{kind=\"prefill\"}", step_prefill_tokens_);
  value(o, "ep_server_step_tokens_total{kind=\"decode\"}", step_decode_tokens_);
  line(o, "ep_server_step_seconds_total", "counter", "Wall time inside steps.");
  value(o, "ep_server_step_seconds_total", step_seconds_);
  line(o, "ep_server_step_expert_bytes_total", "counter",
       "Expert Pack bytes read during steps, by what the step ran (prefill only, decode only, both).");
  value(o, "ep_server_step_expert_bytes_total{steps=\"prefill\"}", expert_bytes_prefill_);
  value(o, "ep_server_step_expert_bytes_total{steps=\"decode\"}", expert_bytes_decode_);
  value(o, "ep_server_step_expert_bytes_total{steps=\"mixed\"}", expert_bytes_mixed_);

  metric(o, "ep_server_requests_recomputed_total", "counter",
         "Requests run again without the others of a batched step that failed (an expert one of them routes to could not be read).",
         recomputed_);
  metric(o, "ep_server_model_errors_total", "counter", "Requests the model failed on by themselves (answered 500).", model_errors_);
  metric(o, "ep_server_connections_refused_total", "counter",
         "Connections refused (429) because their client address held --max-client-connections already.", connections_refused_);
  line(o, "ep_server_connection_timeouts_total", "counter",
       "Connections closed because a request's headers or body missed its deadline (--header-timeout, --body-timeout).");
  value(o, "ep_server_connection_timeouts_total{phase=\"header\"}", header_timeouts_);
  value(o, "ep_server_connection_timeouts_total{phase=\"body\"}", body_timeouts_);

  const PrefixCache::Stats &pc = prefix_cache_;
  metric(o, "ep_server_prefix_cache_hits_total", "counter", "Requests that continued from a kept prefix state.", pc.hits);
  metric(o, "ep_server_prefix_cache_misses_total", "counter", "Requests that found no kept prefix of their prompt (with the cache on).", pc.misses);
  metric(o, "ep_server_prefix_cache_hit_tokens_total", "counter", "Prompt tokens those hits did not run.", pc.hit_tokens);
  metric(o, "ep_server_prefix_cache_inserts_total", "counter", "Prefix states kept.", pc.inserts);
  metric(o, "ep_server_prefix_cache_evictions_total", "counter", "Kept prefix states dropped (least recently used) to make room.", pc.evictions);
  metric(o, "ep_server_prefix_cache_rejected_total", "counter", "Prefix states not kept because one alone exceeds the budget.", pc.rejected);
  metric(o, "ep_server_prefix_cache_kv_full_total", "counter",
         "Prefix states not kept because the model's KV budget had no room beside what running requests may need.", pc.kv_full);
  metric(o, "ep_server_prefix_cache_fork_failures_total", "counter",
         "Copies of a prefix state (to keep it, or for a request to continue it) the model refused for want of memory.", pc.fork_failures);
  metric(o, "ep_server_prefix_cache_entries", "gauge", "Kept prefix states.", pc.entries);
  metric(o, "ep_server_prefix_cache_bytes", "gauge", "Model device memory the kept prefix states hold (ep_session_state_bytes).", pc.bytes);
  metric(o, "ep_server_prefix_cache_budget_bytes", "gauge", "Their budget (--prefix-cache-mib; 0: the cache is off).", pc.budget_bytes);
  metric(o, "ep_server_kv_budget_bytes", "gauge", "The model's KV budget: what all sessions' decode state may take.", kv_budget_);
  metric(o, "ep_server_kv_in_use_bytes", "gauge", "Bytes of the KV budget the sessions (running and kept) count now.", kv_in_use_);
  metric(o, "ep_server_kv_reserved_bytes", "gauge", "Bytes the running requests may still grow into (held for them).", kv_reserved_);
  metric(o, "ep_server_memory_waits_total", "counter", "Queued requests held back until the KV budget had room.", memory_waits_);

  metric(o, "ep_store_acquires_total", "counter", "Calls that asked for one layer's routed experts.", store_.acquires);
  metric(o, "ep_store_pack_reads_total", "counter", "Reads of expert bytes (one per expert from a pack, one per role from source files).", store_.pack_reads);
  metric(o, "ep_store_pack_read_bytes_total", "counter", "Bytes those reads transferred (4096-aligned ranges).", store_.pack_read_bytes);
  line(o, "ep_store_pack_read_seconds_total", "counter", "Wall time with at least one pack read in flight.");
  value(o, "ep_store_pack_read_seconds_total", static_cast<double>(store_.pack_read_ns) * 1e-9);
  metric(o, "ep_store_cache_hits_total", "counter", "Unique experts of an acquire already resident.", store_.cache_hits);
  metric(o, "ep_store_cache_misses_total", "counter", "Unique experts of an acquire that were read.", store_.cache_misses);
  metric(o, "ep_store_cache_evictions_total", "counter", "Resident experts replaced.", store_.cache_evictions);
  metric(o, "ep_store_resident_experts", "gauge", "Experts resident now.", store_.resident_experts);
  metric(o, "ep_store_resident_bytes", "gauge", "Payload bytes of the resident experts.", store_.resident_bytes);
  metric(o, "ep_store_h2d_bytes_total", "counter", "Bytes copied from the staging ring into the expert cache.", store_.h2d_bytes);
  metric(o, "ep_store_io_errors_total", "counter", "Failed expert reads (read errors, and payloads that failed their check).", store_.io_errors);
  metric(o, "ep_store_fallbacks_total", "counter", "Reader degradations (pread pool, buffered reads).", store_.fallback_count);
  metric(o, "ep_store_cache_slots", "gauge", "Slots of the expert cache.", store_.cache_slots);
  metric(o, "ep_store_slot_bytes", "gauge", "Bytes of one expert cache slot.", store_.slot_bytes);
  metric(o, "ep_store_host_hits_total", "counter", "Cache misses served from the host-RAM tier (no pack read).", store_.host_hits);
  metric(o, "ep_store_host_misses_total", "counter", "Cache misses not in the host tier (read from the pack).", store_.host_misses);
  metric(o, "ep_store_demotions_total", "counter", "Experts evicted from the cache and kept in the host tier.", store_.demotions);
  metric(o, "ep_store_host_resident_bytes", "gauge", "Payload bytes held by the host tier.", store_.host_resident_bytes);
  metric(o, "ep_store_host_slots", "gauge", "Slots of the host tier (0: no tier).", store_.host_slots);
  metric(o, "ep_store_prefetch_issued_total", "counter", "Experts loaded ahead of their layer from a prediction.", store_.prefetch_issued);
  metric(o, "ep_store_prefetch_used_total", "counter", "Prefetched experts their layer then asked for.", store_.prefetch_used);
  return o;
}

}  // namespace ep_server
