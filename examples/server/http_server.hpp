// cpp-httplib's server with the connection handling a server on a workstation needs against
// slow and greedy clients: a request's headers must arrive within a deadline that starts when
// the connection (or the previous answer) is ready for it, its body within a second deadline
// that starts when the headers end, and one client address holds at most so many connections
// at once (more are refused with 429 at once). So a few clients trickling bytes never hold
// every worker, and /health and other clients keep being answered.
//
// cpp-httplib 0.11 reads a connection through its Stream interface, with a read timeout per
// call only (a client sending a byte a second never times out). HttpServer serves each
// connection itself (Server::process_and_close_socket) with a Stream of its own that knows the
// deadlines, and hands every request to httplib's own parser and router (process_request).
// The listening socket is made without SO_REUSEPORT, which httplib sets by default: with it a
// second server on a taken port would start and share the connections with the first.
#pragma once

#include <httplib.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>

namespace ep_server {

struct ConnectionLimits {
  std::chrono::milliseconds header_timeout{10000};  ///< request line and headers, from when the connection is ready for them
  std::chrono::milliseconds body_timeout{60000};    ///< the body, from the end of the headers
  size_t per_client = 16;                           ///< connections of one client address at once
};

/// What HttpServer reports: a connection refused (its client held per_client already), or a
/// request whose headers ("header") or body ("body") missed their deadline.
struct ConnectionEvents {
  std::function<void()> refused;
  std::function<void(const char *phase)> timed_out;
};

class HttpServer : public httplib::Server {
 public:
  HttpServer(const ConnectionLimits &limits, ConnectionEvents events);

  /// Connections open now from @p address (the numeric host, as Request::remote_addr has it).
  size_t connections_of(const std::string &address) const;

 private:
  bool process_and_close_socket(socket_t sock) override;
  bool admit(const std::string &address);
  void leave(const std::string &address);

  ConnectionLimits limits_;
  ConnectionEvents events_;
  mutable std::mutex mu_;
  std::map<std::string, size_t> open_;  // client address -> connections being served
};

}  // namespace ep_server
