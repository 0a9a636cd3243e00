// The OpenAI-style HTTP API: request parsing and validation into JobRequests, answers as JSON
// objects or server-sent events, errors as {"error": {message, type, param, code}}.
#pragma once

#include <expertpack/expertpack.h>

#include "metrics.hpp"
#include "reasoning.hpp"
#include "scheduler.hpp"

#include <cstdint>
#include <string>

namespace httplib {
class Server;
}

namespace ep_server {

struct Limits {
  size_t max_body_bytes = 4u << 20;  ///< request body
  uint32_t max_prompt_tokens = 8192; ///< tokens of a rendered prompt
  uint32_t max_tokens = 2048;        ///< max_tokens a request may ask for (and what it gets without one)
  size_t max_stop = 16;              ///< stop strings
  size_t max_json_depth = 64;        ///< nesting of the request's JSON
};

struct ApiContext {
  std::string model_name;            ///< the one model id the server answers to
  int64_t created = 0;               ///< the model's "created" time (Unix seconds)
  const ep_tokenizer *tokenizer = nullptr;
  uint32_t vocab_size = 0;           ///< the model's: a token id prompt is checked against it
  ep_chat_template chat_template = EP_CHAT_TEMPLATE_NONE;  ///< NONE: no chat endpoint
  int thinking = -1;                 ///< chat thinking when a request does not say: 1, 0, -1 the template's default
  float temperature = 1.0f;          ///< when a request does not say
  float top_p = 1.0f;
  Limits limits;
  std::string api_key;               ///< non-empty: /v1/* needs `Authorization: Bearer <key>`
  Scheduler *scheduler = nullptr;
  Metrics *metrics = nullptr;
};

/// Registers every endpoint, the error and exception handlers, authentication and the
/// per-request metrics on @p server. @p ctx must outlive the server.
void install_routes(httplib::Server &server, const ApiContext &ctx);

/// Whether the JSON text nests deeper than @p max_depth (scanned before parsing, so a deeply
/// nested body is refused without building it).
bool json_too_deep(const std::string &text, size_t max_depth);

}  // namespace ep_server
