// The host-RAM tier's bookkeeping, pure C++ like SlotCache: an exclusive victim cache of whole
// experts below the slots (VRAM). An expert evicted from the slots is admitted (demoted) into a
// free tier slot, or in place of the tier policy's victim — unless it was asked for fewer than
// `admit_requests` times and the victim at least that often: a one-off cold expert never
// displaces an expert that came back (it may displace another one-off). A hit leaves the tier (a promotion: the expert is in a slot
// again, and the tier's capacity adds to the slots' instead of duplicating them). The tier's own
// victims are chosen by a Policy of the slots' family (make_policy with the same name).
//
// The ExpertStore moves the bytes (StoreDevice::demote / promote); cache::simulate_two_tier
// replays traces through the same class.
//
// Not thread-safe: the store calls it under its mutex.
#pragma once

#include "cache/key.hpp"
#include "cache/policy.hpp"
#include "cache/slot_cache.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>

namespace ep::cache {

class HostTier {
 public:
  static constexpr uint32_t kDefaultAdmitRequests = 2;
  HostTier(uint32_t num_slots, std::unique_ptr<Policy> policy, uint32_t admit_requests = kDefaultAdmitRequests);

  uint32_t num_slots() const { return slots_.num_slots(); }
  uint32_t resident() const { return slots_.resident(); }
  Policy &policy() { return slots_.policy(); }

  /// An acquire asked for @p keys (distinct; whichever tier holds them): counts towards their
  /// admission, and the tier's policy sees the request as the slots' does (SlotCache::request).
  void count_requests(std::span<const Key> keys, bool prefill);
  uint32_t requests(Key key) const;
  /// The tier slot holding @p key, if any.
  std::optional<uint32_t> find(Key key) const { return slots_.find(key); }

  struct Admission {
    uint32_t slot = 0;
    std::optional<Key> evicted;  ///< the key that lived in the slot before (dropped: it is on the pack)
  };
  /// A demotion of @p key (evicted from the slots): a tier slot for it, free or the policy's victim
  /// among the slots @p evictable allows; nullopt when the key is not admitted (asked for fewer
  /// than admit_requests times while the victim was asked for at least that often) or every slot
  /// is protected.
  std::optional<Admission> admit(Key key, uint64_t tick, const std::function<bool(uint32_t)> &evictable);
  /// A promotion: @p key leaves the tier.
  void remove(Key key) { slots_.remove(key); }
  std::optional<Key> key_of(uint32_t slot) const { return slots_.key_of(slot); }

 private:
  SlotCache slots_;
  std::unordered_map<Key, uint32_t> requests_;
  uint32_t admit_requests_;
};

}  // namespace ep::cache
