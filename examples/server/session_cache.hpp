// Kept sessions, keyed by the tokens they hold, so that a request whose prompt starts with
// those tokens continues from a copy (ep_session_fork) instead of running them again. Sessions
// cannot be rolled back, so an entry is usable only when all of its tokens are a prefix of
// the new prompt: the scheduler keeps the state at the point where a conversation's next
// turn will diverge (JobRequest::snapshot_at) as well as finished sessions.
// Least recently used entries go first. Used by the scheduler thread only.
#pragma once

#include "handles.hpp"

#include <cstdint>
#include <span>
#include <vector>

namespace ep_server {

class SessionCache {
 public:
  explicit SessionCache(size_t capacity) : capacity_(capacity) {}

  size_t capacity() const { return capacity_; }
  size_t size() const { return entries_.size(); }
  uint64_t evictions() const { return evictions_; }

  /// A fork of a kept session.
  struct Fork {
    SessionPtr session;  ///< null: no entry fits
    size_t length = 0;   ///< tokens it holds
    uint64_t draws = 0;  ///< its sampler's draw counter (ep_session_sample calls it has seen, forks included)
  };
  /// The longest entry whose tokens are a prefix of @p prompt, forked; an empty Fork when none
  /// is. A fork that fails counts as no entry.
  Fork fork_longest_prefix(std::span<const int32_t> prompt);
  /// Keeps @p session (holding @p tokens, its sampler at draw @p draws); an entry with the same
  /// tokens is replaced.
  void put(std::vector<int32_t> tokens, SessionPtr session, uint64_t draws);
  /// Whether an entry holds exactly @p tokens.
  bool contains(std::span<const int32_t> tokens) const;

 private:
  struct Entry {
    std::vector<int32_t> tokens;
    SessionPtr session;
    uint64_t draws = 0;
    uint64_t used = 0;
  };
  size_t capacity_;
  uint64_t clock_ = 0, evictions_ = 0;
  std::vector<Entry> entries_;
};

}  // namespace ep_server
