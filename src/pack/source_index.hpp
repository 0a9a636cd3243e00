// Source indexes (docs/pack-format.md, "Source indexes"): an Expert Pack's header, index and
// strings without its data (BuildOptions::source_index), so the store reads every expert from
// the source files themselves. What builder and reader share to fingerprint a source file, and
// the check, at open, that the sources are still the ones the index was built from.
#pragma once

#include "format/byte_source.hpp"
#include "format/hash.hpp"
#include "pack/manifest.hpp"
#include "pack/sources.hpp"

#include <array>
#include <cstdint>
#include <vector>

namespace ep::pack {

/// A source file's digest (ManifestSource::digest): SHA-256 of its metadata region
/// [0, header_bytes) — for GGUF and safetensors the tensor inventory (names, dtypes, shapes,
/// offsets) and the metadata — followed by the SHA-256 of each of its expert slices, in index
/// order.
format::Sha256 source_file_digest(const format::ByteSource &file, uint64_t header_bytes,
                                  const std::vector<std::array<uint8_t, 32>> &slice_sha256);

/// Checks that @p plan (plan_sources() of the index's source, now) is the one @p index (a
/// source index, described by its manifest @p m) was built from: the same files, each with the
/// digest recorded (the metadata region as it is now, the slices' recorded digests), and every
/// expert slice at the same tensor, dtype, shape, offset and size. Throws Status::stale naming
/// the file and what changed.
void check_source_index(const format::PackFile &index, const Manifest &m, const ExpertPlan &plan);

}  // namespace ep::pack
