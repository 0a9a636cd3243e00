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
  std::vector<const void *> addresses;
  for (int64_t e = 0; e < n_exp; ++e) {
    if (expert_owner(layer, e, n_devices_) != device_) {
      addresses.push_back(nullptr);  // another device's
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
    addresses.push_back(buf.get());
    l.objects.push_back(std::move(buf));
    bytes_ += total;
  }
  l.fixed.set(be_, std::move(addresses));
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
  return fixed_experts_batch(be_, layer, l.fixed, l.layout, ids, host_ids, only, pair_slots_, role_table_);
}

}  // namespace ep::experts
