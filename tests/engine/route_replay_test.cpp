// Trace replay (engine::TraceReplay through the routed-expert step's RouteOverride): its mapping
// of a trace onto a model's layers, experts and top-k, and, through the C API on the DeepSeek-V4
// golden model, that the store is asked for exactly the recorded experts: its hits, misses,
// reads and evictions are those of the trace replayed by cache::simulate at the same slots.
#include "support/catch.hpp"
#include "support/temp_dir.hpp"

#include "capi/model_internal.hpp"
#include "cache/simulate.hpp"
#include "core/error.hpp"
#include "engine/engine.hpp"
#include "engine/trace_replay.hpp"
#include "hierarchy_support.hpp"
#include "testkit/trace.hpp"

#include <expertpack/expertpack.h>

#include <memory>
#include <string>
#include <vector>

namespace {

std::vector<int32_t> picks(ep::engine::TraceReplay &r, int64_t layer, int64_t tokens, int64_t k) {
  std::vector<int32_t> out(static_cast<size_t>(tokens * k));
  r.picks(layer, tokens, k, out);
  return out;
}

}  // namespace

TEST_CASE("trace replay maps layers and experts modulo and fills a position with the next tokens' picks", "[model][replay]") {
  ep::cache::Trace t;
  t.name = "hand-made";
  t.num_layers = 2;
  t.num_experts = 8;
  t.top_k = 2;
  // Layer 0: three tokens; layer 1: two. Decode accesses, in recorded order.
  t.accesses = {{0, {7, 1}, false}, {1, {0, 6}, false}, {0, {2, 3}, false}, {1, {5, 2}, false}, {0, {1, 4}, false},
                {0, {5, 5, 5, 5}, true}};  // a prompt cell: not replayed
  // A model of 6 experts and 3 picks: 7 -> 1 and 6 -> 0.
  ep::engine::TraceReplay r(t, 6, 3);
  // Layer 0, position 0: token 0 gives {1} (7 and 1 fold together), token 1 adds 2, 3.
  CHECK(picks(r, 0, 1, 3) == std::vector<int32_t>{1, 2, 3});
  CHECK(r.consumed(0) == 2);
  // Position 1: token 2 gives 1, 4; the trace cycles: token 0 adds nothing new, token 1 adds 2.
  CHECK(picks(r, 0, 1, 3) == std::vector<int32_t>{1, 4, 2});
  CHECK(r.consumed(0) == 5);
  // Model layer 1 replays trace layer 1: {0} (0 and 6 fold), then 5, 2.
  CHECK(picks(r, 1, 1, 3) == std::vector<int32_t>{0, 5, 2});
  // Model layer 2 replays trace layer 0 again, from its own start; two positions at once.
  CHECK(picks(r, 2, 2, 3) == std::vector<int32_t>{1, 2, 3, 1, 4, 2});
  // A position needs as many distinct experts as the model picks.
  CHECK_THROWS_AS(ep::engine::TraceReplay(t, 6, 5), ep::Error);  // trace layer 1 maps onto 4 experts
  CHECK_THROWS_AS(picks(r, 0, 1, 2), ep::Error);                  // made for 3 picks
  // A trace of more picks than the model's: the lowest-ranked are dropped.
  ep::engine::TraceReplay wide(t, 8, 1);
  CHECK(picks(wide, 0, 3, 1) == std::vector<int32_t>{7, 2, 1});
}

TEST_CASE("trace replay feeds the store exactly the recorded experts", "[model][capi][replay]") {
  using namespace hierarchytest;
  const Model m = models().front();  // DeepSeek-V4, 4 MoE layers of 6 experts
  ep::test::TempDir dir;
  const std::string packs = dir / "packs";
  ep_model *probe = open(m, packs, Features{}, EP_DEVICE_CPU);
  ep_model_properties p;
  ep_model_properties_init(&p);
  REQUIRE(ep_model_info(&p, probe) == EP_OK);
  const uint64_t slot = store_stats(probe).slot_bytes;
  ep_model_close(probe);
  const uint32_t layers = p.num_layers, experts = p.num_experts, k = p.experts_per_token;
  REQUIRE(layers * experts == 24);

  // A seeded Zipf trace of the model's shape: replayed, each token's picks are the trace's.
  ep::testkit::SyntheticTraceOptions o;
  o.kind = ep::testkit::SyntheticTraceOptions::Kind::zipf;
  o.num_layers = layers;
  o.num_experts = experts;
  o.top_k = k;
  o.tokens = 24;
  o.zipf_s = 1.2;
  o.seed = 7;
  o.object_bytes = slot;
  const ep::cache::Trace trace = ep::testkit::synthetic_trace(o);
  const uint32_t slots = 8;  // of 24 experts: evictions
  auto sim_policy = ep::cache::make_policy("lru");
  const ep::cache::SimResult expected = ep::cache::simulate(trace, *sim_policy, slots);
  REQUIRE(expected.evictions > 0);

  Features f;
  f.cache_bytes = slot * slots;
  f.policy = "lru";
  auto measure = [&](bool replay) {
    ep_model *model = open(m, packs, f, EP_DEVICE_CPU);
    if (replay)
      ep::capi::model_engine(*model).set_route_override(std::make_shared<ep::engine::TraceReplay>(trace, experts, k));
    const ep_store_stats before = store_stats(model);
    // One position per forward pass: one acquire per layer, as the trace has them.
    run(model, std::vector<int32_t>(m.tokens.begin(), m.tokens.begin() + 2), p.vocab_size);  // positions 0 (prompt) and 1
    ep_session *s = nullptr;
    REQUIRE(ep_session_open(&s, model) == EP_OK);
    std::vector<float> logits(p.vocab_size);
    for (uint32_t t = 2; t < o.tokens; ++t) REQUIRE(ep_score(s, &m.tokens[t % m.tokens.size()], 1, 0, nullptr, logits.data()) == EP_OK);
    ep_session_close(s);
    const ep_store_stats after = store_stats(model);
    ep_model_close(model);
    ep_store_stats d = after;
    d.acquires = after.acquires - before.acquires;
    d.cache_hits = after.cache_hits - before.cache_hits;
    d.cache_misses = after.cache_misses - before.cache_misses;
    d.pack_reads = after.pack_reads - before.pack_reads;
    d.cache_evictions = after.cache_evictions - before.cache_evictions;
    return d;
  };
  const ep_store_stats replayed = measure(true);
  CHECK(replayed.acquires == expected.accesses);
  CHECK(replayed.cache_hits == expected.hits);
  CHECK(replayed.cache_misses == expected.misses);
  CHECK(replayed.pack_reads == expected.misses);
  CHECK(replayed.cache_evictions == expected.evictions);
  // The router's own picks on the same positions are another stream (the replay did something).
  const ep_store_stats routed = measure(false);
  CHECK(routed.acquires == expected.accesses);
  CHECK((routed.cache_hits != expected.hits || routed.cache_evictions != expected.evictions));

  // Refused: with prefetch (its hints predict the router's picks).
  Features pf = f;
  pf.prefetch = 1;
  ep_model *model = open(m, packs, pf, EP_DEVICE_CPU);
  CHECK_THROWS_AS(ep::capi::model_engine(*model).set_route_override(std::make_shared<ep::engine::TraceReplay>(trace, experts, k)),
                  ep::Error);
  ep_model_close(model);
}
