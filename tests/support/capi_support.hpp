// C API helpers the model and engine tests share: opening a model with a pack folder, cache budget, device
// and resident experts; scoring every row; the store's statistics; token and text collectors.
#pragma once

#include "support/catch.hpp"

#include <expertpack/expertpack.h>

#include <string>
#include <vector>

namespace ep::test {

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

inline int append_text(const char *piece, size_t n, void *payload) {
  static_cast<std::string *>(payload)->append(piece, n);
  return 0;
}

}  // namespace ep::test
