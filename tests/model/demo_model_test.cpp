// The trained demo model (models/demo-kjv.gguf: a small DeepSeek-V4 trained on the King James
// Bible, MXFP4 routed experts, Q8_0 dense) on the CPU backend against transformers' golden
// (tests/data/demo_model/golden.json; scripts/dev/train-demo-model oracle).
//
// Tolerance: logits at the golden's top-8 ids and each row's log-sum-exp within 1e-4 · max|logit|,
// perplexity within 1e-4 (relative). Both sides compute in float32 on the very same weights:
// the oracle loaded transformers' model with the values ggml dequantizes from this file's bytes
// (MXFP4 and Q8_0 decode exactly to float32), so what remains is float32 rounding in another
// summation order (measured: 6e-7 of max|logit|, perplexity 2e-7). The bound is the one the
// other DeepSeek-V4 goldens use; a wrong weight, norm or rope dimension moves logits by ~1e-1.
// Greedy tokens are compared over the steps whose margin exceeds 0.05 and whose router and
// indexer selections are at least 2e-5 (relative) from their top-k cut-off, where float32
// rounding cannot change a choice.
#include "support/catch.hpp"
#include "support/temp_dir.hpp"

#include "support/demo_model_golden.hpp"

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

using namespace demomodel;

namespace {

constexpr double kLimit = 1e-4;       // max|dlogit| / max|logit| and max|dlogsumexp| / max|logit|
constexpr double kPerplexity = 1e-4;  // |dperplexity| / perplexity
constexpr double kMargin = 0.05;      // greedy tokens compared where the top-1 / top-2 margin exceeds this

std::vector<int32_t> tokenize(const ep_tokenizer *t, const std::string &text, uint32_t flags) {
  size_t n = 0;
  REQUIRE(ep_tokenize(nullptr, 0, &n, t, text.data(), text.size(), flags) == EP_OK);
  std::vector<int32_t> ids(n);
  REQUIRE(ep_tokenize(ids.data(), ids.size(), &n, t, text.data(), text.size(), flags) == EP_OK);
  return ids;
}

std::string render(const ep_tokenizer *t, const json &messages) {
  const Conversation conv(messages);
  size_t n = 0;
  REQUIRE(ep_chat_render(nullptr, 0, &n, t, conv.messages.data(), conv.messages.size(), nullptr) == EP_OK);
  std::string out(n + 1, '\0');
  REQUIRE(ep_chat_render(out.data(), out.size(), &n, t, conv.messages.data(), conv.messages.size(), nullptr) == EP_OK);
  out.resize(n);
  return out;
}

}  // namespace

TEST_CASE("demo model: the GGUF's tokenizer and chat template give transformers' ids", "[model][demo_model][tokenizer]") {
  ep_tokenizer *t = nullptr;
  REQUIRE(ep_tokenizer_open(&t, model_path().c_str()) == EP_OK);
  ep_tokenizer_properties p;
  ep_tokenizer_properties_init(&p);
  REQUIRE(ep_tokenizer_info(&p, t) == EP_OK);
  CHECK(p.vocab_size == golden().at("tokenizer").at("vocab").get<uint32_t>());
  CHECK(p.chat_template == EP_CHAT_TEMPLATE_DEEPSEEK_V4);
  const json &check = golden().at("tokenize_check");
  CHECK(tokenize(t, check.at("text").get<std::string>(), 0) == ids_of(check.at("ids")));
  for (const json &c : golden().at("continuations")) {
    INFO(c.at("name").get<std::string>());
    if (c.at("kind") == "chat") {
      const std::string prompt = render(t, c.at("messages"));
      CHECK(prompt == c.at("prompt").get<std::string>());
      CHECK(tokenize(t, prompt, 0) == ids_of(c.at("prompt_ids")));
    } else {
      CHECK(tokenize(t, c.at("prompt").get<std::string>(), EP_TOKENIZE_ADD_SPECIAL) == ids_of(c.at("prompt_ids")));
    }
  }
  ep_tokenizer_close(t);
  // The same vocabulary as HF's tokenizer.json the GGUF's keys were made from.
  REQUIRE(ep_tokenizer_open(&t, hf_tokenizer_path().c_str()) == EP_OK);
  CHECK(tokenize(t, check.at("text").get<std::string>(), 0) == ids_of(check.at("ids")));
  ep_tokenizer_close(t);
}

TEST_CASE("demo model: held-out logits and perplexity match transformers on the CPU", "[model][demo_model][goldens]") {
  ep::test::TempDir dir;
  const std::vector<int32_t> tokens = passage_tokens();
  const size_t V = vocab();
  ep_model *m = open_model(dir.str(), EP_DEVICE_CPU);
  CHECK(model_info(m).vocab_size == V);
  const std::vector<float> logits = score_all(m, tokens, V);
  const PassageDiff d = compare_passage(logits, V, kMargin);
  print_passage(("CPU, " + golden().at("passage").at("chapter").get<std::string>()).c_str(), d);
  CHECK(d.logit_rel <= kLimit);
  CHECK(d.lse_rel <= kLimit);
  CHECK(d.perplexity_rel() <= kPerplexity);
  CHECK(d.clear_rows > static_cast<int64_t>(tokens.size()) / 2);
  CHECK(d.agree_rows == d.clear_rows);
  // Through an expert cache of three slots (streamed and evicted): the same bits.
  const uint64_t slot = store_stats(m).slot_bytes;
  ep_model_close(m);
  ep_model *small = open_model(dir.str(), EP_DEVICE_CPU, 3 * slot);
  CHECK(score_all(small, tokens, V) == logits);
  const ep_store_stats s = store_stats(small);
  std::printf("demo model, 3-slot cache: %llu acquires, %llu hits, %llu misses, %llu evictions\n",
              static_cast<unsigned long long>(s.acquires), static_cast<unsigned long long>(s.cache_hits),
              static_cast<unsigned long long>(s.cache_misses), static_cast<unsigned long long>(s.cache_evictions));
  CHECK(s.cache_slots == 3);
  CHECK(s.cache_evictions > 0);
  ep_model_close(small);
}

TEST_CASE("demo model: greedy continuations equal transformers' on the CPU", "[model][demo_model][goldens]") {
  ep::test::TempDir dir;
  ep_model *m = open_model(dir.str(), EP_DEVICE_CPU);
  // Enough clear steps that the check cannot pass by comparing nothing.
  CHECK(check_continuations(m, kMargin, "CPU") >= 40);
  // The text path (template, tokenizer, model, streamed decoding) on the chat prompts whose
  // every golden step is clear: the streamed answer is transformers' text.
  ep_tokenizer *t = nullptr;
  REQUIRE(ep_tokenizer_open_model(&t, m) == EP_OK);
  int checked = 0;
  for (const json &c : golden().at("continuations")) {
    if (c.at("kind") != "chat" || c.at("compare_until").get<size_t>() != c.at("steps").size()) continue;
    const Conversation conv(c.at("messages"));
    ep_session *s = nullptr;
    REQUIRE(ep_session_open(&s, m) == EP_OK);
    ep_generate_options go;
    ep_generate_options_init(&go);
    go.max_new_tokens = static_cast<uint32_t>(c.at("steps").size());
    std::string text;
    REQUIRE(ep_generate_chat(nullptr, s, t, conv.messages.data(), conv.messages.size(), nullptr, &go, ep::test::append_text,
                             &text) == EP_OK);
    ep_session_close(s);
    std::printf("demo model, %s: %s\n", c.at("name").get<std::string>().c_str(), text.c_str());
    CHECK(text == c.at("text").get<std::string>());
    ++checked;
  }
  CHECK(checked >= 1);
  ep_tokenizer_close(t);
  ep_model_close(m);
}
