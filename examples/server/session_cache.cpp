#include "session_cache.hpp"

#include <algorithm>

namespace ep_server {

SessionCache::Fork SessionCache::fork_longest_prefix(std::span<const int32_t> prompt) {
  Entry *best = nullptr;
  for (Entry &e : entries_) {
    if (e.tokens.size() > prompt.size() || (best && e.tokens.size() <= best->tokens.size())) continue;
    if (std::equal(e.tokens.begin(), e.tokens.end(), prompt.begin())) best = &e;
  }
  if (!best) return {};
  ep_session *copy = nullptr;
  if (ep_session_fork(&copy, best->session.get()) != EP_OK) return {};
  best->used = ++clock_;
  return {SessionPtr(copy), best->tokens.size(), best->draws};
}

void SessionCache::put(std::vector<int32_t> tokens, SessionPtr session, uint64_t draws) {
  if (capacity_ == 0 || tokens.empty()) return;
  for (Entry &e : entries_) {
    if (e.tokens == tokens) {
      e.session = std::move(session);
      e.draws = draws;
      e.used = ++clock_;
      return;
    }
  }
  if (entries_.size() >= capacity_) {
    auto lru = std::min_element(entries_.begin(), entries_.end(), [](const Entry &a, const Entry &b) { return a.used < b.used; });
    entries_.erase(lru);
    ++evictions_;
  }
  entries_.push_back({std::move(tokens), std::move(session), draws, ++clock_});
}

bool SessionCache::contains(std::span<const int32_t> tokens) const {
  return std::any_of(entries_.begin(), entries_.end(),
                     [&](const Entry &e) { return std::equal(e.tokens.begin(), e.tokens.end(), tokens.begin(), tokens.end()); });
}

}  // namespace ep_server
