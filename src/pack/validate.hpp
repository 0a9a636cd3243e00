// Pack validation (ep-pack validate) and inspection (ep-pack inspect).
#pragma once

#include "format/pack_file.hpp"
#include "pack/manifest.hpp"

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace ep::pack {

struct ValidateOptions {
  bool full = false;           ///< hash every payload (otherwise a deterministic sample)
  bool check_sources = true;   ///< stat every source named by the manifest (with full: also re-hash
                               ///< every source slice against the index's source_sha256)
  bool require_manifest = false;
};

struct ValidateReport {
  uint64_t objects_hashed = 0;
  uint64_t bytes_hashed = 0;
  bool manifest_checked = false;
  bool sources_checked = false;
  double seconds = 0;
};

/// Opens @p pack_path at the structure level, checks the manifest (when present or required)
/// and the sources, then hashes payloads (sampled or all). Throws the first failure as an
/// ep::Error with its specific one-line message.
ValidateReport validate_pack(const std::string &pack_path, const ValidateOptions &options = {});

/// The inspect document: header, counts, manifest (when given) and every object with its
/// absolute offset, size and roles (docs/pack-format.md lists the fields).
nlohmann::json inspect_json(const format::PackFile &pack, const Manifest *manifest);
/// A human-readable summary (header, counts, the first objects).
std::string inspect_text(const format::PackFile &pack, const Manifest *manifest, size_t max_objects = 8);

}  // namespace ep::pack
