// Where the routed experts come from. The model asks for the experts a step selected and gets
// the ExpertSlots table the backend's moe() op reads; the ExpertStore (src/store) will provide
// this from the Expert Pack. For now ResidentExperts reads every expert's bytes from the source
// file (GGUF or safetensors) into backend memory once, at load.
#pragma once

#include "backend/backend.hpp"

#include <cstdint>
#include <memory>
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

/// Supplies routed-expert slots per layer.
class ExpertProvider {
 public:
  virtual ~ExpertProvider() = default;
  /// Where gate / up / down sit inside each expert object of layer @p layer.
  virtual const backend::ExpertLayout &layout(int64_t layer) const = 0;
  /// Makes experts ids[0..n) of layer @p layer resident and returns the slot table (valid until
  /// the next acquire()).
  virtual backend::ExpertSlots acquire(int64_t layer, const int32_t *ids, int64_t n) = 0;
};

/// Every expert of every layer resident in backend memory (read from the source at load).
class ResidentExperts final : public ExpertProvider {
 public:
  explicit ResidentExperts(backend::Backend &be) : be_(be) {}
  /// Adds layer @p layer (layers must be added in order) from the stacked gate/up/down tensors
  /// (ggml {D, F, E}, {D, F, E}, {F, D, E}): each expert becomes one object gate|up|down.
  void add_layer(const CatalogEntry &gate, const CatalogEntry &up, const CatalogEntry &down);
  const backend::ExpertLayout &layout(int64_t layer) const override;
  backend::ExpertSlots acquire(int64_t layer, const int32_t *ids, int64_t n) override;
  uint64_t bytes() const { return bytes_; }

 private:
  struct Layer {
    backend::ExpertLayout layout;
    std::vector<DeviceBuffer> objects;
    std::vector<const void *> slots;
  };
  backend::Backend &be_;
  std::vector<Layer> layers_;
  uint64_t bytes_ = 0;
};

}  // namespace ep::model
