#include "cache/policy.hpp"

#include "core/error.hpp"

#include <algorithm>
#include <cmath>

namespace ep::cache {

// ---- LRU ------------------------------------------------------------------------------------
void LruPolicy::on_hit(Key key, uint64_t) {
  auto it = where_.find(key);
  if (it == where_.end()) return;
  order_.splice(order_.end(), order_, it->second);
}

void LruPolicy::on_insert(Key key, uint64_t tick) {
  if (where_.count(key)) return on_hit(key, tick);
  order_.push_back(key);
  where_[key] = std::prev(order_.end());
}

void LruPolicy::on_evict(Key key) {
  auto it = where_.find(key);
  if (it == where_.end()) return;
  order_.erase(it->second);
  where_.erase(it);
}

std::optional<Key> LruPolicy::choose_victim(const std::function<bool(Key)> &evictable) const {
  for (Key key : order_)
    if (evictable(key)) return key;
  return std::nullopt;
}

// ---- SGLang's LFU ---------------------------------------------------------------------------
// sgl-project/sglang, python/sglang/srt/layers/moe/expert_pack.py. ExpertPackStore.acquire
// raises _key_frequency[key] (capped at 255) for each distinct key of the acquire before any
// lookup, for hits and misses alike, and never erases an entry; a hit moves the key to the end
// of the recency order, a miss takes the key's count into its slot and appends it there.
// _victim_slot scans the resident keys from the least recently used (from the most recently
// used when is_prefill, which its caller sets when the acquire covers more than one token),
// skips the acquire's own keys and keeps the first one of strictly lower frequency.
void SglangLfuPolicy::on_request(std::span<const Key> keys, bool prefill) {
  prefill_ = prefill;
  for (Key key : keys) {
    uint32_t &f = frequency_[key];
    const uint32_t next = std::min(kMaxFrequency, f + 1);
    auto it = resident_.find(key);
    if (it != resident_.end() && next != f) {
      order_.erase(Rank{f, it->second, key});
      order_.insert(Rank{next, it->second, key});
    }
    f = next;
  }
}

void SglangLfuPolicy::on_hit(Key key, uint64_t tick) {
  auto it = resident_.find(key);
  if (it == resident_.end()) return;
  const uint32_t f = frequency(key);
  order_.erase(Rank{f, it->second, key});
  it->second = tick;
  order_.insert(Rank{f, tick, key});
}

void SglangLfuPolicy::on_insert(Key key, uint64_t tick) {
  if (resident_.count(key)) return on_hit(key, tick);
  resident_[key] = tick;
  order_.insert(Rank{frequency(key), tick, key});
}

void SglangLfuPolicy::on_evict(Key key) {
  auto it = resident_.find(key);
  if (it == resident_.end()) return;
  order_.erase(Rank{frequency(key), it->second, key});
  resident_.erase(it);  // the count stays in frequency_
}

std::optional<Key> SglangLfuPolicy::choose_victim(const std::function<bool(Key)> &evictable) const {
  if (!prefill_) {
    for (const auto &rank : order_)
      if (evictable(std::get<2>(rank))) return std::get<2>(rank);
    return std::nullopt;
  }
  // Prefill: the lowest frequency that has an evictable key, and its most recently used one.
  std::optional<Key> best;
  uint32_t best_frequency = 0;
  for (const auto &[f, tick, key] : order_) {
    if (best && f != best_frequency) break;
    if (evictable(key)) {
      best = key;
      best_frequency = f;
    }
  }
  return best;
}

uint32_t SglangLfuPolicy::frequency(Key key) const {
  auto it = frequency_.find(key);
  return it == frequency_.end() ? 0 : it->second;
}

// ---- decay ----------------------------------------------------------------------------------
DecayPolicy::DecayPolicy(const DecayOptions &options) : options_(options) {
  if (!(options_.half_life_ticks > 0))
    fail(Status::invalid_argument, "decay policy: half_life_ticks {} must be positive",
         options_.half_life_ticks);
}

double DecayPolicy::score(Key key, uint64_t tick) const {
  auto it = history_.find(key);
  if (it == history_.end()) return 0.0;
  const double age = tick > it->second.tick ? static_cast<double>(tick - it->second.tick) : 0.0;
  return it->second.score * std::exp2(-age / options_.half_life_ticks);
}

bool DecayPolicy::on_probation(Key key) const {
  auto it = resident_.find(key);
  return it != resident_.end() && it->second.probation;
}

double DecayPolicy::bump(Key key, uint64_t tick) {
  const double s = score(key, tick) + 1.0;
  history_[key] = History{s, tick};
  return std::log2(s) + static_cast<double>(tick) / options_.half_life_ticks;
}

void DecayPolicy::place(Key key, const Resident &r) {
  auto it = resident_.find(key);
  if (it != resident_.end()) order_.erase(Rank{it->second.probation ? 0 : 1, it->second.priority, it->second.tick, key});
  resident_[key] = r;
  order_.insert(Rank{r.probation ? 0 : 1, r.priority, r.tick, key});
}

void DecayPolicy::on_hit(Key key, uint64_t tick) {
  if (!resident_.count(key)) return;
  place(key, Resident{false, bump(key, tick), tick});
}

void DecayPolicy::on_insert(Key key, uint64_t tick) {
  if (resident_.count(key)) return on_hit(key, tick);
  const bool seen_before = history_.count(key) > 0;
  place(key, Resident{options_.bypass && !seen_before, bump(key, tick), tick});
}

void DecayPolicy::on_evict(Key key) {
  auto it = resident_.find(key);
  if (it == resident_.end()) return;
  order_.erase(Rank{it->second.probation ? 0 : 1, it->second.priority, it->second.tick, key});
  resident_.erase(it);
}

std::optional<Key> DecayPolicy::choose_victim(const std::function<bool(Key)> &evictable) const {
  for (const auto &rank : order_)
    if (evictable(std::get<3>(rank))) return std::get<3>(rank);
  return std::nullopt;
}

// ---- factory --------------------------------------------------------------------------------
std::vector<std::string> policy_names() { return {"lru", "sglang-lfu", "decay", "decay-bypass"}; }

std::unique_ptr<Policy> make_policy(std::string_view name, const DecayOptions &decay) {
  if (name == "lru") return std::make_unique<LruPolicy>();
  if (name == "sglang-lfu" || name == "sglang") return std::make_unique<SglangLfuPolicy>();
  if (name == "decay" || name == "decay-bypass") {
    DecayOptions o = decay;
    o.bypass = decay.bypass || name == "decay-bypass";
    return std::make_unique<DecayPolicy>(o);
  }
  fail(Status::invalid_argument, "cache policy '{}' is not one of lru, sglang-lfu, decay, decay-bypass", name);
}

}  // namespace ep::cache
