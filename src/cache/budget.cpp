#include "cache/budget.hpp"

#include "core/error.hpp"

#include <algorithm>

namespace ep::cache {

Budget compute_budget(const BudgetRequest &r) {
  if (r.object_bytes == 0) fail(Status::invalid_argument, "expert cache budget: object_bytes is 0");
  if (r.top_k == 0 || r.num_experts == 0)
    fail(Status::invalid_argument, "expert cache budget: top_k {} and num_experts {} must be positive", r.top_k, r.num_experts);
  Budget b;
  const uint64_t available = r.free_bytes > r.reserve_bytes ? r.free_bytes - r.reserve_bytes : 0;
  b.usable_bytes = r.requested_bytes == 0 ? available : std::min(r.requested_bytes, available);
  const uint64_t slots = std::min<uint64_t>({b.usable_bytes / r.object_bytes, r.total_objects, UINT32_MAX});
  b.tokens_per_acquire = r.tokens_per_acquire;
  if (b.tokens_per_acquire == 0) {
    const uint64_t all_tokens = (static_cast<uint64_t>(r.num_experts) + r.top_k - 1) / r.top_k;
    b.tokens_per_acquire = static_cast<uint32_t>(std::clamp<uint64_t>(slots / r.top_k, 1, all_tokens));
  }
  b.min_slots = static_cast<uint32_t>(std::min<uint64_t>(
      static_cast<uint64_t>(r.top_k) * b.tokens_per_acquire, r.num_experts));
  if (slots < b.min_slots) {
    fail(Status::budget,
         "expert cache budget too small: min(requested {} B, free {} B - reserve {} B) = {} B holds "
         "{} slot(s) of {} B, but one acquire may need {} unique experts (top_k {} x "
         "tokens_per_acquire {}, at most {} experts): at least {} B are needed",
         r.requested_bytes, r.free_bytes, r.reserve_bytes, b.usable_bytes, slots, r.object_bytes,
         b.min_slots, r.top_k, b.tokens_per_acquire, r.num_experts,
         static_cast<uint64_t>(b.min_slots) * r.object_bytes);
  }
  b.slots = static_cast<uint32_t>(slots);
  b.cache_bytes = static_cast<uint64_t>(b.slots) * r.object_bytes;
  return b;
}

}  // namespace ep::cache
