// Replays a Trace through a policy, or through Belady's offline optimum, at a fixed number of
// slots — exactly the SlotCache the store uses, so the simulated hit rates are the store's —
// and through the store's two tiers (slots + host tier, cache/host_tier.hpp).
#pragma once

#include "cache/policy.hpp"
#include "cache/trace.hpp"

#include <cstdint>
#include <memory>
#include <string>

namespace ep::cache {

struct SimResult {
  std::string policy;
  uint32_t slots = 0;
  uint64_t accesses = 0;
  uint64_t unique_keys = 0;  ///< sum over accesses of the unique keys (= hits + misses)
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t evictions = 0;
  uint64_t bytes_read = 0;   ///< pack (SSD) bytes: misses not served by the host tier
  uint32_t host_slots = 0;   ///< two tiers: the host tier's slots
  uint64_t host_hits = 0;    ///< two tiers: misses served from the host tier
  uint64_t demotions = 0;    ///< two tiers: evicted experts admitted to the host tier
  uint64_t pack_reads() const { return misses - host_hits; }
  double hit_rate() const { return unique_keys ? static_cast<double>(hits) / static_cast<double>(unique_keys) : 0.0; }
};

/// One tick per access. Throws EP_ERR_BUDGET when an access needs more slots than exist.
SimResult simulate(const Trace &trace, Policy &policy, uint32_t slots);

/// The store's two tiers: @p slots slots under @p policy, above a host tier of @p host_slots
/// slots under @p host_policy (HostTier: exclusive, admission on the second request), as
/// ExpertStore::acquire() moves experts between them. misses counts the slots' misses;
/// bytes_read only those read from the pack.
/// @p admit_requests: how often a key must have been asked for before a demotion admits it.
SimResult simulate_two_tier(const Trace &trace, Policy &policy, uint32_t slots, std::unique_ptr<Policy> host_policy,
                            uint32_t host_slots, uint32_t admit_requests = 2);

/// Belady's MIN: on a miss with no free slot, evict the resident key (not needed by the current
/// access) whose next use is farthest in the future. The offline optimum for demand fetching.
SimResult simulate_belady(const Trace &trace, uint32_t slots);

/// The offline static allocation: the keys most requested over the whole trace stay resident
/// once first read — the most requested slots − (the largest access) in the slots, the next
/// @p host_slots in the host tier — and every other key is read on each access (into the slots
/// the largest access needs). What a frequency policy approaches on a trace without temporal
/// locality (independent draws: the best any policy that does not see the future can do there),
/// and what such a policy leaves on the table on a trace with it. Throws EP_ERR_BUDGET as
/// simulate() does.
SimResult simulate_static(const Trace &trace, uint32_t slots, uint32_t host_slots = 0);

}  // namespace ep::cache
