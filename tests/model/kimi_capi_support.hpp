// Shared helpers of the Kimi C API tests (kimi_capi_test, kimi_capi_gpu_test,
// kimi_synthetic_api_test): the goldens with their config, opening a model, scoring, generating.
#pragma once

#include "support/catch.hpp"

#include "kimi_golden.hpp"

#include <expertpack/expertpack.h>

#include <string>
#include <vector>

namespace kimicapi {

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

inline ep_status try_open(ep_model **m, const std::string &path, const std::string &pack_dir, uint64_t cache_bytes,
                          int resident = 0, ep_device_kind device = EP_DEVICE_CPU) {
  ep_model_options o;
  ep_model_options_init(&o);
  o.device = device;
  o.pack_dir = pack_dir.c_str();
  o.cache_budget_bytes = cache_bytes;
  o.resident_experts = resident;
  return ep_model_open(m, path.c_str(), &o);
}

inline ep_model *open_model(const std::string &path, const std::string &pack_dir, uint64_t cache_bytes, int resident = 0,
                            ep_device_kind device = EP_DEVICE_CPU) {
  ep_model *m = nullptr;
  const ep_status st = try_open(&m, path, pack_dir, cache_bytes, resident, device);
  INFO(path << ": " << ep_last_error());
  REQUIRE(st == EP_OK);
  REQUIRE(m != nullptr);
  return m;
}

/// Full logits of @p tokens scored on a new session.
inline std::vector<float> score_all(ep_model *m, const std::vector<int32_t> &tokens, size_t vocab) {
  ep_session *s = nullptr;
  REQUIRE(ep_session_open(&s, m) == EP_OK);
  std::vector<float> out(tokens.size() * vocab);
  REQUIRE(ep_score(s, tokens.data(), tokens.size(), 0, nullptr, out.data()) == EP_OK);
  uint64_t len = 0;
  REQUIRE(ep_session_length(&len, s) == EP_OK);
  CHECK(len == tokens.size());
  ep_session_close(s);
  return out;
}

inline ep_store_stats store_stats(const ep_model *m) {
  ep_store_stats st;
  ep_store_stats_init(&st);
  REQUIRE(ep_model_store_stats(&st, m) == EP_OK);
  return st;
}

inline int collect(int32_t token, uint32_t, void *payload) {
  static_cast<std::vector<int32_t> *>(payload)->push_back(token);
  return 0;
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

inline int append_text(const char *piece, size_t n, void *payload) {
  static_cast<std::string *>(payload)->append(piece, n);
  return 0;
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
