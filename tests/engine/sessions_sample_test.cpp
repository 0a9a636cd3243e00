// ep_sessions_sample (every session of a decode step sampled in one call) against one
// ep_session_sample / ep_session_sample_logprobs per session, on the trained demo model and the CPU
// backend: the same tokens and log-probabilities bit for bit with mixed settings (greedy,
// temperature + top_p, repetition penalty + logit bias, a JSON grammar's mask, log-probabilities),
// the draw counters and grammar states advancing alike; refusals name the session's index and
// change nothing.
#include "support/catch.hpp"
#include "support/temp_dir.hpp"

#include "support/demo_model_golden.hpp"

#include <cstring>
#include <string>
#include <vector>

using namespace demomodel;

namespace {

/// Two sessions of one prompt: one sampled in the batched call, the other by itself.
struct Pair {
  ep_session *batched = nullptr, *alone = nullptr;
  ep_grammar_state *batched_grammar = nullptr, *alone_grammar = nullptr;
  ep_generate_options options{};
  bool defaults = false;  // NULL options for the batched call
  int32_t top = -1;       // -1: no log-probabilities
};

void append_one(ep_session *s, int32_t token) {
  const int32_t *t = &token;
  const size_t one = 1;
  REQUIRE(ep_sessions_append(&s, &t, &one, 1) == EP_OK);
}

bool same_logprobs(const ep_token_logprobs &a, const ep_token_logprobs &b) {
  return a.token == b.token && std::memcmp(&a.logprob, &b.logprob, 4) == 0 && a.n_top == b.n_top &&
         std::memcmp(a.top_tokens, b.top_tokens, a.n_top * 4) == 0 && std::memcmp(a.top_logprobs, b.top_logprobs, a.n_top * 4) == 0;
}

/// One step: the batched call over every pair's batched session, one call per alone session;
/// the tokens (and log-probabilities) must agree. Returns the tokens.
std::vector<int32_t> step(std::vector<Pair> &pairs) {
  const size_t n = pairs.size();
  std::vector<ep_session *> sessions;
  std::vector<ep_generate_options> opts(n);
  std::vector<const ep_generate_options *> opt_ptrs;
  std::vector<ep_token_logprobs> lps(n);
  std::vector<ep_token_logprobs *> lp_ptrs;
  std::vector<uint32_t> tops;
  for (size_t i = 0; i < n; ++i) {
    Pair &p = pairs[i];
    sessions.push_back(p.batched);
    opts[i] = p.options;
    opts[i].grammar = p.batched_grammar;
    opt_ptrs.push_back(p.defaults ? nullptr : &opts[i]);
    ep_token_logprobs_init(&lps[i]);
    lps[i].logprob = 42.0f;  // poison: the call must write it
    lps[i].token = -7;
    lp_ptrs.push_back(p.top >= 0 ? &lps[i] : nullptr);
    tops.push_back(p.top >= 0 ? static_cast<uint32_t>(p.top) : 0);
  }
  std::vector<int32_t> got(n, -7);
  INFO(ep_last_error());
  REQUIRE(ep_sessions_sample(got.data(), lp_ptrs.data(), sessions.data(), opt_ptrs.data(), tops.data(), n) == EP_OK);
  for (size_t i = 0; i < n; ++i) {
    Pair &p = pairs[i];
    ep_generate_options o = p.options;
    o.grammar = p.alone_grammar;
    INFO("session " << i);
    if (p.top < 0) {
      int32_t want = -1;
      REQUIRE(ep_session_sample(&want, p.alone, p.defaults ? nullptr : &o) == EP_OK);
      CHECK(got[i] == want);
    } else {
      ep_token_logprobs want;
      ep_token_logprobs_init(&want);
      REQUIRE(ep_session_sample_logprobs(&want, p.alone, &o, static_cast<uint32_t>(p.top)) == EP_OK);
      CHECK(got[i] == want.token);
      CHECK(same_logprobs(lps[i], want));
      CHECK(lps[i].n_top == static_cast<uint32_t>(p.top));
    }
  }
  return got;
}

struct Fixture {
  ep::test::TempDir dir;
  ep_model *m = nullptr;
  ep_tokenizer *tok = nullptr;
  ep_grammar *grammar = nullptr;
  ep_tokenizer_properties tp{};
  std::vector<Pair> pairs;

  Fixture() {
    m = open_model(dir.str(), EP_DEVICE_CPU);
    REQUIRE(ep_tokenizer_open_model(&tok, m) == EP_OK);
    ep_tokenizer_properties_init(&tp);
    REQUIRE(ep_tokenizer_info(&tp, tok) == EP_OK);
    REQUIRE(ep_grammar_json_object(&grammar, tok) == EP_OK);
    const std::vector<int32_t> passage = passage_tokens();
    REQUIRE(passage.size() >= 40);
    pairs.resize(5);
    for (size_t i = 0; i < pairs.size(); ++i) {
      Pair &p = pairs[i];
      ep_generate_options_init(&p.options);
      REQUIRE(ep_session_open(&p.batched, m) == EP_OK);
      REQUIRE(ep_session_open(&p.alone, m) == EP_OK);
      const std::vector<int32_t> prompt(passage.begin() + static_cast<std::ptrdiff_t>(5 * i),
                                        passage.begin() + static_cast<std::ptrdiff_t>(5 * i + 8 + i));
      const int32_t *t = prompt.data();
      const size_t k = prompt.size();
      REQUIRE(ep_sessions_append(&p.batched, &t, &k, 1) == EP_OK);
      REQUIRE(ep_sessions_append(&p.alone, &t, &k, 1) == EP_OK);
    }
    pairs[0].defaults = true;  // greedy
    pairs[1].options.temperature = 0.9f;
    pairs[1].options.top_p = 0.9f;
    pairs[1].options.seed = 5;
    pairs[1].top = 3;
    pairs[2].options.temperature = 1.1f;
    pairs[2].options.seed = 7;
    pairs[2].options.repetition_penalty = 1.3f;
    pairs[2].options.repetition_window = 8;
    static const ep_logit_bias bias[] = {{11, 3.0f}, {12, -2.0f}};
    pairs[2].options.logit_bias = bias;
    pairs[2].options.n_logit_bias = 2;
    pairs[3].options.temperature = 0.8f;
    pairs[3].options.seed = 9;
    pairs[3].top = 0;
    REQUIRE(ep_grammar_state_open(&pairs[3].batched_grammar, grammar) == EP_OK);
    REQUIRE(ep_grammar_state_open(&pairs[3].alone_grammar, grammar) == EP_OK);
    pairs[4].top = EP_MAX_TOP_LOGPROBS;
    pairs[4].options.logit_bias = bias;
    pairs[4].options.n_logit_bias = 1;
  }
  ~Fixture() {
    for (Pair &p : pairs) {
      ep_grammar_state_close(p.batched_grammar);
      ep_grammar_state_close(p.alone_grammar);
      ep_session_close(p.batched);
      ep_session_close(p.alone);
    }
    ep_grammar_close(grammar);
    ep_tokenizer_close(tok);
    ep_model_close(m);
  }

  /// Steps of sample-then-append on both sides.
  void run(int steps) {
    for (int s = 0; s < steps; ++s) {
      const std::vector<int32_t> tokens = step(pairs);
      for (size_t i = 0; i < pairs.size(); ++i) {
        Pair &p = pairs[i];
        if (p.batched_grammar && (tokens[i] == tp.eos_id || tokens[i] == tp.end_of_turn_id)) {
          // The value is complete: the grammar allows nothing after its end token.
          ep_grammar_state_close(p.batched_grammar);
          ep_grammar_state_close(p.alone_grammar);
          p.batched_grammar = p.alone_grammar = nullptr;
        }
        append_one(p.batched, tokens[i]);
        append_one(p.alone, tokens[i]);
      }
    }
  }
};

}  // namespace

TEST_CASE("ep_sessions_sample: every session's draw as ep_session_sample alone, bit for bit", "[model][batch][sampling]") {
  Fixture f;
  f.run(8);
}

TEST_CASE("ep_sessions_sample: refusals name the session and change nothing", "[model][batch][sampling]") {
  Fixture f;
  f.run(1);
  const size_t n = f.pairs.size();
  std::vector<ep_session *> sessions;
  std::vector<ep_generate_options> opts(n);
  std::vector<const ep_generate_options *> opt_ptrs;
  for (size_t i = 0; i < n; ++i) {
    sessions.push_back(f.pairs[i].batched);
    opts[i] = f.pairs[i].options;
    opts[i].grammar = f.pairs[i].batched_grammar;
    opt_ptrs.push_back(&opts[i]);
  }
  std::vector<int32_t> out(n, -7);
  auto refused = [&](ep_status status, const std::string &needle, ep_token_logprobs *const *lps = nullptr,
                     const uint32_t *tops = nullptr) {
    const ep_status st = ep_sessions_sample(out.data(), lps, sessions.data(), opt_ptrs.data(), tops, n);
    INFO(ep_last_error());
    CHECK(st == status);
    CHECK(std::string(ep_last_error()).find(needle) != std::string::npos);
    CHECK(out == std::vector<int32_t>(n, -7));
  };
  CHECK(ep_sessions_sample(nullptr, nullptr, sessions.data(), nullptr, nullptr, n) == EP_ERR_INVALID_ARGUMENT);
  CHECK(ep_sessions_sample(out.data(), nullptr, nullptr, nullptr, nullptr, n) == EP_ERR_INVALID_ARGUMENT);
  CHECK(ep_sessions_sample(out.data(), nullptr, sessions.data(), nullptr, nullptr, 0) == EP_ERR_INVALID_ARGUMENT);

  ep_session *second = sessions[2];
  sessions[2] = sessions[0];
  refused(EP_ERR_INVALID_ARGUMENT, "sessions[0] and sessions[2] are the same session");
  sessions[2] = second;

  ep_session *empty = nullptr;
  REQUIRE(ep_session_open(&empty, f.m) == EP_OK);
  sessions[1] = empty;
  refused(EP_ERR_INVALID_ARGUMENT, "sessions[1] has no logits");
  sessions[1] = f.pairs[1].batched;
  ep_session_close(empty);

  sessions[3] = nullptr;
  refused(EP_ERR_INVALID_ARGUMENT, "sessions[3] is NULL");
  sessions[3] = f.pairs[3].batched;

  opts[1].top_p = 2.0f;
  refused(EP_ERR_INVALID_ARGUMENT, "options[1]");
  opts[1] = f.pairs[1].options;

  static const ep_logit_bias outside[] = {{1 << 30, 1.0f}};
  opts[2].logit_bias = outside;
  opts[2].n_logit_bias = 1;
  refused(EP_ERR_INVALID_ARGUMENT, "sessions[2]");
  opts[2] = f.pairs[2].options;

  opts[0].grammar = f.pairs[3].batched_grammar;
  refused(EP_ERR_INVALID_ARGUMENT, "share one grammar state");
  opts[0].grammar = nullptr;

  std::vector<ep_token_logprobs> lps(n);
  std::vector<ep_token_logprobs *> lp_ptrs(n, nullptr);
  for (size_t i = 0; i < n; ++i) ep_token_logprobs_init(&lps[i]);
  std::vector<uint32_t> tops(n, 0);
  tops[4] = 2;
  refused(EP_ERR_INVALID_ARGUMENT, "top_logprobs[4] is 2 with no out_logprobs entry", lp_ptrs.data(), tops.data());
  lp_ptrs[4] = &lps[4];
  tops[4] = EP_MAX_TOP_LOGPROBS + 1;
  refused(EP_ERR_INVALID_ARGUMENT, "top_logprobs[4]", lp_ptrs.data(), tops.data());
  tops[4] = 2;
  lps[4].struct_size = 8;
  refused(EP_ERR_STRUCT_SIZE, "out_logprobs[4]", lp_ptrs.data(), tops.data());

  // Nothing moved: the draw counters and grammar states still agree with the alone sessions.
  f.run(4);
}
