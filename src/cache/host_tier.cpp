#include "cache/host_tier.hpp"

namespace ep::cache {

HostTier::HostTier(uint32_t num_slots, std::unique_ptr<Policy> policy, uint32_t admit_requests)
    : slots_(num_slots, std::move(policy)), admit_requests_(admit_requests) {}

void HostTier::count_requests(std::span<const Key> keys, bool prefill) {
  for (Key key : keys) ++requests_[key];
  slots_.request(keys, prefill);
}

uint32_t HostTier::requests(Key key) const {
  auto it = requests_.find(key);
  return it == requests_.end() ? 0 : it->second;
}

std::optional<HostTier::Admission> HostTier::admit(Key key, uint64_t tick, const std::function<bool(uint32_t)> &evictable) {
  if (slots_.find(key)) return std::nullopt;
  // A rarely asked-for key takes a free slot, or the place of another rarely asked-for one, but
  // never evicts a key asked for admit_requests times or more.
  if (requests(key) < admit_requests_ && slots_.resident() == slots_.num_slots()) {
    const auto victim = slots_.policy().choose_victim([&](Key k) {
      const auto s = slots_.find(k);
      return s && evictable(*s);
    });
    if (!victim || requests(*victim) >= admit_requests_) return std::nullopt;
  }
  auto p = slots_.place(key, tick, evictable);
  if (!p) return std::nullopt;
  return Admission{p->slot, p->evicted};
}

}  // namespace ep::cache
