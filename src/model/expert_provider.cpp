#include "model/expert_provider.hpp"

#include "core/error.hpp"
#include "model/weight_catalog.hpp"

namespace ep::model {

void ResidentExperts::add_layer(const CatalogEntry &gate, const CatalogEntry &up, const CatalogEntry &down) {
  if (!gate.read_expert || !up.read_expert || !down.read_expert)
    fail(Status::internal, "experts of layer {}: the source cannot read single experts", layers_.size());
  const int64_t n_exp = gate.ne[2];
  Layer l;
  auto slot_weight = [](const CatalogEntry &e, uint64_t offset) {
    backend::SlotWeight w;
    w.offset = offset;
    w.type = e.type;
    w.ne0 = e.ne[0];
    w.ne1 = e.ne[1];
    return w;
  };
  const uint64_t gate_bytes = format::ggml_row_bytes(gate.type, static_cast<uint64_t>(gate.ne[0]), gate.origin) * static_cast<uint64_t>(gate.ne[1]);
  const uint64_t up_bytes = format::ggml_row_bytes(up.type, static_cast<uint64_t>(up.ne[0]), up.origin) * static_cast<uint64_t>(up.ne[1]);
  const uint64_t down_bytes = format::ggml_row_bytes(down.type, static_cast<uint64_t>(down.ne[0]), down.origin) * static_cast<uint64_t>(down.ne[1]);
  l.layout.gate = slot_weight(gate, 0);
  l.layout.up = slot_weight(up, gate_bytes);
  l.layout.down = slot_weight(down, gate_bytes + up_bytes);
  const uint64_t total = gate_bytes + up_bytes + down_bytes;
  std::vector<uint8_t> host(static_cast<size_t>(total));
  for (int64_t e = 0; e < n_exp; ++e) {
    const std::vector<uint8_t> g = gate.read_expert(e), u = up.read_expert(e), d = down.read_expert(e);
    if (g.size() != gate_bytes || u.size() != up_bytes || d.size() != down_bytes)
      fail(Status::corrupt, "expert {} of {}: read {}+{}+{} bytes, expected {}+{}+{}", e, gate.origin, g.size(), u.size(),
           d.size(), gate_bytes, up_bytes, down_bytes);
    std::copy(g.begin(), g.end(), host.begin());
    std::copy(u.begin(), u.end(), host.begin() + static_cast<std::ptrdiff_t>(gate_bytes));
    std::copy(d.begin(), d.end(), host.begin() + static_cast<std::ptrdiff_t>(gate_bytes + up_bytes));
    DeviceBuffer buf(be_, total);
    be_.upload(buf.get(), host.data(), total);
    l.slots.push_back(buf.get());
    l.objects.push_back(std::move(buf));
    bytes_ += total;
  }
  layers_.push_back(std::move(l));
}

const backend::ExpertLayout &ResidentExperts::layout(int64_t layer) const {
  if (layer < 0 || layer >= static_cast<int64_t>(layers_.size())) fail(Status::invalid_argument, "experts: no layer {}", layer);
  return layers_[static_cast<size_t>(layer)].layout;
}

backend::ExpertSlots ResidentExperts::acquire(int64_t layer, const int32_t *, int64_t) {
  if (layer < 0 || layer >= static_cast<int64_t>(layers_.size())) fail(Status::invalid_argument, "experts: no layer {}", layer);
  const Layer &l = layers_[static_cast<size_t>(layer)];
  backend::ExpertSlots s;
  s.slot = l.slots.data();
  s.n_experts = static_cast<int32_t>(l.slots.size());
  return s;
}

}  // namespace ep::model
