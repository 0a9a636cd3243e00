// Finds the routed experts of a model in its source files (GGUF or safetensors) and lists,
// for every (layer, expert, role), the byte slice of a source file that holds it. The builder
// copies exactly these bytes: nothing is converted or requantized.
#pragma once

#include "format/ggml_type.hpp"
#include "format/pack_format.hpp"

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace ep::pack {

struct ExpertSlice {
  uint32_t file = 0;                ///< index into ExpertPlan::files
  std::string tensor;               ///< source tensor name
  uint64_t offset = 0;              ///< absolute offset in the source file
  uint64_t nbytes = 0;              ///< payload bytes in the pack
  /// verbatim: the payload is the source bytes [offset, offset + nbytes). fp4_e8m0: FP4 values
  /// (source_nbytes = nbytes · 16 / 17 at offset) and their E8M0 scales (scale_nbytes at
  /// scale_offset of file scale_file: the same one or another shard) re-laid into MXFP4 blocks
  /// (format/microscale.hpp).
  format::SourceLayout layout = format::SourceLayout::verbatim;
  uint64_t source_nbytes = 0;
  std::string scale_tensor;
  uint32_t scale_file = 0;          ///< index into ExpertPlan::files
  uint64_t scale_offset = 0;
  uint64_t scale_nbytes = 0;
  format::GgmlType type = format::GgmlType::f32;
  uint32_t n_dims = 2;
  std::array<uint64_t, 4> ne{1, 1, 1, 1};  ///< ggml order
};

struct SourceFile {
  std::string path;                 ///< absolute path
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  uint64_t header_bytes = 0;        ///< metadata region [0, header_bytes) hashed into its digest
};

struct ExpertPlan {
  std::string arch;                 ///< "deepseek4", "kimi-k3", or what the source says
  std::string source_format;        ///< "gguf" or "safetensors"
  uint32_t first_layer = 0;         ///< model block of pack layer 0
  uint32_t num_layers = 0;
  uint32_t num_experts = 0;
  uint32_t top_k = 0;
  std::vector<SourceFile> files;
  std::vector<ExpertSlice> slices;  ///< (layer, expert, role) order; size layers*experts*3
  uint64_t payload_bytes() const;
};

/// Plans a pack from @p sources: GGUF files (the first shard finds the rest; more shards of the
/// same set may be listed), safetensors files, index JSONs or directories. Throws
/// Status::not_found when no routed experts are found, Status::shape when shapes disagree,
/// Status::unsupported for a dtype with no ggml type.
ExpertPlan plan_sources(const std::vector<std::string> &sources);

}  // namespace ep::pack
