// Kimi through the C API on a GPU (skips without one): the goldens scored on CUDA with experts
// from the store's CUDA device (a cache of top_k slots: evictions) must be within 2e-2 · max|logit| of
// the CPU, greedy tokens must agree where the CPU's top-1 / top-2 margin exceeds 0.1, also with
// the smallest cache.
#include "support/catch.hpp"
#include "support/temp_dir.hpp"

#include "kimi_capi_support.hpp"
#include "model/causal_lm.hpp"

#include <expertpack/expertpack.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

using namespace kimicapi;

TEST_CASE("kimi C API on CUDA", "[model][kimi][capi][gpu]") {
  for (const Golden &c : goldens()) {
    INFO(c.name);
    ep::test::TempDir dir;
    const std::vector<int32_t> &tokens = c.tokens;
    ep_model *cpu = open_model(c.gguf, dir.str(), 0);
    const size_t V = static_cast<size_t>(c.vocab), S = tokens.size();
    const std::vector<float> ref = score_all(cpu, tokens, V);
    ep_model_close(cpu);

    ep_model *gpu = nullptr;
    const ep_status st = try_open(&gpu, c.gguf, dir.str(), 0, 0, EP_DEVICE_CUDA);
    if (!ep::model::architecture_runs_on(c.arch, ep::backend::Device::cuda)) {
      std::printf("%s: Kimi is CPU-only in the C API (model::kimi_runs_on): checking the refusal and AUTO\n", c.name.c_str());
      CHECK(st == EP_ERR_UNSUPPORTED);
      ep_model *autom = open_model(c.gguf, dir.str(), 0, 0, EP_DEVICE_AUTO);
      CHECK(score_all(autom, tokens, V) == ref);  // the CPU, bit for bit
      ep_model_close(autom);
      continue;
    }
    INFO(ep_last_error());
    REQUIRE(st == EP_OK);
    const uint64_t slot = store_stats(gpu).slot_bytes;
    const std::vector<float> got = score_all(gpu, tokens, V);
    ep_model_close(gpu);
    const kimitest::Diff d = kimitest::compare(got.data(), ref.data(), ref.size());
    std::printf("%s on CUDA via the C API: max|dlogit| %.3g of max|logit| %.4g (ratio %.3g, limit 2e-2)\n", c.name.c_str(),
                d.max_abs_diff, d.max_abs_ref, d.rel());
    CHECK(d.rel() <= 2e-2);
    for (size_t t = 0; t < S; ++t) {
      const float *r = ref.data() + t * V, *g = got.data() + t * V;
      std::vector<float> sorted(r, r + V);
      std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<>());
      if (sorted[0] - sorted[1] > 0.1f) CHECK(std::max_element(g, g + V) - g == std::max_element(r, r + V) - r);
    }
    // A cache of top_k slots on the GPU evicts and stays within the same bound (MoE chunks of
    // other sizes may take other kernels, so bit equality is not asked for).
    gpu = open_model(c.gguf, dir.str(), slot * static_cast<uint64_t>(c.top_k), 0, EP_DEVICE_CUDA);
    const std::vector<float> small = score_all(gpu, tokens, V);
    const double small_rel = kimitest::compare(small.data(), ref.data(), ref.size()).rel();
    std::printf("%s on CUDA, cache of %lld slots: ratio %.3g\n", c.name.c_str(), static_cast<long long>(c.top_k), small_rel);
    CHECK(small_rel <= 2e-2);
    CHECK(store_stats(gpu).cache_evictions > 0);
    ep_model_close(gpu);
  }
}
