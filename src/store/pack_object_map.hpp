// The ObjectMap of a real Expert Pack v1 file (src/format/pack_file.hpp): one extent per object,
// or, for a source index, one per role in its source file.
#pragma once

#include "store/object_map.hpp"

#include <memory>
#include <string>

namespace ep::format {
class PackFile;
}

namespace ep::store {

class PackObjectMap final : public ObjectMap {
 public:
  explicit PackObjectMap(std::shared_ptr<const format::PackFile> pack);
  /// Opens @p path with structural validation plus the pack reader's sampled payload hashes.
  static std::shared_ptr<PackObjectMap> open(const std::string &path, bool sampled_hashes = true);

  uint32_t num_layers() const override;
  uint32_t num_experts() const override;
  uint64_t object_offset(uint32_t layer, uint32_t expert) const override;
  /// Its part in a striped pack (an index into pack().data_files()).
  uint32_t object_file(uint32_t layer, uint32_t expert) const override;
  uint64_t object_bytes(uint32_t layer, uint32_t expert) const override;
  uint64_t max_object_bytes() const override;
  uint32_t alignment() const override;
  /// A source index: gate, up and down, each from its source file.
  std::vector<ObjectExtent> object_extents(uint32_t layer, uint32_t expert) const override;
  /// Each role's payload against its XXH3 in the pack index.
  std::string check_object(uint32_t layer, uint32_t expert, const std::byte *data) const override;
  /// The same for an object read as its extents (a source index: one per role, each named by its
  /// source file and offset there).
  std::string check_extents(uint32_t layer, uint32_t expert, std::span<const std::byte *const> extent_data) const override;
  const format::PackFile &pack() const { return *pack_; }

 private:
  /// Role r's payload (at @p role_data[r]) against its XXH3 in the index, for every role.
  std::string check_roles(uint32_t layer, uint32_t expert, const std::byte *const *role_data) const;
  std::shared_ptr<const format::PackFile> pack_;
};

}  // namespace ep::store
