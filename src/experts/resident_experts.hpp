// ResidentExperts: every expert of every layer read from the model's source into backend memory
// once, at load (no store, no cache). Its batches are built on the device from the router's ids
// (Backend::gather_role_table: no host round trip) unless the backend's moe op reads host picks.
#pragma once

#include "experts/provider.hpp"

#include <cstdint>
#include <span>
#include <vector>

namespace ep::experts {

/// Every expert of every layer resident in backend memory (read from the source at load).
class ResidentExperts final : public ExpertProvider {
 public:
  /// Experts are allocated on @p be, which must outlive this.
  explicit ResidentExperts(backend::Backend &be) : be_(be) {}
  /// Only the experts that device @p device of @p n_devices owns (experts::expert_owner, for a
  /// model on several devices: sharded_experts.hpp); a batch never covers another's.
  ResidentExperts(backend::Backend &be, int32_t device, int32_t n_devices) : be_(be), device_(device), n_devices_(n_devices) {}
  /// Adds the next layer (layers must be added in order) from its stacked gate / up / down roles
  /// (ggml {D, F, E}, {D, F, E}, {F, D, E}): each expert this device owns becomes one object
  /// gate|up|down (the others are not read).
  /// Status::internal when a role cannot read single experts, Status::corrupt when a read
  /// returns another size than its type and shape give.
  void add_layer(const StackedRole &gate, const StackedRole &up, const StackedRole &down);
  const backend::SlotLayout &layout(int64_t layer) const override;
  bool needs_host_ids() const override { return false; }
  backend::ExpertBatch acquire(int64_t layer, const backend::Tensor &ids, const int32_t *host_ids,
                               std::span<const int32_t> only) override;
  void release(int64_t) override {}
  /// Bytes of every expert object added so far.
  uint64_t bytes() const { return bytes_; }

 private:
  struct Layer {
    backend::SlotLayout layout;
    std::vector<backend::DeviceBuffer> objects;
    FixedExperts fixed;  // the objects' addresses
  };
  const Layer &layer_at(int64_t layer) const;
  backend::Backend &be_;
  int32_t device_ = 0, n_devices_ = 1;
  std::vector<Layer> layers_;
  uint64_t bytes_ = 0;
  backend::DeviceBuffer role_table_;      // [3][pairs] in backend memory (reused layer after layer)
  std::vector<const void *> pair_slots_;  // host: per pair
};

}  // namespace ep::experts
