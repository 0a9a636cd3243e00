#include "scheduler.hpp"

#include <algorithm>
#include <cstdio>
#include <string>

namespace ep_server {

namespace {

using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); }

/// The prompt tokens of the chunk that starts at @p pos: up to the next multiple of @p chunk (the
/// prefix cache's blocks), so that a prompt is cut the same way whether it starts from the
/// beginning or from a kept block boundary.
size_t chunk_at(size_t pos, size_t prompt_size, size_t chunk) { return std::min(chunk - pos % chunk, prompt_size - pos); }

/// Where a text stream's pieces go: one channel of one job.
struct Sink {
  Job *job;
  Channel channel;
  size_t choice = 0;
};

int on_text(const char *piece, size_t length, void *payload) {
  const Sink &s = *static_cast<const Sink *>(payload);
  s.job->emit(s.choice, s.channel, std::string_view(piece, length));
  return 0;
}

/// A token's text for its log-probability entry (special tokens as their text; a token that is
/// part of a UTF-8 character shows U+FFFD, as the detokenizer writes invalid UTF-8).
std::string token_text(const ep_tokenizer *tokenizer, int32_t token) {
  size_t n = 0;
  if (ep_detokenize(nullptr, 0, &n, tokenizer, &token, 1, 0) != EP_OK) return {};
  std::string text(n + 1, '\0');
  if (ep_detokenize(text.data(), text.size(), &n, tokenizer, &token, 1, 0) != EP_OK) return {};
  text.resize(n);
  return text;
}

std::string api_error(const char *what) { return std::string(what) + ": " + ep_last_error(); }

/// What a client is told when the model fails on its request. The library's message names the
/// server's files (the pack, offsets), which are the operator's business: it goes to the log.
std::string client_message(ep_status status) {
  switch (status) {
    case EP_ERR_CORRUPT: return "an expert this request routes to failed its integrity check; the server's log names it";
    case EP_ERR_IO: return "an expert this request routes to could not be read; the server's log has the details";
    default: return std::string("the model failed on this request (") + ep_status_str(status) + "); the server's log has the details";
  }
}

void log_error(const std::string &what) {
  std::fprintf(stderr, "ep-server: %s\n", what.c_str());
  std::fflush(stderr);
}

}  // namespace

Scheduler::Scheduler(ep_model *model, const ep_tokenizer *tokenizer, const ThinkingMarkers &markers, const SchedulerOptions &options,
                     Metrics &metrics)
    : model_(model), tokenizer_(tokenizer), kv_(model), markers_(markers), options_(options), metrics_(metrics), cache_(options.prefill_chunk, options.prefix_cache_bytes) {
  ep_tokenizer_properties tp;
  ep_tokenizer_properties_init(&tp);
  if (ep_tokenizer_info(&tp, tokenizer) == EP_OK) {
    eos_ = tp.eos_id;
    end_of_turn_ = tp.end_of_turn_id;
  }
  ep_store_stats s;
  ep_store_stats_init(&s);
  if (ep_model_store_stats(&s, model_) == EP_OK) {
    last_read_bytes_ = s.pack_read_bytes;
    metrics_.set_store(s);
  }
  metrics_.set_prefix_cache(cache_.stats());
  uint64_t in_use = 0;
  if (ep_model_kv_in_use(&in_use, model_) == EP_OK) metrics_.set_kv(kv_.budget_bytes(), in_use, 0);
  thread_ = std::thread([this] { run(); });
}

Scheduler::~Scheduler() { shutdown(); }

bool Scheduler::submit(std::shared_ptr<Job> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return false;
    pending_.push_back(std::move(job));
  }
  cv_.notify_one();
  return true;
}

void Scheduler::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void Scheduler::publish_load() {
  size_t waiting = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    waiting = pending_.size();
  }
  metrics_.set_load(slots_.size(), waiting);
  metrics_.set_prefix_cache(cache_.stats());
  uint64_t in_use = 0;
  if (ep_model_kv_in_use(&in_use, model_) == EP_OK) metrics_.set_kv(kv_.budget_bytes(), in_use, kv_growth());
}

uint64_t Scheduler::kv_growth() const {
  uint64_t growth = 0;
  for (const auto &s : slots_) {
    uint64_t length = 0;
    if (!s->session || ep_session_length(&length, s->session.get()) != EP_OK) continue;
    const uint64_t now = kv_.session_bytes(length);
    if (s->kv_reserved > now) growth += s->kv_reserved - now;
  }
  return growth;
}

uint64_t Scheduler::kv_unreserved() const {
  uint64_t in_use = 0;
  if (ep_model_kv_in_use(&in_use, model_) != EP_OK) return 0;
  const uint64_t held = in_use + kv_growth();
  return held < kv_.budget_bytes() ? kv_.budget_bytes() - held : 0;
}

bool Scheduler::admit_by_memory(const Job &job, uint64_t starting) {
  const uint64_t need = kv_.request_bytes(job.request()) + starting;  // every answer's session
  while (kv_unreserved() < need)
    if (!cache_.evict_oldest()) break;
  if (kv_unreserved() >= need) return true;
  if (&job != memory_waiter_) {
    memory_waiter_ = &job;
    metrics_.memory_wait();
  }
  return false;
}

void Scheduler::run() {
  for (;;) {
    std::vector<std::shared_ptr<Job>> admitted;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !pending_.empty() || !slots_.empty(); });
      if (stopping_) break;
      uint64_t starting = 0;
      while (!pending_.empty() && slots_.size() + admitted.size() < options_.parallel) {
        Job &next = *pending_.front();
        if (!next.cancelled() && !admit_by_memory(next, starting)) {
          if (!slots_.empty() || !admitted.empty()) break;  // it waits for running requests to finish
          // Nothing of this server's holds memory and it still does not fit: it never will.
          const Usage none;
          const uint64_t tokens = KvAdmission::max_session_tokens(next.request());
          const uint32_t n = next.request().n;
          next.fail(400,
                    "the model's KV budget has no room for this request's " + std::to_string(tokens) + " tokens" +
                        (n > 1 ? " in each of " + std::to_string(n) + " answers" : ""),
                    none);
          metrics_.job_finished(FinishReason::error, none);
          pending_.pop_front();
          continue;
        }
        if (!next.cancelled()) starting += kv_.request_bytes(next.request());
        admitted.push_back(std::move(pending_.front()));
        pending_.pop_front();
      }
    }
    for (auto &job : admitted) start(std::move(job));
    step();
    publish_load();
  }
  const Usage none;
  for (auto &slot : slots_) fail(*slot, 503, "the server is shutting down");
  slots_.clear();
  std::deque<std::shared_ptr<Job>> left;
  {
    std::lock_guard<std::mutex> lock(mu_);
    left.swap(pending_);
  }
  for (auto &job : left) job->fail(503, "the server is shutting down", none);
  publish_load();
}

void Scheduler::start(std::shared_ptr<Job> job) {
  auto slot = std::make_unique<Slot>();
  slot->job = std::move(job);
  slot->admitted = Clock::now();
  const JobRequest &r = slot->job->request();
  slot->usage.prompt_tokens = static_cast<uint32_t>(r.prompt.size());
  slot->usage.queue_ms = ms_between(slot->job->created(), slot->admitted);
  if (slot->job->cancelled()) {
    for (size_t i = 0; i < slot->job->request().n; ++i) slot->job->finish(i, FinishReason::cancelled, slot->usage);
    metrics_.job_finished(FinishReason::cancelled, slot->usage);
    return;
  }
  PrefixCache::Fork fork = cache_.fork_longest_prefix(r.prompt);
  if (fork.session) {
    slot->session = std::move(fork.session);
    slot->pos = slot->reused = fork.length;
  } else {
    ep_session *s = nullptr;
    if (ep_session_open(&s, model_) != EP_OK) {
      log_error(api_error("cannot open a session"));
      fail(*slot, 500, "the server could not open a session for this request (out of memory?); its log has the details");
      return;
    }
    slot->session.reset(s);
  }
  slot->kv_reserved = kv_.request_bytes(r);  // every answer's, until the others are forked
  slot->usage.cached_tokens = static_cast<uint32_t>(slot->reused);
  slot->keep_at = cache_.plan(r.prompt, slot->pos, r.snapshot_at ? r.snapshot_at : r.prompt.size());
  if (!open_streams(*slot)) return;
  metrics_.job_admitted(slot->usage.prompt_tokens, slot->usage.cached_tokens);
  if (slot->pos == r.prompt.size()) {  // the whole prompt was kept: its logits are in the fork
    slot->decoding = true;
    slot->prefilled = slot->admitted;
  }
  std::vector<std::unique_ptr<Slot>> more;
  if (slot->decoding) more = fork_answers(*slot);
  slots_.push_back(std::move(slot));
  for (auto &m : more) slots_.push_back(std::move(m));
}

bool Scheduler::open_streams(Slot &slot) {
  const JobRequest &r = slot.job->request();
  std::vector<const char *> stops;
  for (const std::string &s : r.stop) stops.push_back(s.c_str());
  ep_text_stream *content = nullptr, *reasoning = nullptr;
  if (ep_text_stream_open(&content, tokenizer_, stops.data(), stops.size()) != EP_OK ||
      ep_text_stream_open(&reasoning, tokenizer_, nullptr, 0) != EP_OK) {
    ep_text_stream_close(content);
    fail(slot, 400, api_error("stop"));
    return false;
  }
  slot.content.reset(content);
  slot.reasoning.reset(reasoning);
  if (r.grammar) {
    ep_grammar_state *state = nullptr;
    if (ep_grammar_state_open(&state, r.grammar.get()) != EP_OK) {
      log_error(api_error("cannot open a grammar state"));
      fail(slot, 500, "the server could not start this request's response_format grammar (out of memory?); its log has the details");
      return false;
    }
    slot.grammar.reset(state);
  }
  if (r.split_reasoning) slot.splitter.emplace(markers_, tokenizer_, r.start_in_reasoning, r.tool_markup, r.start_in_tool_calls);
  slot.last_channel = r.start_in_reasoning ? Channel::reasoning : Channel::content;
  return true;
}

std::vector<std::unique_ptr<Scheduler::Slot>> Scheduler::fork_answers(Slot &first) {
  std::vector<std::unique_ptr<Slot>> out;
  const uint32_t n = first.job->request().n;
  // From here each answer holds its own room in the KV budget (the first held all of it so far).
  first.kv_reserved = kv_.answer_bytes(first.job->request());
  for (size_t i = 1; i < n; ++i) {
    auto slot = std::make_unique<Slot>();
    slot->job = first.job;
    slot->choice = i;
    slot->kv_reserved = first.kv_reserved;
    ep_session *copy = nullptr;
    if (ep_session_fork(&copy, first.session.get()) != EP_OK) {
      log_error(api_error("cannot fork a session for an answer"));
      fail(*slot, 500, "the server could not open a session for this request's answers (out of memory?); its log has the details");
      break;
    }
    slot->session.reset(copy);
    slot->pos = first.pos;
    slot->reused = first.reused;
    slot->draws = first.draws;
    slot->decoding = true;
    slot->usage = first.usage;
    slot->admitted = first.admitted;
    slot->prefilled = first.prefilled;
    if (!open_streams(*slot)) break;
    out.push_back(std::move(slot));
  }
  return out;
}

ep_generate_options Scheduler::sampling_options(const Slot &slot) const {
  const JobRequest &r = slot.job->request();
  ep_generate_options o = r.sampling;
  o.seed += slot.choice;  // answer i: seed + i (unsigned, wraps)
  o.logit_bias = r.logit_bias.empty() ? nullptr : r.logit_bias.data();
  o.n_logit_bias = r.logit_bias.size();
  o.grammar = slot.grammar.get();
  return o;
}

void Scheduler::emit_logprobs(Slot &slot, const ep_token_logprobs &lp) {
  const JobRequest &r = slot.job->request();
  // The token that ends the answer at EOS / end of turn is not part of it: no entry.
  if (!r.ignore_eos && (lp.token == eos_ || lp.token == end_of_turn_)) return;
  TokenLogprob entry;
  entry.token = token_text(tokenizer_, lp.token);
  entry.logprob = lp.logprob;
  for (uint32_t i = 0; i < lp.n_top; ++i) entry.top.push_back({token_text(tokenizer_, lp.top_tokens[i]), lp.top_logprobs[i]});
  slot.job->emit_logprob(slot.choice, std::move(entry));
}

ep_status Scheduler::sample(Slot &slot, int32_t &token) {
  const JobRequest &r = slot.job->request();
  const ep_generate_options o = sampling_options(slot);
  if (r.logprobs < 0) return ep_session_sample(&token, slot.session.get(), &o);
  ep_token_logprobs lp;
  ep_token_logprobs_init(&lp);
  if (const ep_status st = ep_session_sample_logprobs(&lp, slot.session.get(), &o, static_cast<uint32_t>(r.logprobs)); st != EP_OK)
    return st;
  token = lp.token;
  emit_logprobs(slot, lp);
  return EP_OK;
}

std::vector<ep_status> Scheduler::sample_all(const std::vector<Slot *> &slots, std::vector<int32_t> &tokens) {
  const size_t n = slots.size();
  tokens.assign(n, -1);
  std::vector<ep_status> status(n, EP_OK);
  if (n == 0) return status;
  std::vector<ep_session *> sessions(n);
  std::vector<ep_generate_options> options(n);
  std::vector<const ep_generate_options *> option_ptrs(n);
  std::vector<ep_token_logprobs> lps(n);
  std::vector<ep_token_logprobs *> lp_ptrs(n, nullptr);
  std::vector<uint32_t> top(n, 0);
  for (size_t i = 0; i < n; ++i) {
    const JobRequest &r = slots[i]->job->request();
    sessions[i] = slots[i]->session.get();
    options[i] = sampling_options(*slots[i]);
    option_ptrs[i] = &options[i];
    if (r.logprobs >= 0) {
      ep_token_logprobs_init(&lps[i]);
      lp_ptrs[i] = &lps[i];
      top[i] = static_cast<uint32_t>(r.logprobs);
    }
  }
  if (ep_sessions_sample(tokens.data(), lp_ptrs.data(), sessions.data(), option_ptrs.data(), top.data(), n) == EP_OK) {
    for (size_t i = 0; i < n; ++i)
      if (lp_ptrs[i]) emit_logprobs(*slots[i], lps[i]);
    return status;
  }
  // A refused batched call changes nothing (no draw counter, no grammar state): each request
  // samples by itself, so that only the one the sampler refuses ends.
  if (n > 1) log_error(api_error("batched sampling failed (each request samples by itself)"));
  for (size_t i = 0; i < n; ++i)
    if ((status[i] = sample(*slots[i], tokens[i])) != EP_OK) log_error(api_error("sampling"));
  return status;
}

bool Scheduler::on_token(Slot &slot, int32_t token) {
  const JobRequest &r = slot.job->request();
  ++slot.usage.completion_tokens;
  if (!r.ignore_eos && token >= 0 && (token == eos_ || token == end_of_turn_)) {
    finish(slot, FinishReason::stop);
    return false;
  }
  const Channel channel = slot.splitter ? slot.splitter->route(token) : Channel::content;
  if (channel != Channel::markup && channel != slot.last_channel) {
    // Leaving the reasoning: what its stream held back (an incomplete character) ends with it.
    if (slot.last_channel == Channel::reasoning) {
      Sink sink{slot.job.get(), Channel::reasoning, slot.choice};
      ep_text_stream_finish(slot.reasoning.get(), on_text, &sink, nullptr);
      ep_text_stream *fresh = nullptr;
      if (ep_text_stream_open(&fresh, tokenizer_, nullptr, 0) != EP_OK) {
        log_error(api_error("text stream"));
        fail(slot, 500, "the server could not open a text stream; its log has the details");
        return false;
      }
      slot.reasoning.reset(fresh);
    }
    slot.last_channel = channel;
  }
  if (channel == Channel::reasoning) {
    ++slot.usage.reasoning_tokens;
    Sink sink{slot.job.get(), Channel::reasoning, slot.choice};
    ep_text_stream_push(slot.reasoning.get(), token, on_text, &sink, nullptr);
  } else if (channel == Channel::content && r.tool_markup && markers_.is_tool_markup(token)) {
    // A special token of the tool-call markup: a text stream leaves it out, so the text before
    // it is let out (a fresh stream goes on after it) and its own text follows.
    Sink sink{slot.job.get(), Channel::content, slot.choice};
    int32_t stopped = 0;
    ep_text_stream_finish(slot.content.get(), on_text, &sink, &stopped);
    if (stopped) {
      finish(slot, FinishReason::stop);
      return false;
    }
    std::vector<const char *> stops;
    for (const std::string &s : r.stop) stops.push_back(s.c_str());
    ep_text_stream *fresh = nullptr;
    if (ep_text_stream_open(&fresh, tokenizer_, stops.data(), stops.size()) != EP_OK) {
      log_error(api_error("text stream"));
      fail(slot, 500, "the server could not open a text stream; its log has the details");
      return false;
    }
    slot.content.reset(fresh);
    char text[64];
    size_t n = 0;
    if (ep_detokenize(text, sizeof text, &n, tokenizer_, &token, 1, 0) == EP_OK && n < sizeof text) slot.job->emit(slot.choice, Channel::content, {text, n});
  } else if (channel == Channel::content) {
    Sink sink{slot.job.get(), Channel::content, slot.choice};
    int32_t stopped = 0;
    ep_text_stream_push(slot.content.get(), token, on_text, &sink, &stopped);
    if (stopped) {
      finish(slot, FinishReason::stop);
      return false;
    }
  }
  if (slot.usage.completion_tokens >= r.max_tokens) {
    finish(slot, FinishReason::length);
    return false;
  }
  return true;
}

void Scheduler::finish(Slot &slot, FinishReason reason) {
  if (reason == FinishReason::stop || reason == FinishReason::length) {
    Sink rs{slot.job.get(), Channel::reasoning, slot.choice};
    ep_text_stream_finish(slot.reasoning.get(), on_text, &rs, nullptr);
    Sink cs{slot.job.get(), Channel::content, slot.choice};
    int32_t stopped = 0;
    ep_text_stream_finish(slot.content.get(), on_text, &cs, &stopped);
    if (stopped) reason = FinishReason::stop;
  }
  const Clock::time_point now = Clock::now();
  if (slot.decoding) {
    slot.usage.prefill_ms = ms_between(slot.admitted, slot.prefilled);
    slot.usage.decode_ms = ms_between(slot.prefilled, now);
  } else {
    slot.usage.prefill_ms = ms_between(slot.admitted, now);
  }
  slot.job->finish(slot.choice, reason, slot.usage);
  metrics_.job_finished(reason, slot.usage);
  slot.session.reset();
}

void Scheduler::fail_by_model(Slot &slot, ep_status status) {
  metrics_.model_error();
  fail(slot, 500, client_message(status));
}

ep_status Scheduler::recompute(Slot &slot) {
  // Its tokens before the failed step (a failed append leaves a session's tokens as they were).
  size_t n = 0;
  if (ep_session_tokens(nullptr, 0, &n, slot.session.get()) != EP_OK) return EP_ERR_INTERNAL;
  std::vector<int32_t> history(n);
  if (n && ep_session_tokens(history.data(), history.size(), &n, slot.session.get()) != EP_OK) return EP_ERR_INTERNAL;
  // Its state goes first: it counts against the KV budget, which the new one needs.
  slot.session.reset();
  // From a kept state that is a prefix of its prompt (of the prompt only: generated tokens ran
  // one at a time, and a kept state ran them as a prompt chunk).
  const JobRequest &r = slot.job->request();
  const size_t prompt_end = std::min(history.size(), r.prompt.size());
  PrefixCache::Fork from = cache_.fork_longest_prefix(std::span<const int32_t>(history.data(), prompt_end), false);
  if (!from.session) {
    ep_session *fresh = nullptr;
    if (ep_session_open(&fresh, model_) != EP_OK) return EP_ERR_OUT_OF_MEMORY;
    from = {SessionPtr(fresh), 0};
  }
  ep_session *one = from.session.get();
  auto append = [&](const int32_t *tokens, size_t count) {
    const ep_status st = ep_sessions_append(&one, &tokens, &count, 1);
    return st;
  };
  // The prompt in the chunks the step cuts it into (aligned to the blocks, as the first time),
  // each generated token by itself, then the failed step's tokens.
  size_t pos = from.length;
  while (pos < prompt_end) {
    const size_t k = chunk_at(pos, prompt_end, options_.prefill_chunk);
    if (const ep_status st = append(history.data() + pos, k); st != EP_OK) return st;
    pos += k;
  }
  for (; pos < history.size(); ++pos)
    if (const ep_status st = append(history.data() + pos, 1); st != EP_OK) return st;
  if (const ep_status st = append(slot.feed, slot.feed_count); st != EP_OK) return st;
  // The sampler's draw counter where it was, so that a seeded request draws as it would have.
  if (const ep_status st = ep_session_set_draw_count(one, slot.draws); st != EP_OK) return st;
  slot.session = std::move(from.session);
  return EP_OK;
}

void Scheduler::fail(Slot &slot, int status, const std::string &message) {
  slot.job->fail(status, message, slot.usage);
  metrics_.job_finished(FinishReason::error, slot.usage);
  slot.session.reset();
}

void Scheduler::step() {
  // Requests whose client went away leave first, and the other answers of a request that failed.
  std::erase_if(slots_, [&](const std::unique_ptr<Slot> &s) {
    if (s->job->failed()) return true;
    if (!s->job->cancelled()) return false;
    finish(*s, FinishReason::cancelled);
    return true;
  });

  // Each decoding request's next token, from its own logits and settings: every one in one
  // ep_sessions_sample (one sampling launch and one download for the step).
  std::vector<Slot *> decoding;
  for (auto &s : slots_) {
    s->feed = nullptr;
    s->feed_count = 0;
    if (s->decoding) decoding.push_back(s.get());
  }
  std::vector<int32_t> sampled;
  const std::vector<ep_status> sample_status = sample_all(decoding, sampled);
  std::vector<bool> ended(decoding.size(), false);
  for (size_t i = 0; i < decoding.size(); ++i) {
    Slot &s = *decoding[i];
    if (sample_status[i] != EP_OK) {
      fail(s, 500, "sampling failed; the server's log has the details");
      ended[i] = true;
      continue;
    }
    ++s.draws;
    if (!on_token(s, sampled[i])) {
      ended[i] = true;
      continue;
    }
    s.next = sampled[i];
    s.feed = &s.next;
    s.feed_count = 1;
  }
  std::erase_if(slots_, [&](const std::unique_ptr<Slot> &s) {
    const auto it = std::find(decoding.begin(), decoding.end(), s.get());
    return it != decoding.end() && ended[static_cast<size_t>(it - decoding.begin())];
  });

  // The next chunk of each prompt still being run, as the step's budget allows.
  size_t prefill_tokens = 0, decode_tokens = 0;
  for (auto &s : slots_) {
    if (s->decoding) {
      ++decode_tokens;
      continue;
    }
    const JobRequest &r = s->job->request();
    const size_t n = chunk_at(s->pos, r.prompt.size(), options_.prefill_chunk);
    if (prefill_tokens > 0 && prefill_tokens + n > options_.step_tokens) continue;  // whole chunks only: waits for the next step
    s->feed = r.prompt.data() + s->pos;
    s->feed_count = n;
    prefill_tokens += n;
  }

  std::vector<ep_session *> sessions;
  std::vector<const int32_t *> tokens;
  std::vector<size_t> counts;
  for (auto &s : slots_) {
    if (!s->feed_count) continue;
    sessions.push_back(s->session.get());
    tokens.push_back(s->feed);
    counts.push_back(s->feed_count);
  }
  if (sessions.empty()) return;

  const Clock::time_point t0 = Clock::now();
  const ep_status st = ep_sessions_append(sessions.data(), tokens.data(), counts.data(), sessions.size());
  StepRecord rec;
  rec.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  rec.sequences = sessions.size();
  rec.prefill_tokens = prefill_tokens;
  rec.decode_tokens = decode_tokens;
  ep_store_stats ss;
  ep_store_stats_init(&ss);
  if (ep_model_store_stats(&ss, model_) == EP_OK) {
    rec.expert_bytes = ss.pack_read_bytes - last_read_bytes_;
    last_read_bytes_ = ss.pack_read_bytes;
    metrics_.set_store(ss);
  }
  metrics_.step(rec);

  if (st != EP_OK) {
    // The engine leaves every session of a failed call to be reset. One request's fault (an
    // expert it routes to fails its check) must not end the others: each is run again by
    // itself, and only those the model fails on alone end.
    log_error(api_error(sessions.size() > 1 ? "a batched step failed (its requests run again one by one)" : "a step failed"));
    size_t recomputed = 0;
    std::erase_if(slots_, [&](const std::unique_ptr<Slot> &s) {
      if (!s->feed_count) return false;
      if (sessions.size() > 1) {
        const ep_status alone = recompute(*s);
        if (alone == EP_OK) {
          ++recomputed;
          return false;
        }
        log_error(api_error("a request failed by itself"));
        fail_by_model(*s, alone);
      } else {
        fail_by_model(*s, st);
      }
      return true;
    });
    metrics_.requests_recomputed(recomputed);
    if (recomputed == 0) return;
  }
  const Clock::time_point now = Clock::now();
  std::vector<std::unique_ptr<Slot>> answers;
  for (auto &s : slots_) {
    if (!s->feed_count) continue;
    if (s->decoding) {
      s->usage.decode_expert_bytes += rec.expert_bytes;
      continue;
    }
    const JobRequest &r = s->job->request();
    s->usage.prefill_expert_bytes += rec.expert_bytes;
    s->pos += s->feed_count;
    if (std::find(s->keep_at.begin(), s->keep_at.end(), s->pos) != s->keep_at.end())
      cache_.offer(std::span<const int32_t>(r.prompt.data(), s->pos), s->session.get(), kv_.session_bytes(s->pos), kv_unreserved());
    if (s->pos == r.prompt.size()) {
      s->decoding = true;
      s->prefilled = now;
      for (auto &a : fork_answers(*s)) answers.push_back(std::move(a));
    }
  }
  for (auto &a : answers) slots_.push_back(std::move(a));
}

}  // namespace ep_server
