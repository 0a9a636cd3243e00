#include "engine/trace_replay.hpp"

#include "core/error.hpp"

#include <algorithm>
#include <set>

namespace ep::engine {

TraceReplay::TraceReplay(const cache::Trace &trace, int64_t num_experts, int64_t k)
    : name_(trace.name), k_(k) {
  if (num_experts <= 0 || k <= 0 || k > num_experts)
    fail(Status::invalid_argument, "trace replay {}: a model of {} experts and {} picks per token", name_, num_experts, k);
  if (trace.num_layers == 0 || trace.top_k == 0)
    fail(Status::invalid_argument, "trace replay {}: {} layers, top-k {}: nothing to replay", name_, trace.num_layers, trace.top_k);
  tokens_.resize(trace.num_layers);
  for (const cache::TraceAccess &a : trace.accesses) {
    if (a.prefill) continue;  // prompt cells are grouped per layer: not one token each
    for (size_t at = 0; at < a.experts.size(); at += trace.top_k) {
      std::vector<int32_t> token;
      for (size_t i = at; i < std::min(a.experts.size(), at + trace.top_k); ++i)
        token.push_back(static_cast<int32_t>(a.experts[i] % static_cast<uint64_t>(num_experts)));
      tokens_[a.layer].push_back(std::move(token));
    }
  }
  for (uint32_t l = 0; l < trace.num_layers; ++l) {
    if (tokens_[l].empty()) fail(Status::invalid_argument, "trace replay {}: trace layer {} has no decode tokens", name_, l);
    std::set<int32_t> distinct;
    for (const auto &t : tokens_[l]) distinct.insert(t.begin(), t.end());
    if (static_cast<int64_t>(distinct.size()) < k)
      fail(Status::invalid_argument,
           "trace replay {}: trace layer {} picks {} distinct experts once mapped onto the model's {}; a position needs {}", name_,
           l, distinct.size(), num_experts, k);
  }
}

void TraceReplay::picks(int64_t layer, int64_t tokens, int64_t k, std::span<int32_t> out) {
  if (k != k_ || layer < 0 || out.size() != static_cast<size_t>(tokens * k))
    fail(Status::internal, "trace replay {}: layer {} asks for {} x {} picks into {} ids; the replay was made for {} picks", name_,
         layer, tokens, k, out.size(), k_);
  if (cursor_.size() <= static_cast<size_t>(layer)) cursor_.resize(static_cast<size_t>(layer) + 1, 0);
  const auto &recorded = tokens_[static_cast<size_t>(layer) % tokens_.size()];
  uint64_t &cursor = cursor_[static_cast<size_t>(layer)];
  for (int64_t t = 0; t < tokens; ++t) {
    int32_t *pos = out.data() + t * k;
    int64_t have = 0;
    // Terminates within one pass over the layer's tokens: they hold at least k distinct experts.
    while (have < k) {
      for (int32_t id : recorded[cursor % recorded.size()])
        if (have < k && std::find(pos, pos + have, id) == pos + have) pos[have++] = id;
      ++cursor;
    }
  }
}

uint64_t TraceReplay::consumed(int64_t layer) const {
  return layer >= 0 && static_cast<size_t>(layer) < cursor_.size() ? cursor_[static_cast<size_t>(layer)] : 0;
}

}  // namespace ep::engine
