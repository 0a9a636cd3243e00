// A tensor as the compute ops see it: a data pointer on one device, a ggml type, a shape in
// ggml order (ne[0] is the contiguous dimension) and byte strides. Non-owning.
#pragma once

#include "format/ggml_type.hpp"

#include <cstdint>
#include <initializer_list>

namespace ep::backend {

using format::GgmlType;

/// Where a tensor's bytes live.
enum class Device : uint8_t { cpu = 0, cuda = 1 };

/// The name of a device ("cpu", "cuda").
const char *device_name(Device device) noexcept;

/// A non-owning view. For block-quantized types ne[0] is a whole number of blocks and nb[0] is
/// the block size in bytes; a row (ne[0] values) is stored as ggml stores it.
struct Tensor {
  void *data = nullptr;
  GgmlType type = GgmlType::f32;
  Device device = Device::cpu;
  int64_t ne[4] = {1, 1, 1, 1};  ///< elements per dimension, ggml order
  uint64_t nb[4] = {0, 0, 0, 0}; ///< byte strides: nb[0] element/block, nb[1] row, nb[2], nb[3]

  /// A contiguous tensor of shape @p shape (ggml order, up to 4 dims) at @p data.
  static Tensor make(const void *data, GgmlType type, Device device,
                     std::initializer_list<int64_t> shape);

  int64_t n_elems() const noexcept { return ne[0] * ne[1] * ne[2] * ne[3]; }
  /// Rows of ne[0] values (ne[1]·ne[2]·ne[3]).
  int64_t n_rows() const noexcept { return ne[1] * ne[2] * ne[3]; }
  /// Bytes of one row of ne[0] values.
  uint64_t row_bytes() const;
  /// Bytes of the whole tensor when contiguous.
  uint64_t n_bytes() const { return row_bytes() * static_cast<uint64_t>(n_rows()); }
  /// True when rows follow each other without gaps.
  bool is_contiguous() const;

  template <typename T>
  T *as() const noexcept {
    return static_cast<T *>(data);
  }
};

}  // namespace ep::backend
