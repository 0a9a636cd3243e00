// ep_sessions_sample (every session of a decode step sampled in one call) against one
// ep_session_sample / ep_session_sample_logprobs per session, on the trained demo model and the CPU
// backend: the same tokens and log-probabilities bit for bit with mixed settings (greedy,
// temperature + top_p, repetition penalty + logit bias, a JSON grammar's mask, log-probabilities),
// the draw counters and grammar states advancing alike (each alone session has its own history);
// refusals name the session's index and change nothing.
#include "sessions_sample_support.hpp"

#include <string>
#include <vector>

using sessions_sample::Fixture;

TEST_CASE("ep_sessions_sample: every session's draw as ep_session_sample alone, bit for bit", "[model][batch][sampling]") {
  Fixture f(EP_DEVICE_CPU, false);
  f.run(8);
}

TEST_CASE("ep_sessions_sample: refusals name the session and change nothing", "[model][batch][sampling]") {
  Fixture f(EP_DEVICE_CPU, false);
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
