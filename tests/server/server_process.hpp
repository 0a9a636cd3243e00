// An ep-server child process for the tests: started on a free port (--port 0, the port read
// from its "listening on" line), its stderr collected, stopped with SIGTERM so that its exit
// status (0, or a sanitizer's report) can be checked.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstring>
#include <mutex>
#include <regex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

namespace ep::test {

class ServerProcess {
 public:
  /// Starts @p exe with @p args and `--port 0` (unless @p args name a port); throws when it does
  /// not come up in @p timeout, with its output in the message.
  ServerProcess(const std::string &exe, std::vector<std::string> args, std::chrono::seconds timeout = std::chrono::seconds(120)) {
    int fds[2];
    if (pipe(fds) != 0) throw std::runtime_error("pipe failed");
    const bool port_given = std::find(args.begin(), args.end(), "--port") != args.end();
    args.insert(args.begin(), exe);
    if (!port_given) {
      args.push_back("--port");
      args.push_back("0");
    }
    std::vector<char *> argv;
    for (std::string &a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], STDERR_FILENO);
    posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&fa, fds[0]);
    const int rc = posix_spawn(&pid_, exe.c_str(), &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    if (rc != 0) {
      close(fds[0]);
      throw std::runtime_error("cannot start " + exe + ": " + std::strerror(rc));
    }
    fd_ = fds[0];
    reader_ = std::thread([this] { read_log(); });
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return port_ > 0 || eof_; }) || port_ <= 0) {
      const std::string log = log_;
      lock.unlock();
      kill_now();
      throw std::runtime_error("ep-server did not start; its output:\n" + log);
    }
  }
  ServerProcess(const ServerProcess &) = delete;
  ServerProcess &operator=(const ServerProcess &) = delete;
  ~ServerProcess() { kill_now(); }

  int port() const { return port_; }

  std::string log() const {
    std::lock_guard<std::mutex> lock(mu_);
    return log_;
  }

  /// SIGTERM, then the exit status: the exit code, or 128 + the signal that ended it.
  int stop(std::chrono::seconds timeout = std::chrono::seconds(120)) {
    if (pid_ <= 0) return exit_status_;
    ::kill(pid_, SIGTERM);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    int status = 0;
    for (;;) {
      const pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_) break;
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    pid_ = -1;
    if (reader_.joinable()) reader_.join();
    exit_status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return exit_status_;
  }

 private:
  void read_log() {
    char buf[4096];
    const std::regex listening("listening on http://[^:]+:([0-9]+)");
    for (;;) {
      const ssize_t n = read(fd_, buf, sizeof buf);
      if (n <= 0) break;
      std::lock_guard<std::mutex> lock(mu_);
      log_.append(buf, static_cast<size_t>(n));
      std::smatch m;
      if (port_ <= 0 && std::regex_search(log_, m, listening)) {
        port_ = std::stoi(m[1]);
        cv_.notify_all();
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    eof_ = true;
    cv_.notify_all();
    close(fd_);
  }

  void kill_now() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      int status = 0;
      waitpid(pid_, &status, 0);
      pid_ = -1;
    }
    if (reader_.joinable()) reader_.join();
  }

  pid_t pid_ = -1;
  int fd_ = -1;
  int port_ = 0;
  int exit_status_ = -1;
  bool eof_ = false;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::string log_;
  std::thread reader_;
};

}  // namespace ep::test
