// Backend memory helpers for the models: a per-forward scratch arena of reusable DeviceBuffers,
// and StateBuffer, backend memory with value semantics (copying allocates on the same backend and
// copies the bytes there with Backend::copy: forking a decode state).
#pragma once

#include "backend/backend.hpp"
#include "backend/device_buffer.hpp"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace ep::model {

using backend::DeviceBuffer;
class WeightCatalog;

/// The part of a model's weight loader that both models share: copies weight bytes into
/// backend memory it keeps in @p bufs (adding their size to @p bytes), taking tensors from @p cat.
class WeightUploader {
 public:
  WeightUploader(WeightCatalog &cat, backend::Backend &be, std::vector<DeviceBuffer> &bufs, uint64_t &bytes)
      : cat_(cat), be_(be), bufs_(bufs), bytes_(bytes) {}
  /// @p n_bytes of @p data in backend memory, as a tensor of @p type and @p shape.
  backend::Tensor upload(const void *data, backend::GgmlType type, std::initializer_list<int64_t> shape, uint64_t n_bytes) {
    DeviceBuffer buf(be_, n_bytes);
    be_.upload(buf.get(), data, n_bytes);
    backend::Tensor t = backend::Tensor::make(buf.get(), type, be_.device(), shape);
    bufs_.push_back(std::move(buf));
    bytes_ += n_bytes;
    return t;
  }

 protected:
  WeightCatalog &cat_;
  backend::Backend &be_;
  std::vector<DeviceBuffer> &bufs_;
  uint64_t &bytes_;
};

/// Reusable activation buffers: get() hands out the smallest free buffer that fits (or a new
/// one); reset() marks them all free again. Buffers live until the arena is destroyed.
class BackendScratch {
 public:
  explicit BackendScratch(backend::Backend &be) : be_(be) {}
  void *get(uint64_t bytes) {
    bytes = std::max<uint64_t>(bytes, 16);
    size_t best = bufs_.size();
    for (size_t i = 0; i < bufs_.size(); ++i)
      if (!used_[i] && bufs_[i].bytes() >= bytes && (best == bufs_.size() || bufs_[i].bytes() < bufs_[best].bytes())) best = i;
    if (best == bufs_.size()) {
      bufs_.emplace_back(be_, (bytes + 255) / 256 * 256);
      used_.push_back(0);
    }
    used_[best] = 1;
    return bufs_[best].get();
  }
  float *f32(int64_t n) { return static_cast<float *>(get(static_cast<uint64_t>(n) * 4)); }
  int32_t *i32(int64_t n) { return static_cast<int32_t *>(get(static_cast<uint64_t>(n) * 4)); }
  int8_t *i8(int64_t n) { return static_cast<int8_t *>(get(static_cast<uint64_t>(n))); }
  void reset() { std::fill(used_.begin(), used_.end(), 0); }
  /// Which buffers are in use now; release() frees those taken after it.
  using Mark = std::vector<char>;
  Mark mark() const { return used_; }
  void release(const Mark &m) {
    for (size_t i = 0; i < used_.size(); ++i) used_[i] = i < m.size() ? m[i] : 0;
  }

 private:
  backend::Backend &be_;
  std::vector<DeviceBuffer> bufs_;
  std::vector<char> used_;
};

/// The rows a growing state buffer (Kimi's MLA keys and values, DeepSeek-V4's compressed
/// entries) is given room for when it must hold @p needed: at least 16, else @p needed rounded up
/// to an eighth of the power of two below it (at most 1/8 unused: Kimi-K3's MLA rows are 2.8 MiB
/// a token; growing copies the rows, about 8 times a state's bytes over its life). A function of
/// the row count alone, so that the bytes a state holds follow from its length
/// (CausalLm::state_bytes) whatever the sizes of the appends that grew it.
inline int64_t state_capacity(int64_t needed) {
  if (needed <= 16) return 16;
  int64_t step = 1;
  while (16 * step < needed) step *= 2;
  return (needed + step - 1) / step * step;
}

/// Backend memory that copies by value. A default-constructed one is empty (no backend).
class StateBuffer {
 public:
  StateBuffer() = default;
  /// @p bytes of zeros on @p be.
  StateBuffer(backend::Backend &be, uint64_t bytes) : be_(&be), buf_(be, bytes) {
    if (bytes) be.fill_zero(buf_.get(), bytes);
  }
  StateBuffer(const StateBuffer &o) : be_(o.be_) {
    if (o.be_ && o.bytes()) {
      buf_ = DeviceBuffer(*o.be_, o.bytes());
      copy_bytes(o.get(), buf_.get(), o.bytes());
    }
  }
  StateBuffer &operator=(const StateBuffer &o) {
    if (this != &o) *this = StateBuffer(o);
    return *this;
  }
  StateBuffer(StateBuffer &&) noexcept = default;
  StateBuffer &operator=(StateBuffer &&) noexcept = default;

  void *get() const { return buf_.get(); }
  float *f32() const { return static_cast<float *>(buf_.get()); }
  uint64_t bytes() const { return buf_.get() ? buf_.bytes() : 0; }
  /// The backend the memory lives on (null when empty).
  backend::Backend *owner() const { return be_; }

 private:
  void copy_bytes(const void *src, void *dst, uint64_t n) {
    const backend::Device dv = be_->device();
    be_->copy(backend::Tensor::make(src, backend::GgmlType::i8, dv, {static_cast<int64_t>(n)}),
              backend::Tensor::make(dst, backend::GgmlType::i8, dv, {static_cast<int64_t>(n)}));
  }

  backend::Backend *be_ = nullptr;
  DeviceBuffer buf_;
};

}  // namespace ep::model
