// The runner: one MoE layer's routed experts, the same sequence for every model family. A model
// calls start_moe() once its router can run, queues what does not depend on the routed experts
// (the shared experts, a latent projection) and calls finish_moe():
//
//   start_moe:  route this layer ─► (provider wants hints) route the next MoE layer on this
//               layer's input ─► the ids' one device → host copy, only when the provider or the
//               backend's moe op needs them on the host (returns at once)
//   finish_moe: wait for that copy ─► acquire ─► hint ─► Backend::moe ─► release, by one of four
//               strategies that give the same bits:
//                 direct        one acquire covers every pick; one moe()
//                 staged        the provider stages_reads(): moe_pairs() over the resident
//                               experts while the misses are read, then over each expert as it
//                               lands (next_staged()), then moe_combine()
//                 expert-major  the step's distinct experts exceed max_unique(): for chunks of
//                               tokens, moe_pairs() per group of max_unique() experts, then
//                               moe_combine()
//                 sharded       the experts are on several devices (ShardedExperts): each
//                               device computes its picks' rows (moe_pairs; its reads staged when
//                               its share fits one acquire), the rows come back to the first
//                               device, moe_combine() there (docs/multi-device.md)
// The sums are in pick order in every strategy, so the logits do not depend on which one ran.
#pragma once

#include "backend/backend.hpp"
#include "experts/provider.hpp"

#include <cstdint>
#include <functional>

namespace ep::experts {

/// A router's picks for one MoE layer, in backend memory: ids i32 [k, T], weights f32 [k, T].
struct Routed {
  backend::Tensor ids, weights;
};

/// One MoE layer as the model hands it to start_moe().
struct MoeLayer {
  int64_t layer = 0;        ///< the provider's layer: the block's index among the model's MoE blocks
  int64_t next_layer = -1;  ///< the provider layer of the next block when it is a MoE block; -1: none
  /// Runs a router over this layer's input and returns its picks: this layer's own (@p next
  /// false), or the next MoE block's as a prediction of its picks (@p next true, asked only when
  /// the provider wants_hints() and next_layer >= 0; only its ids are used, as a hint: exact for
  /// a hash-routed block, whose picks depend on the token only).
  std::function<Routed(bool next)> route;
};

/// One MoE layer between start_moe() and finish_moe().
struct MoeStep {
  int64_t layer = 0;
  backend::Tensor ids;                ///< i32 [k, T], backend memory
  backend::Tensor weights;            ///< f32 [k, T], backend memory
  const int32_t *host_ids = nullptr;  ///< the ids' host copy, when start_moe() started one
  int64_t hint_layer = -1;
  int64_t n_hint = 0;
  const int32_t *host_hint = nullptr;  ///< the hint's host copy, when one was routed
};

/// Routes @p layer (and the next MoE block, for a provider that wants hints) and starts the
/// ids' device → host copy when the provider or the backend needs them; returns at once.
MoeStep start_moe(backend::Backend &be, ExpertProvider &experts, const MoeLayer &layer);

/// Finishes @p step: y = Σ_j weights[j, t] · expert_j(x_t) for every token t (see the file
/// comment for the strategies). x, y: f32 [d, T] in backend memory; @p act: the experts' GLU.
/// Releases the provider's acquisitions on every path, errors included.
void finish_moe(backend::Backend &be, ExpertProvider &experts, const MoeStep &step, const float *x, float *y, int64_t d,
                const backend::Activation &act);

}  // namespace ep::experts
