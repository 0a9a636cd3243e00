// Builds an Expert Pack from GGUF or safetensors sources: plans the expert slices
// (pack/sources.hpp), copies each slice byte for byte into its 4096-aligned object while
// hashing it (into the pack file, or striped over part files in several directories), then
// writes the index and header last. The pack is written under a temporary
// name in the target directory, fsynced, verified and renamed; a failure at any point removes
// the temporary file, so nothing that opens as a pack is left behind. An flock on
// <pack>.lock keeps two builders from racing on one output.
#pragma once

#include "format/file_writer.hpp"
#include "pack/sources.hpp"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ep::pack {

struct BuildProgress {
  uint64_t done_bytes = 0;     ///< payload bytes copied so far
  uint64_t total_bytes = 0;    ///< payload bytes to copy
  double elapsed_s = 0;
  double rate_bytes_per_s = 0;
  double eta_s = 0;
};

struct BuildOptions {
  uint32_t alignment = 4096;                         ///< object alignment (power of two, 64..1 MiB)
  std::function<void(const BuildProgress &)> progress;  ///< called after every chunk
  format::OutputWrapper wrap_output;                 ///< test seam: wraps the pack's OutputFile
  size_t chunk_bytes = 16u << 20;                    ///< copy granularity
  bool verify = true;                                ///< re-open the temp pack (structure) before the rename
  /// Stripe the objects over one part file per directory (at least two; docs/pack-format.md,
  /// "Striped packs"): the pack file keeps the header, index and strings, part k of N in
  /// stripe_dirs[k] holds objects k, k + N, ... (several drives read in parallel). Empty: one file.
  std::vector<std::string> stripe_dirs;
  /// Write a source index instead of a pack (docs/pack-format.md, "Source indexes"): the same
  /// header, index and strings, every payload read and hashed but left in its source (the file
  /// ends at data_start). Verbatim slices only (Status::unsupported otherwise); not striped.
  bool source_index = false;
};

struct BuildResult {
  std::string pack_path;
  std::string manifest_path;
  std::vector<std::string> part_paths;  ///< a striped pack's part files
  uint64_t file_bytes = 0;
  uint64_t payload_bytes = 0;
  uint32_t num_layers = 0;
  uint32_t num_experts = 0;
  uint64_t generation = 0;
  double seconds = 0;                ///< whole build, including planning, fsync and rename
  double copy_seconds = 0;           ///< the payload copy loop only
  double payload_bytes_per_s = 0;    ///< payload_bytes / seconds
};

/// Plans and builds. Throws ep::Error: Status::busy when another builder holds the lock,
/// Status::io on a read/write/fsync failure (ENOSPC, EIO), and the planning errors.
BuildResult build_pack(const std::vector<std::string> &sources, const std::string &pack_path,
                       const BuildOptions &options = {});
BuildResult build_pack(const ExpertPlan &plan, const std::string &pack_path, const BuildOptions &options = {});

}  // namespace ep::pack
