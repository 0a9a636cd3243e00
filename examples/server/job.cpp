#include "job.hpp"

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

bool Job::wait_take(std::chrono::milliseconds timeout, Delta &delta) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return done_ || !pending_.empty(); });
  delta.content += std::move(pending_.content);
  delta.reasoning += std::move(pending_.reasoning);
  pending_ = Delta{};
  return done_;
}

JobResult Job::result() const {
  std::lock_guard<std::mutex> lock(mu_);
  return result_;
}

void Job::emit(Channel channel, std::string_view text) {
  if (channel == Channel::markup || text.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    (channel == Channel::reasoning ? pending_.reasoning : pending_.content).append(text);
  }
  cv_.notify_all();
}

void Job::finish(FinishReason reason, const Usage &usage) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return;
    result_.finish = reason;
    result_.usage = usage;
    done_ = true;
  }
  cv_.notify_all();
}

void Job::fail(int http_status, std::string message, const Usage &usage) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return;
    result_.finish = FinishReason::error;
    result_.error_status = http_status;
    result_.error_message = std::move(message);
    result_.usage = usage;
    done_ = true;
  }
  cv_.notify_all();
}

}  // namespace ep_server
