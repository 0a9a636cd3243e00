// The byte budget of the expert cache: how many slots of one object each fit.
//
//   slots = floor(min(requested, free − reserve) / object_bytes)   (capped at the object count;
//                                                                    requested 0 = free − reserve)
//
// Initialisation fails with EP_ERR_BUDGET when the slots cannot hold the largest unique set
// one acquire may need: min(top_k × tokens_per_acquire, num_experts) — otherwise an acquire
// could need more experts resident at once than there are slots. tokens_per_acquire 0 asks for
// as many tokens as the slots hold top_k experts for: clamp(slots / top_k, 1, ⌈num_experts /
// top_k⌉) (an expert-major pass covers the rest of a larger step).
#pragma once

#include <cstdint>
#include <string>

namespace ep::cache {

struct BudgetRequest {
  uint64_t requested_bytes = 0;  ///< what the user asked for (0: "all that is free", as ep_model_options' 0)
  uint64_t free_bytes = UINT64_MAX;  ///< free device memory (cudaMemGetInfo) or host memory
  uint64_t reserve_bytes = 0;    ///< kept free for activations, workspaces, other users
  uint64_t object_bytes = 0;     ///< one slot: the largest object, aligned
  uint32_t top_k = 1;
  uint32_t tokens_per_acquire = 1;  ///< 0: as many as the slots hold (see above)
  uint32_t num_experts = 1;      ///< per layer
  uint64_t total_objects = UINT64_MAX;  ///< layers × experts: more slots are never useful
};

struct Budget {
  uint32_t slots = 0;
  uint32_t min_slots = 0;     ///< the largest unique set of one acquire
  uint32_t tokens_per_acquire = 0;  ///< the request's, or the one derived from the slots
  uint64_t usable_bytes = 0;  ///< min(requested, free − reserve)
  uint64_t cache_bytes = 0;   ///< slots × object_bytes
};

/// Applies the rule above. Throws ep::Error(Status::budget) with the numbers when too small,
/// Status::invalid_argument for a zero object size.
Budget compute_budget(const BudgetRequest &request);

}  // namespace ep::cache
