// Expert batches for the moe op tests: what a provider would publish for a table of expert
// slots (one address per expert, null for an expert without a slot).
#pragma once

#include "backend/backend.hpp"

#include <cstdint>
#include <vector>

namespace ep::test {

/// A backend::ExpertBatch over host vectors it owns (per pair: slot, expert; the role table
/// in host memory, for a backend whose device memory is host memory).
struct HostBatch {
  std::vector<const void *> pair_slots;
  std::vector<int32_t> pair_experts;
  std::vector<const void *> role_table;
  backend::ExpertBatch batch;
};

/// The batch of the pairs @p ids (n of them) over @p table (n_experts addresses): a pair whose
/// expert has a null address (or an id outside the table) gets a null slot.
inline HostBatch host_batch(const std::vector<int32_t> &ids, const std::vector<const void *> &table,
                            const backend::SlotLayout &layout) {
  HostBatch h;
  const size_t n = ids.size();
  h.pair_slots.assign(n, nullptr);
  h.pair_experts = ids;
  h.role_table.assign(3 * n, nullptr);
  for (size_t p = 0; p < n; ++p) {
    const int32_t e = ids[p];
    if (e < 0 || static_cast<size_t>(e) >= table.size() || !table[static_cast<size_t>(e)]) continue;
    const auto *base = static_cast<const uint8_t *>(table[static_cast<size_t>(e)]);
    h.pair_slots[p] = base;
    h.role_table[p] = base + layout.gate.offset;
    h.role_table[n + p] = base + layout.up.offset;
    h.role_table[2 * n + p] = base + layout.down.offset;
  }
  h.batch.n_pairs = static_cast<int64_t>(n);
  h.batch.pair_slots = h.pair_slots.data();
  h.batch.pair_experts = h.pair_experts.data();
  h.batch.role_table = h.role_table.data();
  return h;
}

}  // namespace ep::test
