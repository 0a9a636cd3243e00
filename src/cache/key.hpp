// A cache key: one (layer, expert) pair.
#pragma once

#include <cstdint>

namespace ep::cache {

using Key = uint64_t;

inline constexpr Key make_key(uint32_t layer, uint32_t expert) {
  return (static_cast<Key>(layer) << 32) | expert;
}
inline constexpr uint32_t key_layer(Key key) { return static_cast<uint32_t>(key >> 32); }
inline constexpr uint32_t key_expert(Key key) { return static_cast<uint32_t>(key & 0xffffffffu); }

}  // namespace ep::cache
