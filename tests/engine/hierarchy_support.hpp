// Shared by the memory-hierarchy tests through the C API (hierarchy_capi_test on the CPU,
// hierarchy_gpu_test on CUDA): the goldens' models, opening one with a set of features, a prompt
// pass followed by decoding token by token, bitwise comparison.
#pragma once

#include "support/catch.hpp"

#include "support/capi_support.hpp"

#include <expertpack/expertpack.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace hierarchytest {

using ep::test::score_all;
using ep::test::store_stats;

struct Model {
  std::string gguf;
  std::vector<int32_t> tokens;
};

inline std::vector<Model> models() {
  const std::string d = EP_TEST_DATA_DIR;
  std::vector<int32_t> toks;
  for (int i = 0; i < 24; ++i) toks.push_back((i * 37 + 11) % 60 + 3);  // inside both vocabularies (97, 67)
  return {{d + "/deepseek_v4/deepseek_v4_a.gguf", toks}, {d + "/kimi_k3/k3_a.gguf", toks}};
}

struct Features {
  uint64_t cache_bytes = 0;
  uint64_t host_bytes = 0;
  int overlap = 0, prefetch = 0, resident = 0;
  const char *policy = nullptr;
};

inline ep_model *open(const Model &m, const std::string &packs, const Features &f, ep_device_kind device) {
  ep_model_options o;
  ep_model_options_init(&o);
  o.device = device;
  o.pack_dir = packs.c_str();
  o.cache_budget_bytes = f.cache_bytes;
  o.host_cache_bytes = f.host_bytes;
  o.overlap_reads = f.overlap;
  o.prefetch = f.prefetch;
  o.resident_experts = f.resident;
  o.cache_policy = f.policy;
  o.direct_io = 0;
  ep_model *out = nullptr;
  const ep_status st = ep_model_open(&out, m.gguf.c_str(), &o);
  INFO(m.gguf << ": " << ep_last_error());
  REQUIRE(st == EP_OK);
  return out;
}

/// A prompt pass of the first half, then the rest token by token: every row of logits.
inline std::vector<float> run(ep_model *model, const std::vector<int32_t> &tokens, size_t vocab) {
  ep_session *s = nullptr;
  REQUIRE(ep_session_open(&s, model) == EP_OK);
  std::vector<float> out(tokens.size() * vocab);
  const size_t half = tokens.size() / 2;
  const ep_status st = ep_score(s, tokens.data(), half, 0, nullptr, out.data());
  INFO(ep_last_error());
  REQUIRE(st == EP_OK);
  for (size_t t = half; t < tokens.size(); ++t) {
    const ep_status sd = ep_score(s, &tokens[t], 1, 0, nullptr, out.data() + t * vocab);
    INFO(ep_last_error());
    REQUIRE(sd == EP_OK);
  }
  ep_session_close(s);
  return out;
}

inline bool same_bits(const std::vector<float> &a, const std::vector<float> &b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// Each feature of @p on alone, over @p off: the logits must be @p ref's bits.
inline void check_each_feature_alone(const Model &m, const std::string &packs, const Features &off, const Features &on,
                                     ep_device_kind device, size_t vocab, const std::vector<float> &ref) {
  for (int which = 0; which < 3; ++which) {
    INFO("feature " << (which == 0 ? "host tier" : which == 1 ? "overlap" : "prefetch") << " alone");
    Features one = off;
    if (which == 0) one.host_bytes = on.host_bytes;
    if (which == 1) one.overlap = 1;
    if (which == 2) one.prefetch = 1;
    ep_model *c = open(m, packs, one, device);
    CHECK(same_bits(run(c, m.tokens, vocab), ref));
    ep_model_close(c);
  }
}

}  // namespace hierarchytest
