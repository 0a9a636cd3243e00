// The batched C API on CUDA (skips without a GPU): ep_sessions_append over sessions of different
// lengths (prompts of different sizes in one call, then one token each per step),
// ep_session_sample from each session's logits on the device, and ep_session_fork of a running
// session stepped beside its parent, against the same requests run alone on the same device.
// The demo model (DeepSeek-V4, trained: clear greedy margins) must give the same greedy tokens,
// with every expert cached and with a cache of three slots (evictions between the sessions'
// experts); on the goldens of every architecture (random weights) each sequence's logits after
// a batched history must be within the CUDA bound of the same history alone (2e-2 · max|logit|),
// with the same top-1 where the alone top-1 / top-2 margin exceeds 0.1. The CPU's bit-for-bit
// equality is engine_sessions_step_test.
#include "support/catch.hpp"
#include "support/temp_dir.hpp"

#include "support/demo_model_golden.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

using namespace demomodel;

namespace {

constexpr double kCudaLimit = 2e-2;  // max|dlogit| / max|logit|
constexpr float kMargin = 0.1f;      // top-1 compared where the top-1 / top-2 margin exceeds this

ep_status append_all(std::vector<ep_session *> &ss, const std::vector<const int32_t *> &tp, const std::vector<size_t> &tn) {
  return ep_sessions_append(ss.data(), tp.data(), tn.data(), ss.size());
}

/// Greedy continuation of @p prompt on a fresh session, alone: the prompt in one append, then one
/// token per append, sampled with ep_session_sample.
std::vector<int32_t> greedy_alone(ep_model *m, const std::vector<int32_t> &prompt, uint32_t n) {
  ep_session *s = nullptr;
  REQUIRE(ep_session_open(&s, m) == EP_OK);
  std::vector<ep_session *> one = {s};
  std::vector<const int32_t *> tp = {prompt.data()};
  std::vector<size_t> tn = {prompt.size()};
  REQUIRE(append_all(one, tp, tn) == EP_OK);
  std::vector<int32_t> out;
  int32_t next = -1;
  for (uint32_t i = 0; i < n; ++i) {
    REQUIRE(ep_session_sample(&next, s, nullptr) == EP_OK);
    out.push_back(next);
    tp[0] = &next;
    tn[0] = 1;
    REQUIRE(append_all(one, tp, tn) == EP_OK);
  }
  ep_session_close(s);
  return out;
}

/// Prompts of 1, 5, 11 and 23 tokens of the golden passage (different lengths, different places).
std::vector<std::vector<int32_t>> demo_prompts() {
  const std::vector<int32_t> passage = passage_tokens();
  std::vector<std::vector<int32_t>> out;
  size_t at = 0;
  for (const size_t n : {size_t{1}, size_t{5}, size_t{11}, size_t{23}}) {
    REQUIRE(at + n <= passage.size());
    out.emplace_back(passage.begin() + static_cast<std::ptrdiff_t>(at), passage.begin() + static_cast<std::ptrdiff_t>(at + n));
    at += n + 3;
  }
  return out;
}

void check_demo_batched(ep_model *m, const char *what) {
  INFO(what);
  constexpr uint32_t kSteps = 12, kForkAt = 5;
  const std::vector<std::vector<int32_t>> prompts = demo_prompts();
  std::vector<std::vector<int32_t>> alone;
  for (const auto &p : prompts) alone.push_back(greedy_alone(m, p, kSteps));

  std::vector<ep_session *> ss(prompts.size(), nullptr);
  for (auto &s : ss) REQUIRE(ep_session_open(&s, m) == EP_OK);
  std::vector<const int32_t *> tp;
  std::vector<size_t> tn;
  for (const auto &p : prompts) {
    tp.push_back(p.data());
    tn.push_back(p.size());
  }
  REQUIRE(append_all(ss, tp, tn) == EP_OK);
  std::vector<std::vector<int32_t>> batched(prompts.size());
  std::vector<int32_t> next(prompts.size());
  // A fork of the longest sequence, taken after kForkAt steps, joins the batch beside its parent.
  ep_session *fork = nullptr;
  std::vector<int32_t> forked;
  for (uint32_t step = 0; step < kSteps; ++step) {
    if (step == kForkAt) {
      REQUIRE(ep_session_fork(&fork, ss[3]) == EP_OK);
      ss.push_back(fork);
      next.push_back(-1);
      tp.push_back(nullptr);
      tn.push_back(1);
    }
    for (size_t i = 0; i < ss.size(); ++i) {
      REQUIRE(ep_session_sample(&next[i], ss[i], nullptr) == EP_OK);
      if (i < prompts.size()) batched[i].push_back(next[i]);
      else forked.push_back(next[i]);
      tp[i] = &next[i];
      tn[i] = 1;
    }
    REQUIRE(append_all(ss, tp, tn) == EP_OK);
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    INFO("prompt of " << prompts[i].size() << " tokens");
    CHECK(batched[i] == alone[i]);
  }
  // The fork draws what its parent drew from the step it was taken on.
  CHECK(std::equal(forked.begin(), forked.end(), alone[3].begin() + kForkAt));
  for (auto *s : ss) ep_session_close(s);
}

/// The session's logits for one more token (@p probe), downloaded through ep_score.
std::vector<float> probe_logits(ep_session *s, size_t vocab) {
  const int32_t probe = 1;
  std::vector<float> z(vocab);
  REQUIRE(ep_score(s, &probe, 1, 0, nullptr, z.data()) == EP_OK);
  return z;
}

}  // namespace

TEST_CASE("ep_sessions_append, ep_session_sample and ep_session_fork on CUDA: the demo model's greedy tokens as alone",
          "[engine][batch][gpu]") {
  ep::test::TempDir dir;
  ep_model *all = open_model(dir.str(), EP_DEVICE_CUDA);
  CHECK(model_info(all).device == EP_DEVICE_CUDA);
  const uint64_t slot = store_stats(all).slot_bytes;
  check_demo_batched(all, "every expert cached");
  ep_model_close(all);
  ep_model *small = open_model(dir.str(), EP_DEVICE_CUDA, 3 * slot);
  check_demo_batched(small, "a cache of three slots");
  CHECK(store_stats(small).cache_evictions > 0);
  ep_model_close(small);
}

TEST_CASE("ep_sessions_append on CUDA on the goldens of every architecture: batched logits as alone", "[engine][batch][gpu]") {
  const std::string data = EP_TEST_DATA_DIR;
  for (const std::string &path : {data + "/deepseek_v4/deepseek_v4_a.gguf", data + "/kimi_linear/kimi_a.gguf",
                                  data + "/kimi_k3/k3_a.gguf"}) {
    INFO(path);
    ep::test::TempDir dir;
    ep_model *m = ep::test::open_model(path, dir.str(), 0, 1, EP_DEVICE_CUDA);
    const ep_model_properties p = model_info(m);
    REQUIRE(p.device == EP_DEVICE_CUDA);
    const size_t V = p.vocab_size;
    const int32_t Vi = static_cast<int32_t>(V);
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
    REQUIRE(append_all(ss, tp, tn) == EP_OK);
    std::vector<std::vector<int32_t>> step_tokens(steps.size(), std::vector<int32_t>(prompts.size()));
    for (size_t k = 0; k < steps.size(); ++k) {
      for (size_t i = 0; i < ss.size(); ++i) {
        step_tokens[k][i] = steps[k][i] % Vi;
        tp[i] = &step_tokens[k][i];
        tn[i] = 1;
      }
      REQUIRE(append_all(ss, tp, tn) == EP_OK);
    }
    for (size_t i = 0; i < ss.size(); ++i) {
      INFO("sequence " << i);
      std::vector<int32_t> seq = prompts[i];
      for (const auto &st : step_tokens) seq.push_back(st[i]);
      const std::vector<float> batched = probe_logits(ss[i], V);
      ep_session *solo = nullptr;
      REQUIRE(ep_session_open(&solo, m) == EP_OK);
      std::vector<float> rows(seq.size() * V);
      REQUIRE(ep_score(solo, seq.data(), seq.size(), 0, nullptr, rows.data()) == EP_OK);
      const std::vector<float> alone = probe_logits(solo, V);
      ep_session_close(solo);
      double max_ref = 0, max_diff = 0;
      for (size_t v = 0; v < V; ++v) {
        max_ref = std::max(max_ref, static_cast<double>(std::fabs(alone[v])));
        max_diff = std::max(max_diff, static_cast<double>(std::fabs(batched[v] - alone[v])));
      }
      std::printf("%s sequence %zu on CUDA: batched against alone max|dlogit| %.3g of max|logit| %.4g\n", path.c_str(), i, max_diff,
                  max_ref);
      CHECK(max_diff <= kCudaLimit * max_ref);
      std::vector<float> sorted = alone;
      std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<>());
      if (sorted[0] - sorted[1] > kMargin)
        CHECK(std::max_element(batched.begin(), batched.end()) - batched.begin() ==
              std::max_element(alone.begin(), alone.end()) - alone.begin());
    }
    for (auto *s : ss) ep_session_close(s);
    ep_model_close(m);
  }
}
