// The OpenAI-style HTTP API: routes, authentication, requests (parsed by request.hpp) queued on
// the scheduler, answers as JSON objects or server-sent events, errors as {"error": {message,
// type, param, code}}.
#pragma once

#include <expertpack/expertpack.h>

#include "metrics.hpp"
#include "reasoning.hpp"
#include "request.hpp"
#include "scheduler.hpp"

#include <cstdint>
#include <string>

namespace httplib {
class Server;
}

namespace ep_server {

struct ApiContext : RequestContext {
  int64_t created = 0;               ///< the model's "created" time (Unix seconds)
  std::string architecture;          ///< the model's (GET /props)
  uint32_t parallel = 0;             ///< requests decoding together (GET /props)
  std::string api_key;               ///< non-empty: /v1/* needs `Authorization: Bearer <key>`
  Scheduler *scheduler = nullptr;
  Metrics *metrics = nullptr;
};

/// Registers every endpoint, the error and exception handlers, authentication and the
/// per-request metrics on @p server. @p ctx must outlive the server.
void install_routes(httplib::Server &server, const ApiContext &ctx);

}  // namespace ep_server
