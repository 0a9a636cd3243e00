// The "device" side of the ExpertStore: memory for staging, slots and the host-RAM tier, the
// copies between them, and the events that order them. Two implementations: HostDevice (slots
// and tier in host memory, a CPU "device", so CI can test the whole acquire path without a GPU)
// and the CUDA one (store/cuda_device.cpp: pinned staging and host tier, cudaMalloc'd slots, a
// transfer stream for copies into slots, a demotion stream for copies out of them, per-slot
// `ready`, `last_use` and `demoted` events, per-staging-slot copy events, per-host-slot events).
//
// Called by the store under its mutex: implementations need not be thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

namespace ep::store {

struct DeviceShape {
  uint32_t num_slots = 0;
  uint64_t slot_bytes = 0;       ///< a multiple of 4096
  uint32_t staging_slots = 0;
  uint64_t staging_slot_bytes = 0;
  uint32_t tables = 0;           ///< pointer tables in the ring
  uint32_t table_entries = 0;    ///< pointer-sized words per table
  uint32_t host_slots = 0;       ///< slots of the host-RAM tier (slot_bytes each; 0 = no tier)
};

/// One piece of a copy from a staging slot into a slot: @p bytes from @p src_offset of the
/// staging slot to @p dst_offset of the slot.
struct CopySegment {
  uint64_t src_offset = 0;
  uint64_t dst_offset = 0;
  uint64_t bytes = 0;
};

class StoreDevice {
 public:
  virtual ~StoreDevice() = default;
  virtual std::string_view name() const = 0;
  /// Memory the expert cache may take (device free memory, or host memory for HostDevice).
  virtual uint64_t free_bytes() const = 0;
  /// Allocates everything; called once by the store before any other call below. Throws
  /// EP_ERR_BUDGET naming the size when the host tier cannot be allocated (pinned on CUDA).
  virtual void allocate(const DeviceShape &shape) = 0;
  /// Base of the staging ring (4096-aligned host memory; pinned on CUDA).
  virtual std::byte *staging_base() = 0;
  /// Address of slot @p slot (device memory on CUDA).
  virtual std::byte *slot_ptr(uint32_t slot) = 0;

  /// Copies @p segments (a pack object: one, from offset 0 to offset 0; an object read from its
  /// sources: one per extent, to its offset in the object) from staging slot @p staging to slot
  /// @p slot on the transfer stream, then records the slot's `ready` event and the staging
  /// slot's `copied` event. When orders_copies_after_last_use(), the copies start only after the
  /// slot's last `last_use` event completed.
  virtual void copy_to_slot(uint32_t slot, uint32_t staging, std::span<const CopySegment> segments) = 0;
  /// True when copy_to_slot(), promote() and demote() wait (on the device, not the host) for the
  /// slot's pending `last_use` event, so a slot still read by queued kernels may be chosen as a
  /// victim.
  virtual bool orders_copies_after_last_use() const = 0;
  /// Address of host-tier slot @p host (host memory; pinned on CUDA).
  virtual std::byte *host_slot_ptr(uint32_t host) = 0;
  /// A demotion: copies @p bytes of slot @p slot to host-tier slot @p host, after the slot's copy
  /// (`ready`) and its readers (`last_use`) and after the host slot's last promotion; the slot's
  /// next copy_to_slot() / promote() waits for it. Returns without waiting for the copy.
  virtual void demote(uint32_t slot, uint32_t host, uint64_t bytes) = 0;
  /// A promotion (a host-tier hit): copies @p bytes of host-tier slot @p host to slot @p slot on
  /// the transfer stream, after the slot's readers and demotion and the host slot's demotion,
  /// then records the slot's `ready` event. Returns without waiting for the copy.
  virtual void promote(uint32_t host, uint32_t slot, uint64_t bytes) = 0;
  /// Copies a host-tier slot's bytes to @p dst once its demotion is done (tests).
  virtual void read_host_slot(uint32_t host, void *dst, uint64_t bytes) = 0;
  /// Blocks the host until staging slot @p staging may be overwritten (its last copy is done).
  virtual void wait_staging(uint32_t staging) = 0;
  /// Makes the compute stream wait for slot @p slot's `ready` event.
  virtual void compute_wait_ready(uint32_t slot) = 0;
  /// Records slot @p slot's `last_use` event on the compute stream.
  virtual void record_last_use(uint32_t slot) = 0;
  /// True once the work before the last record_last_use(@p slot) finished.
  virtual bool last_use_done(uint32_t slot) = 0;

  /// Publishes @p count pointer-sized words at word @p first of table @p table on the compute
  /// stream (words before @p first are left as they are); returns the address of word @p first in
  /// device memory.
  virtual const void *const *publish_table(uint32_t table, const void *const *pointers, uint32_t count, uint32_t first) = 0;
  /// Records table @p table's `done` event on the compute stream (at release).
  virtual void record_table_done(uint32_t table) = 0;
  /// Blocks the host until table @p table may be rewritten.
  virtual void wait_table(uint32_t table) = 0;

  /// Copies a slot's bytes to host memory synchronously (tests, verification).
  virtual void read_slot(uint32_t slot, void *dst, uint64_t bytes) = 0;
  /// Waits for all work of the store's streams.
  virtual void synchronize() = 0;
};

/// Host memory "device". With hold_last_use, recorded last_use events stay pending until
/// complete_last_use() — so tests can check that in-flight slots are never evicted.
class HostDevice final : public StoreDevice {
 public:
  struct Options {
    uint64_t free_bytes = UINT64_MAX;
    bool hold_last_use = false;
  };
  explicit HostDevice(const Options &options);
  HostDevice();
  ~HostDevice() override;
  std::string_view name() const override { return "host"; }
  uint64_t free_bytes() const override { return options_.free_bytes; }
  void allocate(const DeviceShape &shape) override;
  std::byte *staging_base() override;
  std::byte *slot_ptr(uint32_t slot) override;
  void copy_to_slot(uint32_t slot, uint32_t staging, std::span<const CopySegment> segments) override;
  /// False: a host "device" has no streams (in hold_last_use mode its pending events stand for
  /// kernels still reading, which must never be overwritten).
  bool orders_copies_after_last_use() const override { return false; }
  std::byte *host_slot_ptr(uint32_t host) override;
  void demote(uint32_t slot, uint32_t host, uint64_t bytes) override;
  void promote(uint32_t host, uint32_t slot, uint64_t bytes) override;
  void read_host_slot(uint32_t host, void *dst, uint64_t bytes) override;
  void wait_staging(uint32_t) override {}
  void compute_wait_ready(uint32_t) override {}
  void record_last_use(uint32_t slot) override;
  bool last_use_done(uint32_t slot) override;
  const void *const *publish_table(uint32_t table, const void *const *pointers, uint32_t count, uint32_t first) override;
  void record_table_done(uint32_t) override {}
  void wait_table(uint32_t) override {}
  void read_slot(uint32_t slot, void *dst, uint64_t bytes) override;
  void synchronize() override {}

  /// Completes every pending last_use event (hold_last_use mode).
  void complete_last_use();

 private:
  struct Impl;
  Options options_;
  std::unique_ptr<Impl> impl_;
};

/// The CUDA implementation (null-safe to call in builds without CUDA: throws EP_ERR_NO_DEVICE).
/// @p compute_stream is a cudaStream_t the store orders its consumers on (nullptr: the store
/// creates one, see cuda_compute_stream()).
std::unique_ptr<StoreDevice> make_cuda_device(int device_index, void *compute_stream);
/// The compute stream of a device made by make_cuda_device (a cudaStream_t).
void *cuda_compute_stream(StoreDevice &device);

}  // namespace ep::store
