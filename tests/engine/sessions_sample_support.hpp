// What the tests of ep_sessions_sample share (sessions_sample_test.cpp on the CPU,
// sessions_sample_gpu_test.cpp on CUDA): five sessions of the demo model with mixed settings
// (greedy, temperature + top_p with 3 alternatives, repetition penalty + logit bias, a JSON
// grammar's mask with the log-probability, greedy with a bias and 20 alternatives), each step
// sampled in one ep_sessions_sample and compared with one ep_session_sample /
// ep_session_sample_logprobs per session.
#pragma once

#include "support/catch.hpp"
#include "support/temp_dir.hpp"

#include "support/demo_model_golden.hpp"

#include <cstring>
#include <string>
#include <vector>

namespace sessions_sample {

using namespace demomodel;


/// Two sessions of one prompt: one sampled in the batched call, the other by itself (or, in fork
/// mode, a fork of the first taken just before each step's batched call: the same logits bit for
/// bit and the same draw counter whatever the device's forward passes do).
struct Pair {
  ep_session *batched = nullptr, *alone = nullptr;
  ep_grammar_state *batched_grammar = nullptr, *alone_grammar = nullptr;
  ep_generate_options options{};
  bool defaults = false;  // NULL options for the batched call
  int32_t top = -1;       // -1: no log-probabilities
};

inline void append_one(ep_session *s, int32_t token) {
  const int32_t *t = &token;
  const size_t one = 1;
  REQUIRE(ep_sessions_append(&s, &t, &one, 1) == EP_OK);
}

inline bool same_logprobs(const ep_token_logprobs &a, const ep_token_logprobs &b) {
  return a.token == b.token && std::memcmp(&a.logprob, &b.logprob, 4) == 0 && a.n_top == b.n_top &&
         std::memcmp(a.top_tokens, b.top_tokens, a.n_top * 4) == 0 && std::memcmp(a.top_logprobs, b.top_logprobs, a.n_top * 4) == 0;
}

/// One step: the batched call over every pair's batched session, one call per alone session;
/// the tokens (and log-probabilities) must agree. Returns the tokens.
inline std::vector<int32_t> step(std::vector<Pair> &pairs, bool fork_alone) {
  const size_t n = pairs.size();
  if (fork_alone)
    for (Pair &p : pairs) REQUIRE(ep_session_fork(&p.alone, p.batched) == EP_OK);
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
    if (fork_alone) {
      ep_session_close(p.alone);
      p.alone = nullptr;
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

  bool fork_alone = false;

  Fixture(ep_device_kind device, bool fork) : fork_alone(fork) {
    m = open_model(dir.str(), device);
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
      if (!fork_alone) REQUIRE(ep_session_open(&p.alone, m) == EP_OK);
      const std::vector<int32_t> prompt(passage.begin() + static_cast<std::ptrdiff_t>(5 * i),
                                        passage.begin() + static_cast<std::ptrdiff_t>(5 * i + 8 + i));
      const int32_t *t = prompt.data();
      const size_t k = prompt.size();
      REQUIRE(ep_sessions_append(&p.batched, &t, &k, 1) == EP_OK);
      if (!fork_alone) REQUIRE(ep_sessions_append(&p.alone, &t, &k, 1) == EP_OK);
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
      const std::vector<int32_t> tokens = step(pairs, fork_alone);
      for (size_t i = 0; i < pairs.size(); ++i) {
        Pair &p = pairs[i];
        if (p.batched_grammar && (tokens[i] == tp.eos_id || tokens[i] == tp.end_of_turn_id)) {
          // The value is complete: the grammar allows nothing after its end token.
          ep_grammar_state_close(p.batched_grammar);
          ep_grammar_state_close(p.alone_grammar);
          p.batched_grammar = p.alone_grammar = nullptr;
        }
        append_one(p.batched, tokens[i]);
        if (!fork_alone) append_one(p.alone, tokens[i]);
      }
    }
  }
};


}  // namespace sessions_sample
