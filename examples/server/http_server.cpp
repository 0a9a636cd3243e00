#include "http_server.hpp"

#include "connection.hpp"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace ep_server {

namespace {

using Clock = std::chrono::steady_clock;

/// Waits until @p fd has @p events or @p deadline passes; false on the deadline, an error, or
/// once @p listener is closed (the server stops: a connection waiting for a slow client ends).
bool wait_for(int fd, short events, Clock::time_point deadline, const std::atomic<socket_t> *listener = nullptr) {
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left < 0 || (listener && *listener == INVALID_SOCKET)) return false;
    pollfd p{fd, events, 0};
    const int r = poll(&p, 1, static_cast<int>(std::min<long long>(left, 100)));
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) return false;
  }
}

/// One connection as httplib's parser reads it: reads wait at most until the deadline of the
/// request's part they are in (its headers, then its body), writes at most the write timeout per
/// call. Kept across the connection's requests, so bytes read ahead stay with it.
class DeadlineStream final : public httplib::Stream {
 public:
  DeadlineStream(int fd, const ConnectionLimits &limits, std::chrono::microseconds write_timeout, const std::atomic<socket_t> &listener)
      : fd_(fd), limits_(limits), write_timeout_(write_timeout), listener_(listener) {}

  /// The next request's headers are due by now + the header timeout.
  void begin_request() {
    in_headers_ = true;
    matched_ = 0;
    deadline_ = Clock::now() + limits_.header_timeout;
  }
  /// Waits for the first byte of the next request; false when none came before the header
  /// deadline (an idle connection) or the connection failed.
  bool wait_request() const { return buffered_ < filled_ || wait_for(fd_, POLLIN, deadline_, &listener_); }
  /// The part of a request that missed its deadline ("header" or "body"); null when none did.
  const char *timed_out() const { return timed_out_; }
  /// The connection cannot carry another request (a refused body was left unread).
  bool close_after() const { return close_after_; }

  bool is_readable() const override { return buffered_ < filled_ || wait_for(fd_, POLLIN, deadline_, &listener_); }
  bool is_writable() const override { return wait_for(fd_, POLLOUT, Clock::now() + write_timeout_); }

  ssize_t read(char *ptr, size_t size) override {
    if (buffered_ == filled_) {
      if (!wait_for(fd_, POLLIN, deadline_, &listener_)) {
        if (Clock::now() >= deadline_) timed_out_ = in_headers_ ? "header" : "body";
        return -1;
      }
      ssize_t n;
      do n = recv(fd_, buffer_.data(), buffer_.size(), 0);
      while (n < 0 && errno == EINTR);
      if (n <= 0) return n;
      buffered_ = 0;
      filled_ = static_cast<size_t>(n);
    }
    const size_t n = std::min(size, filled_ - buffered_);
    std::memcpy(ptr, buffer_.data() + buffered_, n);
    buffered_ += n;
    if (in_headers_) see_header_bytes(ptr, n);
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char *ptr, size_t size) override {
    // A body refused for its size was not read to its end: what follows on the connection is
    // the rest of it, not a next request.
    static constexpr char kTooLarge[] = "HTTP/1.1 413 ";
    if (size >= sizeof kTooLarge - 1 && std::memcmp(ptr, kTooLarge, sizeof kTooLarge - 1) == 0) close_after_ = true;
    if (!is_writable()) return -1;
    ssize_t n;
    do n = send(fd_, ptr, size, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    return n;
  }

  void get_remote_ip_and_port(std::string &ip, int &port) const override {
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    if (getpeername(fd_, reinterpret_cast<sockaddr *>(&a), &len) != 0 || !host_port(a, len, ip, port)) port = 0;
  }
  void get_local_ip_and_port(std::string &ip, int &port) const override {
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    if (getsockname(fd_, reinterpret_cast<sockaddr *>(&a), &len) != 0 || !host_port(a, len, ip, port)) port = 0;
  }
  socket_t socket() const override { return fd_; }

 private:
  // The headers end at the first empty line ("\r\n\r\n" from the request line on, as httplib
  // parses them); the body's deadline starts there.
  void see_header_bytes(const char *p, size_t n) {
    static constexpr char kEnd[] = "\r\n\r\n";
    for (size_t i = 0; i < n && in_headers_; ++i) {
      if (p[i] == kEnd[matched_]) ++matched_;
      else matched_ = p[i] == '\r' ? 1 : 0;
      if (matched_ == 4) {
        in_headers_ = false;
        deadline_ = Clock::now() + limits_.body_timeout;
      }
    }
  }

  int fd_;
  ConnectionLimits limits_;
  std::chrono::microseconds write_timeout_;
  const std::atomic<socket_t> &listener_;
  std::array<char, 4096> buffer_{};
  size_t buffered_ = 0, filled_ = 0;  // buffer_[buffered_, filled_) is read but not yet taken
  bool in_headers_ = true;
  size_t matched_ = 0;  // bytes of "\r\n\r\n" just seen
  Clock::time_point deadline_{};
  const char *timed_out_ = nullptr;
  bool close_after_ = false;
};

std::string peer_address(int fd) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  std::string host;
  int port = 0;
  if (getpeername(fd, reinterpret_cast<sockaddr *>(&a), &len) != 0 || !host_port(a, len, host, port)) return {};
  return host;
}

/// After an answer sent before the request's body was read (413): the write side is closed and
/// what the client still sends is read and dropped for a while, so that the close does not reset
/// the connection (a reset can discard the answer before the client has read it), at most
/// @p longest.
void drain(int fd, Clock::duration longest) {
  shutdown(fd, SHUT_WR);
  const Clock::time_point until = Clock::now() + longest;
  char sink[16384];
  for (;;) {
    if (!wait_for(fd, POLLIN, until)) return;
    const ssize_t n = recv(fd, sink, sizeof sink, 0);
    if (n == 0 || (n < 0 && errno != EINTR)) return;
  }
}

void close_connection(int fd) {
  shutdown(fd, SHUT_RDWR);
  close(fd);
}

}  // namespace

HttpServer::HttpServer(const ConnectionLimits &limits, ConnectionEvents events) : limits_(limits), events_(std::move(events)) {
  // httplib's default options add SO_REUSEPORT, which lets a second server bind a port that is
  // in use and take part of its connections; SO_REUSEADDR alone binds again over connections
  // of an earlier run in TIME_WAIT, never over a listening socket.
  set_socket_options([](socket_t sock) {
    const int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
}

size_t HttpServer::connections_of(const std::string &address) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = open_.find(address);
  return it == open_.end() ? 0 : it->second;
}

bool HttpServer::admit(const std::string &address) {
  std::lock_guard<std::mutex> lock(mu_);
  size_t &n = open_[address];
  if (n >= limits_.per_client) return false;
  ++n;
  return true;
}

void HttpServer::leave(const std::string &address) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = open_.find(address);
  if (it != open_.end() && --it->second == 0) open_.erase(it);
}

bool HttpServer::process_and_close_socket(socket_t sock) {
  const std::string address = peer_address(sock);
  if (!admit(address)) {
    // Answered without reading the request: the worker is free again at once.
    static const std::string body =
        R"({"error":{"message":"too many connections from this address at once","type":"rate_limit_error","param":null,)"
        R"("code":"too_many_connections"}})";
    const std::string reply = "HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\nContent-Length: " +
                              std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
    (void)send(sock, reply.data(), reply.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (events_.refused) events_.refused();
    close_connection(sock);
    return false;
  }
  DeadlineStream strm(sock, limits_,
                      std::chrono::seconds(write_timeout_sec_) + std::chrono::microseconds(write_timeout_usec_), svr_sock_);
  bool ok = false;
  for (size_t left = keep_alive_max_count_; left > 0 && svr_sock_ != INVALID_SOCKET; --left) {
    strm.begin_request();
    if (!strm.wait_request()) break;
    bool closed = false;
    ok = process_request(strm, left == 1, closed, nullptr);
    if (!ok || closed || strm.timed_out() || strm.close_after()) break;
  }
  if (strm.timed_out() && events_.timed_out) events_.timed_out(strm.timed_out());
  if (strm.close_after()) drain(sock, std::min<Clock::duration>(limits_.body_timeout, std::chrono::seconds(2)));
  leave(address);
  close_connection(sock);
  return ok;
}

}  // namespace ep_server
