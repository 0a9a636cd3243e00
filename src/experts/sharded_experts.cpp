#include "experts/sharded_experts.hpp"

#include "core/error.hpp"
#include "experts/resident_experts.hpp"

#include <algorithm>

namespace ep::experts {

namespace {

constexpr unsigned kExchangeUses = 3;

uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

int32_t expert_owner(int64_t layer, int64_t expert, int32_t n_devices) {
  if (n_devices <= 1) return 0;
  const uint64_t start = splitmix64(static_cast<uint64_t>(layer)) % static_cast<uint64_t>(n_devices);
  return static_cast<int32_t>((static_cast<uint64_t>(expert) + start) % static_cast<uint64_t>(n_devices));
}

ShardedExperts::ShardedExperts(std::vector<Shard> shards) : shards_(std::move(shards)) {
  if (shards_.empty()) fail(Status::invalid_argument, "experts: a model on no device");
  for (size_t d = 0; d < shards_.size(); ++d) {
    if (!shards_[d].backend || !shards_[d].experts) fail(Status::invalid_argument, "experts: device {} has no backend or experts", d);
    if (shards_[d].backend->device() != shards_[0].backend->device())
      fail(Status::invalid_argument, "experts: device {} is {}, device 0 {} (the devices of a model are of one kind)", d,
           backend::device_name(shards_[d].backend->device()), backend::device_name(shards_[0].backend->device()));
  }
  exchange_.resize(shards_.size() * kExchangeUses);
}

ShardedExperts::~ShardedExperts() {
  // Each device's buffers and provider are freed with that device current.
  for (size_t d = shards_.size(); d-- > 1;) {
    shards_[d].backend->make_current();
    for (unsigned u = 0; u < kExchangeUses; ++u) exchange_[d * kExchangeUses + u] = backend::DeviceBuffer();
    shards_[d].experts.reset();
  }
  if (!shards_.empty()) shards_[0].backend->make_current();
}

void *ShardedExperts::exchange_buffer(int32_t device, unsigned use, uint64_t bytes) {
  if (device < 0 || device >= n_devices() || use >= kExchangeUses)
    fail(Status::internal, "experts: exchange buffer {} of device {}", use, device);
  backend::DeviceBuffer &b = exchange_[static_cast<size_t>(device) * kExchangeUses + use];
  if (b.bytes() < bytes) {
    b = backend::DeviceBuffer();
    b = backend::DeviceBuffer(backend(device), bytes);
  }
  return b.get();
}

void ShardedExperts::one_device(const char *what) const {
  if (n_devices() > 1)
    fail(Status::internal, "experts: {} of experts spread over {} devices (the runner acquires from each device's shard)",
         what, n_devices());
}

bool ShardedExperts::needs_host_ids() const { return n_devices() > 1 || shard(0).needs_host_ids(); }

backend::ExpertBatch ShardedExperts::acquire(int64_t layer, const backend::Tensor &ids, const int32_t *host_ids,
                                             std::span<const int32_t> only) {
  one_device("acquire");
  return shard(0).acquire(layer, ids, host_ids, only);
}

void ShardedExperts::release(int64_t layer) {
  one_device("release");
  shard(0).release(layer);
}

int64_t ShardedExperts::max_unique() const {
  int64_t m = shard(0).max_unique();
  for (int32_t d = 1; d < n_devices(); ++d) m = std::min(m, shard(d).max_unique());
  return m;
}

bool ShardedExperts::stages_reads() const { return n_devices() == 1 && shard(0).stages_reads(); }

backend::ExpertBatch ShardedExperts::acquire_staged(int64_t layer, const backend::Tensor &ids, const int32_t *host_ids) {
  one_device("acquire_staged");
  return shard(0).acquire_staged(layer, ids, host_ids);
}

bool ShardedExperts::next_staged(int64_t layer, backend::ExpertBatch &batch) {
  one_device("next_staged");
  return shard(0).next_staged(layer, batch);
}

bool ShardedExperts::wants_hints() const {
  bool any = false;
  for (int32_t d = 0; d < n_devices(); ++d) any = any || shard(d).wants_hints();
  return any;
}

void ShardedExperts::hint(int64_t layer, std::span<const int32_t> ids) {
  if (n_devices() == 1) {
    shard(0).hint(layer, ids);
    return;
  }
  for (int32_t d = n_devices(); d-- > 0;) {
    hint_ids_.clear();
    for (int32_t e : ids)
      if (e >= 0 && owner(layer, e) == d) hint_ids_.push_back(e);
    if (hint_ids_.empty()) continue;
    backend(d).make_current();
    shard(d).hint(layer, hint_ids_);
  }
  backend(0).make_current();
}

ResidentShards::ResidentShards(backend::Backend &model, const std::vector<backend::Backend *> &devices)
    : devices_(devices) {
  if (devices_.empty()) devices_.push_back(&model);
  if (devices_.front() != &model)
    fail(Status::invalid_argument, "experts: the resident experts' first device is not the model's backend");
  const auto n = static_cast<int32_t>(devices_.size());
  for (int32_t d = 0; d < n; ++d) shards_.push_back(std::make_unique<ResidentExperts>(*devices_[static_cast<size_t>(d)], d, n));
}

ResidentShards::~ResidentShards() = default;

void ResidentShards::add_layer(const StackedRole &gate, const StackedRole &up, const StackedRole &down) {
  for (size_t d = shards_.size(); d-- > 0;) {
    devices_[d]->make_current();
    shards_[d]->add_layer(gate, up, down);
  }
}

uint64_t ResidentShards::bytes() const {
  uint64_t b = 0;
  for (const auto &s : shards_) b += s->bytes();
  return b;
}

std::unique_ptr<ShardedExperts> ResidentShards::finish() {
  std::vector<ShardedExperts::Shard> shards;
  for (size_t d = 0; d < shards_.size(); ++d) shards.push_back({devices_[d], std::move(shards_[d])});
  shards_.clear();
  return std::make_unique<ShardedExperts>(std::move(shards));
}

}  // namespace ep::experts
