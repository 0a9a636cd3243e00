// Notices a client that went away while its request waits for a slot, is prefilled, or is
// answered without streaming (a streamed answer also notices it when a write fails).
// cpp-httplib 0.11 gives a handler no access to its connection's socket, so the probe finds
// it among the process's descriptors by the connection's addresses (local and peer address
// and port, which identify one TCP connection), and then only polls it: the socket stays
// httplib's, and it stays open while the handler runs, since the same thread closes it after.
#pragma once

#include <sys/socket.h>

#include <string>

namespace ep_server {

/// The numeric host and port of socket address @p a (@p len bytes), as httplib writes them
/// (getnameinfo with NI_NUMERICHOST | NI_NUMERICSERV); false when it cannot be converted.
bool host_port(const sockaddr_storage &a, socklen_t len, std::string &host, int &port);

class ConnectionProbe {
 public:
  ConnectionProbe(const std::string &local_addr, int local_port, const std::string &remote_addr, int remote_port);
  /// True once the peer closed the connection (or it failed). A connection that was not found
  /// is never reported gone.
  bool client_gone() const;

 private:
  int fd_ = -1;
};

}  // namespace ep_server
