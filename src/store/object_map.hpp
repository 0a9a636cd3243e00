// Where each expert object lives in a pack: the only thing the store needs to know about the
// pack format. The Expert Pack reader (src/format) provides one through pack_layout.hpp; tests
// and benchmarks use UniformObjectMap over synthetic packs.
#pragma once

#include <cstdint>
#include <cstddef>
#include <memory>
#include <string>

namespace ep::store {

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
