// libFuzzer target: ep-server's request parser (examples/server/request.cpp), the code every
// client's body reaches before anything else runs. The first input byte picks the endpoint
// (bits 2-3: 0 or 3 the generation endpoints, bit 0 then chat completions (0) or completions
// (1); 1 /tokenize; 2 /detokenize) and bit 1 the chat template (DeepSeek-V4 or Kimi-K3); the
// rest is the body. The tokenizer is the demo model's (models/demo-kjv-tokenizer.json).
// A refusal must be an ApiError with an HTTP status of 400, 404 or 413 and a message; a request
// that is taken must be one the scheduler can run: a prompt of 1..max_prompt_tokens ids inside
// the vocabulary, max_tokens in [1, limit], sampling values in their ranges, non-empty stop
// strings. Anything else (a crash, a sanitizer report, another exception, a broken rule:
// __builtin_trap) is a bug.
#include "request.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

namespace {

ep_tokenizer *demo_tokenizer() {
  static ep_tokenizer *tok = [] {
    ep_tokenizer *t = nullptr;
    if (ep_tokenizer_open(&t, EP_FUZZ_DEMO_TOKENIZER) != EP_OK) {
      std::fprintf(stderr, "request_fuzz: cannot open %s: %s\n", EP_FUZZ_DEMO_TOKENIZER, ep_last_error());
      std::abort();
    }
    return t;
  }();
  return tok;
}

void check_taken(const ep_server::ParsedRequest &p, const ep_server::RequestContext &ctx) {
  const ep_server::JobRequest &j = p.job;
  if (j.prompt.empty() || j.prompt.size() > ctx.limits.max_prompt_tokens) __builtin_trap();
  for (const int32_t id : j.prompt)
    if (id < 0 || static_cast<uint32_t>(id) >= ctx.vocab_size) __builtin_trap();
  if (j.snapshot_at > j.prompt.size()) __builtin_trap();
  // 0: the request names no max_tokens (the scheduler's admission gives it what the context and
  // the KV budget leave)
  if (j.max_tokens > ctx.limits.max_tokens) __builtin_trap();
  const ep_generate_options &o = j.sampling;
  if (!(o.temperature >= 0 && o.temperature <= 2) || !(o.top_p > 0 && o.top_p <= 1) || o.top_k < 0 || !(o.min_p >= 0 && o.min_p <= 1) ||
      !(o.repetition_penalty > 0))
    __builtin_trap();
  if (j.stop.size() > ctx.limits.max_stop) __builtin_trap();
  for (const std::string &s : j.stop)
    if (s.empty()) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  ep_server::RequestContext ctx;
  ctx.model_name = "demo-kjv";
  ctx.tokenizer = demo_tokenizer();
  ep_tokenizer_properties tp;
  ep_tokenizer_properties_init(&tp);
  if (ep_tokenizer_info(&tp, ctx.tokenizer) != EP_OK) __builtin_trap();
  ctx.vocab_size = tp.vocab_size;
  ctx.chat_template = (data[0] & 2) ? EP_CHAT_TEMPLATE_KIMI_K3 : EP_CHAT_TEMPLATE_DEEPSEEK_V4;
  ctx.limits.max_body_bytes = 65536;
  ctx.limits.max_prompt_tokens = 4096;
  ctx.limits.max_tokens = 256;
  const std::string body(reinterpret_cast<const char *>(data + 1), size - 1);
  try {
    const int endpoint = (data[0] >> 2) & 3;
    if (endpoint == 1) {
      const nlohmann::json r = ep_server::tokenize_request(body, ctx);
      for (const auto &id : r.at("tokens"))
        if (id.get<int64_t>() < 0 || id.get<int64_t>() >= ctx.vocab_size) __builtin_trap();
    } else if (endpoint == 2) {
      if (!ep_server::detokenize_request(body, ctx).at("content").is_string()) __builtin_trap();
    } else {
      const ep_server::ParsedRequest p =
          (data[0] & 1) ? ep_server::parse_completion_request(body, ctx) : ep_server::parse_chat_request(body, ctx);
      check_taken(p, ctx);
    }
  } catch (const ep_server::ApiError &e) {
    if ((e.status != 400 && e.status != 404 && e.status != 413) || e.message.empty()) __builtin_trap();
  }
  return 0;
}
