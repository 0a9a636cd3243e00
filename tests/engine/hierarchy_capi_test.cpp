// The memory hierarchy through the public C API on the goldens' models (CPU backend, host-memory
// device): every feature on — a tiny expert cache, a tiny host tier, overlapped reads, prefetch —
// gives logits bit-identical to every feature off and to resident experts, for a prompt pass and
// for decoding token by token, while demotions, host hits and used prefetches all happen; old
// callers' struct sizes keep working; a host tier larger than the machine's memory and bad option
// values are refused at open.
#include "support/catch.hpp"
#include "support/temp_dir.hpp"

#include "hierarchy_support.hpp"

#include <expertpack/expertpack.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

using namespace hierarchytest;

TEST_CASE("hierarchy: every feature on gives the bits of every feature off", "[model][capi][hierarchy]") {
  for (const Model &m : models()) {
    INFO(m.gguf);
    ep::test::TempDir dir;
    const std::string packs = dir / "packs";
    Features resident;
    resident.resident = 1;
    ep_model *ref_model = open(m, packs, resident, EP_DEVICE_CPU);
    ep_model_properties p;
    ep_model_properties_init(&p);
    REQUIRE(ep_model_info(&p, ref_model) == EP_OK);
    const size_t V = p.vocab_size;
    const std::vector<float> ref = run(ref_model, m.tokens, V);
    ep_model_close(ref_model);

    // The slot size of this model's pack (from an unlimited open).
    ep_model *probe = open(m, packs, Features{}, EP_DEVICE_CPU);
    const ep_store_stats ps = store_stats(probe);
    const uint64_t slot = ps.slot_bytes, all = ps.cache_slots;
    ep_model_close(probe);
    REQUIRE(all >= 8);
    // Half the experts in the slots (so that prefetch finds victims outside the current token's
    // picks), a quarter in the host tier.
    Features off;
    off.cache_bytes = slot * (all / 2);
    Features on = off;
    on.host_bytes = slot * (all / 4);
    on.overlap = 1;
    on.prefetch = 1;
    for (const char *policy : {"decay", "lru", "sglang-lfu"}) {
      INFO(policy);
      off.policy = on.policy = policy;
      ep_model *a = open(m, packs, off, EP_DEVICE_CPU);
      CHECK(same_bits(run(a, m.tokens, V), ref));
      const ep_store_stats sa = store_stats(a);
      CHECK(sa.host_slots == 0);
      CHECK(sa.prefetch_issued == 0);
      ep_model_close(a);

      ep_model *b = open(m, packs, on, EP_DEVICE_CPU);
      CHECK(same_bits(run(b, m.tokens, V), ref));
      const ep_store_stats sb = store_stats(b);
      CHECK(sb.host_slots == all / 4);
      CHECK(sb.demotions > 0);
      CHECK(sb.host_hits > 0);
      CHECK(sb.prefetch_issued > 0);
      CHECK(sb.prefetch_used > 0);
      CHECK(sb.cache_misses == sb.host_hits + sb.host_misses);
      CHECK(sb.pack_reads < sa.pack_reads + sb.prefetch_issued);
      ep_model_close(b);

      check_each_feature_alone(m, packs, off, on, EP_DEVICE_CPU, V, ref);
    }
  }
}

TEST_CASE("hierarchy: option checks and old struct sizes", "[model][capi][hierarchy]") {
  const Model m = models().front();
  ep::test::TempDir dir;
  const std::string packs = dir / "packs";
  ep_model_options o;
  ep_model_options_init(&o);
  CHECK(o.host_cache_bytes == 0);
  CHECK(o.overlap_reads == 1);
  CHECK(o.prefetch == 0);
  CHECK(o.cache_policy == nullptr);
  o.device = EP_DEVICE_CPU;
  o.pack_dir = packs.c_str();
  ep_model *model = nullptr;
  o.overlap_reads = 2;
  CHECK(ep_model_open(&model, m.gguf.c_str(), &o) == EP_ERR_INVALID_ARGUMENT);
  o.overlap_reads = 1;
  o.prefetch = -1;
  CHECK(ep_model_open(&model, m.gguf.c_str(), &o) == EP_ERR_INVALID_ARGUMENT);
  o.prefetch = 0;
  o.cache_policy = "fifo";
  CHECK(ep_model_open(&model, m.gguf.c_str(), &o) == EP_ERR_INVALID_ARGUMENT);
  CHECK(std::string(ep_last_error()).find("fifo") != std::string::npos);
  o.cache_policy = nullptr;
  // A host tier larger than the experts the cache cannot hold is capped at them (the store tests
  // check the EP_ERR_BUDGET of a tier larger than the memory the process may take).
  ep_model *probe = nullptr;
  REQUIRE(ep_model_open(&probe, m.gguf.c_str(), &o) == EP_OK);
  const uint64_t slot = store_stats(probe).slot_bytes;
  ep_model_close(probe);
  o.cache_budget_bytes = 2 * slot;
  o.host_cache_bytes = uint64_t{1} << 62;
  REQUIRE(ep_model_open(&model, m.gguf.c_str(), &o) == EP_OK);
  const ep_store_stats capped = store_stats(model);
  CHECK(capped.host_slots > 0);
  CHECK(capped.host_slots + capped.cache_slots == 4 * 6);  // deepseek_v4_a: 4 layers x 6 experts
  ep_model_close(model);
  // The stats struct of the first version is filled up to its size.
  REQUIRE(ep_model_open(&model, m.gguf.c_str(), &o) == EP_OK);
  ep_store_stats old;
  ep_store_stats_init(&old);
  old.struct_size = offsetof(ep_store_stats, host_hits);
  old.host_hits = 12345;
  CHECK(ep_model_store_stats(&old, model) == EP_OK);
  CHECK(old.host_hits == 12345);  // past its struct_size: untouched
  CHECK(old.cache_slots == 2);
  old.struct_size = offsetof(ep_store_stats, host_hits) - 8;
  CHECK(ep_model_store_stats(&old, model) == EP_ERR_STRUCT_SIZE);
  ep_model_close(model);
  // Options of the previous version (up to cpu_threads) get the defaults of the new fields.
  ep_model_options prev;
  ep_model_options_init(&prev);
  prev.device = EP_DEVICE_CPU;
  prev.pack_dir = packs.c_str();
  prev.struct_size = offsetof(ep_model_options, host_cache_bytes);
  prev.host_cache_bytes = 999;  // ignored: past struct_size
  REQUIRE(ep_model_open(&model, m.gguf.c_str(), &prev) == EP_OK);
  CHECK(store_stats(model).host_slots == 0);
  ep_model_close(model);
}
