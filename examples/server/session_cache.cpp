#include "session_cache.hpp"

#include <algorithm>

namespace ep_server {

namespace {

/// Block hashes of recent prompts remembered per generation (two generations are kept).
constexpr size_t kSeenGeneration = size_t(1) << 16;

/// splitmix64's finaliser: every input bit moves every output bit.
uint64_t mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

PrefixCache::PrefixCache(size_t block_tokens, uint64_t budget_bytes) : block_(std::max<size_t>(block_tokens, 1)), budget_bytes_(budget_bytes) {
  stats_.budget_bytes = budget_bytes;
}

std::vector<uint64_t> PrefixCache::chain(std::span<const int32_t> tokens) const {
  std::vector<uint64_t> out(tokens.size() / block_);
  uint64_t h = mix(block_);  // chains of different block sizes never meet
  for (size_t b = 0; b < out.size(); ++b) {
    for (size_t i = b * block_; i < (b + 1) * block_; ++i) h = mix(h ^ static_cast<uint32_t>(tokens[i]));
    out[b] = h = mix(h + b);
  }
  return out;
}

PrefixCache::Fork PrefixCache::fork_longest_prefix(std::span<const int32_t> prompt, bool count) {
  if (!enabled()) return {};
  const std::vector<uint64_t> hashes = chain(prompt);
  for (size_t b = hashes.size(); b-- > 0;) {
    auto it = entries_.find(hashes[b]);
    if (it == entries_.end()) continue;
    Entry &e = it->second;
    if (e.tokens.size() > prompt.size() || !std::equal(e.tokens.begin(), e.tokens.end(), prompt.begin())) continue;
    ep_session *copy = nullptr;
    if (ep_session_fork(&copy, e.session.get()) != EP_OK) {  // out of memory: the prompt runs instead
      ++stats_.fork_failures;
      break;
    }
    SessionPtr fork(copy);
    if (ep_session_set_draw_count(copy, 0) != EP_OK) break;
    lru_.splice(lru_.begin(), lru_, e.lru);
    if (count) {
      ++stats_.hits;
      stats_.hit_tokens += e.tokens.size();
    }
    return {std::move(fork), e.tokens.size()};
  }
  if (count) ++stats_.misses;
  return {};
}

std::vector<size_t> PrefixCache::plan(std::span<const int32_t> prompt, size_t from, size_t snapshot_at) {
  std::vector<size_t> at;
  if (!enabled()) return at;
  const std::vector<uint64_t> hashes = chain(prompt);
  // The deepest boundary this prompt shares with one seen before: where they part. (A prompt
  // seen whole does not part; its end is the next point's business.)
  size_t shared = 0;
  while (shared < hashes.size() && seen(hashes[shared])) ++shared;
  if (shared < hashes.size() && shared * block_ > from && !entries_.contains(hashes[shared - 1])) at.push_back(shared * block_);
  const size_t next_turn = snapshot_at / block_ * block_;
  if (next_turn > from && (at.empty() || at.back() != next_turn)) at.push_back(next_turn);
  std::sort(at.begin(), at.end());
  for (uint64_t h : hashes) {
    if (seen_now_.size() >= kSeenGeneration) {
      seen_before_ = std::move(seen_now_);
      seen_now_.clear();
    }
    seen_now_.insert(h);
  }
  return at;
}

bool PrefixCache::evict_oldest() {
  if (lru_.empty()) return false;
  auto victim = entries_.find(lru_.back());
  stats_.bytes -= victim->second.bytes;
  entries_.erase(victim);
  lru_.pop_back();
  stats_.entries = entries_.size();
  ++stats_.evictions;
  return true;
}

void PrefixCache::offer(std::span<const int32_t> tokens, const ep_session *session, uint64_t kv_bytes, uint64_t kv_free_bytes) {
  if (!enabled() || tokens.empty() || tokens.size() % block_ != 0) return;
  const uint64_t hash = chain(tokens).back();
  if (auto it = entries_.find(hash); it != entries_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second.lru);
    return;  // kept already (or, with a colliding hash, another prefix stays)
  }
  uint64_t bytes = 0;
  if (ep_session_state_bytes(&bytes, session) != EP_OK) return;
  if (bytes > budget_bytes_) {
    ++stats_.rejected;
    return;
  }
  // What dropping every entry would give back to the KV budget: if even that is too little, the
  // kept states stay and this one is not kept.
  uint64_t kv_kept = 0;
  for (const auto &entry : entries_) kv_kept += entry.second.kv_bytes;
  if (kv_bytes > kv_free_bytes + kv_kept) {
    ++stats_.kv_full;
    return;
  }
  while ((stats_.bytes + bytes > budget_bytes_ || kv_bytes > kv_free_bytes) && !lru_.empty()) {
    kv_free_bytes += entries_.find(lru_.back())->second.kv_bytes;
    evict_oldest();
  }
  ep_session *copy = nullptr;
  if (ep_session_fork(&copy, session) != EP_OK) {  // reuse is an optimisation: go on without it
    ++stats_.fork_failures;
    return;
  }
  lru_.push_front(hash);
  entries_.emplace(hash, Entry{std::vector<int32_t>(tokens.begin(), tokens.end()), SessionPtr(copy), bytes, kv_bytes, lru_.begin()});
  stats_.bytes += bytes;
  stats_.entries = entries_.size();
  ++stats_.inserts;
}

}  // namespace ep_server
