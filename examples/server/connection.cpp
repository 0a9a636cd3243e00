#include "connection.hpp"

#include <dirent.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

namespace ep_server {

bool host_port(const sockaddr_storage &a, socklen_t len, std::string &host, int &port) {
  char h[NI_MAXHOST], p[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr *>(&a), len, h, sizeof h, p, sizeof p, NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return false;
  host = h;
  port = std::atoi(p);
  return true;
}

ConnectionProbe::ConnectionProbe(const std::string &local_addr, int local_port, const std::string &remote_addr, int remote_port) {
  if (local_port <= 0 || remote_port <= 0) return;
  DIR *dir = opendir("/proc/self/fd");
  if (!dir) return;
  const int dir_fd = dirfd(dir);
  while (const dirent *e = readdir(dir)) {
    char *end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == dir_fd) continue;
    struct stat sb {};
    if (fstat(static_cast<int>(fd), &sb) != 0 || !S_ISSOCK(sb.st_mode)) continue;
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    std::string host;
    int port = 0;
    if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr *>(&a), &len) != 0 || !host_port(a, len, host, port) ||
        port != local_port || host != local_addr)
      continue;
    len = sizeof a;
    if (getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr *>(&a), &len) != 0 || !host_port(a, len, host, port) ||
        port != remote_port || host != remote_addr)
      continue;
    fd_ = static_cast<int>(fd);
    break;
  }
  closedir(dir);
}

bool ConnectionProbe::client_gone() const {
  if (fd_ < 0) return false;
  pollfd p{fd_, POLLIN | POLLRDHUP, 0};
  const int r = poll(&p, 1, 0);
  if (r <= 0) return false;
  if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
  if (p.revents & POLLIN) {
    char c;
    const ssize_t n = recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
  }
  return false;
}

}  // namespace ep_server
