#include "cache/simulate.hpp"

#include "cache/host_tier.hpp"
#include "cache/slot_cache.hpp"
#include "core/error.hpp"

#include <algorithm>
#include <limits>
#include <optional>
#include <set>
#include <unordered_map>
#include <unordered_set>

namespace ep::cache {
namespace {

std::vector<Key> unique_keys(const TraceAccess &a) {
  std::vector<Key> keys;
  keys.reserve(a.experts.size());
  for (uint32_t e : a.experts) keys.push_back(make_key(a.layer, e));
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  return keys;
}

[[noreturn]] void too_small(uint32_t slots, std::size_t need, uint64_t index) {
  fail(Status::budget, "cache simulation: access {} needs {} unique experts but the cache has {} slots",
       index, need, slots);
}

/// SlotCache owns its policy; this forwards to the caller's.
struct Forward final : Policy {
  Policy &p;
  explicit Forward(Policy &inner) : p(inner) {}
  std::string_view name() const override { return p.name(); }
  void on_request(std::span<const Key> k, bool prefill) override { p.on_request(k, prefill); }
  void on_hit(Key k, uint64_t t) override { p.on_hit(k, t); }
  void on_insert(Key k, uint64_t t) override { p.on_insert(k, t); }
  void on_evict(Key k) override { p.on_evict(k); }
  std::optional<Key> choose_victim(const std::function<bool(Key)> &f) const override { return p.choose_victim(f); }
};

}  // namespace

namespace {

/// The replay: the slots under @p policy_in, and, with @p host, the host tier below them as the
/// store moves experts (the misses found in the tier are protected there first, every miss is
/// placed with an admitted victim demoted, then the tier's hits are promoted).
SimResult replay(const Trace &trace, Policy &policy_in, uint32_t slots, HostTier *host) {
  SlotCache cache(slots, std::make_unique<Forward>(policy_in));
  SimResult r;
  r.policy = std::string(policy_in.name()) + (host ? "+host" : "");
  r.slots = slots;
  r.host_slots = host ? host->num_slots() : 0;
  std::vector<char> protect(slots, 0), host_protect(r.host_slots, 0);
  uint64_t tick = 0;
  for (const auto &access : trace.accesses) {
    ++tick;
    const auto keys = unique_keys(access);
    if (keys.size() > slots) too_small(slots, keys.size(), r.accesses);
    ++r.accesses;
    r.unique_keys += keys.size();
    std::vector<Key> missing;
    std::vector<uint32_t> used;
    // As the store decides it: more than one token's picks (ExpertStore::acquire).
    const bool prefill = access.prefill || access.experts.size() > trace.top_k;
    cache.request(keys, prefill);
    if (host) host->count_requests(keys, prefill);
    for (Key k : keys) {
      if (auto s = cache.find(k)) {
        ++r.hits;
        cache.touch(k, tick);
        protect[*s] = 1;
        used.push_back(*s);
      } else {
        missing.push_back(k);
      }
    }
    std::vector<std::optional<uint32_t>> in_host(missing.size());
    if (host)
      for (size_t j = 0; j < missing.size(); ++j)
        if ((in_host[j] = host->find(missing[j]))) host_protect[*in_host[j]] = 1;
    for (Key k : missing) {
      auto p = cache.place(k, tick, [&](uint32_t s) { return !protect[s]; });
      if (!p) too_small(slots, keys.size(), r.accesses - 1);
      ++r.misses;
      if (p->evicted) {
        ++r.evictions;
        if (host && host->admit(*p->evicted, tick, [&](uint32_t h) { return !host_protect[h]; })) ++r.demotions;
      }
      protect[p->slot] = 1;
      used.push_back(p->slot);
    }
    for (size_t j = 0; j < missing.size(); ++j) {
      if (host && in_host[j]) {
        ++r.host_hits;
        host->remove(missing[j]);
        host_protect[*in_host[j]] = 0;
      } else {
        r.bytes_read += trace.object_bytes_of(access.layer);
      }
    }
    for (uint32_t s : used) protect[s] = 0;
  }
  return r;
}

}  // namespace

SimResult simulate(const Trace &trace, Policy &policy, uint32_t slots) { return replay(trace, policy, slots, nullptr); }

SimResult simulate_two_tier(const Trace &trace, Policy &policy, uint32_t slots, std::unique_ptr<Policy> host_policy,
                            uint32_t host_slots, uint32_t admit_requests) {
  if (host_slots == 0) return simulate(trace, policy, slots);
  HostTier host(host_slots, std::move(host_policy), admit_requests);
  return replay(trace, policy, slots, &host);
}

SimResult simulate_belady(const Trace &trace, uint32_t slots) {
  const std::size_t n = trace.accesses.size();
  constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();
  std::vector<std::vector<Key>> keys(n);
  for (std::size_t i = 0; i < n; ++i) keys[i] = unique_keys(trace.accesses[i]);
  // next_use[i][j]: the next access after i that needs keys[i][j].
  std::vector<std::vector<uint64_t>> next_use(n);
  std::unordered_map<Key, uint64_t> upcoming;
  for (std::size_t i = n; i-- > 0;) {
    next_use[i].resize(keys[i].size());
    for (std::size_t j = 0; j < keys[i].size(); ++j) {
      auto it = upcoming.find(keys[i][j]);
      next_use[i][j] = it == upcoming.end() ? kNever : it->second;
      upcoming[keys[i][j]] = i;
    }
  }
  SimResult r;
  r.policy = "belady";
  r.slots = slots;
  std::unordered_map<Key, uint64_t> resident;  // key → next use
  std::set<std::pair<uint64_t, Key>> by_next;  // largest = best victim
  for (std::size_t i = 0; i < n; ++i) {
    const auto &ks = keys[i];
    if (ks.size() > slots) too_small(slots, ks.size(), i);
    ++r.accesses;
    r.unique_keys += ks.size();
    const std::unordered_set<Key> current(ks.begin(), ks.end());
    for (std::size_t j = 0; j < ks.size(); ++j) {
      if (resident.count(ks[j])) {
        ++r.hits;
        continue;
      }
      ++r.misses;
      r.bytes_read += trace.object_bytes_of(trace.accesses[i].layer);
      if (resident.size() >= slots) {
        auto victim = by_next.end();
        for (auto it = by_next.rbegin(); it != by_next.rend(); ++it) {
          if (!current.count(it->second)) {
            victim = std::prev(it.base());
            break;
          }
        }
        if (victim == by_next.end()) too_small(slots, ks.size(), i);
        resident.erase(victim->second);
        by_next.erase(victim);
        ++r.evictions;
      }
      resident[ks[j]] = i;  // the real next use is set below, after every key is placed
      by_next.insert({i, ks[j]});
    }
    for (std::size_t j = 0; j < ks.size(); ++j) {
      auto it = resident.find(ks[j]);
      by_next.erase({it->second, ks[j]});
      it->second = next_use[i][j];
      by_next.insert({it->second, ks[j]});
    }
  }
  return r;
}

SimResult simulate_static(const Trace &trace, uint32_t slots, uint32_t host_slots) {
  const std::size_t n = trace.accesses.size();
  std::vector<std::vector<Key>> keys(n);
  std::unordered_map<Key, uint64_t> requests;
  std::size_t largest = 0;
  for (std::size_t i = 0; i < n; ++i) {
    keys[i] = unique_keys(trace.accesses[i]);
    if (keys[i].size() > slots) too_small(slots, keys[i].size(), i);
    largest = std::max(largest, keys[i].size());
    for (Key k : keys[i]) ++requests[k];
  }
  std::vector<std::pair<uint64_t, Key>> ranked;
  for (const auto &[k, c] : requests) ranked.emplace_back(c, k);
  std::sort(ranked.begin(), ranked.end(), [](const auto &a, const auto &b) { return a.first != b.first ? a.first > b.first : a.second < b.second; });
  // 0: read on every access; 1: pinned in the slots; 2: pinned in the host tier.
  std::unordered_map<Key, int> tier;
  const std::size_t pinned = slots - largest;
  for (std::size_t i = 0; i < ranked.size() && i < pinned + host_slots; ++i) tier[ranked[i].second] = i < pinned ? 1 : 2;
  SimResult r;
  r.policy = host_slots ? "static+host" : "static";
  r.slots = slots;
  r.host_slots = host_slots;
  std::unordered_set<Key> loaded;
  for (std::size_t i = 0; i < n; ++i) {
    ++r.accesses;
    r.unique_keys += keys[i].size();
    for (Key k : keys[i]) {
      const auto t = tier.find(k);
      const int where = t == tier.end() ? 0 : t->second;
      const bool first = loaded.insert(k).second;
      if (where == 1 && !first) {
        ++r.hits;
        continue;
      }
      ++r.misses;
      if (where == 2 && !first) {
        ++r.host_hits;
        continue;
      }
      r.bytes_read += trace.object_bytes_of(trace.accesses[i].layer);
    }
  }
  return r;
}

}  // namespace ep::cache
