// Placement policies behind one interface. A policy only ranks the resident keys; the
// SlotCache decides which of them may be evicted (never a key of the current acquire, never a
// slot a kernel may still read) and asks the policy for the best victim among those.
//
//  - lru:        least recently used.
//  - sglang-lfu: SGLang-compatible LFU/LRU — a per-resident-key frequency counter that
//                saturates at 255 and never decays; every miss is admitted (inserted with
//                frequency 1); the victim is the lowest frequency, ties broken by LRU. The
//                counter is dropped on eviction.
//  - decay:      the project's own: an exponentially decaying frequency (half-life in ticks),
//                remembered for evicted keys too, recency as the tie-break; with `bypass` a
//                key never seen before (a one-off cold expert) is admitted on probation: it is
//                the first victim until it is hit again, so it cannot push out a hot expert
//                beyond the one slot the stream of cold experts cycles through.
#pragma once

#include "cache/key.hpp"

#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace ep::cache {

class Policy {
 public:
  virtual ~Policy() = default;
  virtual std::string_view name() const = 0;
  /// A resident key was requested.
  virtual void on_hit(Key key, uint64_t tick) = 0;
  /// A missed key became resident.
  virtual void on_insert(Key key, uint64_t tick) = 0;
  /// A resident key left the cache (eviction or invalidation).
  virtual void on_evict(Key key) = 0;
  /// The best victim among resident keys for which @p evictable is true; nullopt if none.
  virtual std::optional<Key> choose_victim(const std::function<bool(Key)> &evictable) const = 0;
};

class LruPolicy final : public Policy {
 public:
  std::string_view name() const override { return "lru"; }
  void on_hit(Key key, uint64_t tick) override;
  void on_insert(Key key, uint64_t tick) override;
  void on_evict(Key key) override;
  std::optional<Key> choose_victim(const std::function<bool(Key)> &evictable) const override;

 private:
  std::list<Key> order_;  // front: least recent
  std::unordered_map<Key, std::list<Key>::iterator> where_;
};

class SglangLfuPolicy final : public Policy {
 public:
  static constexpr uint32_t kMaxFrequency = 255;
  std::string_view name() const override { return "sglang-lfu"; }
  void on_hit(Key key, uint64_t tick) override;
  void on_insert(Key key, uint64_t tick) override;
  void on_evict(Key key) override;
  std::optional<Key> choose_victim(const std::function<bool(Key)> &evictable) const override;
  /// The frequency of a resident key (0 if not resident), for tests.
  uint32_t frequency(Key key) const;

 private:
  struct Entry {
    uint32_t frequency;
    uint64_t tick;
  };
  using Rank = std::tuple<uint32_t, uint64_t, Key>;  // (frequency, last use, key)
  std::unordered_map<Key, Entry> entries_;
  std::set<Rank> order_;
};

struct DecayOptions {
  double half_life_ticks = 256.0;  ///< a frequency halves after this many ticks without use
  bool bypass = false;             ///< probation for keys never seen before
};

class DecayPolicy final : public Policy {
 public:
  explicit DecayPolicy(const DecayOptions &options = {});
  std::string_view name() const override { return options_.bypass ? "decay-bypass" : "decay"; }
  void on_hit(Key key, uint64_t tick) override;
  void on_insert(Key key, uint64_t tick) override;
  void on_evict(Key key) override;
  std::optional<Key> choose_victim(const std::function<bool(Key)> &evictable) const override;
  /// The decayed frequency of @p key at @p tick (resident or remembered; 0 if never seen).
  double score(Key key, uint64_t tick) const;
  bool on_probation(Key key) const;

 private:
  struct History {
    double score = 0;  // at `tick`
    uint64_t tick = 0;
  };
  struct Resident {
    bool probation = false;
    double priority = 0;
    uint64_t tick = 0;
  };
  // Ordering by the decayed score at any common "now" equals ordering by
  // log2(score at last use) + last_use / half_life, which does not change with time: the
  // set stays sorted without re-scoring.
  using Rank = std::tuple<int, double, uint64_t, Key>;  // (tier: 0 probation, priority, tick, key)
  double bump(Key key, uint64_t tick);
  void place(Key key, const Resident &resident);

  DecayOptions options_;
  std::unordered_map<Key, History> history_;
  std::unordered_map<Key, Resident> resident_;
  std::set<Rank> order_;
};

/// Policy names accepted by make_policy().
std::vector<std::string> policy_names();
/// "lru", "sglang-lfu", "decay", "decay-bypass" (throws EP_ERR_INVALID_ARGUMENT otherwise).
std::unique_ptr<Policy> make_policy(std::string_view name, const DecayOptions &decay = {});

}  // namespace ep::cache
