// The JSON manifest beside a pack (<pack>.json): source fingerprints, the build
// configuration, the identity digests (copied from the header) and a generation counter.
#pragma once

#include "format/pack_file.hpp"

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace ep::pack {

struct ManifestSource {
  std::string path;
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  std::string digest;        ///< hex SHA-256 (docs/pack-format.md: metadata region + slice digests)
};

struct Manifest {
  uint32_t version = 1;
  uint64_t generation = 1;
  std::string created_utc;
  std::string pack_file;     ///< base name of the pack
  uint64_t pack_size = 0;
  std::string source_files_sha256, model_identity_sha256, config_sha256;
  std::vector<ManifestSource> sources;
  nlohmann::json config;     ///< canonical; config_sha256 = SHA-256 of config.dump()
  nlohmann::json build;      ///< informational: seconds, throughput, builder version

  nlohmann::json to_json() const;
  /// Parses and checks a manifest; throws Status::format naming @p name on any bad field.
  static Manifest parse(const std::string &text, const std::string &name);
  static Manifest load(const std::string &path);
};

/// "<pack>.json"
std::string manifest_path(const std::string &pack_path);

/// Checks the manifest against its pack: identity digests equal, size equal. Throws
/// Status::stale ("manifest does not match the pack") otherwise.
void check_manifest_matches(const Manifest &m, const format::PackFile &pack, const std::string &manifest_name);
/// Checks each source still exists (Status::not_found, "source missing: PATH") with the size
/// and mtime recorded at build time (Status::stale, "source changed: PATH ...").
void check_sources(const Manifest &m);

}  // namespace ep::pack
