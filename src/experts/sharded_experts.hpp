// The routed experts of a model opened on several devices of one kind (docs/multi-device.md).
// Each (layer, expert) is owned by one device (expert_owner: a layer's experts spread evenly over
// the devices, the spread rotated from layer to layer), and served by that device's provider:
// its own expert cache (a PackedExperts on that device) or its share of the resident experts. The
// runner (runner.hpp) sends each MoE layer's tokens to the devices that own its picks, each device
// computes its experts' rows, and the rows come back to the first device, where each token sums
// them in pick order: the bits of one device.
//
// One device is the same object with one shard: every call goes to that shard's provider as it
// is, and the runner runs its single-device strategies (no exchange, no extra copy or wait).
#pragma once

#include "backend/backend.hpp"
#include "backend/device_buffer.hpp"
#include "experts/provider.hpp"

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace ep::experts {

class ResidentExperts;

/// The device (0 .. @p n_devices − 1) that owns expert @p expert of provider layer @p layer: a
/// round robin over the layer's experts, started at a hash of the layer, so that every device owns
/// ⌊E/N⌋ or ⌈E/N⌉ experts of every layer and expert 0 is not always the first device's.
int32_t expert_owner(int64_t layer, int64_t expert, int32_t n_devices);

/// Routed experts spread over the backends of several devices (see the file comment).
class ShardedExperts final : public ExpertProvider {
 public:
  /// One device's backend and the provider of the experts it owns (its layouts equal the others').
  struct Shard {
    backend::Backend *backend = nullptr;
    std::unique_ptr<ExpertProvider> experts;
  };
  /// @p shards: at least one; shard 0's backend is the model's (the dense weights, the attention
  /// and the sums). Status::invalid_argument otherwise.
  explicit ShardedExperts(std::vector<Shard> shards);
  ~ShardedExperts() override;

  int32_t n_devices() const { return static_cast<int32_t>(shards_.size()); }
  backend::Backend &backend(int32_t device) const { return *shards_[static_cast<size_t>(device)].backend; }
  ExpertProvider &shard(int32_t device) const { return *shards_[static_cast<size_t>(device)].experts; }
  /// expert_owner(@p layer, @p expert, n_devices()).
  int32_t owner(int64_t layer, int64_t expert) const { return expert_owner(layer, expert, n_devices()); }
  /// Backend memory of device @p device for the exchange, one growing buffer per @p use (0: the
  /// tokens' activations, 1: their picks, 2: the rows of the picks the device computes), valid
  /// until the next call with the same device and use.
  void *exchange_buffer(int32_t device, unsigned use, uint64_t bytes);

  ShardedExperts *sharded() override { return this; }
  const backend::SlotLayout &layout(int64_t layer) const override { return shard(0).layout(layer); }
  /// Several devices: true (the host decides which device computes each pick).
  bool needs_host_ids() const override;
  /// One device: that device's provider's; several: Status::internal (the runner acquires per
  /// device, from shard()).
  backend::ExpertBatch acquire(int64_t layer, const backend::Tensor &ids, const int32_t *host_ids,
                               std::span<const int32_t> only) override;
  void release(int64_t layer) override;
  int64_t max_unique() const override;
  bool stages_reads() const override;
  backend::ExpertBatch acquire_staged(int64_t layer, const backend::Tensor &ids, const int32_t *host_ids) override;
  bool next_staged(int64_t layer, backend::ExpertBatch &batch) override;
  bool wants_hints() const override;
  /// Each id goes to its owner's provider.
  void hint(int64_t layer, std::span<const int32_t> ids) override;

 private:
  void one_device(const char *what) const;
  std::vector<Shard> shards_;
  std::vector<backend::DeviceBuffer> exchange_;  // [device][use]
  std::vector<int32_t> hint_ids_;
};

/// Reads a model's resident experts onto one or several devices: each expert read once from the
/// source, into the memory of the device that owns it (expert_owner).
class ResidentShards {
 public:
  /// @p model: the model's backend; @p devices: every device's backend, the model's first (empty:
  /// the model's alone). Status::invalid_argument when the first is not the model's.
  ResidentShards(backend::Backend &model, const std::vector<backend::Backend *> &devices);
  ~ResidentShards();
  /// ResidentExperts::add_layer on every device, each keeping the experts it owns.
  void add_layer(const StackedRole &gate, const StackedRole &up, const StackedRole &down);
  /// Bytes of every expert read so far, on all devices.
  uint64_t bytes() const;
  /// The provider of the experts read (the object is empty afterwards).
  std::unique_ptr<ShardedExperts> finish();

 private:
  std::vector<backend::Backend *> devices_;
  std::vector<std::unique_ptr<ResidentExperts>> shards_;
};

}  // namespace ep::experts
