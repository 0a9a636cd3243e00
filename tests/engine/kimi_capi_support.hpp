// Shared helpers of the Kimi C API tests (kimi_capi_test, kimi_capi_gpu_test,
// kimi_synthetic_api_test): the goldens with their config, opening a model, scoring, generating.
#pragma once

#include "support/catch.hpp"

#include "support/capi_support.hpp"
#include "support/kimi_golden.hpp"

#include <expertpack/expertpack.h>

#include <string>
#include <vector>

namespace kimicapi {

using ep::test::append_text;
using ep::test::collect;
using ep::test::open_model;
using ep::test::score_all;
using ep::test::store_stats;
using ep::test::try_open;

/// A golden (kimitest::Golden) with what the C API reports about its model.
struct Golden : kimitest::Golden {
  std::string name, arch;
  int64_t layers = 0, hidden = 0, experts = 0, top_k = 0, n_dense = 0;
};

inline Golden load_golden(const std::string &dir, const std::string &name, const std::string &arch) {
  Golden r;
  static_cast<kimitest::Golden &>(r) = kimitest::load_golden(name, dir);
  r.name = name;
  r.arch = arch;
  const nlohmann::json &c = r.meta.at("config");
  r.layers = c.at("layers").get<int64_t>();
  r.hidden = c.at("hidden").get<int64_t>();
  r.experts = c.at("experts").get<int64_t>();
  r.top_k = c.at("top_k").get<int64_t>();
  r.n_dense = c.at("n_dense").get<int64_t>();
  return r;
}

inline std::vector<Golden> goldens() {
  return {load_golden("kimi_linear", "kimi_a", "kimi-linear"), load_golden("kimi_linear", "kimi_b", "kimi-linear"),
          load_golden("kimi_k3", "k3_a", "kimi-k3")};
}

/// @p n tokens generated after @p prompt on a new session (greedy at temperature 0).
inline std::vector<int32_t> generate(ep_model *m, const std::vector<int32_t> &prompt, uint32_t n, float temperature,
                                     uint64_t seed) {
  ep_session *s = nullptr;
  REQUIRE(ep_session_open(&s, m) == EP_OK);
  ep_generate_options g;
  ep_generate_options_init(&g);
  g.max_new_tokens = n;
  g.temperature = temperature;
  g.seed = seed;
  std::vector<int32_t> out;
  ep_generate_stats st;
  ep_generate_stats_init(&st);
  REQUIRE(ep_generate(&st, s, prompt.data(), prompt.size(), &g, collect, &out) == EP_OK);
  CHECK(st.prompt_tokens == prompt.size());
  CHECK(st.generated_tokens == n);
  CHECK(st.session_tokens == prompt.size() + n);
  ep_session_close(s);
  REQUIRE(out.size() == n);
  return out;
}

/// One user message answered with @p n tokens (EOS ignored) on a new session; returns the stats.
inline ep_generate_stats chat(ep_model *m, const ep_tokenizer *tok, const char *user, uint32_t n) {
  ep_session *s = nullptr;
  REQUIRE(ep_session_open(&s, m) == EP_OK);
  const ep_chat_message msg = {"user", user, nullptr};
  ep_generate_options g;
  ep_generate_options_init(&g);
  g.max_new_tokens = n;
  g.ignore_eos = 1;
  ep_generate_stats gs;
  ep_generate_stats_init(&gs);
  std::string text;
  REQUIRE(ep_generate_chat(&gs, s, tok, &msg, 1, nullptr, &g, append_text, &text) == EP_OK);
  CHECK(gs.generated_tokens == n);
  ep_session_close(s);
  return gs;
}

}  // namespace kimicapi
