// The KV budget and the context length through the C API, on the CPU with a small synthetic
// DeepSeek-V4 whose file states a context length of 64: an append past the context, and an open,
// append or fork past the budget, fail with a message naming the limit and change nothing (the
// session continues afterwards exactly as a fresh one with the same tokens); what the sessions
// count is ep_model_state_bytes at their lengths, and closing a session gives its bytes back.
#include "support/catch.hpp"
#include "support/context_model.hpp"
#include "support/temp_dir.hpp"

#include <expertpack/expertpack.h>

#include <cstdint>
#include <string>
#include <vector>

namespace {

constexpr int64_t kContext = 64;

ep_model *open_model(const std::string &path, uint64_t kv_budget_bytes) {
  ep_model_options o;
  ep_model_options_init(&o);
  CHECK(o.kv_budget_bytes == 0);  // the default: automatic
  o.device = EP_DEVICE_CPU;
  o.resident_experts = 1;
  o.cpu_threads = 2;
  o.kv_budget_bytes = kv_budget_bytes;
  ep_model *m = nullptr;
  const ep_status st = ep_model_open(&m, path.c_str(), &o);
  INFO(ep_last_error());
  REQUIRE(st == EP_OK);
  return m;
}

uint64_t state_bytes(const ep_model *m, uint64_t tokens) {
  uint64_t b = 0;
  REQUIRE(ep_model_state_bytes(&b, m, tokens) == EP_OK);
  return b;
}

uint64_t in_use(const ep_model *m) {
  uint64_t b = 0;
  REQUIRE(ep_model_kv_in_use(&b, m) == EP_OK);
  return b;
}

uint64_t length(const ep_session *s) {
  uint64_t n = 0;
  REQUIRE(ep_session_length(&n, s) == EP_OK);
  return n;
}

std::vector<int32_t> tokens(size_t n, size_t from = 0) {
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>(((from + i) * 37 + 11) % 256);
  return t;
}

ep_status append(ep_session *s, const std::vector<int32_t> &t) {
  const int32_t *p = t.data();
  const size_t n = t.size();
  return ep_sessions_append(&s, &p, &n, 1);
}

int32_t greedy(ep_session *s) {
  int32_t t = -1;
  REQUIRE(ep_session_sample(&t, s, nullptr) == EP_OK);
  return t;
}

/// The greedy token after @p history on a fresh session of @p m.
int32_t greedy_fresh(ep_model *m, const std::vector<int32_t> &history) {
  ep_session *s = nullptr;
  REQUIRE(ep_session_open(&s, m) == EP_OK);
  REQUIRE(append(s, history) == EP_OK);
  const int32_t t = greedy(s);
  ep_session_close(s);
  return t;
}

bool has(const std::string &text, const std::string &part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("the context length: an append past it is refused and changes nothing", "[engine][kv]") {
  ep::test::TempDir dir;
  const std::string path = ep::test::write_context_model(dir, kContext);
  ep_model *m = open_model(path, 0);
  ep_model_properties p;
  ep_model_properties_init(&p);
  REQUIRE(ep_model_info(&p, m) == EP_OK);
  CHECK(p.context_length == static_cast<uint64_t>(kContext));
  CHECK(p.kv_budget_bytes > 0);  // automatic: a quarter of the physical memory

  ep_session *s = nullptr, *t = nullptr;
  REQUIRE(ep_session_open(&s, m) == EP_OK);
  REQUIRE(ep_session_open(&t, m) == EP_OK);
  const std::vector<int32_t> first = tokens(60);
  REQUIRE(append(s, first) == EP_OK);
  CHECK(append(s, tokens(5, 60)) == EP_ERR_INVALID_ARGUMENT);
  const std::string why = ep_last_error();
  INFO(why);
  CHECK(has(why, "5 tokens after the 60 the session holds make 65"));
  CHECK(has(why, "context length of 64 tokens"));
  CHECK(length(s) == 60);
  // In a batch: nothing runs, for any session of the call.
  ep_session *both[2] = {t, s};
  const std::vector<int32_t> one = tokens(1), five = tokens(5, 60);
  const int32_t *toks[2] = {one.data(), five.data()};
  const size_t counts[2] = {1, 5};
  CHECK(ep_sessions_append(both, toks, counts, 2) == EP_ERR_INVALID_ARGUMENT);
  CHECK(has(ep_last_error(), "tokens[1]: 5 tokens after the 60"));
  CHECK(length(s) == 60);
  CHECK(length(t) == 0);
  // Up to the context exactly, and the session goes on as a fresh one with the same tokens.
  const std::vector<int32_t> rest = tokens(4, 60);
  REQUIRE(append(s, rest) == EP_OK);
  CHECK(length(s) == 64);
  std::vector<int32_t> all = first;
  all.insert(all.end(), rest.begin(), rest.end());
  CHECK(greedy(s) == greedy_fresh(m, all));
  // ep_generate stops at the limit with the same error.
  ep_generate_options g;
  ep_generate_options_init(&g);
  g.max_new_tokens = 8;
  CHECK(ep_generate(nullptr, t, tokens(60).data(), 60, &g, nullptr, nullptr) == EP_ERR_INVALID_ARGUMENT);
  CHECK(has(ep_last_error(), "context length of 64 tokens"));
  CHECK(length(t) == 64);
  ep_session_close(s);
  ep_session_close(t);
  ep_model_close(m);
}

TEST_CASE("the KV budget: an open, append or fork past it is refused and changes nothing", "[engine][kv]") {
  ep::test::TempDir dir;
  const std::string path = ep::test::write_context_model(dir, kContext);
  ep_model *probe = open_model(path, 0);
  const uint64_t empty = state_bytes(probe, 0), one = state_bytes(probe, 1), forty = state_bytes(probe, 40);
  CHECK(empty == 256 * sizeof(float));  // an empty session holds its row of logits only
  CHECK(one > empty);
  CHECK(forty > one);
  // The entries of a ratio-4 compressor have room for 16 rows at first: 64 tokens hold as much
  // as 40, 68 more.
  CHECK(state_bytes(probe, 64) == forty);
  CHECK(state_bytes(probe, 68) > forty);
  // Room for a session of 40 tokens and an empty one, not for that one holding a token.
  const uint64_t budget = forty + empty + (one - empty) / 2;
  ep_model *m = open_model(path, budget);
  ep_model_properties p;
  ep_model_properties_init(&p);
  REQUIRE(ep_model_info(&p, m) == EP_OK);
  CHECK(p.kv_budget_bytes == budget);

  ep_session *a = nullptr, *b = nullptr;
  REQUIRE(ep_session_open(&a, m) == EP_OK);
  CHECK(in_use(m) == empty);
  const std::vector<int32_t> history = tokens(40);
  REQUIRE(append(a, history) == EP_OK);
  CHECK(in_use(m) == forty);
  REQUIRE(ep_session_open(&b, m) == EP_OK);
  CHECK(in_use(m) == forty + empty);

  CHECK(append(b, tokens(1)) == EP_ERR_BUDGET);
  const std::string why = ep_last_error();
  INFO(why);
  CHECK(has(why, "1 tokens after the 0 the session holds needs " + std::to_string(one) + " bytes"));
  CHECK(has(why, "the KV budget is " + std::to_string(budget) + " bytes"));
  CHECK(has(why, std::to_string(forty + empty) + " bytes"));  // what is in use
  CHECK(has(why, "kv_budget_bytes (--kv-mib)"));
  CHECK(length(b) == 0);
  CHECK(in_use(m) == forty + empty);
  // A batch that would outgrow it runs nothing.
  ep_session *both[2] = {a, b};
  const std::vector<int32_t> next = tokens(1, 40), first = tokens(1);
  const int32_t *toks[2] = {next.data(), first.data()};
  const size_t counts[2] = {1, 1};
  CHECK(ep_sessions_append(both, toks, counts, 2) == EP_ERR_BUDGET);
  CHECK(has(ep_last_error(), "2 tokens for 2 sessions"));
  CHECK(length(a) == 40);
  CHECK(length(b) == 0);
  CHECK(greedy(a) == greedy_fresh(probe, history));
  // A copy of a does not fit either.
  ep_session *copy = nullptr;
  CHECK(ep_session_fork(&copy, a) == EP_ERR_BUDGET);
  CHECK(copy == nullptr);
  CHECK(has(ep_last_error(), "a copy of a session of 40 tokens"));
  CHECK(in_use(m) == forty + empty);

  // Closing a gives its bytes back: b runs, as a fresh session does.
  ep_session_close(a);
  CHECK(in_use(m) == empty);
  REQUIRE(append(b, tokens(40)) == EP_OK);
  CHECK(in_use(m) == forty);
  CHECK(greedy(b) == greedy_fresh(probe, tokens(40)));
  // Beside it, an empty session fits and one of a token does not.
  ep_session *c = nullptr;
  REQUIRE(ep_session_open(&c, m) == EP_OK);
  CHECK(append(c, tokens(1)) == EP_ERR_BUDGET);
  // A reset gives back what the tokens held.
  REQUIRE(ep_session_reset(b) == EP_OK);
  CHECK(in_use(m) == 2 * empty);
  ep_session_close(b);
  ep_session_close(c);
  CHECK(in_use(m) == 0);
  ep_model_close(m);

  // A budget below one session of one token is refused at open, naming it.
  ep_model_options o;
  ep_model_options_init(&o);
  o.device = EP_DEVICE_CPU;
  o.resident_experts = 1;
  o.kv_budget_bytes = one - 1;
  ep_model *tiny = nullptr;
  CHECK(ep_model_open(&tiny, path.c_str(), &o) == EP_ERR_BUDGET);
  CHECK(has(ep_last_error(), "cannot hold one session of one token (" + std::to_string(one) + " bytes)"));
  ep_model_close(probe);
}
