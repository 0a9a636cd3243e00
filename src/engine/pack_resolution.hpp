// Where a model's weights come from: the dense weights from the source (a GGUF file, first shard
// of a set, or a safetensors directory with config.json), the routed experts from an Expert Pack.
// Given a source, its pack is found (or built, with progress) in a pack directory and reused
// while its manifest's source fingerprints (size, mtime) still match; given a pack, its
// manifest names the source.
//
// Staleness policy: a pack found for a source is a derived cache, so a changed source rebuilds
// it (generation + 1), unless building is disabled (then Status::stale). A pack given
// explicitly is never rebuilt: a changed or missing source is Status::stale / Status::not_found.
//
// Without a pack (PackPlacement::source_index): the experts are read from the source itself,
// through a source index ("<name>-<hash>.epx" and its manifest, built once by reading and
// hashing the experts; docs/pack-format.md, "Source indexes"). An index found is checked
// against the source at open and never rebuilt: a source whose size, mtime, metadata or tensor
// inventory changed is Status::stale naming the file (remove the index to build it again).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace ep::engine {

struct PackPlacement {
  /// Directory of packs built for sources; "" = default_pack_dir().
  std::string pack_dir;
  /// Build a missing pack / rebuild a stale one (false: Status::not_found / Status::stale).
  bool build = true;
  /// Build progress: (payload bytes done, total), called after every chunk.
  std::function<void(uint64_t, uint64_t)> progress;
  /// No pack: find or build the source's source index instead (see the file comment). A pack
  /// given as the path is then Status::invalid_argument.
  bool source_index = false;
};

struct ResolvedModel {
  std::string source;      ///< what DeepseekV4Model::open() reads the dense weights from
  std::string pack;        ///< the Expert Pack (PackPlacement::source_index: the source index)
  bool built = false;      ///< this call built (or rebuilt) the pack
  std::string rebuild_reason;  ///< why an existing pack was rebuilt ("" = it was not)
  uint64_t generation = 0; ///< the manifest's generation
};

/// $XDG_CACHE_HOME/expertpack, else $HOME/.cache/expertpack, else <tmp>/expertpack.
std::string default_pack_dir();
/// The pack a source gets in @p pack_dir: "<name>-<16 hex of SHA-256 of the absolute path>.epk".
std::string pack_path_for_source(const std::string &source, const std::string &pack_dir);
/// The source index a source gets in @p pack_dir: pack_path_for_source() ending in ".epx".
std::string source_index_path_for_source(const std::string &source, const std::string &pack_dir);
/// True when @p path is an Expert Pack (by its magic).
bool is_pack_file(const std::string &path);
/// See the file comment. Throws Status::not_found, Status::stale, the builder's and the pack
/// reader's errors.
ResolvedModel resolve_model(const std::string &path, const PackPlacement &placement);

}  // namespace ep::engine
