#include "experts/resident_experts.hpp"

#include "core/error.hpp"
#include "experts/sharded_experts.hpp"
#include "format/ggml_type.hpp"

#include <algorithm>

namespace ep::experts {

void ResidentExperts::add_layer(const StackedRole &gate, const StackedRole &up, const StackedRole &down) {
  if (!gate.read_expert || !up.read_expert || !down.read_expert)
    fail(Status::internal, "experts of layer {}: the source cannot read single experts", layers_.size());
  const int64_t n_exp = gate.n_experts;
  Layer l;
  auto slot_weight = [](const StackedRole &e, uint64_t offset) {
    backend::SlotWeight w;
    w.offset = offset;
    w.type = e.type;
    w.ne0 = e.ne0;
    w.ne1 = e.ne1;
    return w;
  };
  auto role_bytes = [](const StackedRole &e) {
    return format::ggml_row_bytes(e.type, static_cast<uint64_t>(e.ne0), e.origin) * static_cast<uint64_t>(e.ne1);
  };
  const uint64_t gate_bytes = role_bytes(gate), up_bytes = role_bytes(up), down_bytes = role_bytes(down);
  l.layout.gate = slot_weight(gate, 0);
  l.layout.up = slot_weight(up, gate_bytes);
  l.layout.down = slot_weight(down, gate_bytes + up_bytes);
  const uint64_t total = gate_bytes + up_bytes + down_bytes;
  std::vector<uint8_t> host(static_cast<size_t>(total));
  const auto layer = static_cast<int64_t>(layers_.size());
  for (int64_t e = 0; e < n_exp; ++e) {
    if (expert_owner(layer, e, n_devices_) != device_) {
      l.slots.push_back(nullptr);  // another device's
      l.objects.emplace_back();
      continue;
    }
    const std::vector<uint8_t> g = gate.read_expert(e), u = up.read_expert(e), d = down.read_expert(e);
    if (g.size() != gate_bytes || u.size() != up_bytes || d.size() != down_bytes)
      fail(Status::corrupt, "expert {} of {}: read {}+{}+{} bytes, expected {}+{}+{}", e, gate.origin, g.size(), u.size(),
           d.size(), gate_bytes, up_bytes, down_bytes);
    std::copy(g.begin(), g.end(), host.begin());
    std::copy(u.begin(), u.end(), host.begin() + static_cast<std::ptrdiff_t>(gate_bytes));
    std::copy(d.begin(), d.end(), host.begin() + static_cast<std::ptrdiff_t>(gate_bytes + up_bytes));
    backend::DeviceBuffer buf(be_, total);
    be_.upload(buf.get(), host.data(), total);
    l.slots.push_back(buf.get());
    l.objects.push_back(std::move(buf));
    bytes_ += total;
  }
  l.slots_dev = backend::DeviceBuffer(be_, l.slots.size() * sizeof(void *));
  be_.upload(l.slots_dev.get(), l.slots.data(), l.slots.size() * sizeof(void *));
  layers_.push_back(std::move(l));
}
const ResidentExperts::Layer &ResidentExperts::layer_at(int64_t layer) const {
  if (layer < 0 || layer >= static_cast<int64_t>(layers_.size())) fail(Status::invalid_argument, "experts: no layer {}", layer);
  return layers_[static_cast<size_t>(layer)];
}

const backend::SlotLayout &ResidentExperts::layout(int64_t layer) const { return layer_at(layer).layout; }

backend::ExpertBatch ResidentExperts::acquire(int64_t layer, const backend::Tensor &ids, const int32_t *host_ids,
                                              std::span<const int32_t> only) {
  const Layer &l = layer_at(layer);
  const int64_t n = ids.n_elems(), n_exp = static_cast<int64_t>(l.slots.size());
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
    pair_slots_.assign(static_cast<size_t>(n), nullptr);
    for (int64_t p = 0; p < n; ++p) {
      const int32_t e = host_ids[p];
      if (e < 0 || e >= n_exp)
        fail(Status::corrupt, "experts: layer {}: expert id {} at pair {} is outside 0..{}", layer, e, p, n_exp - 1);
      if (!wanted.empty() && !wanted[static_cast<size_t>(e)]) continue;
      if (!l.slots[static_cast<size_t>(e)])
        fail(Status::internal, "experts: layer {}: expert {} is device {}'s, not device {}'s", layer, e,
             expert_owner(layer, e, n_devices_), device_);
      pair_slots_[static_cast<size_t>(p)] = l.slots[static_cast<size_t>(e)];
    }
    b.pair_slots = pair_slots_.data();
    b.pair_experts = host_ids;
  }
  if (only.empty() && !be_.moe_reads_host_picks(ids.n_rows(), l.layout)) {
    const uint64_t bytes = static_cast<uint64_t>(3 * n) * sizeof(void *);
    if (role_table_.bytes() < bytes) role_table_ = backend::DeviceBuffer(be_, bytes);
    auto *table = static_cast<const void **>(role_table_.get());
    be_.gather_role_table(ids, static_cast<const void *const *>(l.slots_dev.get()), n_exp, l.layout, table);
    b.role_table = table;
  }
  return b;
}

}  // namespace ep::experts
