#include "kv_admission.hpp"

#include "request.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>

namespace ep_server {

namespace {

std::string mib(uint64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f MiB", static_cast<double>(bytes) / 1048576.0);
  return text;
}

}  // namespace

KvAdmission::KvAdmission(const ep_model *model) : model_(model) {
  ep_model_properties p;
  ep_model_properties_init(&p);
  if (ep_model_info(&p, model) != EP_OK) throw std::runtime_error(std::string("ep_model_info: ") + ep_last_error());
  context_length_ = p.context_length;
  budget_bytes_ = p.kv_budget_bytes;
}

uint64_t KvAdmission::max_session_tokens(const JobRequest &request) {
  return request.prompt.size() + (request.max_tokens > 0 ? request.max_tokens - 1 : 0);
}

uint64_t KvAdmission::session_bytes(uint64_t tokens) const {
  uint64_t bytes = 0;
  if (ep_model_state_bytes(&bytes, model_, tokens) != EP_OK)
    throw std::runtime_error(std::string("ep_model_state_bytes: ") + ep_last_error());
  return bytes;
}

uint32_t KvAdmission::default_max_tokens(const JobRequest &request, uint32_t cap) const {
  const uint64_t prompt = request.prompt.size();
  uint64_t most = cap ? cap : UINT32_MAX;
  if (context_length_) most = std::min(most, context_length_ > prompt ? context_length_ - prompt : 0);
  // The most tokens whose sessions fit the budget: a session's bytes grow with its length.
  const auto fits = [&](uint64_t max_tokens) { return request.n * session_bytes(prompt + max_tokens - 1) <= budget_bytes_; };
  if (most == 0 || !fits(1)) return 0;
  uint64_t lo = 1, hi = most;  // fits(lo); the answer is in [lo, hi]
  while (lo < hi) {
    const uint64_t mid = lo + (hi - lo + 1) / 2;
    if (fits(mid)) lo = mid;
    else hi = mid - 1;
  }
  return static_cast<uint32_t>(lo);
}

void KvAdmission::admit(JobRequest &request, const char *prompt_param, uint32_t cap) const {
  const bool given = request.max_tokens > 0;
  if (!given) request.max_tokens = std::max<uint32_t>(default_max_tokens(request, cap), 1);  // 1: the 400 below names why
  const uint64_t prompt = request.prompt.size(), asked = prompt + request.max_tokens;
  const std::string tokens = std::to_string(asked) + " tokens (" + std::to_string(prompt) + " in the prompt, " +
                             std::to_string(request.max_tokens) + " in the completion)";
  if (context_length_ && asked > context_length_)
    throw ApiError{400,
                   "This model's maximum context length is " + std::to_string(context_length_) + " tokens. However, you requested " +
                       tokens + ". Please reduce the length of the prompt or max_tokens.",
                   !given || prompt > context_length_ ? prompt_param : "max_tokens", "context_length_exceeded"};
  const uint64_t need = request_bytes(request);
  if (need > budget_bytes_) {
    const std::string answers = request.n > 1 ? " in each of " + std::to_string(request.n) + " answers" : "";
    throw ApiError{400,
                   "This server's KV budget is " + mib(budget_bytes_) + " for all requests together. However, you requested " + tokens +
                       answers + ", whose decode state takes " + mib(need) + ". Please reduce the length of the prompt or max_tokens" +
                       (request.n > 1 ? ", or n." : "."),
                   !given || request.n * session_bytes(prompt) > budget_bytes_ ? prompt_param : "max_tokens", "context_length_exceeded"};
  }
}

}  // namespace ep_server
