// A model's batched pass against each sequence alone: the sequences are stepped together, one
// chunk each per pass (the first pass a prompt of its own length, then one token per pass), with
// forward_batch, and separately each on its own state with forward(); every row's logits must be
// the same bits (CPU backend). Works with any model class that has new_state(), forward(tokens,
// n, state, float *logits) and forward_batch(tokens, offsets, states, LogitRows).
#pragma once

#include "support/catch.hpp"

#include "backend/backend.hpp"
#include "model/causal_lm.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace ep::test {

/// @p tokens[s]: sequence s's tokens (at least first[s] + passes - 1 of them); @p first[s]: its
/// prompt's length (the first pass's chunk).
template <class Model>
void check_batched_equals_alone(Model &model, const std::vector<std::vector<int32_t>> &tokens, const std::vector<int64_t> &first,
                                int passes) {
  using State = decltype(model.new_state());
  const size_t seqs = tokens.size();
  const int64_t V = model.config().vocab;
  auto chunk = [&](size_t s, int pass) { return pass == 0 ? first[s] : int64_t{1}; };
  std::vector<std::vector<float>> alone(seqs), together(seqs);
  for (size_t s = 0; s < seqs; ++s) {
    REQUIRE(static_cast<int64_t>(tokens[s].size()) >= first[s] + passes - 1);
    State st = model.new_state();
    int64_t at = 0;
    for (int pass = 0; pass < passes; ++pass) {
      const int64_t n = chunk(s, pass);
      std::vector<float> rows(static_cast<size_t>(n * V));
      model.forward(tokens[s].data() + at, n, st, rows.data());
      alone[s].insert(alone[s].end(), rows.begin(), rows.end());
      at += n;
    }
  }
  std::vector<State> states;
  for (size_t s = 0; s < seqs; ++s) states.push_back(model.new_state());
  std::vector<State *> ptrs;
  for (auto &st : states) ptrs.push_back(&st);
  std::vector<int64_t> at(seqs, 0);
  for (int pass = 0; pass < passes; ++pass) {
    std::vector<int32_t> all;
    std::vector<int64_t> offsets{0};
    for (size_t s = 0; s < seqs; ++s) {
      all.insert(all.end(), tokens[s].begin() + at[s], tokens[s].begin() + at[s] + chunk(s, pass));
      offsets.push_back(static_cast<int64_t>(all.size()));
    }
    const backend::Tensor out = model.forward_batch(all, offsets, ptrs, model::LogitRows::all);
    REQUIRE(out.ne[0] == V);
    REQUIRE(out.ne[1] == static_cast<int64_t>(all.size()));
    const float *rows = out.as<float>();
    for (size_t s = 0; s < seqs; ++s) {
      together[s].insert(together[s].end(), rows + offsets[s] * V, rows + offsets[s + 1] * V);
      at[s] += chunk(s, pass);
    }
  }
  for (size_t s = 0; s < seqs; ++s) {
    INFO("sequence " << s);
    REQUIRE(together[s].size() == alone[s].size());
    for (float x : together[s]) REQUIRE(std::isfinite(x));
    CHECK(std::memcmp(together[s].data(), alone[s].data(), alone[s].size() * sizeof(float)) == 0);
  }
}

}  // namespace ep::test
