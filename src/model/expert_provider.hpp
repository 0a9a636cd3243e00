// Where the routed experts come from, and the one contract between the MoE layers and them.
// Per MoE layer the router writes expert ids on the backend; the provider resolves them to a
// backend::ExpertBatch — the table of slot addresses the backend's moe op reads — and releases
// it after the op:
//  - ResidentExperts (here): every expert's bytes read from the source (GGUF or safetensors)
//    into backend memory once, at load; its batches are built on the device from the router's
//    ids (no host round trip) unless the backend's moe op reads host picks.
//  - engine::PackedExperts: served by the ExpertStore (src/store) from an Expert Pack through a
//    bounded slot cache; the router's ids come to the host once, the store resolves them once.
#pragma once

#include "backend/backend.hpp"

#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <vector>

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

/// Supplies routed-expert batches per layer (see the file comment).
class ExpertProvider {
 public:
  virtual ~ExpertProvider() = default;
  /// Where gate / up / down sit inside each expert object of layer @p layer.
  virtual const backend::SlotLayout &layout(int64_t layer) const = 0;
  /// True when acquire() needs the picks on the host (a cache decides hits and misses there).
  virtual bool needs_host_ids() const = 0;
  /// Makes the experts of layer @p layer's picks resident and returns their batch, valid until
  /// release(). @p ids: i32 [k, T] in backend memory (the router's output); @p host_ids: the
  /// same k·T ids in host memory, or null when neither needs_host_ids() nor the backend's moe op
  /// asks for them. With @p only non-empty (distinct experts, host_ids given), the batch covers
  /// only the pairs whose expert is listed (an expert-major pass: Backend::moe_pairs); at most
  /// max_unique() distinct experts per call either way.
  virtual backend::ExpertBatch acquire(int64_t layer, const backend::Tensor &ids, const int32_t *host_ids,
                                       std::span<const int32_t> only) = 0;
  /// Ends the last acquire() of @p layer (after the ops that read its batch were queued).
  virtual void release(int64_t layer) = 0;
  /// The most distinct expert ids one acquire() may cover.
  virtual int64_t max_unique() const { return std::numeric_limits<int64_t>::max(); }

  /// True when acquire_staged() may return before every expert of the picks is resident (a cache
  /// whose misses are read from a disk): the MoE then computes the resident experts' rows while
  /// the others are read (finish_routed_experts()).
  virtual bool stages_reads() const { return false; }
  /// acquire() of every pick (host_ids given), returning once the misses' reads are submitted:
  /// the batch covers the pairs whose expert is resident (pair_slots null for the others; its
  /// role_table only when it covers every pair). next_staged() hands out the rest.
  virtual backend::ExpertBatch acquire_staged(int64_t layer, const backend::Tensor &ids, const int32_t *host_ids) {
    return acquire(layer, ids, host_ids, {});
  }
  /// Waits until more experts of the last acquire_staged() of @p layer are resident and sets
  /// @p batch to the pairs they cover (pair_slots null for every other pair); false once every
  /// pair was handed out. Throws the failed read's error (EP_ERR_IO, EP_ERR_CORRUPT) once the
  /// acquisition's reads all landed; release() must follow either way.
  virtual bool next_staged(int64_t layer, backend::ExpertBatch &batch) {
    (void)layer;
    (void)batch;
    return false;
  }
  /// True when the provider uses hint()s (prefetch): the model may then predict a later layer's
  /// picks (start_routed_experts()'s hint).
  virtual bool wants_hints() const { return false; }
  /// Experts of MoE layer @p layer a later acquire() will likely ask for (ids outside the range
  /// are ignored): the provider may start loading them. Never changes a result.
  virtual void hint(int64_t layer, std::span<const int32_t> ids) {
    (void)layer;
    (void)ids;
  }

  /// Backend memory for the per-pair rows of a staged MoE (f32 [d, pairs]), reused layer after
  /// layer (grown when a step needs more).
  float *staged_rows(backend::Backend &be, uint64_t bytes) {
    if (staged_rows_.bytes() < bytes) staged_rows_ = DeviceBuffer(be, bytes);
    return static_cast<float *>(staged_rows_.get());
  }

 private:
  DeviceBuffer staged_rows_;
};

/// Every expert of every layer resident in backend memory (read from the source at load).
class ResidentExperts final : public ExpertProvider {
 public:
  explicit ResidentExperts(backend::Backend &be) : be_(be) {}
  /// Adds layer @p layer (layers must be added in order) from the stacked gate/up/down tensors
  /// (ggml {D, F, E}, {D, F, E}, {F, D, E}): each expert becomes one object gate|up|down.
  void add_layer(const CatalogEntry &gate, const CatalogEntry &up, const CatalogEntry &down);
  const backend::SlotLayout &layout(int64_t layer) const override;
  bool needs_host_ids() const override { return false; }
  backend::ExpertBatch acquire(int64_t layer, const backend::Tensor &ids, const int32_t *host_ids,
                               std::span<const int32_t> only) override;
  void release(int64_t) override {}
  uint64_t bytes() const { return bytes_; }

 private:
  struct Layer {
    backend::SlotLayout layout;
    std::vector<DeviceBuffer> objects;
    std::vector<const void *> slots;  // host copy of the object addresses
    DeviceBuffer slots_dev;           // the same [E] addresses in backend memory
  };
  const Layer &layer_at(int64_t layer) const;
  backend::Backend &be_;
  std::vector<Layer> layers_;
  uint64_t bytes_ = 0;
  DeviceBuffer role_table_;              // [3][pairs] in backend memory (reused layer after layer)
  std::vector<const void *> pair_slots_; // host: per pair
};

/// What the model expects of each layer's experts (from the source file's stacked tensors):
/// types and shapes of gate / up / down; offsets are not used.
struct ExpertShape {
  backend::SlotWeight gate, up, down;
};
/// The shape of a layer's experts from its stacked gate / up / down tensors; Status::unsupported
/// (naming the tensor) when a type is not one the backends multiply.
ExpertShape expert_shape_of(const CatalogEntry &gate, const CatalogEntry &up, const CatalogEntry &down);

/// The routed-expert FFN of one MoE layer in two steps, so that the host can queue other work
/// (the shared experts) while the router's ids travel to the host:
/// start_routed_experts() begins the one device → host copy of the ids when the provider or the
/// backend needs them (returns at once); finish_routed_experts() waits for it, acquires the
/// batch(es), queues Backend::moe and releases. When the step's distinct experts exceed the
/// provider's max_unique(), the pass is expert-major (moe_pairs per group of experts, then
/// moe_combine: the same bits). A provider that stages_reads() gets the resident experts' rows
/// computed (moe_pairs) while its misses are read, each later expert's rows as it arrives, then
/// moe_combine: the same bits again. @p ids: i32 [k, T], @p weights: f32 [k, T], x, y: f32 [d, T],
/// all in backend memory.
/// @p hint_ids (i32 [k, T], optional): the model's prediction of MoE layer @p hint_layer's picks
/// (e.g. that layer's router on this layer's input; exact for hash-routed layers), copied with
/// the ids and given to the provider's hint() after this layer's acquire, when it wants_hints().
struct RoutedPicks {
  int64_t layer = 0;
  backend::Tensor ids;
  const int32_t *host_ids = nullptr;  ///< set by start_routed_experts() when copied
  int64_t hint_layer = -1;
  int64_t n_hint = 0;
  const int32_t *host_hint = nullptr;  ///< set by start_routed_experts() when a hint is copied
};
RoutedPicks start_routed_experts(backend::Backend &be, ExpertProvider &experts, int64_t layer, const backend::Tensor &ids,
                                 const backend::Tensor *hint_ids = nullptr, int64_t hint_layer = -1);
void finish_routed_experts(backend::Backend &be, ExpertProvider &experts, const RoutedPicks &picks,
                           const backend::Tensor &weights, const float *x, float *y, int64_t d,
                           const backend::Activation &act);

}  // namespace ep::model
