// The CUDA StoreDevice: pinned staging ring, cudaMalloc'd expert slots, a pinned host-RAM tier,
// a transfer stream for copies into slots (staging → slot, host tier → slot), a demotion stream
// for copies out of them (slot → host tier, so that PCIe carries both directions at once), and
// the events that order them:
//   ready[slot]        recorded on the transfer stream after the slot's copy; the compute
//                      stream waits on it before a kernel reads the slot;
//   last_use[slot]     recorded on the compute stream at release; the transfer and demotion
//                      streams wait on it before they overwrite or copy out the slot (a victim
//                      may still be read by queued kernels: the host does not wait for them);
//   demoted[slot]      recorded on the demotion stream after the slot's content went to the
//                      host tier; the slot's next copy waits on it;
//   host_ready[host]   recorded after a demotion into a host-tier slot; a promotion from it
//                      waits on it;
//   host_free[host]    recorded after a promotion out of a host-tier slot; the next demotion
//                      into it waits on it;
//   copied[staging]    recorded after a staging slot's copy; the slot is not read into again
//                      until it completed;
//   table_done[table]  recorded at release; the pointer table is not rewritten before.
#include "store/device.hpp"

#include "core/error.hpp"
#include "gpu/check.hpp"

#include <cuda_runtime.h>

#include <cstring>
#include <vector>

namespace ep::store {
namespace {

class CudaStoreDevice final : public StoreDevice {
 public:
  CudaStoreDevice(int device, void *compute_stream) : device_(device) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
      cudaGetLastError();
      fail(Status::no_device, "ExpertStore: no CUDA device");
    }
    if (device < 0 || device >= count)
      fail(Status::no_device, "ExpertStore: CUDA device {} does not exist ({} devices)", device, count);
    EP_CUDA_CHECK(cudaSetDevice(device_));
    EP_CUDA_CHECK(cudaStreamCreateWithFlags(&transfer_, cudaStreamNonBlocking));
    EP_CUDA_CHECK(cudaStreamCreateWithFlags(&demote_, cudaStreamNonBlocking));
    if (compute_stream) {
      compute_ = static_cast<cudaStream_t>(compute_stream);
    } else {
      EP_CUDA_CHECK(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
      own_compute_ = true;
    }
  }

  ~CudaStoreDevice() override {
    cudaSetDevice(device_);
    if (transfer_) cudaStreamSynchronize(transfer_);
    if (demote_) cudaStreamSynchronize(demote_);
    if (compute_) cudaStreamSynchronize(compute_);
    for (auto *list : {&ready_, &last_use_, &demoted_, &copied_, &table_done_, &host_ready_, &host_free_})
      for (cudaEvent_t e : *list) cudaEventDestroy(e);
    if (staging_raw_) cudaFreeHost(staging_raw_);
    if (host_) cudaFreeHost(host_);
    if (host_tables_) cudaFreeHost(host_tables_);
    if (slots_) cudaFree(slots_);
    if (device_tables_) cudaFree(device_tables_);
    if (own_compute_ && compute_) cudaStreamDestroy(compute_);
    if (transfer_) cudaStreamDestroy(transfer_);
    if (demote_) cudaStreamDestroy(demote_);
  }

  std::string_view name() const override { return "cuda"; }

  uint64_t free_bytes() const override {
    size_t free = 0, total = 0;
    EP_CUDA_CHECK(cudaSetDevice(device_));
    EP_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    return free;
  }

  void allocate(const DeviceShape &shape) override {
    shape_ = shape;
    EP_CUDA_CHECK(cudaSetDevice(device_));
    void *p = nullptr;
    // Small pinned allocations come from a pool and need not be page-aligned: allocate one page
    // more and align (O_DIRECT reads need 4096-aligned buffers).
    EP_CUDA_CHECK(cudaHostAlloc(&p, shape.staging_slots * shape.staging_slot_bytes + kStagingAlign, cudaHostAllocPortable));
    staging_raw_ = p;
    staging_ = static_cast<std::byte *>(p) + (kStagingAlign - reinterpret_cast<uintptr_t>(p) % kStagingAlign) % kStagingAlign;
    EP_CUDA_CHECK(cudaMalloc(&p, shape.num_slots * shape.slot_bytes));
    slots_ = static_cast<std::byte *>(p);
    const size_t table_bytes = static_cast<size_t>(shape.tables) * shape.table_entries * sizeof(void *);
    EP_CUDA_CHECK(cudaHostAlloc(&p, table_bytes, cudaHostAllocPortable));
    host_tables_ = static_cast<const void **>(p);
    EP_CUDA_CHECK(cudaMalloc(&p, table_bytes));
    device_tables_ = static_cast<const void **>(p);
    auto make = [](std::vector<cudaEvent_t> &list, uint32_t n) {
      list.resize(n, nullptr);
      for (auto &e : list) EP_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    };
    make(ready_, shape.num_slots);
    make(last_use_, shape.num_slots);
    make(demoted_, shape.num_slots);
    make(copied_, shape.staging_slots);
    make(table_done_, shape.tables);
    if (shape.host_slots) {
      // One pinned allocation (page-aligned for a large size): the DMA engine reads and writes it
      // directly, so demotions and promotions run at PCIe speed without a bounce buffer.
      const uint64_t bytes = static_cast<uint64_t>(shape.host_slots) * shape.slot_bytes;
      const cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
      if (e != cudaSuccess) {
        cudaGetLastError();
        fail(Status::budget, "ExpertStore: cannot pin the host tier: cudaHostAlloc of {} bytes ({} experts of {} B) failed: {}",
             bytes, shape.host_slots, shape.slot_bytes, cudaGetErrorString(e));
      }
      host_ = static_cast<std::byte *>(p);
      make(host_ready_, shape.host_slots);
      make(host_free_, shape.host_slots);
    }
  }

  std::byte *staging_base() override { return staging_; }
  std::byte *slot_ptr(uint32_t slot) override { return slots_ + static_cast<uint64_t>(slot) * shape_.slot_bytes; }

  void copy_to_slot(uint32_t slot, uint32_t staging, std::span<const CopySegment> segments) override {
    // The slot's previous content may still be read by kernels queued on the compute stream, or
    // be on its way to the host tier.
    EP_CUDA_CHECK(cudaStreamWaitEvent(transfer_, last_use_[slot], 0));
    EP_CUDA_CHECK(cudaStreamWaitEvent(transfer_, demoted_[slot], 0));
    const std::byte *src = staging_ + static_cast<uint64_t>(staging) * shape_.staging_slot_bytes;
    for (const CopySegment &c : segments)
      EP_CUDA_CHECK(cudaMemcpyAsync(slot_ptr(slot) + c.dst_offset, src + c.src_offset, c.bytes, cudaMemcpyHostToDevice, transfer_));
    EP_CUDA_CHECK(cudaEventRecord(ready_[slot], transfer_));
    EP_CUDA_CHECK(cudaEventRecord(copied_[staging], transfer_));
  }

  bool orders_copies_after_last_use() const override { return true; }

  std::byte *host_slot_ptr(uint32_t host) override { return host_ + static_cast<uint64_t>(host) * shape_.slot_bytes; }

  void demote(uint32_t slot, uint32_t host, uint64_t bytes) override {
    EP_CUDA_CHECK(cudaStreamWaitEvent(demote_, ready_[slot], 0));
    EP_CUDA_CHECK(cudaStreamWaitEvent(demote_, last_use_[slot], 0));
    EP_CUDA_CHECK(cudaStreamWaitEvent(demote_, host_free_[host], 0));
    EP_CUDA_CHECK(cudaMemcpyAsync(host_slot_ptr(host), slot_ptr(slot), bytes, cudaMemcpyDeviceToHost, demote_));
    EP_CUDA_CHECK(cudaEventRecord(demoted_[slot], demote_));
    EP_CUDA_CHECK(cudaEventRecord(host_ready_[host], demote_));
  }

  void promote(uint32_t host, uint32_t slot, uint64_t bytes) override {
    EP_CUDA_CHECK(cudaStreamWaitEvent(transfer_, last_use_[slot], 0));
    EP_CUDA_CHECK(cudaStreamWaitEvent(transfer_, demoted_[slot], 0));
    EP_CUDA_CHECK(cudaStreamWaitEvent(transfer_, host_ready_[host], 0));
    EP_CUDA_CHECK(cudaMemcpyAsync(slot_ptr(slot), host_slot_ptr(host), bytes, cudaMemcpyHostToDevice, transfer_));
    EP_CUDA_CHECK(cudaEventRecord(ready_[slot], transfer_));
    EP_CUDA_CHECK(cudaEventRecord(host_free_[host], transfer_));
  }

  void read_host_slot(uint32_t host, void *dst, uint64_t bytes) override {
    EP_CUDA_CHECK(cudaStreamSynchronize(demote_));
    std::memcpy(dst, host_slot_ptr(host), bytes);
  }

  void wait_staging(uint32_t staging) override { EP_CUDA_CHECK(cudaEventSynchronize(copied_[staging])); }
  void compute_wait_ready(uint32_t slot) override { EP_CUDA_CHECK(cudaStreamWaitEvent(compute_, ready_[slot], 0)); }
  void record_last_use(uint32_t slot) override { EP_CUDA_CHECK(cudaEventRecord(last_use_[slot], compute_)); }

  bool last_use_done(uint32_t slot) override {
    const cudaError_t e = cudaEventQuery(last_use_[slot]);
    if (e == cudaSuccess) return true;
    if (e == cudaErrorNotReady) {
      cudaGetLastError();
      return false;
    }
    gpu::throw_error(e, "cudaEventQuery(last_use)");
  }

  const void *const *publish_table(uint32_t table, const void *const *pointers, uint32_t count, uint32_t first) override {
    if (table >= shape_.tables || first > shape_.table_entries || count > shape_.table_entries - first)
      fail(Status::internal, "CUDA store device: table {} with {} words at word {} (it holds {})", table, count, first,
           shape_.table_entries);
    const void **host = host_tables_ + static_cast<size_t>(table) * shape_.table_entries + first;
    const void **dev = device_tables_ + static_cast<size_t>(table) * shape_.table_entries + first;
    std::memcpy(host, pointers, count * sizeof(void *));
    EP_CUDA_CHECK(cudaMemcpyAsync(dev, host, count * sizeof(void *), cudaMemcpyHostToDevice, compute_));
    return dev;
  }

  void record_table_done(uint32_t table) override { EP_CUDA_CHECK(cudaEventRecord(table_done_[table], compute_)); }
  void wait_table(uint32_t table) override { EP_CUDA_CHECK(cudaEventSynchronize(table_done_[table])); }

  void read_slot(uint32_t slot, void *dst, uint64_t bytes) override {
    EP_CUDA_CHECK(cudaStreamSynchronize(transfer_));
    EP_CUDA_CHECK(cudaMemcpy(dst, slot_ptr(slot), bytes, cudaMemcpyDeviceToHost));
  }

  void synchronize() override {
    EP_CUDA_CHECK(cudaStreamSynchronize(demote_));
    EP_CUDA_CHECK(cudaStreamSynchronize(transfer_));
    EP_CUDA_CHECK(cudaStreamSynchronize(compute_));
  }

  cudaStream_t compute() const { return compute_; }

 private:
  int device_;
  DeviceShape shape_;
  cudaStream_t transfer_ = nullptr, demote_ = nullptr, compute_ = nullptr;
  bool own_compute_ = false;
  static constexpr uintptr_t kStagingAlign = 4096;
  void *staging_raw_ = nullptr;  // what cudaHostAlloc returned; staging_ is it rounded up to 4096
  std::byte *staging_ = nullptr, *slots_ = nullptr, *host_ = nullptr;
  const void **host_tables_ = nullptr, **device_tables_ = nullptr;
  std::vector<cudaEvent_t> ready_, last_use_, demoted_, copied_, table_done_, host_ready_, host_free_;
};

}  // namespace

std::unique_ptr<StoreDevice> make_cuda_device(int device_index, void *compute_stream) {
  return std::make_unique<CudaStoreDevice>(device_index, compute_stream);
}

void *cuda_compute_stream(StoreDevice &device) {
  auto *cuda = dynamic_cast<CudaStoreDevice *>(&device);
  if (!cuda) fail(Status::invalid_argument, "cuda_compute_stream: the store's device is '{}', not CUDA", device.name());
  return cuda->compute();
}

}  // namespace ep::store
