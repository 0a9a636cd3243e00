// Replay of a recorded routing trace in place of a model's router (benchmark-only; see
// experts/route_override.hpp): ep-bench e2e --replay-trace. The trace's picks are mapped onto the
// model this way, which docs/expert-delivery.md documents beside the benchmark:
//  - layers: the model's MoE layer l replays trace layer l mod (the trace's layers);
//  - experts: trace expert e becomes model expert e mod (the model's experts);
//  - positions: every position of every forward pass (prompt or generated) takes the next
//    recorded token of its layer, cycling through the trace; a position needs the model's k
//    distinct experts, taken in the recorded order (the router's rank order in a route CSV):
//    with a trace top-k above the model's, a token's lowest-ranked picks are dropped; below it
//    (or where the expert mapping folds two picks into one), the position also takes the next
//    recorded tokens' picks until it has k.
// Route CSVs give their decode cells (one token each); a store trace's accesses are split into
// tokens of its top_k ids. Positions are counted per layer over the replay's life, across
// sessions, in the order forward passes run (the engine's lock orders them).
#pragma once

#include "cache/trace.hpp"
#include "experts/route_override.hpp"

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace ep::engine {

class TraceReplay final : public experts::RouteOverride {
 public:
  /// Replays @p trace on a model of @p num_experts experts per MoE layer and @p k picks per
  /// token. Throws Status::invalid_argument naming the trace when a trace layer the model would
  /// replay has no tokens or maps onto fewer than @p k distinct experts.
  TraceReplay(const cache::Trace &trace, int64_t num_experts, int64_t k);
  void picks(int64_t layer, int64_t tokens, int64_t k, std::span<int32_t> out) override;
  /// Recorded tokens of layer @p layer (the trace's) consumed so far.
  uint64_t consumed(int64_t layer) const;
  const std::string &name() const { return name_; }

 private:
  std::string name_;
  int64_t k_ = 0;
  std::vector<std::vector<std::vector<int32_t>>> tokens_;  // trace layer -> token -> model expert ids
  std::vector<uint64_t> cursor_;                           // per model MoE layer: next recorded token
};

}  // namespace ep::engine
