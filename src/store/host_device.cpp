#include "store/device.hpp"

#include "core/error.hpp"
#include "io/file.hpp"

#include <cstring>
#include <new>
#include <vector>

namespace ep::store {

struct HostDevice::Impl {
  DeviceShape shape;
  io::AlignedBuffer staging, slots, host;
  std::vector<const void *> tables;
  std::vector<char> last_use_pending;
};

HostDevice::HostDevice() : HostDevice(Options{}) {}
HostDevice::HostDevice(const Options &options) : options_(options), impl_(std::make_unique<Impl>()) {}
HostDevice::~HostDevice() = default;

void HostDevice::allocate(const DeviceShape &shape) {
  impl_->shape = shape;
  impl_->staging = io::AlignedBuffer(shape.staging_slots * shape.staging_slot_bytes);
  impl_->slots = io::AlignedBuffer(shape.num_slots * shape.slot_bytes);
  impl_->tables.assign(static_cast<std::size_t>(shape.tables) * shape.table_entries, nullptr);
  impl_->last_use_pending.assign(shape.num_slots, 0);
  if (shape.host_slots) {
    const uint64_t bytes = static_cast<uint64_t>(shape.host_slots) * shape.slot_bytes;
    try {
      impl_->host = io::AlignedBuffer(static_cast<std::size_t>(bytes));
    } catch (const std::bad_alloc &) {
      fail(Status::budget, "host device: cannot allocate the host tier: {} bytes ({} experts of {} B)", bytes,
           shape.host_slots, shape.slot_bytes);
    }
  }
}

std::byte *HostDevice::host_slot_ptr(uint32_t host) {
  if (host >= impl_->shape.host_slots)
    fail(Status::internal, "host device: host-tier slot {} of {}", host, impl_->shape.host_slots);
  return impl_->host.data() + static_cast<uint64_t>(host) * impl_->shape.slot_bytes;
}

void HostDevice::demote(uint32_t slot, uint32_t host, uint64_t bytes) {
  if (bytes > impl_->shape.slot_bytes) fail(Status::internal, "host device: demotion of {} bytes", bytes);
  std::memcpy(host_slot_ptr(host), slot_ptr(slot), bytes);
}

void HostDevice::promote(uint32_t host, uint32_t slot, uint64_t bytes) {
  if (bytes > impl_->shape.slot_bytes) fail(Status::internal, "host device: promotion of {} bytes", bytes);
  std::memcpy(slot_ptr(slot), host_slot_ptr(host), bytes);
}

void HostDevice::read_host_slot(uint32_t host, void *dst, uint64_t bytes) { std::memcpy(dst, host_slot_ptr(host), bytes); }

std::byte *HostDevice::staging_base() { return impl_->staging.data(); }

std::byte *HostDevice::slot_ptr(uint32_t slot) {
  if (slot >= impl_->shape.num_slots) fail(Status::internal, "host device: slot {} of {}", slot, impl_->shape.num_slots);
  return impl_->slots.data() + static_cast<uint64_t>(slot) * impl_->shape.slot_bytes;
}

void HostDevice::copy_to_slot(uint32_t slot, uint32_t staging, std::span<const CopySegment> segments) {
  if (staging >= impl_->shape.staging_slots)
    fail(Status::internal, "host device: copy from staging {} of {} into slot {}", staging, impl_->shape.staging_slots, slot);
  const std::byte *src = impl_->staging.data() + static_cast<uint64_t>(staging) * impl_->shape.staging_slot_bytes;
  std::byte *dst = slot_ptr(slot);
  for (const CopySegment &c : segments) {
    if (c.src_offset > impl_->shape.staging_slot_bytes || c.bytes > impl_->shape.staging_slot_bytes - c.src_offset ||
        c.dst_offset > impl_->shape.slot_bytes || c.bytes > impl_->shape.slot_bytes - c.dst_offset)
      fail(Status::internal, "host device: copy of {} bytes from offset {} of staging {} to offset {} of slot {}", c.bytes,
           c.src_offset, staging, c.dst_offset, slot);
    std::memcpy(dst + c.dst_offset, src + c.src_offset, c.bytes);
  }
}

void HostDevice::record_last_use(uint32_t slot) {
  if (options_.hold_last_use) impl_->last_use_pending.at(slot) = 1;
}

bool HostDevice::last_use_done(uint32_t slot) { return !impl_->last_use_pending.at(slot); }

void HostDevice::complete_last_use() { std::fill(impl_->last_use_pending.begin(), impl_->last_use_pending.end(), 0); }

const void *const *HostDevice::publish_table(uint32_t table, const void *const *pointers, uint32_t count, uint32_t first) {
  if (table >= impl_->shape.tables || first > impl_->shape.table_entries || count > impl_->shape.table_entries - first)
    fail(Status::internal, "host device: table {} with {} words at word {} (it holds {})", table, count, first,
         impl_->shape.table_entries);
  const void **dst = impl_->tables.data() + static_cast<std::size_t>(table) * impl_->shape.table_entries + first;
  std::memcpy(dst, pointers, count * sizeof(void *));
  return dst;
}

void HostDevice::read_slot(uint32_t slot, void *dst, uint64_t bytes) { std::memcpy(dst, slot_ptr(slot), bytes); }

#ifndef EP_HAVE_CUDA
std::unique_ptr<StoreDevice> make_cuda_device(int, void *) {
  fail(Status::no_device, "ExpertStore: this build has no CUDA backend (EP_WITH_CUDA=OFF): use the host device");
}
void *cuda_compute_stream(StoreDevice &) {
  fail(Status::no_device, "ExpertStore: this build has no CUDA backend (EP_WITH_CUDA=OFF)");
}
#endif

}  // namespace ep::store
