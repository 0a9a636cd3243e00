// Benchmark-only: expert picks that replace the router's. ep-bench e2e --replay-trace replays a
// recorded routing trace through a real model this way (engine/trace_replay.hpp): the runner
// (start_moe, experts/runner.cpp) asks its provider's override for each MoE layer's picks right
// after the router ran and writes them over the router's ids in backend memory, before anything
// reads them (the ids' host copy, the hint, the MoE). The router's weights stay as it produced them per
// position and pick, so the MoE computes on the replayed experts with the model's own weights and
// activations: the compute is unchanged, only which experts are read differs. Nothing but a
// benchmark sets one (engine::Engine::set_route_override).
#pragma once

#include "backend/backend.hpp"

#include <cstdint>
#include <span>

namespace ep::experts {

class RouteOverride {
 public:
  virtual ~RouteOverride() = default;
  /// The picks of MoE layer @p layer (the provider's index) for the next @p tokens positions:
  /// @p out holds k ids per position, position-major (the router's i32 [k, tokens] layout),
  /// each id below the model's expert count. Called once per layer and forward pass, in order.
  virtual void picks(int64_t layer, int64_t tokens, int64_t k, std::span<int32_t> out) = 0;
};

/// Overwrites @p ids (i32 [k, T] in backend memory, the router's output) with @p route's picks of
/// MoE layer @p layer, ordered on the backend's stream after the router.
void apply_route_override(backend::Backend &be, RouteOverride &route, int64_t layer, const backend::Tensor &ids);

}  // namespace ep::experts
