#include "job.hpp"

#include <algorithm>
#include <iterator>

namespace ep_server {

const char *finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::stop: return "stop";
    case FinishReason::length: return "length";
    case FinishReason::cancelled: return "cancelled";
    case FinishReason::error: return "error";
  }
  return "error";
}

bool Job::wait_take(std::chrono::milliseconds timeout, std::vector<Delta> &deltas) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] {
    return done_ || std::any_of(pending_.begin(), pending_.end(), [](const Delta &d) { return !d.empty(); });
  });
  deltas.resize(pending_.size());
  for (size_t i = 0; i < pending_.size(); ++i) {
    Delta &p = pending_[i], &d = deltas[i];
    d.content += p.content;
    d.reasoning += p.reasoning;
    d.logprobs.insert(d.logprobs.end(), std::make_move_iterator(p.logprobs.begin()), std::make_move_iterator(p.logprobs.end()));
    p = Delta{};
  }
  return done_;
}

JobResult Job::result() const {
  std::lock_guard<std::mutex> lock(mu_);
  return result_;
}

void Job::emit(size_t choice, Channel channel, std::string_view text) {
  if (channel == Channel::markup || text.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    (channel == Channel::reasoning ? pending_[choice].reasoning : pending_[choice].content).append(text);
  }
  cv_.notify_all();
}

void Job::emit_logprob(size_t choice, TokenLogprob entry) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_[choice].logprobs.push_back(std::move(entry));
  }
  cv_.notify_all();
}

void Job::finish(size_t choice, FinishReason reason, const Usage &usage) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_ || finished_[choice]) return;
    finished_[choice] = true;
    if (result_.choices.empty()) {
      result_.choices.assign(pending_.size(), FinishReason::cancelled);
      result_.usage = usage;  // the prompt's counts and times: every answer shares them
    } else {
      Usage &u = result_.usage;
      u.completion_tokens += usage.completion_tokens;
      u.reasoning_tokens += usage.reasoning_tokens;
      u.decode_expert_bytes += usage.decode_expert_bytes;
      u.decode_ms = std::max(u.decode_ms, usage.decode_ms);
    }
    result_.choices[choice] = reason;
    if (++n_finished_ < pending_.size()) return;
    result_.finish = result_.choices[0];
    done_ = true;
  }
  cv_.notify_all();
}

void Job::fail(int http_status, std::string message, const Usage &usage) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return;
    failed_.store(true, std::memory_order_relaxed);
    result_.finish = FinishReason::error;
    result_.error_status = http_status;
    result_.error_message = std::move(message);
    result_.usage = usage;
    done_ = true;
  }
  cv_.notify_all();
}

}  // namespace ep_server
