// 1,000 open / generate / close cycles on a tiny model (EP_LEAK_CYCLES overrides the count):
// no file descriptor, thread or memory may be left behind. Under ASan (CI's asan build)
// LeakSanitizer checks every allocation at exit; in every build the test itself checks open
// file descriptors, threads and (without a sanitizer) resident memory after a warm-up.
#include "rel_support.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <dirent.h>
#include <fstream>
#include <thread>

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define EP_REL_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define EP_REL_SANITIZED 1
#endif
#endif

using namespace ep;

namespace {

size_t count_dir(const char *path) {
  size_t n = 0;
  if (DIR *d = ::opendir(path)) {
    while (const dirent *e = ::readdir(d))
      if (e->d_name[0] != '.') ++n;
    ::closedir(d);
  }
  return n;
}

// The names of this process's threads (their /proc comm), for a failure's message.
std::string thread_names() {
  std::string names;
  if (DIR *d = ::opendir("/proc/self/task")) {
    while (const dirent *e = ::readdir(d)) {
      if (e->d_name[0] == '.') continue;
      std::ifstream in(std::string("/proc/self/task/") + e->d_name + "/comm");
      std::string comm;
      std::getline(in, comm);
      names += (names.empty() ? "" : ", ") + std::string(e->d_name) + ":" + comm;
    }
    ::closedir(d);
  }
  return names;
}

// The thread count once it has come down to `expected`. A joined thread (a worker of a closed
// model's pool) and the kernel's io_uring workers of a torn-down ring leave /proc/self/task a
// little after the join or the ring's exit returns, later the more loaded the machine; a leaked
// thread stays, and then this waits until CTest's timeout ends the test (no deadline here: how
// long an exit takes must not decide the result). Every 10 s it names the threads it waits for.
size_t settled_threads(size_t expected) {
  size_t n = count_dir("/proc/self/task");
  for (int polls = 1; n > expected; ++polls) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    n = count_dir("/proc/self/task");
    if (polls % 1000 == 0)
      std::fprintf(stderr, "waiting for %zu threads to end (%zu of them): %s\n", n - expected, n, thread_names().c_str());
  }
  return n;
}

uint64_t rss_kib() {
  std::ifstream in("/proc/self/status");
  std::string key;
  uint64_t value = 0;
  while (in >> key) {
    if (key == "VmRSS:") {
      in >> value;
      return value;
    }
    in.ignore(1 << 20, '\n');
  }
  return 0;
}

int cycles() {
  const char *e = std::getenv("EP_LEAK_CYCLES");
  return e && *e ? std::max(1, std::atoi(e)) : 1000;
}

// One full cycle: open (the pack exists), two sessions, generate, score, close.
void cycle(const std::string &gguf, const std::string &packs, uint64_t budget, std::vector<int32_t> &tokens) {
  rel::ModelHandle h;
  const ep_model_options o = rel::options_in(packs, budget, 0);
  REQUIRE(ep_model_open(&h.model, gguf.c_str(), &o) == EP_OK);
  REQUIRE(rel::generate(h.model, {1, 2, 3}, 3, tokens) == EP_OK);
  ep_session *s = nullptr;
  REQUIRE(ep_session_open(&s, h.model) == EP_OK);
  ep_session_close(s);  // opened and closed without use
}

}  // namespace

TEST_CASE("open / generate / close cycles leave no descriptor, thread or memory behind", "[reliability][leak]") {
  test::TempDir dir;
  const std::string gguf = rel::write_tiny_model(dir / "m.gguf");
  const std::string packs = dir / "packs";
  std::vector<int32_t> first, tokens;
  uint64_t slot_bytes = 0;
  {
    rel::ModelHandle h;
    const ep_model_options o = rel::options_in(packs);
    REQUIRE(ep_model_open(&h.model, gguf.c_str(), &o) == EP_OK);  // builds the pack
    REQUIRE(rel::generate(h.model, {1, 2, 3}, 3, first) == EP_OK);
    ep_store_stats s;
    ep_store_stats_init(&s);
    REQUIRE(ep_model_store_stats(&s, h.model) == EP_OK);
    slot_bytes = s.slot_bytes;
  }
  const int n = cycles();
  const int warmup = std::min(20, n);
  const auto t0 = std::chrono::steady_clock::now();
  // Alternate a cache of every expert with a 2-slot one (evictions on every step).
  for (int i = 0; i < warmup; ++i) cycle(gguf, packs, (i & 1) ? 2 * slot_bytes : 0, tokens);
  const size_t fds = count_dir("/proc/self/fd"), threads = settled_threads(1);
  const uint64_t rss0 = rss_kib();
  int mismatches = 0;
  for (int i = warmup; i < n; ++i) {
    cycle(gguf, packs, (i & 1) ? 2 * slot_bytes : 0, tokens);
    if (tokens != first) ++mismatches;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const uint64_t rss1 = rss_kib();
  WARN(n << " cycles in " << seconds << " s; RSS " << rss0 << " KiB after warm-up, " << rss1 << " KiB at the end; "
         << fds << " fds, " << threads << " threads");
  CHECK(mismatches == 0);
  CHECK(count_dir("/proc/self/fd") == fds);
  const size_t threads_now = settled_threads(threads);
  INFO("threads: " << thread_names());
  CHECK(threads_now == threads);
#ifndef EP_REL_SANITIZED
  // A leak of even one small buffer per cycle (the ~8 KiB expert slots, a pack header, a
  // session's state) shows over the cycles; allocator noise stays well under this.
  CHECK(rss1 <= rss0 + 8 * 1024);
#endif
}

TEST_CASE("failed opens leave nothing behind either", "[reliability][leak]") {
  test::TempDir dir;
  const std::string gguf = rel::write_tiny_model(dir / "m.gguf");
  const std::string packs = dir / "packs";
  {
    rel::ModelHandle h;
    const ep_model_options o = rel::options_in(packs);
    REQUIRE(ep_model_open(&h.model, gguf.c_str(), &o) == EP_OK);
  }
  const size_t fds = count_dir("/proc/self/fd"), threads = settled_threads(1);
  const int n = std::max(10, cycles() / 10);
  int failures = 0;
  for (int i = 0; i < n; ++i) {
    ep_model *m = nullptr;
    // A budget below top_k slots: the store refuses after the model and pack are loaded.
    const ep_model_options o = rel::options_in(packs, 1, 0);
    if (ep_model_open(&m, gguf.c_str(), &o) == EP_ERR_BUDGET) ++failures;
    CHECK(m == nullptr);
    ep_model_close(m);
  }
  CHECK(failures == n);
  CHECK(count_dir("/proc/self/fd") == fds);
  const size_t threads_now = settled_threads(threads);
  INFO("threads: " << thread_names());
  CHECK(threads_now == threads);
}
