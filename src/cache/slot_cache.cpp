#include "cache/slot_cache.hpp"

#include "core/error.hpp"

namespace ep::cache {

SlotCache::SlotCache(uint32_t num_slots, std::unique_ptr<Policy> policy)
    : policy_(std::move(policy)), slot_key_(num_slots) {
  if (!policy_) fail(Status::invalid_argument, "SlotCache: no policy");
  if (num_slots == 0) fail(Status::budget, "SlotCache: 0 slots");
  free_.reserve(num_slots);
  for (uint32_t s = num_slots; s-- > 0;) free_.push_back(s);  // slot 0 handed out first
}

std::optional<uint32_t> SlotCache::find(Key key) const {
  auto it = where_.find(key);
  if (it == where_.end()) return std::nullopt;
  return it->second;
}

void SlotCache::touch(Key key, uint64_t tick) {
  if (where_.count(key)) policy_->on_hit(key, tick);
}

std::optional<SlotCache::Placement> SlotCache::place(Key key, uint64_t tick,
                                                     const std::function<bool(uint32_t)> &evictable) {
  if (where_.count(key))
    fail(Status::internal, "SlotCache::place: layer {} expert {} is already resident", key_layer(key),
         key_expert(key));
  Placement p;
  if (!free_.empty()) {
    p.slot = free_.back();
    free_.pop_back();
  } else {
    const auto victim = policy_->choose_victim([&](Key k) { return evictable(where_.at(k)); });
    if (!victim) return std::nullopt;
    p.slot = where_.at(*victim);
    p.evicted = *victim;
    policy_->on_evict(*victim);
    where_.erase(*victim);
  }
  slot_key_[p.slot] = key;
  where_[key] = p.slot;
  policy_->on_insert(key, tick);
  return p;
}

void SlotCache::remove(Key key) {
  auto it = where_.find(key);
  if (it == where_.end()) return;
  policy_->on_evict(key);
  slot_key_[it->second].reset();
  free_.push_back(it->second);
  where_.erase(it);
}

std::optional<Key> SlotCache::key_of(uint32_t slot) const {
  if (slot >= slot_key_.size()) return std::nullopt;
  return slot_key_[slot];
}

}  // namespace ep::cache
