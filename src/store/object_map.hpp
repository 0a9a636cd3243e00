// Where each expert object lives in a pack: the only thing the store needs to know about the
// pack format. The Expert Pack reader (src/format) provides one through pack_object_map.hpp;
// tests and benchmarks use UniformObjectMap over synthetic packs.
//
// An object is one contiguous range of one file (a pack), or a list of extents (a source index:
// each role a slice of a source file) that the store reads separately and lays out in the slot
// at their offsets in the object.
#pragma once

#include "format/microscale.hpp"

#include <cstdint>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace ep::store {

/// A piece of an object: @p bytes at @p offset of file @p file (an index into the store's data
/// files), which go to @p offset_in_object in the object. With fp4_cols set, the piece is an
/// FP4 matrix of a source [fp4_rows, fp4_cols]: @p bytes of packed values at @p offset and
/// @p scale_bytes of E8M0 scales at @p scale_offset of file @p scale_file, which the store
/// reads both and re-lays into the MXFP4 blocks that go to the object (format/microscale.hpp).
struct ObjectExtent {
  uint32_t file = 0;
  uint64_t offset = 0;
  uint64_t bytes = 0;
  uint64_t offset_in_object = 0;
  uint32_t scale_file = 0;
  uint64_t scale_offset = 0;
  uint64_t scale_bytes = 0;
  uint64_t fp4_rows = 0;
  uint64_t fp4_cols = 0;  ///< 0: the bytes go to the object as they are
  /// True for an FP4 piece (re-laid as it is read).
  bool fp4() const { return fp4_cols != 0; }
  /// Bytes the piece takes in the object: @p bytes, or its MXFP4 blocks.
  uint64_t object_bytes() const { return fp4() ? format::mxfp4_bytes(fp4_rows, fp4_cols) : bytes; }
};

class ObjectMap {
 public:
  virtual ~ObjectMap() = default;
  virtual uint32_t num_layers() const = 0;
  virtual uint32_t num_experts() const = 0;
  /// File offset of object (layer, expert) in its file (object_file()): aligned to alignment().
  virtual uint64_t object_offset(uint32_t layer, uint32_t expert) const = 0;
  /// The file object (layer, expert) lies in: an index into the store's data files (a striped
  /// pack's parts); 0 for a pack in one file (the default).
  virtual uint32_t object_file(uint32_t layer, uint32_t expert) const {
    (void)layer;
    (void)expert;
    return 0;
  }
  /// Payload bytes of object (layer, expert) (without the alignment padding).
  virtual uint64_t object_bytes(uint32_t layer, uint32_t expert) const = 0;
  /// The pieces of object (layer, expert), in object order, not overlapping; the default: one
  /// extent, [object_offset(), + object_bytes()) of object_file() at offset 0 in the object.
  /// The store reads each as the 4096-aligned range around it.
  virtual std::vector<ObjectExtent> object_extents(uint32_t layer, uint32_t expert) const {
    return {ObjectExtent{object_file(layer, expert), object_offset(layer, expert), object_bytes(layer, expert), 0}};
  }
  /// The largest object; the default scans every object.
  virtual uint64_t max_object_bytes() const;
  virtual uint32_t alignment() const { return 4096; }
  /// Checks object (layer, expert) as read (@p data, object_bytes() bytes) against what the
  /// layout knows of it: "" when it is right or there is nothing to check it against (the
  /// default), else what is wrong (PackObjectMap: the role whose XXH3 differs from the index).
  virtual std::string check_object(uint32_t layer, uint32_t expert, const std::byte *data) const {
    (void)layer;
    (void)expert;
    (void)data;
    return {};
  }
  /// check_object() for an object read as its extents (object_extents()), extent i's bytes as
  /// they go to the object (an FP4 piece re-laid) at @p extent_data[i]. The default checks one
  /// extent holding the whole object in place, and otherwise puts the extents together at their
  /// offsets and calls check_object().
  virtual std::string check_extents(uint32_t layer, uint32_t expert, std::span<const std::byte *const> extent_data) const;
};

/// offset = data_start + (layer * num_experts + expert) * stride — the Expert Pack v1 rule.
class UniformObjectMap final : public ObjectMap {
 public:
  UniformObjectMap(uint32_t num_layers, uint32_t num_experts, uint64_t object_bytes, uint64_t stride,
                uint64_t data_start, uint32_t alignment = 4096);
  uint32_t num_layers() const override { return num_layers_; }
  uint32_t num_experts() const override { return num_experts_; }
  uint64_t object_offset(uint32_t layer, uint32_t expert) const override {
    return data_start_ + (static_cast<uint64_t>(layer) * num_experts_ + expert) * stride_;
  }
  uint64_t object_bytes(uint32_t, uint32_t) const override { return object_bytes_; }
  uint64_t max_object_bytes() const override { return object_bytes_; }
  uint32_t alignment() const override { return alignment_; }
  uint64_t stride() const { return stride_; }
  uint64_t data_start() const { return data_start_; }
  uint64_t file_bytes() const { return data_start_ + static_cast<uint64_t>(num_layers_) * num_experts_ * stride_; }

 private:
  uint32_t num_layers_, num_experts_;
  uint64_t object_bytes_, stride_, data_start_;
  uint32_t alignment_;
};

}  // namespace ep::store
