// Where the routed experts come from. The model asks for the experts a step selected and gets
// the ExpertSlots table the backend's moe() op reads, then releases them after the op.
//  - PackedExperts: served by the ExpertStore (src/store) from an Expert Pack, through a
//    bounded slot cache (host-memory device on the CPU backend).
//  - ResidentExperts: every expert's bytes read from the source file (GGUF or safetensors)
//    into backend memory once, at load (the reference path; no pack needed).
#pragma once

#include "backend/backend.hpp"

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

namespace ep::io {
class IoSeam;
}  // namespace ep::io

namespace ep::store {
class ExpertStore;
class PackObjectMap;
struct StoreStats;
}  // namespace ep::store

namespace ep::model {

struct CatalogEntry;

/// Backend memory owned by RAII.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(backend::Backend &be, uint64_t bytes) : be_(&be), ptr_(bytes ? be.allocate(bytes) : nullptr), bytes_(bytes) {}
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer &&o) noexcept : be_(o.be_), ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; }
  DeviceBuffer &operator=(DeviceBuffer &&o) noexcept {
    if (this != &o) {
      reset();
      be_ = o.be_; ptr_ = o.ptr_; bytes_ = o.bytes_;
      o.ptr_ = nullptr;
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer &) = delete;
  DeviceBuffer &operator=(const DeviceBuffer &) = delete;
  void *get() const { return ptr_; }
  uint64_t bytes() const { return bytes_; }

 private:
  void reset() noexcept {
    if (ptr_ && be_) be_->deallocate(ptr_);
    ptr_ = nullptr;
  }
  backend::Backend *be_ = nullptr;
  void *ptr_ = nullptr;
  uint64_t bytes_ = 0;
};

/// Supplies routed-expert slots per layer.
class ExpertProvider {
 public:
  virtual ~ExpertProvider() = default;
  /// Where gate / up / down sit inside each expert object of layer @p layer.
  virtual const backend::SlotLayout &layout(int64_t layer) const = 0;
  /// Makes experts ids[0..n) of layer @p layer resident (ids may repeat) and returns the slot
  /// table, valid until release(). At most max_unique() distinct ids per call.
  virtual backend::ExpertSlots acquire(int64_t layer, const int32_t *ids, int64_t n) = 0;
  /// Ends the last acquire() of @p layer (after the MoE op that read its slots).
  virtual void release(int64_t /*layer*/) {}
  /// The most distinct expert ids one acquire() may ask for (the model splits a step's tokens
  /// into chunks that stay within it).
  virtual int64_t max_unique() const { return std::numeric_limits<int64_t>::max(); }
};

/// Every expert of every layer resident in backend memory (read from the source at load).
class ResidentExperts final : public ExpertProvider {
 public:
  explicit ResidentExperts(backend::Backend &be) : be_(be) {}
  /// Adds layer @p layer (layers must be added in order) from the stacked gate/up/down tensors
  /// (ggml {D, F, E}, {D, F, E}, {F, D, E}): each expert becomes one object gate|up|down.
  void add_layer(const CatalogEntry &gate, const CatalogEntry &up, const CatalogEntry &down);
  const backend::SlotLayout &layout(int64_t layer) const override;
  backend::ExpertSlots acquire(int64_t layer, const int32_t *ids, int64_t n) override;
  uint64_t bytes() const { return bytes_; }

 private:
  struct Layer {
    backend::SlotLayout layout;
    std::vector<DeviceBuffer> objects;
    std::vector<const void *> slots;
  };
  backend::Backend &be_;
  std::vector<Layer> layers_;
  uint64_t bytes_ = 0;
};

/// What the model expects of each layer's experts (from the source file's stacked tensors):
/// types and shapes of gate / up / down; offsets are not used.
struct ExpertShape {
  backend::SlotWeight gate, up, down;
};
/// The shape of a layer's experts from its stacked gate / up / down tensors; Status::unsupported
/// (naming the tensor) when a type is not one the backends multiply.
ExpertShape expert_shape_of(const CatalogEntry &gate, const CatalogEntry &up, const CatalogEntry &down);

struct PackedExpertsOptions {
  uint64_t cache_bytes = UINT64_MAX;  ///< slot budget (UINT64_MAX: every expert, at most half the physical memory)
  uint32_t staging_slots = 0;         ///< 0: the store's default
  uint32_t queue_depth = 0;           ///< 0: the reader's default
  uint32_t read_splits = 0;           ///< 0: the reader's default
  int direct_io = -1;                 ///< 1 O_DIRECT, 0 buffered, -1 automatic
  std::string policy = "decay";       ///< cache policy (store/expert_store.hpp)
  std::string stats_path;             ///< JSON stats written at close ("" = none)
  /// >= 0: the slots live in the memory of this CUDA device (store::make_cuda_device: pinned
  /// staging, VRAM slots, a transfer stream) and are ordered on @p cuda_stream, which must be
  /// the compute backend's stream; -1: host-memory slots (the CPU backend).
  int cuda_device = -1;
  void *cuda_stream = nullptr;  ///< a cudaStream_t (the CudaBackend's), with cuda_device >= 0
  /// CUDA: device memory left free for activations and workspaces when the budget is "all of it".
  uint64_t cuda_reserve_bytes = uint64_t{2} << 30;
  /// The model block of provider layer 0, which the pack's first_layer must equal: 0 for
  /// DeepSeek-V4; Kimi's leading dense blocks have no experts (CausalLm::first_expert_layer()).
  int64_t first_layer = 0;
  /// The I/O seam the store's reader passes every read through (src/io/seam.hpp): fault
  /// injection for tests (EIO, short, slow or wrong bytes); null: none.
  std::shared_ptr<io::IoSeam> seam;
};

/// Routed experts served by the ExpertStore from an Expert Pack: host-memory slots for the CPU
/// backend, VRAM slots (the store's CUDA device, on the backend's stream) for the CUDA backend. The pack's per-role entries (type, shape, offset inside the
/// object) become the backend's SlotLayout; they must match what the model's source says
/// (fail-closed, Status::shape / Status::format). A step's tokens are acquired in chunks of at
/// most max_unique() distinct experts, so a cache of only top_k slots still runs (evicting).
class PackedExperts final : public ExpertProvider {
 public:
  /// @p expected: one entry per MoE layer (provider layer l = pack layer l = model block
  /// options.first_layer + l); @p top_k: experts per token.
  PackedExperts(const std::string &pack_path, const std::vector<ExpertShape> &expected, int64_t top_k,
                const PackedExpertsOptions &options);
  ~PackedExperts() override;
  const backend::SlotLayout &layout(int64_t layer) const override;
  backend::ExpertSlots acquire(int64_t layer, const int32_t *ids, int64_t n) override;
  void release(int64_t layer) override;
  int64_t max_unique() const override { return max_unique_; }

  store::StoreStats stats() const;
  uint32_t num_slots() const;
  uint64_t slot_bytes() const;
  /// The smallest cache budget the store accepts for this pack and top_k (top_k slots).
  static uint64_t min_cache_bytes(const std::string &pack_path, int64_t top_k);

 private:
  struct Held;
  std::shared_ptr<store::PackObjectMap> pack_;
  std::unique_ptr<store::ExpertStore> store_;
  std::vector<backend::SlotLayout> layouts_;
  std::vector<const void *> table_;
  std::unique_ptr<Held> held_;
  int64_t max_unique_ = 1;
};

/// The routed-expert FFN of one MoE layer over @p n tokens: Backend::moe on experts from
/// @p experts' layer @p layer, the tokens in chunks whose distinct experts fit one acquire()
/// (the moe op is per token, so chunking does not change its result). When the step's experts
/// do not fit one acquire and the backend has moe_pairs(), expert-major instead: each expert
/// goes through the cache once per (large) chunk of tokens, with the same result bits. @p ids: the host copy of
/// the [n][k] expert ids (ids outside 0 .. n_experts − 1 are skipped); @p ids_dev, @p weights_dev:
/// the same ids and their weights in backend memory; x, y: [n][d] in backend memory.
void run_routed_experts(backend::Backend &be, ExpertProvider &experts, int64_t layer, int64_t n_experts,
                        const std::vector<int32_t> &ids, const int32_t *ids_dev, const float *weights_dev, int64_t k,
                        const float *x, float *y, int64_t d, int64_t n, const backend::Activation &act);

}  // namespace ep::model
