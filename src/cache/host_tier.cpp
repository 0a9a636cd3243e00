#include "cache/host_tier.hpp"

namespace ep::cache {

HostTier::HostTier(uint32_t num_slots, std::unique_ptr<Policy> policy, uint32_t admit_requests)
    : slots_(num_slots, std::move(policy)), admit_requests_(admit_requests) {}

uint32_t HostTier::requests(Key key) const {
  auto it = requests_.find(key);
  return it == requests_.end() ? 0 : it->second;
}

std::optional<HostTier::Admission> HostTier::admit(Key key, uint64_t tick, const std::function<bool(uint32_t)> &evictable) {
  if (requests(key) < admit_requests_ || slots_.find(key)) return std::nullopt;
  auto p = slots_.place(key, tick, evictable);
  if (!p) return std::nullopt;
  return Admission{p->slot, p->evicted};
}

}  // namespace ep::cache
