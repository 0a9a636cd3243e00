// Placement policies behind one interface. A policy only ranks the resident keys; the
// SlotCache decides which of them may be evicted (never a key of the current acquire, never a
// slot a kernel may still read) and asks the policy for the best victim among those.
//
//  - lru:        least recently used.
//  - sglang-lfu: SGLang's rule as its ExpertPackStore has it (sgl-project/sglang,
//                python/sglang/srt/layers/moe/expert_pack.py: ExpertPackStore.acquire and
//                _victim_slot): every acquire counts each key it asks for once (on_request),
//                saturating at 255, never decayed, and the count outlives the key's eviction,
//                so a re-admitted key takes its kept count; every miss is admitted; the victim
//                is the least frequent evictable key, the least recently used of those in an
//                acquire of one token, the most recently used in one of several (prefill).
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
#include <span>
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
  /// An acquire asks for @p keys (distinct), before the on_hit / on_insert of each of them;
  /// @p prefill: it covers more than one token. Only request-counting policies use it.
  virtual void on_request(std::span<const Key> keys, bool prefill) {
    (void)keys;
    (void)prefill;
  }
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
  void on_request(std::span<const Key> keys, bool prefill) override;
  void on_hit(Key key, uint64_t tick) override;
  void on_insert(Key key, uint64_t tick) override;
  void on_evict(Key key) override;
  std::optional<Key> choose_victim(const std::function<bool(Key)> &evictable) const override;
  /// How often @p key was asked for (at most kMaxFrequency), resident or not; 0 if never.
  uint32_t frequency(Key key) const;
  bool resident(Key key) const { return resident_.count(key) > 0; }

 private:
  // Recency is (tick, key): the keys of one acquire share its tick and are ordered by key, as
  // SGLang's acquire touches them in sorted order.
  using Rank = std::tuple<uint32_t, uint64_t, Key>;  // (frequency, last use, key)
  std::unordered_map<Key, uint32_t> frequency_;      // every key ever asked for
  std::unordered_map<Key, uint64_t> resident_;       // resident key -> last use
  std::set<Rank> order_;
  bool prefill_ = false;                             // the current acquire's
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
