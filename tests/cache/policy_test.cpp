// Placement policies: victim choice, protection, the SGLang-compatible rules, decay, bypass,
// and the byte-budget rule.
#include "support/catch.hpp"

#include "cache/budget.hpp"
#include "cache/policy.hpp"
#include "cache/slot_cache.hpp"
#include "core/error.hpp"

#include <string>

using namespace ep;
using namespace ep::cache;

namespace {
auto any = [](Key) { return true; };
}

TEST_CASE("LRU evicts the least recently used evictable key", "[cache]") {
  LruPolicy p;
  p.on_insert(1, 1);
  p.on_insert(2, 2);
  p.on_insert(3, 3);
  p.on_hit(1, 4);
  CHECK(p.choose_victim(any) == Key{2});
  CHECK(p.choose_victim([](Key k) { return k != 2; }) == Key{3});
  CHECK_FALSE(p.choose_victim([](Key) { return false; }).has_value());
  p.on_evict(2);
  CHECK(p.choose_victim(any) == Key{3});
}

TEST_CASE("SGLang LFU: frequency saturates at 255, no decay, ties by LRU, counter dropped on eviction", "[cache]") {
  SglangLfuPolicy p;
  p.on_insert(10, 1);
  for (uint64_t t = 2; t < 400; ++t) p.on_hit(10, t);
  CHECK(p.frequency(10) == 255);

  p.on_insert(20, 500);
  p.on_insert(21, 501);
  // Equal frequency 1: the least recently used goes first.
  CHECK(p.choose_victim(any) == Key{20});
  p.on_hit(20, 502);
  CHECK(p.choose_victim(any) == Key{21});

  // No decay: key 30 used 5 times long ago beats key 31 used 4 times just now.
  p.on_insert(30, 600);
  for (uint64_t t = 601; t < 605; ++t) p.on_hit(30, t);
  p.on_insert(31, 100000);
  for (uint64_t t = 100001; t < 100004; ++t) p.on_hit(31, t);
  CHECK(p.frequency(30) == 5);
  CHECK(p.frequency(31) == 4);
  CHECK(p.choose_victim([](Key k) { return k == 30 || k == 31; }) == Key{31});

  p.on_evict(30);
  CHECK(p.frequency(30) == 0);
  p.on_insert(30, 200000);
  CHECK(p.frequency(30) == 1);
}

TEST_CASE("SGLang LFU through SlotCache admits every miss", "[cache]") {
  SlotCache c(2, make_policy("sglang-lfu"));
  for (Key k = 0; k < 50; ++k) {
    auto placed = c.place(k, k + 1, [](uint32_t) { return true; });
    REQUIRE(placed.has_value());
    CHECK(c.find(k) == placed->slot);
  }
  CHECK(c.resident() == 2);
}

TEST_CASE("decay: old popularity fades, recency breaks ties", "[cache]") {
  DecayOptions o;
  o.half_life_ticks = 100;
  DecayPolicy p(o);
  p.on_insert(1, 0);
  for (uint64_t t = 1; t < 8; ++t) p.on_hit(1, t);  // 8 uses around tick 0
  p.on_insert(2, 2000);
  p.on_hit(2, 2001);                                 // 2 uses much later
  CHECK(p.score(1, 2001) < p.score(2, 2001));
  CHECK(p.choose_victim(any) == Key{1});

  DecayPolicy q(o);
  q.on_insert(1, 0);
  for (uint64_t t = 1; t < 8; ++t) q.on_hit(1, t);
  q.on_insert(2, 9);
  CHECK(q.choose_victim(any) == Key{2});  // no time passed: frequency wins

  DecayPolicy r(o);
  r.on_insert(5, 10);
  r.on_insert(6, 10);
  r.on_insert(7, 11);
  // 5 and 6 tie exactly (same score, same tick): the key order decides; 7 is more recent.
  CHECK(r.choose_victim([](Key k) { return k != 5; }) == Key{6});
  CHECK(r.choose_victim([](Key k) { return k == 7 || k == 6; }) == Key{6});
}

TEST_CASE("decay remembers evicted keys; bypass puts one-off cold keys on probation", "[cache]") {
  DecayOptions o;
  o.half_life_ticks = 1000;
  o.bypass = true;
  DecayPolicy p(o);
  CHECK(p.name() == "decay-bypass");
  p.on_insert(1, 1);  // first sight: probation
  CHECK(p.on_probation(1));
  p.on_hit(1, 2);
  CHECK_FALSE(p.on_probation(1));
  p.on_insert(2, 3);
  p.on_hit(2, 4);
  p.on_insert(3, 5);  // never seen: on probation, evicted before older non-probation keys
  CHECK(p.on_probation(3));
  CHECK(p.choose_victim(any) == Key{3});
  p.on_evict(3);
  p.on_insert(3, 6);  // seen before: not a one-off any more
  CHECK_FALSE(p.on_probation(3));
  CHECK(p.score(3, 6) > 1.9);

  DecayOptions plain = o;
  plain.bypass = false;
  DecayPolicy q(plain);
  q.on_insert(1, 1);
  q.on_insert(2, 2);
  q.on_insert(3, 3);
  CHECK(q.choose_victim(any) == Key{1});  // without bypass the newcomer is not preferred
}

TEST_CASE("SlotCache never evicts protected slots", "[cache]") {
  for (const auto &name : policy_names()) {
    SlotCache c(3, make_policy(name));
    for (Key k = 0; k < 3; ++k) REQUIRE(c.place(k, k + 1, [](uint32_t) { return true; }));
    const uint32_t keep = *c.find(0), keep2 = *c.find(1);
    auto p = c.place(9, 10, [&](uint32_t s) { return s != keep && s != keep2; });
    REQUIRE(p.has_value());
    CHECK(p->evicted == Key{2});
    CHECK(c.find(0) == keep);
    CHECK(c.find(1) == keep2);
    CHECK_FALSE(c.find(2).has_value());
    CHECK_FALSE(c.place(11, 11, [](uint32_t) { return false; }).has_value());
    CHECK_FALSE(c.find(11).has_value());
    c.remove(9);
    CHECK(c.resident() == 2);
    auto q = c.place(12, 12, [](uint32_t) { return false; });  // a free slot needs no victim
    REQUIRE(q.has_value());
    CHECK_FALSE(q->evicted.has_value());
  }
  CHECK_THROWS_AS(make_policy("fifo"), Error);
}

TEST_CASE("budget: slots = floor(min(requested, free - reserve) / object_bytes)", "[cache]") {
  BudgetRequest r;
  r.object_bytes = 1000;
  r.top_k = 4;
  r.tokens_per_acquire = 2;
  r.num_experts = 64;
  r.requested_bytes = 20'500;
  r.free_bytes = 100'000;
  r.reserve_bytes = 10'000;
  CHECK(compute_budget(r).slots == 20);
  r.free_bytes = 25'999;  // free - reserve = 15'999 < requested
  CHECK(compute_budget(r).slots == 15);
  r.total_objects = 12;
  CHECK(compute_budget(r).slots == 12);
  r.total_objects = UINT64_MAX;
  r.free_bytes = 17'999;  // 7 slots < top_k x tokens = 8
  try {
    compute_budget(r);
    FAIL("expected EP_ERR_BUDGET");
  } catch (const Error &e) {
    CHECK(e.status() == Status::budget);
    CHECK(std::string(e.what()).find("8 unique experts") != std::string::npos);
  }
  r.free_bytes = 5'000;  // less than the reserve
  CHECK_THROWS_AS(compute_budget(r), Error);
  // The largest unique set is capped by the experts of a layer.
  r.free_bytes = UINT64_MAX;
  r.requested_bytes = 6'000;
  r.num_experts = 6;
  CHECK(compute_budget(r).min_slots == 6);
  CHECK(compute_budget(r).slots == 6);
  r.object_bytes = 0;
  CHECK_THROWS_AS(compute_budget(r), Error);
}
