// A model on a list of CUDA devices through the C API (skips without a GPU), on the goldens'
// models: the list of one ("cuda:0") runs the one device's path unchanged (the logits' bits of
// the model opened without a list); the same GPU named twice ("cuda:0,cuda:0": two backends, two
// streams, two expert caches on one GPU) runs the exchange between devices — activations out,
// rows back, the sums on the first device — and gives the same greedy tokens and the same logits,
// streamed from a pack through small caches and resident.
#include "support/catch.hpp"
#include "support/temp_dir.hpp"

#include "hierarchy_support.hpp"

#include <expertpack/expertpack.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

using namespace hierarchytest;

namespace {

ep_model *open_cuda(const Model &m, const std::string &packs, const Features &f, const char *devices) {
  ep_model_options o;
  ep_model_options_init(&o);
  if (devices) o.devices = devices;
  else o.device = EP_DEVICE_CUDA;
  o.pack_dir = packs.c_str();
  o.cache_budget_bytes = f.cache_bytes;
  o.resident_experts = f.resident;
  o.overlap_reads = f.overlap;
  o.direct_io = 0;
  ep_model *out = nullptr;
  const ep_status st = ep_model_open(&out, m.gguf.c_str(), &o);
  INFO(m.gguf << " on " << (devices ? devices : "cuda") << ": " << ep_last_error());
  REQUIRE(st == EP_OK);
  return out;
}

std::vector<int32_t> greedy(ep_model *model, const std::vector<int32_t> &prompt, uint32_t n) {
  ep_session *s = nullptr;
  REQUIRE(ep_session_open(&s, model) == EP_OK);
  ep_generate_options g;
  ep_generate_options_init(&g);
  g.max_new_tokens = n;
  g.temperature = 0.0f;
  g.ignore_eos = 1;
  std::vector<int32_t> out;
  const ep_status st = ep_generate(nullptr, s, prompt.data(), prompt.size(), &g, ep::test::collect, &out);
  INFO(ep_last_error());
  REQUIRE(st == EP_OK);
  ep_session_close(s);
  return out;
}

double max_abs_diff(const std::vector<float> &a, const std::vector<float> &b) {
  double d = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) d = std::max(d, std::fabs(static_cast<double>(a[i]) - b[i]));
  return d;
}

}  // namespace

TEST_CASE("multi-device on CUDA: one device through the list, and one GPU named twice", "[model][capi][multi_device][gpu]") {
  for (const Model &m : models()) {
    INFO(m.gguf);
    ep::test::TempDir dir;
    const std::string packs = dir / "packs";
    ep_model *probe = open_cuda(m, packs, Features{}, nullptr);
    ep_model_properties p;
    ep_model_properties_init(&p);
    REQUIRE(ep_model_info(&p, probe) == EP_OK);
    REQUIRE(p.device == EP_DEVICE_CUDA);
    const size_t V = p.vocab_size;
    const ep_store_stats ps = ep::test::store_stats(probe);
    const uint64_t slot = ps.slot_bytes, all = ps.cache_slots;
    ep_model_close(probe);
    const std::vector<int32_t> prompt(m.tokens.begin(), m.tokens.begin() + 8);
    constexpr uint32_t kNew = 16;

    Features small;
    small.cache_bytes = slot * (all / 4);
    Features resident;
    resident.resident = 1;
    for (const Features &f : {small, resident}) {
      INFO((f.resident ? "resident" : "pack, a quarter of the experts per device"));
      ep_model *one = open_cuda(m, packs, f, nullptr);
      const std::vector<float> ref = run(one, m.tokens, V);
      const std::vector<int32_t> ref_tokens = greedy(one, prompt, kNew);
      ep_model_close(one);

      ep_model *listed = open_cuda(m, packs, f, "cuda:0");
      CHECK(same_bits(run(listed, m.tokens, V), ref));
      CHECK(greedy(listed, prompt, kNew) == ref_tokens);
      ep_model_close(listed);

      ep_model *twice = open_cuda(m, packs, f, "cuda:0,cuda:0");
      const std::vector<float> got = run(twice, m.tokens, V);
      const std::vector<int32_t> got_tokens = greedy(twice, prompt, kNew);
      if (!f.resident) {
        const ep_store_stats st = ep::test::store_stats(twice);
        CHECK(st.cache_slots == 2 * (all / 4));
        CHECK(st.cache_evictions > 0);
      }
      ep_model_close(twice);
      std::printf("%s %s on cuda:0,cuda:0: max|dlogit| %.3g against one device\n", m.gguf.c_str(),
                  f.resident ? "resident" : "pack", max_abs_diff(got, ref));
      CHECK(got_tokens == ref_tokens);
      CHECK(same_bits(got, ref));
    }
  }
}
