// The slot table of the expert cache: which key lives in which of N equal slots, with a
// Policy choosing victims. Pure bookkeeping (no memory, no CUDA): the store owns the bytes
// and says, per slot, whether it may be evicted now (not needed by the current acquire, not
// pinned by an unreleased acquire, its last_use event completed).
//
// Not thread-safe: the store calls it under its mutex.
#pragma once

#include "cache/key.hpp"
#include "cache/policy.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

namespace ep::cache {

class SlotCache {
 public:
  SlotCache(uint32_t num_slots, std::unique_ptr<Policy> policy);

  uint32_t num_slots() const { return static_cast<uint32_t>(slot_key_.size()); }
  uint32_t resident() const { return static_cast<uint32_t>(where_.size()); }
  Policy &policy() { return *policy_; }

  /// The slot holding @p key, if resident.
  std::optional<uint32_t> find(Key key) const;
  /// An acquire asks for @p keys (distinct), before their find / touch / place: the policy
  /// counts the request (Policy::on_request). @p prefill: the acquire covers more than one token.
  void request(std::span<const Key> keys, bool prefill) { policy_->on_request(keys, prefill); }
  /// Records a hit on a resident key.
  void touch(Key key, uint64_t tick);

  struct Placement {
    uint32_t slot = 0;
    std::optional<Key> evicted;  ///< the key that lived in the slot before
  };
  /// A slot for the missed key @p key: a free one, else the policy's best victim among the
  /// slots for which @p evictable(slot) is true. nullopt when every slot is protected.
  /// The key is resident (and inserted into the policy) on return.
  std::optional<Placement> place(Key key, uint64_t tick, const std::function<bool(uint32_t)> &evictable);
  /// Forgets @p key (a failed read): its slot becomes free.
  void remove(Key key);

  /// The key in @p slot, if any.
  std::optional<Key> key_of(uint32_t slot) const;

 private:
  std::unique_ptr<Policy> policy_;
  std::vector<std::optional<Key>> slot_key_;
  std::vector<uint32_t> free_;
  std::unordered_map<Key, uint32_t> where_;
};

}  // namespace ep::cache
