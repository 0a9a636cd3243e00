// Rows of random logits with mixed sampling settings, for Backend::sample_rows() against one
// sample() call per row: the CPU test (sample_rows_test.cpp) and the CUDA one
// (cuda/sampling_gpu_test.cpp) draw the same cases.
#pragma once

#include "backend/backend.hpp"

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace ep::test {

struct SampleCase {
  std::vector<float> logits;            // [vocab]
  backend::SamplingParams params;       // penalty_tokens and allowed point into the vectors below
  std::vector<int32_t> penalty;         // recent tokens: the row's top tokens, repeats, ids outside the row
  std::vector<uint32_t> mask;           // allowed tokens (empty: all)
  uint64_t counter = 0;
  int32_t top_n = -1;                   // -1: no log-probabilities
  int kind = 0;
};

/// @p n rows of @p vocab logits (normal, sd 4), cycling through eight kinds of settings: greedy;
/// temperature + top_p; temperature + top_k + min_p; greedy with a repetition penalty;
/// temperature, penalty and logit bias; a grammar-like token mask (a few hundred tokens, shorter
/// than the row, without the row's maximum) with temperature; log-probabilities (5) with
/// temperature, top_p and a bias; greedy with a mask, a bias and 20 alternatives.
inline std::vector<SampleCase> sample_cases(int64_t vocab, size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 4.0f);
  std::vector<SampleCase> cases(n);
  for (size_t i = 0; i < n; ++i) {
    SampleCase &c = cases[i];
    c.kind = static_cast<int>(i % 8);
    c.logits.resize(static_cast<size_t>(vocab));
    for (float &v : c.logits) v = g(rng);
    int32_t top = 0;
    for (int32_t t = 1; t < vocab; ++t)
      if (c.logits[static_cast<size_t>(t)] > c.logits[static_cast<size_t>(top)]) top = t;
    c.counter = rng() % 1000;
    backend::SamplingParams &p = c.params;
    p.seed = rng();
    auto recent = [&] {
      for (int32_t t = 0; t < vocab; ++t)
        if (c.logits[static_cast<size_t>(t)] > 11.0f) c.penalty.push_back(t);
      c.penalty.push_back(top);
      c.penalty.push_back(top);
      c.penalty.push_back(-3);
      c.penalty.push_back(static_cast<int32_t>(vocab + 5));
      for (int k = 0; k < 40; ++k) c.penalty.push_back(static_cast<int32_t>(rng() % vocab));
    };
    auto mask = [&] {
      c.mask.assign(static_cast<size_t>(vocab / 32 - 3), 0u);
      for (int k = 0; k < 300; ++k) {
        const auto t = static_cast<size_t>(rng() % (c.mask.size() * 32));
        c.mask[t / 32] |= uint32_t{1} << (t % 32);
      }
      if (static_cast<size_t>(top) / 32 < c.mask.size()) c.mask[static_cast<size_t>(top) / 32] &= ~(uint32_t{1} << (top % 32));
    };
    switch (c.kind) {
      case 0: break;
      case 1: p.temperature = 0.8f; p.top_p = 0.9f; break;
      case 2: p.temperature = 1.0f; p.top_k = 40; p.min_p = 0.05f; break;
      case 3: p.repetition_penalty = 1.3f; recent(); break;
      case 4:
        p.temperature = 0.7f;
        p.repetition_penalty = 1.2f;
        recent();
        p.logit_bias = {{static_cast<int32_t>(rng() % vocab), 6.0f}, {top, -3.0f}};
        break;
      case 5: p.temperature = 1.1f; mask(); break;
      case 6:
        p.temperature = 0.9f;
        p.top_p = 0.95f;
        p.logit_bias = {{static_cast<int32_t>(rng() % vocab), 4.0f}};
        c.top_n = 5;
        break;
      default:
        mask();
        p.logit_bias = {{static_cast<int32_t>(rng() % vocab), 1.5f}};
        c.top_n = 20;
        break;
    }
    p.penalty_tokens = c.penalty;
    p.allowed = c.mask;
  }
  return cases;
}

/// Log-probabilities set to values no sampler writes (a NaN log-probability, ids -9, 42.0f), so
/// a field the call under test leaves unwritten shows.
inline backend::TokenLogprobs poisoned_logprobs(int32_t top_n) {
  backend::TokenLogprobs lp;
  lp.top_n = top_n;
  lp.logprob = std::nanf("");
  lp.top_ids.assign(3, -9);
  lp.top_logprobs.assign(3, 42.0f);
  return lp;
}

}  // namespace ep::test
