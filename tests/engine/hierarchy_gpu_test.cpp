// The memory hierarchy on a GPU through the C API (skips without one): with the expert cache's
// slots in VRAM, a pinned host tier, overlapped reads (the staged MoE: moe_pairs per group of
// arriving experts, then moe_combine) and prefetch, the goldens' models give logits bit-identical
// to the same GPU with every feature off, for a prompt pass and token by token; demotions, host
// hits and used prefetches all happen. Kimi is skipped while the C API runs it on the CPU only.
#include "support/catch.hpp"
#include "support/temp_dir.hpp"

#include "hierarchy_support.hpp"

#include <expertpack/expertpack.h>

#include <cstdio>

using namespace hierarchytest;

TEST_CASE("hierarchy on CUDA: every feature on gives the bits of every feature off", "[model][capi][hierarchy][gpu]") {
  for (const Model &m : models()) {
    INFO(m.gguf);
    ep::test::TempDir dir;
    const std::string packs = dir / "packs";
    ep_model_options o;
    ep_model_options_init(&o);
    o.device = EP_DEVICE_CUDA;
    o.pack_dir = packs.c_str();
    ep_model *probe = nullptr;
    const ep_status st = ep_model_open(&probe, m.gguf.c_str(), &o);
    if (st == EP_ERR_UNSUPPORTED) {
      std::printf("%s: not run on CUDA through the C API: skipped\n", m.gguf.c_str());
      continue;
    }
    REQUIRE(st == EP_OK);
    ep_model_properties p;
    ep_model_properties_init(&p);
    REQUIRE(ep_model_info(&p, probe) == EP_OK);
    REQUIRE(p.device == EP_DEVICE_CUDA);
    const size_t V = p.vocab_size;
    const ep_store_stats ps = ep::test::store_stats(probe);
    const uint64_t slot = ps.slot_bytes, all = ps.cache_slots;
    ep_model_close(probe);
    Features off;
    off.cache_bytes = slot * (all / 2);
    Features on = off;
    on.host_bytes = slot * (all / 4);
    on.overlap = 1;
    on.prefetch = 1;
    for (const char *policy : {"decay", "sglang-lfu"}) {
      INFO(policy);
      off.policy = on.policy = policy;
      ep_model *a = open(m, packs, off, EP_DEVICE_CUDA);
      const std::vector<float> ref = run(a, m.tokens, V);
      ep_model_close(a);
      ep_model *b = open(m, packs, on, EP_DEVICE_CUDA);
      CHECK(same_bits(run(b, m.tokens, V), ref));
      const ep_store_stats sb = ep::test::store_stats(b);
      std::printf("%s [%s] on CUDA: %llu hits, %llu misses, %llu host hits, %llu demotions, prefetch %llu issued / %llu used\n",
                  m.gguf.c_str(), policy, static_cast<unsigned long long>(sb.cache_hits),
                  static_cast<unsigned long long>(sb.cache_misses), static_cast<unsigned long long>(sb.host_hits),
                  static_cast<unsigned long long>(sb.demotions), static_cast<unsigned long long>(sb.prefetch_issued),
                  static_cast<unsigned long long>(sb.prefetch_used));
      CHECK(sb.demotions > 0);
      CHECK(sb.host_hits > 0);
      CHECK(sb.prefetch_used > 0);
      ep_model_close(b);
      check_each_feature_alone(m, packs, off, on, EP_DEVICE_CUDA, V, ref);
    }
  }
}
