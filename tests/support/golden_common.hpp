// What the tests of every architecture (in tests/model, tests/engine and tests/store) share about
// the oracle goldens (tests/data/<model>/NAME.{json,logits.f32,gguf}): loading them, the logit
// difference that never lets a non-finite value pass, and the greedy-token agreement check.
#pragma once

#include "support/catch.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace ep::test {

/// The whole file (REQUIREs that it opens).
inline std::string slurp(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  REQUIRE(f.good());
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

/// One golden: the oracle's json, the token ids, the reference logits [S][V] and the GGUF path.
struct GoldenData {
  nlohmann::json meta;
  std::vector<int32_t> tokens;
  std::vector<float> logits;  // [S][V]
  int64_t n_tokens = 0, vocab = 0;
  std::string gguf;
};

/// Loads @p base.{json,logits.f32,gguf}; @p writer names the script that writes them.
inline GoldenData load_golden_data(const std::string &base, const std::string &writer) {
  namespace fs = std::filesystem;
  GoldenData g;
  INFO("golden files " << base << ".{json,logits.f32,gguf} must exist (" << writer << " writes them)");
  REQUIRE(fs::exists(base + ".json"));
  REQUIRE(fs::exists(base + ".logits.f32"));
  REQUIRE(fs::exists(base + ".gguf"));
  g.meta = nlohmann::json::parse(slurp(base + ".json"));
  for (const auto &t : g.meta.at("tokens")) g.tokens.push_back(t.get<int32_t>());
  g.n_tokens = g.meta.at("logits_shape")[0].get<int64_t>();
  g.vocab = g.meta.at("logits_shape")[1].get<int64_t>();
  REQUIRE(static_cast<int64_t>(g.tokens.size()) == g.n_tokens);
  const std::string raw = slurp(base + ".logits.f32");
  REQUIRE(raw.size() == static_cast<size_t>(g.n_tokens * g.vocab * 4));
  g.logits.resize(static_cast<size_t>(g.n_tokens * g.vocab));
  std::memcpy(g.logits.data(), raw.data(), raw.size());
  g.gguf = base + ".gguf";
  return g;
}

/// max |got − ref| and max |ref| over some logits.
struct Diff {
  double max_abs_diff = 0, max_abs_ref = 0;
  double rel() const { return max_abs_diff / max_abs_ref; }
};

/// The difference of @p n values; every value of @p got must be finite.
inline Diff compare(const float *got, const float *ref, size_t n) {
  Diff d;
  for (size_t i = 0; i < n; ++i) {
    REQUIRE(std::isfinite(got[i]));
    d.max_abs_diff = std::max(d.max_abs_diff, std::fabs(static_cast<double>(got[i]) - ref[i]));
    d.max_abs_ref = std::max(d.max_abs_ref, std::fabs(static_cast<double>(ref[i])));
  }
  return d;
}

inline Diff compare(const std::vector<float> &got, const std::vector<float> &ref) {
  REQUIRE(got.size() == ref.size());
  return compare(got.data(), ref.data(), ref.size());
}

/// Greedy agreement: over the rows whose reference top-1 / top-2 margin exceeds 0.1, the share
/// where @p got's argmax is the reference's top-1 must be at least @p min_agree, and there must
/// be more than @p min_rows such rows. Prints the counts.
inline void check_greedy(const std::vector<float> &got, const std::vector<float> &ref, int64_t vocab, const char *what,
                         int64_t min_rows = 0, double min_agree = 1.0) {
  REQUIRE(got.size() == ref.size());
  const int64_t rows = static_cast<int64_t>(ref.size()) / vocab;
  int64_t checked = 0, agree = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float *a = ref.data() + r * vocab, *b = got.data() + r * vocab;
    int64_t t1 = 0, t2 = -1, g = 0;
    for (int64_t i = 1; i < vocab; ++i) {
      if (a[i] > a[t1]) {
        t2 = t1;
        t1 = i;
      } else if (t2 < 0 || a[i] > a[t2]) {
        t2 = i;
      }
      if (b[i] > b[g]) g = i;
    }
    if (a[t1] - a[t2] <= 0.1f) continue;
    ++checked;
    agree += g == t1;
  }
  std::printf("%s: greedy token equal on %lld of %lld rows with margin > 0.1 (%lld rows)\n", what,
              static_cast<long long>(agree), static_cast<long long>(checked), static_cast<long long>(rows));
  CHECK(checked > min_rows);
  CHECK(static_cast<double>(agree) >= min_agree * static_cast<double>(checked));
}

}  // namespace ep::test
