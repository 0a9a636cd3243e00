// The sampler's logit bias, log-probabilities and forked answers through the C API, on the trained
// demo model and the CPU backend: a +100 bias forces its token and -100 forbids it; the
// log-probabilities equal a log-softmax computed here from the logits ep_score() returns, and do
// not move with the sampling settings; the alternatives are sorted and hold the greedy token
// first; n answers forked from one prompt equal the same seeds run alone.
#include "support/catch.hpp"
#include "support/temp_dir.hpp"

#include "support/demo_model_golden.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

using namespace demomodel;

namespace {

const std::vector<int32_t> &prompt() {
  static const std::vector<int32_t> p = [] {
    std::vector<int32_t> t = passage_tokens();
    t.resize(std::min<size_t>(t.size(), 12));
    return t;
  }();
  return p;
}

/// A session holding the prompt.
ep_session *prompted(ep_model *m) {
  ep_session *s = nullptr;
  REQUIRE(ep_session_open(&s, m) == EP_OK);
  const int32_t *tokens = prompt().data();
  const size_t n = prompt().size();
  REQUIRE(ep_sessions_append(&s, &tokens, &n, 1) == EP_OK);
  return s;
}

/// @p n tokens sampled and appended one by one (the host's loop).
std::vector<int32_t> continue_with(ep_session *s, const ep_generate_options &o, uint32_t n) {
  std::vector<int32_t> out;
  for (uint32_t i = 0; i < n; ++i) {
    int32_t t = -1;
    REQUIRE(ep_session_sample(&t, s, &o) == EP_OK);
    out.push_back(t);
    const int32_t *tp = &t;
    const size_t one = 1;
    REQUIRE(ep_sessions_append(&s, &tp, &one, 1) == EP_OK);
  }
  return out;
}

int32_t sample_once(ep_session *s, const ep_generate_options &o) {
  int32_t t = -1;
  REQUIRE(ep_session_sample(&t, s, &o) == EP_OK);
  return t;
}

}  // namespace

TEST_CASE("logit_bias: +100 forces a token, -100 forbids it, bad entries are refused by token", "[model][sampling]") {
  ep::test::TempDir dir;
  ep_model *m = open_model(dir.str(), EP_DEVICE_CPU);
  const int32_t V = static_cast<int32_t>(vocab());
  ep_session *s = prompted(m);
  ep_generate_options greedy;
  ep_generate_options_init(&greedy);
  const int32_t top = sample_once(s, greedy);

  // +100 on a token the model finds unlikely: greedy and sampled draws all take it.
  const int32_t forced = top == 7 ? 8 : 7;
  ep_logit_bias plus{forced, 100.0f};
  ep_generate_options o = greedy;
  o.logit_bias = &plus;
  o.n_logit_bias = 1;
  CHECK(sample_once(s, o) == forced);
  o.temperature = 1.0f;
  o.seed = 3;
  for (int i = 0; i < 50; ++i) CHECK(sample_once(s, o) == forced);

  // -100 on the greedy token: greedy takes another, and 300 draws at temperature 1 never take it.
  ep_logit_bias minus{top, -100.0f};
  o = greedy;
  o.logit_bias = &minus;
  o.n_logit_bias = 1;
  CHECK(sample_once(s, o) != top);
  o.temperature = 1.0f;
  int hits = 0;
  for (int i = 0; i < 300; ++i) hits += sample_once(s, o) == top;
  CHECK(hits == 0);
  // ... while without the bias the same draws take it (the test would see a bias that did nothing).
  o.logit_bias = nullptr;
  o.n_logit_bias = 0;
  hits = 0;
  for (int i = 0; i < 300; ++i) hits += sample_once(s, o) == top;
  CHECK(hits > 0);

  // ep_generate applies it too.
  {
    ep_session *g = nullptr;
    REQUIRE(ep_session_open(&g, m) == EP_OK);
    ep_generate_options go = greedy;
    go.max_new_tokens = 4;
    go.logit_bias = &plus;
    go.n_logit_bias = 1;
    std::vector<int32_t> out;
    REQUIRE(ep_generate(nullptr, g, prompt().data(), prompt().size(), &go, ep::test::collect, &out) == EP_OK);
    CHECK(out == std::vector<int32_t>(4, forced));
    ep_session_close(g);
  }

  // Refusals name the token.
  const auto refused = [&](std::vector<ep_logit_bias> entries, const std::string &needle) {
    ep_generate_options r = greedy;
    r.logit_bias = entries.data();
    r.n_logit_bias = entries.size();
    int32_t t = -1;
    CHECK(ep_session_sample(&t, s, &r) == EP_ERR_INVALID_ARGUMENT);
    const std::string err = ep_last_error();
    INFO(err);
    CHECK(err.find(needle) != std::string::npos);
  };
  refused({{5, 100.5f}}, "token 5");
  refused({{5, -101.0f}}, "-100..100");
  refused({{5, NAN}}, "token 5");
  refused({{V, 1.0f}}, "token " + std::to_string(V));
  refused({{-2, 1.0f}}, "token -2");
  refused({{9, 1.0f}, {4, 2.0f}, {9, 3.0f}}, "token 9");
  ep_generate_options r = greedy;
  r.n_logit_bias = 2;
  int32_t t = -1;
  CHECK(ep_session_sample(&t, s, &r) == EP_ERR_INVALID_ARGUMENT);
  // A refused draw does not advance the sampler.
  CHECK(sample_once(s, greedy) == top);

  ep_session_close(s);
  ep_model_close(m);
}

TEST_CASE("ep_session_sample_logprobs: the log-softmax of the raw logits, top alternatives sorted", "[model][sampling]") {
  ep::test::TempDir dir;
  ep_model *m = open_model(dir.str(), EP_DEVICE_CPU);
  const size_t V = vocab();

  // The logits after the prompt, from ep_score, and their log-softmax computed here.
  std::vector<float> rows(prompt().size() * V);
  {
    ep_session *scorer = nullptr;
    REQUIRE(ep_session_open(&scorer, m) == EP_OK);
    REQUIRE(ep_score(scorer, prompt().data(), prompt().size(), 0, nullptr, rows.data()) == EP_OK);
    ep_session_close(scorer);
  }
  const float *z = rows.data() + (prompt().size() - 1) * V;
  long double sum = 0;
  const float zmax = *std::max_element(z, z + V);
  for (size_t i = 0; i < V; ++i) sum += std::exp(static_cast<long double>(z[i]) - zmax);
  const long double lse = zmax + std::log(sum);
  std::vector<int32_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [z](int32_t a, int32_t b) { return z[a] > z[b]; });

  ep_session *s = prompted(m);
  ep_generate_options o;
  ep_generate_options_init(&o);
  const auto check_against_scored = [&](const ep_token_logprobs &lp, uint32_t k) {
    REQUIRE(lp.n_top == k);
    CHECK(std::fabs(lp.logprob - static_cast<double>(z[lp.token] - lse)) < 1e-5);
    CHECK(lp.logprob <= 0.0f);
    for (uint32_t i = 0; i < k; ++i) {
      INFO("alternative " << i);
      CHECK(lp.top_tokens[i] == order[i]);
      CHECK(std::fabs(lp.top_logprobs[i] - static_cast<double>(z[order[i]] - lse)) < 1e-5);
      if (i > 0) CHECK(lp.top_logprobs[i] <= lp.top_logprobs[i - 1]);
    }
  };

  // Greedy: the token is the first alternative, with its log-probability.
  ep_token_logprobs lp;
  ep_token_logprobs_init(&lp);
  REQUIRE(ep_session_sample_logprobs(&lp, s, &o, EP_MAX_TOP_LOGPROBS) == EP_OK);
  check_against_scored(lp, EP_MAX_TOP_LOGPROBS);
  CHECK(lp.token == order[0]);
  CHECK(lp.token == lp.top_tokens[0]);
  CHECK(lp.logprob == lp.top_logprobs[0]);
  CHECK(sample_once(s, o) == lp.token);  // ep_session_sample draws the same token

  // Sampled with a temperature, top_p and a bias: the same token as ep_session_sample with the same
  // draw counter, and the log-probabilities still the raw distribution's.
  ep_logit_bias bias{order[3], 5.0f};
  o.temperature = 1.3f;
  o.top_p = 0.95f;
  o.seed = 11;
  o.logit_bias = &bias;
  o.n_logit_bias = 1;
  for (int draw = 0; draw < 12; ++draw) {
    ep_session *twin = nullptr;
    REQUIRE(ep_session_fork(&twin, s) == EP_OK);
    ep_token_logprobs_init(&lp);
    REQUIRE(ep_session_sample_logprobs(&lp, s, &o, 3) == EP_OK);
    check_against_scored(lp, 3);
    CHECK(sample_once(twin, o) == lp.token);
    ep_session_close(twin);
  }

  // top_logprobs 0 gives the token's alone; above the limit is refused; a wrong struct_size too.
  ep_token_logprobs_init(&lp);
  REQUIRE(ep_session_sample_logprobs(&lp, s, nullptr, 0) == EP_OK);
  CHECK(lp.n_top == 0);
  CHECK(std::fabs(lp.logprob - static_cast<double>(z[order[0]] - lse)) < 1e-5);
  CHECK(ep_session_sample_logprobs(&lp, s, nullptr, EP_MAX_TOP_LOGPROBS + 1) == EP_ERR_INVALID_ARGUMENT);
  lp.struct_size = 8;
  CHECK(ep_session_sample_logprobs(&lp, s, nullptr, 1) == EP_ERR_STRUCT_SIZE);
  CHECK(ep_session_sample_logprobs(nullptr, s, nullptr, 1) == EP_ERR_INVALID_ARGUMENT);

  ep_session_close(s);
  ep_model_close(m);
}

TEST_CASE("n answers forked from one prompt: greedy ones agree, seeded ones equal the same seeds alone", "[model][sampling]") {
  ep::test::TempDir dir;
  ep_model *m = open_model(dir.str(), EP_DEVICE_CPU);
  constexpr uint32_t kTokens = 10;
  ep_session *p = prompted(m);
  ep_generate_options o;
  ep_generate_options_init(&o);

  // Greedy: two forks of the prompt give the same answer.
  {
    ep_session *a = nullptr, *b = nullptr;
    REQUIRE(ep_session_fork(&a, p) == EP_OK);
    REQUIRE(ep_session_fork(&b, p) == EP_OK);
    const std::vector<int32_t> x = continue_with(a, o, kTokens), y = continue_with(b, o, kTokens);
    CHECK(x == y);
    ep_session_close(a);
    ep_session_close(b);
  }

  // With a temperature, answer i takes seed + i (as the server's n does): each equals a session
  // that ran the prompt alone with that seed, and the two differ.
  o.temperature = 1.2f;
  const uint64_t seed = 1234;
  std::vector<std::vector<int32_t>> forked, alone;
  for (uint64_t i = 0; i < 2; ++i) {
    ep_generate_options oi = o;
    oi.seed = seed + i;
    ep_session *f = nullptr;
    REQUIRE(ep_session_fork(&f, p) == EP_OK);
    forked.push_back(continue_with(f, oi, kTokens));
    ep_session_close(f);
    ep_session *solo = prompted(m);
    alone.push_back(continue_with(solo, oi, kTokens));
    ep_session_close(solo);
  }
  CHECK(forked[0] == alone[0]);
  CHECK(forked[1] == alone[1]);
  CHECK(forked[0] != forked[1]);

  ep_session_close(p);
  ep_model_close(m);
}
