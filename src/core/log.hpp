// The process-wide log sink behind ep_log_configure(). Library code logs with
// ep::log::warn("...{}...", x) and never writes to stderr directly.
#pragma once

#include <expertpack/status.h>

#include <fmt/format.h>

#include <string_view>
#include <utility>

namespace ep::log {

/// Replaces the sink configuration (thread-safe).
void configure(ep_log_level min_level, ep_log_fn callback, void *payload);
/// Changes only the level / only the callback.
void set_level(ep_log_level min_level);
void set_callback(ep_log_fn callback, void *payload);
/// The current minimum level; the first call reads the EP_LOG environment variable.
ep_log_level level();
/// The level named by EP_LOG, or EP_LOG_WARN when unset or unknown.
ep_log_level level_from_environment();
/// Parses "off|error|warn|info|debug|trace" (case-insensitive); false if unknown.
bool parse_level(std::string_view text, ep_log_level &out);
/// True when a message at @p lvl would be delivered.
inline bool enabled(ep_log_level lvl) { return lvl >= level(); }
/// Delivers one line (without newline) to the sink.
void write(ep_log_level lvl, std::string_view message);

template <typename... Args>
void emit(ep_log_level lvl, fmt::format_string<Args...> format, Args &&...args) {
  if (enabled(lvl)) write(lvl, fmt::format(format, std::forward<Args>(args)...));
}
template <typename... Args>
void error(fmt::format_string<Args...> f, Args &&...a) { emit(EP_LOG_ERROR, f, std::forward<Args>(a)...); }
template <typename... Args>
void warn(fmt::format_string<Args...> f, Args &&...a) { emit(EP_LOG_WARN, f, std::forward<Args>(a)...); }
template <typename... Args>
void info(fmt::format_string<Args...> f, Args &&...a) { emit(EP_LOG_INFO, f, std::forward<Args>(a)...); }
template <typename... Args>
void debug(fmt::format_string<Args...> f, Args &&...a) { emit(EP_LOG_DEBUG, f, std::forward<Args>(a)...); }
template <typename... Args>
void trace(fmt::format_string<Args...> f, Args &&...a) { emit(EP_LOG_TRACE, f, std::forward<Args>(a)...); }

}  // namespace ep::log
