#include "store/pack_layout.hpp"

#include "core/error.hpp"
#include "format/pack_file.hpp"

namespace ep::store {

PackLayout::PackLayout(std::shared_ptr<const format::PackFile> pack) : pack_(std::move(pack)) {
  if (!pack_) fail(Status::invalid_argument, "PackLayout: no pack");
  if (pack_->alignment() % 4096 != 0)
    fail(Status::unsupported, "{}: alignment {} is not a multiple of 4096: O_DIRECT reads need it",
         pack_->path(), pack_->alignment());
}

std::shared_ptr<PackLayout> PackLayout::open(const std::string &path, bool sampled_hashes) {
  std::shared_ptr<const format::PackFile> pack = format::PackFile::open(
      path, sampled_hashes ? format::ValidationLevel::sampled : format::ValidationLevel::structure);
  return std::make_shared<PackLayout>(std::move(pack));
}

uint32_t PackLayout::num_layers() const { return pack_->num_layers(); }
uint32_t PackLayout::num_experts() const { return pack_->num_experts(); }
uint64_t PackLayout::object_offset(uint32_t layer, uint32_t expert) const { return pack_->object_offset(layer, expert); }
uint64_t PackLayout::object_bytes(uint32_t layer, uint32_t expert) const { return pack_->object_bytes(layer, expert); }
uint64_t PackLayout::max_object_bytes() const { return pack_->max_object_bytes(); }
uint32_t PackLayout::alignment() const { return static_cast<uint32_t>(pack_->alignment()); }

}  // namespace ep::store
