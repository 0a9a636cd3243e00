#include "core/log.hpp"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

namespace ep::log {
namespace {

// The sink is process-wide by design (like sqlite3_config): a log destination belongs to
// the host program, not to one model. Guarded by a mutex; the level is read often, so the
// first read initialises it from EP_LOG once.
struct Sink {
  std::mutex mutex;
  ep_log_level min_level = level_from_environment();
  ep_log_fn callback = nullptr;
  void *payload = nullptr;
};

Sink &sink() {
  static Sink instance;
  return instance;
}

const char *level_tag(ep_log_level lvl) {
  switch (lvl) {
    case EP_LOG_TRACE: return "trace";
    case EP_LOG_DEBUG: return "debug";
    case EP_LOG_INFO: return "info";
    case EP_LOG_WARN: return "warn";
    case EP_LOG_ERROR: return "error";
    default: return "log";
  }
}

}  // namespace

bool parse_level(std::string_view text, ep_log_level &out) {
  std::string lower(text);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  static constexpr std::pair<const char *, ep_log_level> names[] = {
      {"trace", EP_LOG_TRACE}, {"debug", EP_LOG_DEBUG}, {"info", EP_LOG_INFO},
      {"warn", EP_LOG_WARN},   {"warning", EP_LOG_WARN}, {"error", EP_LOG_ERROR},
      {"off", EP_LOG_OFF},     {"none", EP_LOG_OFF}};
  for (const auto &[name, value] : names) {
    if (lower == name) {
      out = value;
      return true;
    }
  }
  return false;
}

ep_log_level level_from_environment() {
  ep_log_level parsed = EP_LOG_WARN;
  if (const char *env = std::getenv("EP_LOG"); env && *env) {
    if (!parse_level(env, parsed)) {
      std::fprintf(stderr, "expertpack: warn: EP_LOG=%s is not one of off|error|warn|info|debug|trace; using warn\n", env);
      parsed = EP_LOG_WARN;
    }
  }
  return parsed;
}

void configure(ep_log_level min_level, ep_log_fn callback, void *payload) {
  Sink &s = sink();
  std::lock_guard lock(s.mutex);
  s.min_level = min_level;
  s.callback = callback;
  s.payload = payload;
}

void set_level(ep_log_level min_level) {
  Sink &s = sink();
  std::lock_guard lock(s.mutex);
  s.min_level = min_level;
}

void set_callback(ep_log_fn callback, void *payload) {
  Sink &s = sink();
  std::lock_guard lock(s.mutex);
  s.callback = callback;
  s.payload = payload;
}

ep_log_level level() {
  Sink &s = sink();
  std::lock_guard lock(s.mutex);
  return s.min_level;
}

void write(ep_log_level lvl, std::string_view message) {
  Sink &s = sink();
  ep_log_fn callback;
  void *payload;
  {
    std::lock_guard lock(s.mutex);
    if (lvl < s.min_level) return;
    callback = s.callback;
    payload = s.payload;
  }
  std::string line(message);
  if (callback) {
    callback(lvl, line.c_str(), payload);
  } else {
    std::fprintf(stderr, "expertpack: %s: %s\n", level_tag(lvl), line.c_str());
  }
}

}  // namespace ep::log
