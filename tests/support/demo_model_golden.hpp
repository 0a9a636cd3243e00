// What the demo model's tests share: the trained model (models/demo-kjv.gguf), transformers'
// golden for it (tests/data/demo_model/golden.json, written by scripts/dev/train-demo-model
// oracle), opening and scoring through the C API, and the comparison of logits with the golden's
// top-k, log-sum-exp and perplexity.
#pragma once

#include "support/catch.hpp"

#include "support/capi_support.hpp"
#include "support/golden_common.hpp"

#include <expertpack/expertpack.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace demomodel {

using nlohmann::json;

inline std::string model_path() { return std::string(EP_TEST_DATA_DIR) + "/../../models/demo-kjv.gguf"; }
inline std::string hf_tokenizer_path() { return std::string(EP_TEST_DATA_DIR) + "/../../models/demo-kjv-tokenizer.json"; }

inline const json &golden() {
  static const json g = json::parse(ep::test::slurp(std::string(EP_TEST_DATA_DIR) + "/demo_model/golden.json"));
  return g;
}

inline std::vector<int32_t> ids_of(const json &j) { return j.get<std::vector<int32_t>>(); }

/// A golden conversation ([[user, answer or null], ...]) as C API chat messages.
struct Conversation {
  std::vector<std::string> text;
  std::vector<ep_chat_message> messages;
  explicit Conversation(const json &turns) {
    for (const json &turn : turns) {
      text.push_back(turn[0].get<std::string>());
      if (!turn[1].is_null()) text.push_back(turn[1].get<std::string>());
    }
    size_t i = 0;
    for (const json &turn : turns) {
      messages.push_back({"user", text[i++].c_str(), nullptr});
      if (!turn[1].is_null()) messages.push_back({"assistant", text[i++].c_str(), nullptr});
    }
  }
  Conversation(const Conversation &) = delete;  // messages point into text
  Conversation &operator=(const Conversation &) = delete;
};

inline std::vector<int32_t> passage_tokens() { return ids_of(golden().at("passage").at("tokens")); }
inline size_t vocab() { return golden().at("tokenizer").at("vocab").get<size_t>(); }

inline ep_model_properties model_info(const ep_model *m) {
  ep_model_properties p;
  ep_model_properties_init(&p);
  REQUIRE(ep_model_info(&p, m) == EP_OK);
  return p;
}

using ep::test::score_all;
using ep::test::store_stats;

/// Opens the model; @p cache_bytes 0 = room for every expert.
inline ep_model *open_model(const std::string &pack_dir, ep_device_kind device, uint64_t cache_bytes = 0) {
  return ep::test::open_model(model_path(), pack_dir, cache_bytes, 0, device);
}

/// How logits of the golden passage compare with transformers': the largest difference at the
/// golden's top-k ids and of each row's log-sum-exp, both per max|logit|; the perplexity; and
/// the greedy token where the golden's top-1 / top-2 margin is clear.
struct PassageDiff {
  double logit_rel = 0, lse_rel = 0, perplexity = 0, golden_perplexity = 0;
  int64_t clear_rows = 0, agree_rows = 0;
  double perplexity_rel() const { return std::fabs(perplexity - golden_perplexity) / golden_perplexity; }
};

inline PassageDiff compare_passage(const std::vector<float> &logits, size_t vocab, double margin) {
  const json &p = golden().at("passage");
  const std::vector<int32_t> tokens = ids_of(p.at("tokens"));
  const double max_abs = p.at("max_abs_logit").get<double>();
  PassageDiff d;
  d.golden_perplexity = p.at("perplexity").get<double>();
  double nll = 0;
  for (size_t t = 0; t < tokens.size(); ++t) {
    const float *row = logits.data() + t * vocab;
    const json &ids = p.at("topk_ids")[t], &vals = p.at("topk_logits")[t];
    for (size_t k = 0; k < ids.size(); ++k) {
      const float got = row[ids[k].get<int32_t>()];
      REQUIRE(std::isfinite(got));
      d.logit_rel = std::max(d.logit_rel, std::fabs(got - vals[k].get<double>()) / max_abs);
    }
    const float mx = *std::max_element(row, row + vocab);
    double sum = 0;
    for (size_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(row[i]) - mx);
    const double lse = mx + std::log(sum);
    d.lse_rel = std::max(d.lse_rel, std::fabs(lse - p.at("logsumexp")[t].get<double>()) / max_abs);
    if (t + 1 < tokens.size()) nll += lse - row[tokens[t + 1]];
    if (vals[0].get<double>() - vals[1].get<double>() > margin) {
      ++d.clear_rows;
      d.agree_rows += std::max_element(row, row + vocab) - row == ids[0].get<int32_t>();
    }
  }
  d.perplexity = std::exp(nll / static_cast<double>(tokens.size() - 1));
  return d;
}

inline void print_passage(const char *what, const PassageDiff &d) {
  std::printf("demo model %s: max|dlogit| at the golden's top-%d %.3g, max|dlogsumexp| %.3g (of max|logit| %.4g); "
              "perplexity %.6f, transformers %.6f (rel %.3g); top-1 equal on %lld of %lld clear rows\n",
              what, golden().at("passage").at("topk").get<int>(), d.logit_rel, d.lse_rel,
              golden().at("passage").at("max_abs_logit").get<double>(), d.perplexity, d.golden_perplexity, d.perplexity_rel(),
              static_cast<long long>(d.agree_rows), static_cast<long long>(d.clear_rows));
}

/// Greedy ep_generate after @p prompt for @p n tokens (stops after EOS).
inline std::vector<int32_t> generate_greedy(ep_model *m, const std::vector<int32_t> &prompt, uint32_t n) {
  ep_session *s = nullptr;
  REQUIRE(ep_session_open(&s, m) == EP_OK);
  ep_generate_options go;
  ep_generate_options_init(&go);
  go.max_new_tokens = n;
  go.stop_token = golden().at("tokenizer").at("eos").get<int32_t>();
  std::vector<int32_t> out;
  REQUIRE(ep_generate(nullptr, s, prompt.data(), prompt.size(), &go, ep::test::collect, &out) == EP_OK);
  ep_session_close(s);
  return out;
}

/// Checks each golden continuation's greedy tokens on @p m over its leading steps whose top-1 /
/// top-2 margin exceeds @p margin and whose router / indexer choices are clear (the golden's
/// compare_until); returns the number of tokens compared.
inline int64_t check_continuations(ep_model *m, double margin, const char *what) {
  int64_t compared = 0;
  for (const json &c : golden().at("continuations")) {
    const std::string name = c.at("name").get<std::string>();
    INFO(what << ": continuation " << name);
    const std::vector<int32_t> want = ids_of(c.at("generated"));
    const std::vector<int32_t> got = generate_greedy(m, ids_of(c.at("prompt_ids")), static_cast<uint32_t>(want.size()));
    size_t until = 0;
    const size_t clear = c.at("compare_until").get<size_t>();
    while (until < clear && c.at("steps")[until].at("margin").get<double>() > margin) ++until;
    size_t equal = 0;
    while (equal < std::min(want.size(), got.size()) && want[equal] == got[equal]) ++equal;
    std::printf("demo model %s, %s: %zu of %zu greedy tokens equal transformers' (%zu clear steps compared)\n", what,
                name.c_str(), equal, want.size(), until);
    REQUIRE(got.size() >= until);
    for (size_t i = 0; i < until; ++i) CHECK(got[i] == want[i]);
    compared += static_cast<int64_t>(until);
  }
  return compared;
}

}  // namespace demomodel
