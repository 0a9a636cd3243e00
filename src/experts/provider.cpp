#include "experts/provider.hpp"

#include "core/error.hpp"

namespace ep::experts {

ExpertShape expert_shape_of(const StackedRole &gate, const StackedRole &up, const StackedRole &down) {
  auto shape_of = [](const StackedRole &e) {
    if (!backend::is_supported_weight_type(e.type))
      fail(Status::unsupported, "{}: ggml type {} is not supported for experts", e.origin, static_cast<uint32_t>(e.type));
    backend::SlotWeight w;
    w.type = e.type;
    w.ne0 = e.ne0;
    w.ne1 = e.ne1;
    return w;
  };
  return ExpertShape{shape_of(gate), shape_of(up), shape_of(down)};
}

void FixedExperts::set(backend::Backend &be, std::vector<const void *> addresses) {
  slots = std::move(addresses);
  slots_dev = backend::DeviceBuffer(be, slots.size() * sizeof(void *));
  be.upload(slots_dev.get(), slots.data(), slots.size() * sizeof(void *));
}

backend::ExpertBatch fixed_experts_batch(backend::Backend &be, int64_t layer, const FixedExperts &experts,
                                         const backend::SlotLayout &layout, const backend::Tensor &ids,
                                         const int32_t *host_ids, std::span<const int32_t> only,
                                         std::vector<const void *> &pair_slots, backend::DeviceBuffer &role_table) {
  const int64_t n = ids.n_elems(), n_exp = static_cast<int64_t>(experts.slots.size());
  backend::ExpertBatch b;
  b.n_pairs = n;
  if (host_ids) {
    std::vector<uint8_t> wanted;
    if (!only.empty()) {
      wanted.assign(static_cast<size_t>(n_exp), 0);
      for (int32_t e : only) {
        if (e < 0 || e >= n_exp) fail(Status::invalid_argument, "experts: layer {}: expert {} outside 0..{}", layer, e, n_exp - 1);
        wanted[static_cast<size_t>(e)] = 1;
      }
    }
    pair_slots.assign(static_cast<size_t>(n), nullptr);
    for (int64_t p = 0; p < n; ++p) {
      const int32_t e = host_ids[p];
      if (e < 0 || e >= n_exp)
        fail(Status::corrupt, "experts: layer {}: expert id {} at pair {} is outside 0..{}", layer, e, p, n_exp - 1);
      if (!wanted.empty() && !wanted[static_cast<size_t>(e)]) continue;
      if (!experts.slots[static_cast<size_t>(e)])
        fail(Status::internal, "experts: layer {}: expert {} is not held here (another device owns it)", layer, e);
      pair_slots[static_cast<size_t>(p)] = experts.slots[static_cast<size_t>(e)];
    }
    b.pair_slots = pair_slots.data();
    b.pair_experts = host_ids;
  }
  if (only.empty() && !be.moe_reads_host_picks(ids.n_rows(), layout)) {
    const uint64_t bytes = static_cast<uint64_t>(3 * n) * sizeof(void *);
    if (role_table.bytes() < bytes) role_table = backend::DeviceBuffer(be, bytes);
    auto *table = static_cast<const void **>(role_table.get());
    be.gather_role_table(ids, static_cast<const void *const *>(experts.slots_dev.get()), n_exp, layout, table);
    b.role_table = table;
  }
  return b;
}

}  // namespace ep::experts
