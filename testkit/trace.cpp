#include "testkit/trace.hpp"

#include "core/error.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

namespace ep::testkit {

using cache::Trace;
using cache::TraceAccess;

SyntheticTraceOptions::Kind parse_synthetic_kind(const std::string &name) {
  if (name == "uniform") return SyntheticTraceOptions::Kind::uniform;
  if (name == "zipf") return SyntheticTraceOptions::Kind::zipf;
  if (name == "zipf-temporal" || name == "zipf_temporal") return SyntheticTraceOptions::Kind::zipf_temporal;
  fail(Status::invalid_argument, "synthetic trace '{}' is not one of uniform, zipf, zipf-temporal", name);
}

Trace synthetic_trace(const SyntheticTraceOptions &o) {
  if (o.num_layers == 0 || o.num_experts == 0 || o.top_k == 0 || o.top_k > o.num_experts)
    fail(Status::invalid_argument, "synthetic trace: need layers > 0 and 0 < top_k {} <= experts {}", o.top_k,
         o.num_experts);
  Trace t;
  const char *kind_name = o.kind == SyntheticTraceOptions::Kind::uniform ? "uniform"
                          : o.kind == SyntheticTraceOptions::Kind::zipf  ? "zipf"
                                                                         : "zipf-temporal";
  t.name = std::string("synthetic-") + kind_name;
  t.num_layers = o.num_layers;
  t.num_experts = o.num_experts;
  t.top_k = o.top_k;
  t.object_bytes.assign(o.num_layers, o.object_bytes);
  std::mt19937_64 rng(o.seed);
  // Per layer: which expert has popularity rank r (a random permutation).
  std::vector<std::vector<uint32_t>> rank_to_expert(o.num_layers);
  for (auto &perm : rank_to_expert) {
    perm.resize(o.num_experts);
    std::iota(perm.begin(), perm.end(), 0u);
    std::shuffle(perm.begin(), perm.end(), rng);
  }
  std::vector<double> cdf(o.num_experts);
  double sum = 0;
  for (uint32_t r = 0; r < o.num_experts; ++r) {
    sum += 1.0 / std::pow(static_cast<double>(r + 1), o.zipf_s);
    cdf[r] = sum;
  }
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<std::vector<uint32_t>> previous(o.num_layers);
  for (uint32_t token = 0; token < o.tokens; ++token) {
    for (uint32_t layer = 0; layer < o.num_layers; ++layer) {
      TraceAccess a;
      a.layer = layer;
      std::vector<char> taken(o.num_experts, 0);
      while (a.experts.size() < o.top_k) {
        uint32_t e;
        if (o.kind == SyntheticTraceOptions::Kind::uniform) {
          e = static_cast<uint32_t>(std::uniform_int_distribution<uint32_t>(0, o.num_experts - 1)(rng));
        } else if (o.kind == SyntheticTraceOptions::Kind::zipf_temporal && !previous[layer].empty() &&
                   unit(rng) < o.temporal_repeat) {
          const auto &prev = previous[layer];
          e = prev[std::uniform_int_distribution<std::size_t>(0, prev.size() - 1)(rng)];
        } else {
          const double x = unit(rng) * sum;
          const auto r = static_cast<uint32_t>(std::lower_bound(cdf.begin(), cdf.end(), x) - cdf.begin());
          e = rank_to_expert[layer][std::min(r, o.num_experts - 1)];
        }
        if (taken[e]) continue;
        taken[e] = 1;
        a.experts.push_back(e);
      }
      previous[layer] = a.experts;
      t.accesses.push_back(std::move(a));
    }
  }
  return t;
}

}  // namespace ep::testkit
