// Synthetic "pack-shaped" files for tests and benchmarks: a 4096-byte text header, then one
// 4096-aligned object per (layer, expert) at data_start + (layer * E + expert) * stride, each
// filled with seeded pseudo-random bytes that can be regenerated (and hashed) without the file.
#pragma once

#include "store/object_map.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

namespace ep::testkit {

struct SyntheticPackSpec {
  uint32_t num_layers = 4;
  uint32_t num_experts = 16;
  uint64_t object_bytes = 1 << 20;
  uint64_t seed = 1;

  uint64_t stride() const;
  static constexpr uint64_t kDataStart = 4096;
  uint64_t file_bytes() const;
  std::shared_ptr<store::UniformObjectMap> object_map() const;
  /// A spec of about @p total_bytes with objects of @p object_bytes and @p num_experts per layer.
  static SyntheticPackSpec for_size(uint64_t total_bytes, uint64_t object_bytes, uint32_t num_experts, uint64_t seed);
};

/// The bytes of object (layer, expert) (object_bytes of them) into @p out.
void fill_synthetic_object(const SyntheticPackSpec &spec, uint32_t layer, uint32_t expert, std::span<std::byte> out);
/// XXH3-64 of object (layer, expert)'s payload.
uint64_t synthetic_object_hash(const SyntheticPackSpec &spec, uint32_t layer, uint32_t expert);

/// Writes the file (temporary name, fsync, rename) with @p threads writers. If @p path already
/// holds a synthetic pack of the same spec it is kept. Returns true when it wrote a new file.
bool create_synthetic_pack(const std::string &path, const SyntheticPackSpec &spec, unsigned threads = 4);

/// The spec in the header of a synthetic pack, or nullopt if @p path is not one.
std::optional<SyntheticPackSpec> read_synthetic_header(const std::string &path);

/// "20G", "512M", "4096", "1.5G" → bytes (binary units). Throws on junk.
uint64_t parse_size(const std::string &text);

}  // namespace ep::testkit
