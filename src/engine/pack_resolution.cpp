#include "engine/pack_resolution.hpp"

#include "core/error.hpp"
#include "core/log.hpp"
#include "format/file_format.hpp"
#include "format/hash.hpp"
#include "format/pack_file.hpp"
#include "pack/builder.hpp"
#include "pack/manifest.hpp"
#include "pack/source_index.hpp"

#include <cstdlib>
#include <filesystem>

namespace ep::engine {

namespace fs = std::filesystem;

namespace {

std::string abs_path(const std::string &p) { return fs::absolute(p).lexically_normal().string(); }

/// The source a manifest's pack was built from, as DeepseekV4Model::open() takes it.
std::string source_of(const pack::Manifest &m, const std::string &manifest_name) {
  if (m.sources.empty()) fail(Status::format, "{}: the manifest lists no source files", manifest_name);
  const std::string &first = m.sources.front().path;
  const format::FileFormat kind = format::detect_file_format(first);
  if (kind == format::FileFormat::gguf) return first;
  return format::checkpoint_dir_of(first, kind);  // safetensors: the checkpoint directory (config.json)
}

/// Checks a pack and its manifest; returns the manifest. Throws on any mismatch.
pack::Manifest check_pack(const std::string &pack_path) {
  const std::string mpath = pack::manifest_path(pack_path);
  if (!fs::exists(mpath))
    fail(Status::not_found, "{}: manifest missing ({}): the pack's sources cannot be checked", pack_path, mpath);
  pack::Manifest m = pack::Manifest::load(mpath);
  const auto pf = format::PackFile::open(pack_path, format::ValidationLevel::structure);
  pack::check_manifest_matches(m, *pf, mpath);
  pack::check_sources(m);
  return m;
}

/// "<pack_dir>/<name>-<16 hex of SHA-256 of the absolute path><extension>".
std::string derived_path(const std::string &source, const std::string &pack_dir, const char *extension) {
  const std::string abs = abs_path(source);
  fs::path p(abs);
  std::string name = p.filename().string();
  if (name.empty()) name = p.parent_path().filename().string();
  if (p.extension() == ".gguf") name = p.stem().string();
  const format::Sha256 d = format::sha256(abs.data(), abs.size());
  return (fs::path(pack_dir.empty() ? default_pack_dir() : pack_dir) / (name + "-" + format::hex(d).substr(0, 16) + extension))
      .string();
}

/// Checks a source index found for @p source against it now (fail-closed): the manifest's size
/// and mtime of every file, the index's structure (every source present and long enough),
/// and the plan of the source as it is now (files, metadata and tensor inventory, every slice).
pack::Manifest check_index_for(const std::string &index_path, const std::string &source) {
  const std::string mpath = pack::manifest_path(index_path);
  if (!fs::exists(mpath))
    fail(Status::not_found, "{}: manifest missing ({}): the source index cannot be checked", index_path, mpath);
  pack::Manifest m = pack::Manifest::load(mpath);
  pack::check_sources(m);
  const auto pf = format::PackFile::open(index_path, format::ValidationLevel::structure);
  pack::check_manifest_matches(m, *pf, mpath);
  pack::check_source_index(*pf, m, pack::plan_sources(std::vector<std::string>{source}));
  return m;
}

pack::BuildOptions build_options(const PackPlacement &placement) {
  pack::BuildOptions bo;
  if (placement.progress) {
    auto cb = placement.progress;
    bo.progress = [cb](const pack::BuildProgress &p) { cb(p.done_bytes, p.total_bytes); };
  }
  return bo;
}

void create_parent(const std::string &path) {
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  if (ec) fail(Status::io, "{}: cannot create the pack directory: {}", fs::path(path).parent_path().string(), ec.message());
}

ResolvedModel resolve_source_index(const std::string &path, const PackPlacement &placement) {
  if (is_pack_file(path))
    fail(Status::invalid_argument, "{} is an Expert Pack (or a source index): reading the experts from the source (no pack) needs "
         "the source", path);
  ResolvedModel r;
  r.source = path;
  r.pack = source_index_path_for_source(path, placement.pack_dir);
  std::error_code ec;
  if (fs::exists(r.pack, ec) || fs::exists(pack::manifest_path(r.pack), ec)) {
    try {
      const pack::Manifest m = check_index_for(r.pack, path);
      r.generation = m.generation;
    } catch (const Error &e) {
      throw Error(e.status(), fmt::format("{} (the experts are read from the source through the index {}: remove it and its "
                                          "manifest to index the source again)", e.what(), r.pack));
    }
    log::info("{}: reading the experts from the source through the index {}", path, r.pack);
    return r;
  }
  if (!placement.build) fail(Status::not_found, "{}: no source index at {} and building is disabled", path, r.pack);
  create_parent(r.pack);
  log::info("{}: indexing the experts of the source into {}", path, r.pack);
  pack::BuildOptions bo = build_options(placement);
  bo.source_index = true;
  const pack::BuildResult b = pack::build_pack(std::vector<std::string>{path}, r.pack, bo);
  r.built = true;
  r.generation = b.generation;
  log::info("{}: indexed {} ({} layers x {} experts, {} payload bytes in {:.2f} s)", path, b.pack_path, b.num_layers,
            b.num_experts, b.payload_bytes, b.seconds);
  return r;
}

}  // namespace

std::string default_pack_dir() {
  if (const char *x = std::getenv("XDG_CACHE_HOME"); x && *x) return (fs::path(x) / "expertpack").string();
  if (const char *h = std::getenv("HOME"); h && *h) return (fs::path(h) / ".cache" / "expertpack").string();
  return (fs::temp_directory_path() / "expertpack").string();
}

std::string pack_path_for_source(const std::string &source, const std::string &pack_dir) {
  return derived_path(source, pack_dir, ".epk");
}

std::string source_index_path_for_source(const std::string &source, const std::string &pack_dir) {
  return derived_path(source, pack_dir, ".epx");
}

bool is_pack_file(const std::string &path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return false;
  return format::probe_file_format(path) == format::FileFormat::expert_pack;
}

ResolvedModel resolve_model(const std::string &path, const PackPlacement &placement) {
  std::error_code ec;
  if (!fs::exists(path, ec)) fail(Status::not_found, "{}: no such file or directory", path);
  ResolvedModel r;
  if (placement.source_index) return resolve_source_index(path, placement);
  if (is_pack_file(path)) {
    // A pack given explicitly: never rebuilt.
    const pack::Manifest m = check_pack(path);
    r.pack = abs_path(path);
    r.source = source_of(m, pack::manifest_path(path));
    r.generation = m.generation;
    return r;
  }
  r.source = path;
  r.pack = pack_path_for_source(path, placement.pack_dir);
  const std::string source_abs = abs_path(path);
  if (fs::exists(r.pack, ec)) {
    try {
      const pack::Manifest m = check_pack(r.pack);
      // The pack must be this source's (a GGUF: its first shard; a directory: a file inside it).
      bool ours = false;
      for (const pack::ManifestSource &s : m.sources)
        ours = ours || s.path == source_abs || fs::path(s.path).parent_path().string() == source_abs;
      if (!ours) fail(Status::stale, "{}: built from {}, not {}", r.pack, m.sources.front().path, source_abs);
      r.generation = m.generation;
      log::info("{}: reusing the Expert Pack {} (generation {})", path, r.pack, m.generation);
      return r;
    } catch (const Error &e) {
      if (!placement.build)
        throw Error(e.status(),
                    fmt::format("{} (pack building is disabled: rebuild it with ep-pack, or allow building)", e.what()));
      r.rebuild_reason = e.what();
      log::warn("{}: rebuilding the Expert Pack: {}", path, e.what());
    }
  } else if (!placement.build) {
    fail(Status::not_found, "{}: no Expert Pack at {} and pack building is disabled", path, r.pack);
  }
  create_parent(r.pack);
  log::info("{}: building the Expert Pack {}", path, r.pack);
  const pack::BuildResult b = pack::build_pack(std::vector<std::string>{path}, r.pack, build_options(placement));
  r.built = true;
  r.generation = b.generation;
  log::info("{}: built {} ({} layers x {} experts, {} payload bytes in {:.2f} s)", path, b.pack_path, b.num_layers,
            b.num_experts, b.payload_bytes, b.seconds);
  return r;
}

}  // namespace ep::engine
