#include "store/pack_object_map.hpp"

#include "core/error.hpp"
#include "format/hash.hpp"
#include "format/pack_file.hpp"

#include <fmt/format.h>

namespace ep::store {

PackObjectMap::PackObjectMap(std::shared_ptr<const format::PackFile> pack) : pack_(std::move(pack)) {
  if (!pack_) fail(Status::invalid_argument, "PackObjectMap: no pack");
  if (pack_->alignment() % 4096 != 0)
    fail(Status::unsupported, "{}: alignment {} is not a multiple of 4096: O_DIRECT reads need it",
         pack_->path(), pack_->alignment());
}

std::shared_ptr<PackObjectMap> PackObjectMap::open(const std::string &path, bool sampled_hashes) {
  std::shared_ptr<const format::PackFile> pack = format::PackFile::open(
      path, sampled_hashes ? format::ValidationLevel::sampled : format::ValidationLevel::structure);
  return std::make_shared<PackObjectMap>(std::move(pack));
}

uint32_t PackObjectMap::num_layers() const { return pack_->num_layers(); }
uint32_t PackObjectMap::num_experts() const { return pack_->num_experts(); }
uint64_t PackObjectMap::object_offset(uint32_t layer, uint32_t expert) const { return pack_->object_offset(layer, expert); }
uint32_t PackObjectMap::object_file(uint32_t layer, uint32_t expert) const { return pack_->object_file(layer, expert); }
uint64_t PackObjectMap::object_bytes(uint32_t layer, uint32_t expert) const { return pack_->object_bytes(layer, expert); }
uint64_t PackObjectMap::max_object_bytes() const { return pack_->max_object_bytes(); }
uint32_t PackObjectMap::alignment() const { return static_cast<uint32_t>(pack_->alignment()); }

std::vector<ObjectExtent> PackObjectMap::object_extents(uint32_t layer, uint32_t expert) const {
  if (!pack_->source_objects()) return ObjectMap::object_extents(layer, expert);
  std::vector<ObjectExtent> out;
  for (uint32_t r = 0; r < format::kPackNumRoles; ++r) {
    const format::RoleEntry &e = pack_->entry(layer, expert, static_cast<format::Role>(r));
    ObjectExtent x{e.file, e.file_offset, e.source_bytes, e.offset_in_object};
    if (e.source_layout == format::SourceLayout::fp4_e8m0) {
      x.scale_file = e.scale_file;
      x.scale_offset = e.scale_offset;
      x.scale_bytes = e.scale_bytes;
      x.fp4_rows = e.ne[1] * e.ne[2] * e.ne[3];
      x.fp4_cols = e.ne[0];
    }
    out.push_back(x);
  }
  return out;
}

std::string PackObjectMap::check_roles(uint32_t layer, uint32_t expert, const std::byte *const *role_data) const {
  for (uint32_t r = 0; r < format::kPackNumRoles; ++r) {
    const format::RoleEntry &e = pack_->entry(layer, expert, static_cast<format::Role>(r));
    const uint64_t got = format::xxh3_64(role_data[r], static_cast<size_t>(e.nbytes));
    if (got == e.xxh3) continue;
    if (pack_->source_objects())
      return fmt::format("payload hash mismatch: {}: layer {} expert {} {} (tensor '{}') at offset {} ({} bytes) hashes to {:016x}, "
                         "the index {} says {:016x}",
                         pack_->data_files()[e.file], layer, expert, format::role_name(e.role), e.source_tensor, e.file_offset,
                         e.nbytes, got, pack_->path(), e.xxh3);
    return fmt::format("payload hash mismatch: {} at offset {} ({} bytes) hashes to {:016x}, the index says {:016x}",
                       format::role_name(e.role), e.file_offset, e.nbytes, got, e.xxh3);
  }
  return {};
}

std::string PackObjectMap::check_extents(uint32_t layer, uint32_t expert, std::span<const std::byte *const> extent_data) const {
  if (!pack_->source_objects()) return ObjectMap::check_extents(layer, expert, extent_data);
  if (extent_data.size() != format::kPackNumRoles)
    fail(Status::internal, "{}: layer {} expert {}: {} extents given, a source object has {}", pack_->path(), layer, expert,
         extent_data.size(), format::kPackNumRoles);
  return check_roles(layer, expert, extent_data.data());
}

std::string PackObjectMap::check_object(uint32_t layer, uint32_t expert, const std::byte *data) const {
  const std::byte *role_data[format::kPackNumRoles];
  for (uint32_t r = 0; r < format::kPackNumRoles; ++r)
    role_data[r] = data + pack_->entry(layer, expert, static_cast<format::Role>(r)).offset_in_object;
  return check_roles(layer, expert, role_data);
}

}  // namespace ep::store
