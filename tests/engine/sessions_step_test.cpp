// Stepping several sessions together through the C API (ep_sessions_append, ep_session_sample,
// ep_session_tokens, ep_text_stream_*), on the trained demo model and the CPU backend: a
// session's tokens and logits do not depend on what it was appended with, the host-driven loop
// equals ep_generate(), and the text stream equals ep_generate_text()'s text.
#include "support/catch.hpp"
#include "support/temp_dir.hpp"

#include "support/demo_model_golden.hpp"

#include <cstring>
#include <string>
#include <vector>

using namespace demomodel;

namespace {

std::vector<int32_t> tokenize(const ep_tokenizer *t, const std::string &text) {
  size_t n = 0;
  REQUIRE(ep_tokenize(nullptr, 0, &n, t, text.data(), text.size(), EP_TOKENIZE_ADD_SPECIAL) == EP_OK);
  std::vector<int32_t> ids(n);
  REQUIRE(ep_tokenize(ids.data(), ids.size(), &n, t, text.data(), text.size(), EP_TOKENIZE_ADD_SPECIAL) == EP_OK);
  return ids;
}

/// Greedy continuation of @p prompt on a fresh session through ep_generate().
std::vector<int32_t> generate_alone(ep_model *m, const std::vector<int32_t> &prompt, uint32_t n) {
  ep_session *s = nullptr;
  REQUIRE(ep_session_open(&s, m) == EP_OK);
  ep_generate_options o;
  ep_generate_options_init(&o);
  o.max_new_tokens = n;
  std::vector<int32_t> out;
  REQUIRE(ep_generate(nullptr, s, prompt.data(), prompt.size(), &o, ep::test::collect, &out) == EP_OK);
  ep_session_close(s);
  return out;
}

}  // namespace

TEST_CASE("ep_sessions_append: batched sessions decode as they do alone", "[model][batch]") {
  ep::test::TempDir dir;
  ep_model *m = open_model(dir.str(), EP_DEVICE_CPU);
  ep_tokenizer *t = nullptr;
  REQUIRE(ep_tokenizer_open_model(&t, m) == EP_OK);
  const std::vector<std::string> prompts = {"And God said", "In the beginning", "Blessed are the", "The LORD is my"};
  std::vector<std::vector<int32_t>> ids;
  for (const std::string &p : prompts) ids.push_back(tokenize(t, p));
  constexpr uint32_t kSteps = 12;
  std::vector<std::vector<int32_t>> alone;
  for (const auto &p : ids) alone.push_back(generate_alone(m, p, kSteps));

  // The host's loop: every session's prompt in one call (different lengths), then one token per
  // session and step, sampled from each session's own logits.
  std::vector<ep_session *> ss(ids.size(), nullptr);
  for (auto &s : ss) REQUIRE(ep_session_open(&s, m) == EP_OK);
  std::vector<const int32_t *> tok_ptrs;
  std::vector<size_t> counts;
  for (const auto &p : ids) {
    tok_ptrs.push_back(p.data());
    counts.push_back(p.size());
  }
  REQUIRE(ep_sessions_append(ss.data(), tok_ptrs.data(), counts.data(), ss.size()) == EP_OK);
  std::vector<std::vector<int32_t>> batched(ids.size());
  std::vector<int32_t> next(ids.size());
  for (uint32_t step = 0; step < kSteps; ++step) {
    for (size_t i = 0; i < ss.size(); ++i) {
      REQUIRE(ep_session_sample(&next[i], ss[i], nullptr) == EP_OK);
      batched[i].push_back(next[i]);
      tok_ptrs[i] = &next[i];
      counts[i] = 1;
    }
    REQUIRE(ep_sessions_append(ss.data(), tok_ptrs.data(), counts.data(), ss.size()) == EP_OK);
  }
  for (size_t i = 0; i < ss.size(); ++i) {
    INFO("prompt " << prompts[i]);
    CHECK(batched[i] == alone[i]);
    size_t n = 0;
    REQUIRE(ep_session_tokens(nullptr, 0, &n, ss[i]) == EP_OK);
    CHECK(n == ids[i].size() + kSteps);
    std::vector<int32_t> held(n);
    REQUIRE(ep_session_tokens(held.data(), held.size(), &n, ss[i]) == EP_OK);
    CHECK(std::equal(ids[i].begin(), ids[i].end(), held.begin()));
    CHECK(std::equal(batched[i].begin(), batched[i].end(), held.begin() + static_cast<std::ptrdiff_t>(ids[i].size())));
  }

  // A batch's logits are bitwise those of the same session alone (ep_score after the batch).
  {
    ep_session *solo = nullptr;
    REQUIRE(ep_session_open(&solo, m) == EP_OK);
    std::vector<int32_t> held(ids[0].size() + kSteps);
    size_t n = 0;
    REQUIRE(ep_session_tokens(held.data(), held.size(), &n, ss[0]) == EP_OK);
    const size_t V = vocab();
    std::vector<float> a(V), b(V);
    std::vector<float> rows(held.size() * V);
    REQUIRE(ep_score(solo, held.data(), held.size(), 0, nullptr, rows.data()) == EP_OK);
    const int32_t probe = 5;
    REQUIRE(ep_score(solo, &probe, 1, 0, nullptr, a.data()) == EP_OK);
    ep_session *b_session = ss[0];
    REQUIRE(ep_score(b_session, &probe, 1, 0, nullptr, b.data()) == EP_OK);
    CHECK(std::memcmp(a.data(), b.data(), V * sizeof(float)) == 0);
    ep_session_close(solo);
  }

  // A fork continues as the original does, and appending to it leaves the original alone.
  {
    ep_session *f = nullptr;
    REQUIRE(ep_session_fork(&f, ss[3]) == EP_OK);
    int32_t a = -1, b = -1;
    REQUIRE(ep_session_sample(&a, ss[3], nullptr) == EP_OK);
    REQUIRE(ep_session_sample(&b, f, nullptr) == EP_OK);
    CHECK(a == b);
    const int32_t extra[2] = {11, 12};
    ep_session *fs[1] = {f};
    const int32_t *ep_[1] = {extra};
    const size_t en[1] = {2};
    REQUIRE(ep_sessions_append(fs, ep_, en, 1) == EP_OK);
    size_t nf = 0, no = 0;
    REQUIRE(ep_session_tokens(nullptr, 0, &nf, f) == EP_OK);
    REQUIRE(ep_session_tokens(nullptr, 0, &no, ss[3]) == EP_OK);
    CHECK(nf == no + 2);
    REQUIRE(ep_session_sample(&b, ss[3], nullptr) == EP_OK);
    CHECK(a == b);  // the original's logits are untouched
    ep_session_close(f);
  }

  // Refusals: a session twice, an empty list, a token outside the vocabulary, an empty session's sample.
  {
    ep_session *two[2] = {ss[1], ss[1]};
    const int32_t tk = 7;
    const int32_t *tp[2] = {&tk, &tk};
    const size_t one[2] = {1, 1}, none[2] = {1, 0};
    CHECK(ep_sessions_append(two, tp, one, 2) == EP_ERR_INVALID_ARGUMENT);
    ep_session *pair[2] = {ss[1], ss[2]};
    CHECK(ep_sessions_append(pair, tp, none, 2) == EP_ERR_INVALID_ARGUMENT);
    const int32_t bad = static_cast<int32_t>(vocab());
    const int32_t *bp[2] = {&tk, &bad};
    CHECK(ep_sessions_append(pair, bp, one, 2) == EP_ERR_INVALID_ARGUMENT);
    CHECK(std::string(ep_last_error()).find("outside") != std::string::npos);
    ep_session *empty = nullptr;
    REQUIRE(ep_session_open(&empty, m) == EP_OK);
    int32_t out = -1;
    CHECK(ep_session_sample(&out, empty, nullptr) == EP_ERR_INVALID_ARGUMENT);
    ep_session_close(empty);
  }
  for (auto *s : ss) ep_session_close(s);
  ep_tokenizer_close(t);
  ep_model_close(m);
}

TEST_CASE("ep_text_stream: the host loop's text equals ep_generate_text()", "[model][batch][text]") {
  ep::test::TempDir dir;
  ep_model *m = open_model(dir.str(), EP_DEVICE_CPU);
  ep_tokenizer *t = nullptr;
  REQUIRE(ep_tokenizer_open_model(&t, m) == EP_OK);
  // The second stop string is a piece from the middle of the first run's text, so it is found.
  std::string stop;
  for (int run = 0; run < 2; ++run) {
    ep_generate_options o;
    ep_generate_options_init(&o);
    o.max_new_tokens = 24;
    o.ignore_eos = 1;
    const char *stops[1] = {stop.c_str()};
    if (run == 1) {
      o.stop_strings = stops;
      o.n_stop_strings = 1;
    }
    ep_session *s = nullptr;
    REQUIRE(ep_session_open(&s, m) == EP_OK);
    std::string want;
    REQUIRE(ep_generate_text(nullptr, s, t, "And God said", &o, ep::test::append_text, &want) == EP_OK);
    ep_session_close(s);
    REQUIRE(!want.empty());

    REQUIRE(ep_session_open(&s, m) == EP_OK);
    const std::vector<int32_t> prompt = tokenize(t, "And God said");
    ep_session *one[1] = {s};
    const int32_t *tp[1] = {prompt.data()};
    size_t n[1] = {prompt.size()};
    REQUIRE(ep_sessions_append(one, tp, n, 1) == EP_OK);
    ep_text_stream *ts = nullptr;
    REQUIRE(ep_text_stream_open(&ts, t, run == 1 ? stops : nullptr, run == 1 ? 1 : 0) == EP_OK);
    std::string got;
    int32_t stopped = 0;
    for (uint32_t i = 0; i < o.max_new_tokens && !stopped; ++i) {
      int32_t tok = -1;
      REQUIRE(ep_session_sample(&tok, s, &o) == EP_OK);
      REQUIRE(ep_text_stream_push(ts, tok, ep::test::append_text, &got, &stopped) == EP_OK);
      tp[0] = &tok;
      n[0] = 1;
      REQUIRE(ep_sessions_append(one, tp, n, 1) == EP_OK);
    }
    if (!stopped) REQUIRE(ep_text_stream_finish(ts, ep::test::append_text, &got, &stopped) == EP_OK);
    INFO("stop string '" << stop << "'");
    CHECK(got == want);
    CHECK(stopped == run);
    if (run == 0) {
      REQUIRE(want.size() > 8);
      stop = want.substr(want.size() / 2, 3);
    }
    ep_text_stream_close(ts);
    ep_session_close(s);
  }
  ep_text_stream *ts = nullptr;
  const char *empty[1] = {""};
  CHECK(ep_text_stream_open(&ts, t, empty, 1) == EP_ERR_INVALID_ARGUMENT);
  CHECK(ts == nullptr);
  ep_text_stream_close(nullptr);
  ep_tokenizer_close(t);
  ep_model_close(m);
}

TEST_CASE("ep_sessions_append on the goldens of every architecture: batched logits are bitwise those alone",
          "[model][batch]") {
  const std::string data = EP_TEST_DATA_DIR;
  for (const std::string &path : {data + "/deepseek_v4/deepseek_v4_a.gguf", data + "/kimi_linear/kimi_a.gguf",
                                  data + "/kimi_k3/k3_a.gguf"}) {
    INFO(path);
    ep::test::TempDir dir;
    ep_model *m = ep::test::open_model(path, dir.str(), 0, 1, EP_DEVICE_CPU);
    ep_model_properties p;
    ep_model_properties_init(&p);
    REQUIRE(ep_model_info(&p, m) == EP_OK);
    const int32_t V = static_cast<int32_t>(p.vocab_size);
    // three sequences of different lengths, then two steps of one token each
    const std::vector<std::vector<int32_t>> prompts = {{3, 14, 15}, {9, 2, 6, 5, 3, 5, 8}, {7}};
    const std::vector<std::vector<int32_t>> steps = {{4, 11, 2}, {1, 8, 5}};
    std::vector<ep_session *> ss(prompts.size(), nullptr);
    for (auto &s : ss) REQUIRE(ep_session_open(&s, m) == EP_OK);
    std::vector<const int32_t *> tp;
    std::vector<size_t> tn;
    for (const auto &q : prompts) {
      tp.push_back(q.data());
      tn.push_back(q.size());
    }
    REQUIRE(ep_sessions_append(ss.data(), tp.data(), tn.data(), ss.size()) == EP_OK);
    for (const auto &st : steps) {
      for (size_t i = 0; i < ss.size(); ++i) {
        tp[i] = &st[i];
        tn[i] = 1;
      }
      REQUIRE(ep_sessions_append(ss.data(), tp.data(), tn.data(), ss.size()) == EP_OK);
    }
    for (size_t i = 0; i < ss.size(); ++i) {
      std::vector<int32_t> seq = prompts[i];
      for (const auto &st : steps) seq.push_back(st[i] % V);
      const int32_t probe = 1;
      std::vector<float> batched(static_cast<size_t>(V)), alone(static_cast<size_t>(V));
      REQUIRE(ep_score(ss[i], &probe, 1, 0, nullptr, batched.data()) == EP_OK);
      ep_session *solo = nullptr;
      REQUIRE(ep_session_open(&solo, m) == EP_OK);
      std::vector<float> rows(seq.size() * static_cast<size_t>(V));
      REQUIRE(ep_score(solo, seq.data(), seq.size(), 0, nullptr, rows.data()) == EP_OK);
      REQUIRE(ep_score(solo, &probe, 1, 0, nullptr, alone.data()) == EP_OK);
      INFO("sequence " << i);
      CHECK(std::memcmp(batched.data(), alone.data(), alone.size() * sizeof(float)) == 0);
      ep_session_close(solo);
    }
    for (auto *s : ss) ep_session_close(s);
    ep_model_close(m);
  }
}
