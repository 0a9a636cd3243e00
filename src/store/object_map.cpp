#include "store/object_map.hpp"

#include "core/error.hpp"

#include <algorithm>
#include <cstring>

namespace ep::store {

uint64_t ObjectMap::max_object_bytes() const {
  uint64_t m = 0;
  for (uint32_t l = 0; l < num_layers(); ++l)
    for (uint32_t e = 0; e < num_experts(); ++e) m = std::max(m, object_bytes(l, e));
  return m;
}

std::string ObjectMap::check_extents(uint32_t layer, uint32_t expert, std::span<const std::byte *const> extent_data) const {
  const std::vector<ObjectExtent> extents = object_extents(layer, expert);
  if (extents.size() != extent_data.size())
    fail(Status::internal, "object map: layer {} expert {} has {} extents, {} given", layer, expert, extents.size(),
         extent_data.size());
  // One extent holding the whole object (a pack's): checked where it was read.
  if (extents.size() == 1 && extents[0].offset_in_object == 0 && extents[0].bytes == object_bytes(layer, expert))
    return check_object(layer, expert, extent_data[0]);
  std::vector<std::byte> object(static_cast<size_t>(object_bytes(layer, expert)));
  for (size_t i = 0; i < extents.size(); ++i)
    std::memcpy(object.data() + extents[i].offset_in_object, extent_data[i], static_cast<size_t>(extents[i].object_bytes()));
  return check_object(layer, expert, object.data());
}

UniformObjectMap::UniformObjectMap(uint32_t num_layers, uint32_t num_experts, uint64_t object_bytes,
                             uint64_t stride, uint64_t data_start, uint32_t alignment)
    : num_layers_(num_layers), num_experts_(num_experts), object_bytes_(object_bytes),
      stride_(stride), data_start_(data_start), alignment_(alignment) {
  if (num_layers == 0 || num_experts == 0 || object_bytes == 0)
    fail(Status::invalid_argument, "object map: {} layers, {} experts, {} object bytes must be positive",
         num_layers, num_experts, object_bytes);
  if (alignment == 0 || stride % alignment || data_start % alignment || stride < object_bytes)
    fail(Status::format, "object map: stride {} and data_start {} must be multiples of the alignment {} "
         "and stride >= object bytes {}", stride, data_start, alignment, object_bytes);
}

}  // namespace ep::store
