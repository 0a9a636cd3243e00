#include "pack/validate.hpp"

#include "core/error.hpp"
#include "format/byte_source.hpp"
#include "format/checkpoint_tensors.hpp"
#include "format/safetensors.hpp"
#include "format/hash.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <tuple>
#include <filesystem>
#include <fmt/format.h>

namespace ep::pack {

namespace {

/// Re-hashes every source slice the pack was built from: a source replaced after packing with
/// its size and mtime kept (cp -p, rsync -t) passes check_sources() but not this.
void check_source_slices(const format::PackFile &pack) {
  // The pack's source files in order of first use, each opened once (and its safetensors header
  // parsed once, when an FP4 entry needs its scales).
  std::vector<std::string> paths;
  for (const format::RoleEntry &e : pack.entries())
    if (std::find(paths.begin(), paths.end(), e.source_file) == paths.end()) paths.emplace_back(e.source_file);
  std::vector<std::unique_ptr<format::FileSource>> files(paths.size());
  auto file = [&](size_t i) -> format::FileSource & {
    if (!files[i]) files[i] = std::make_unique<format::FileSource>(paths[i]);
    return *files[i];
  };
  // Their safetensors headers (headers[i] and st[i] are paths[i]'s), and one more for a shard the
  // checkpoint's index lists for scales that no other file holds.
  std::vector<std::unique_ptr<format::SafetensorsFile>> headers;
  std::vector<const format::SafetensorsFile *> st;
  auto open_shard = [&](const std::string &shard) {
    paths.push_back(shard);
    files.emplace_back();
    headers.push_back(std::make_unique<format::SafetensorsFile>(format::SafetensorsFile::open(shard)));
    return headers.back().get();
  };
  std::vector<uint8_t> buffer;
  for (const format::RoleEntry &e : pack.entries()) {
    const size_t own = static_cast<size_t>(std::find(paths.begin(), paths.end(), e.source_file) - paths.begin());
    // The source bytes the payload came from: the slice itself, or FP4 values and their scales
    // (in the same file or another shard).
    std::vector<std::tuple<size_t, uint64_t, uint64_t>> parts;
    if (e.source_layout == format::SourceLayout::fp4_e8m0) {
      if (st.empty())
        for (const std::string &p : paths) {
          headers.push_back(std::make_unique<format::SafetensorsFile>(format::SafetensorsFile::open(p)));
          st.push_back(headers.back().get());
        }
      const std::string scale_name = format::fp4_scale_tensor_name(std::string(e.source_tensor));
      const auto sc = format::find_fp4_scale(st, own, std::string(e.source_tensor), open_shard);
      if (!sc || sc->tensor->nbytes != e.scale_bytes)
        fail(Status::stale, "{}: source slice changed: no source of the pack ({} or another) has a scale tensor '{}' of {} bytes for {}",
             pack.path(), paths[own], scale_name, e.scale_bytes, e.source_tensor);
      parts = {{own, e.source_offset, e.source_bytes}, {sc->file, sc->tensor->file_offset, sc->tensor->nbytes}};
    } else {
      parts = {{own, e.source_offset, e.nbytes}};
    }
    format::Sha256Hasher sha;
    constexpr uint64_t kChunk = 8u << 20;
    for (const auto &[fi, offset, size] : parts) {
      format::FileSource &f = file(fi);
      if (offset > f.size() || size > f.size() - offset)
        fail(Status::stale, "{}: source slice changed: {} is {} bytes, the slice of {} lies at {} ({} bytes)", pack.path(),
             f.name(), f.size(), e.source_tensor, offset, size);
      for (uint64_t done = 0; done < size;) {
        const size_t n = static_cast<size_t>(std::min(kChunk, size - done));
        buffer.resize(n);
        f.read(offset + done, buffer.data(), n);
        sha.update(buffer.data(), n);
        done += n;
      }
    }
    const format::Sha256 got = sha.finish();
    if (std::memcmp(got.data(), e.source_sha256.data(), 32) != 0)
      fail(Status::stale, "{}: source slice changed: {} tensor {} at offset {} ({} bytes) no longer hashes to the "
           "pack's source_sha256 (the source was replaced after packing: rebuild the pack)",
           pack.path(), paths[own], e.source_tensor, e.source_offset, e.nbytes);
  }
}

}  // namespace

ValidateReport validate_pack(const std::string &pack_path, const ValidateOptions &options) {
  const auto t0 = std::chrono::steady_clock::now();
  ValidateReport report;
  auto pack = format::PackFile::open(pack_path, format::ValidationLevel::structure);
  const std::string mpath = manifest_path(pack_path);
  if (options.require_manifest || std::filesystem::exists(mpath)) {
    const Manifest m = Manifest::load(mpath);
    check_manifest_matches(m, *pack, mpath);
    report.manifest_checked = true;
    if (options.check_sources) {
      check_sources(m);
      report.sources_checked = true;
    }
  }
  const auto objects = options.full ? std::vector<std::pair<uint32_t, uint32_t>>{} : pack->sample_objects();
  pack->verify_payloads(objects);
  if (options.full && report.sources_checked) check_source_slices(*pack);
  if (options.full) {
    report.objects_hashed = static_cast<uint64_t>(pack->num_layers()) * pack->num_experts();
    for (const auto &e : pack->entries()) report.bytes_hashed += e.nbytes;
  } else {
    report.objects_hashed = objects.size();
    for (auto [l, x] : objects)
      for (uint32_t r = 0; r < 3; ++r) report.bytes_hashed += pack->entry(l, x, static_cast<format::Role>(r)).nbytes;
  }
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return report;
}

nlohmann::json inspect_json(const format::PackFile &pack, const Manifest *manifest) {
  const auto &h = pack.header();
  nlohmann::json j;
  j["file"] = pack.path();
  j["format_version"] = h.version;
  j["header_size"] = h.header_size;
  j["entry_size"] = h.entry_size;
  j["flags"] = h.flags;
  j["alignment"] = h.alignment;
  j["data_start"] = h.data_start;
  j["object_stride"] = h.object_stride;
  j["num_layers"] = h.num_layers;
  j["num_experts"] = h.num_experts;
  j["num_roles"] = h.num_roles;
  j["top_k"] = h.top_k;
  j["first_layer"] = h.first_layer;
  j["file_size"] = h.file_size;
  j["index"] = {{"offset", h.index_offset}, {"size", h.index_size}, {"sha256", format::to_hex(h.index_sha256, 32)}};
  j["strings"] = {{"offset", h.strings_offset}, {"size", h.strings_size}};
  j["identity"] = {{"source_files_sha256", format::to_hex(h.source_files_sha256, 32)},
                   {"model_identity_sha256", format::to_hex(h.model_identity_sha256, 32)},
                   {"config_sha256", format::to_hex(h.config_sha256, 32)}};
  j["header_xxh3"] = fmt::format("{:016x}", h.header_xxh3);
  if (manifest) j["manifest"] = manifest->to_json();
  nlohmann::json objects = nlohmann::json::array();
  for (uint32_t l = 0; l < h.num_layers; ++l) {
    for (uint32_t x = 0; x < h.num_experts; ++x) {
      nlohmann::json o;
      o["layer"] = l;
      o["model_layer"] = l + h.first_layer;
      o["expert"] = x;
      o["offset"] = pack.object_offset(l, x);
      o["bytes"] = pack.object_bytes(l, x);
      nlohmann::json roles = nlohmann::json::array();
      for (uint32_t r = 0; r < 3; ++r) {
        const format::RoleEntry &e = pack.entry(l, x, static_cast<format::Role>(r));
        nlohmann::json shape = nlohmann::json::array();
        for (uint32_t d = 0; d < e.n_dims; ++d) shape.push_back(e.ne[d]);
        roles.push_back({{"role", format::role_name(e.role)},
                         {"ggml_type", format::ggml_type_info(static_cast<uint32_t>(e.type))->name},
                         {"ggml_type_id", static_cast<uint32_t>(e.type)},
                         {"shape", shape},
                         {"offset", e.file_offset},
                         {"offset_in_object", e.offset_in_object},
                         {"nbytes", e.nbytes},
                         {"xxh3", fmt::format("{:016x}", e.xxh3)},
                         {"source_sha256", format::to_hex(e.source_sha256.data(), 32)},
                         {"source", {{"file", std::string(e.source_file)}, {"tensor", std::string(e.source_tensor)}, {"offset", e.source_offset},
                                     {"nbytes", e.source_layout == format::SourceLayout::fp4_e8m0 ? e.nbytes / 17 * 16 : e.nbytes},
                                     {"layout", e.source_layout == format::SourceLayout::fp4_e8m0 ? "fp4_e8m0" : "verbatim"}}}});
      }
      o["roles"] = roles;
      objects.push_back(std::move(o));
    }
  }
  j["objects"] = std::move(objects);
  return j;
}

std::string inspect_text(const format::PackFile &pack, const Manifest *manifest, size_t max_objects) {
  const auto &h = pack.header();
  std::string s;
  s += fmt::format("{}: Expert Pack v{}, {} bytes{}\n", pack.path(), h.version, h.file_size,
                   pack.source_objects() ? " (a source index: every payload is read from its source file)" : "");
  s += fmt::format("  layers {} (model blocks {}..{}), experts {}, roles {}, top_k {}\n", h.num_layers, h.first_layer,
                   h.first_layer + h.num_layers - 1, h.num_experts, h.num_roles, h.top_k);
  s += fmt::format("  alignment {}, data_start {}, object_stride {}, max object bytes {}\n", h.alignment, h.data_start,
                   h.object_stride, pack.max_object_bytes());
  s += fmt::format("  index at {} ({} bytes), strings at {} ({} bytes)\n", h.index_offset, h.index_size,
                   h.strings_offset, h.strings_size);
  s += fmt::format("  source files sha256  {}\n  model identity sha256 {}\n  config sha256        {}\n",
                   format::to_hex(h.source_files_sha256, 32), format::to_hex(h.model_identity_sha256, 32),
                   format::to_hex(h.config_sha256, 32));
  if (manifest) {
    s += fmt::format("  manifest: generation {}, created {}, {} source file(s)\n", manifest->generation,
                     manifest->created_utc, manifest->sources.size());
    for (const auto &src : manifest->sources) s += fmt::format("    {} ({} bytes)\n", src.path, src.size);
  }
  size_t shown = 0;
  for (uint32_t l = 0; l < h.num_layers && shown < max_objects; ++l) {
    for (uint32_t x = 0; x < h.num_experts && shown < max_objects; ++x, ++shown) {
      s += fmt::format("  object (layer {}, expert {}): offset {}, {} bytes\n", l, x, pack.object_offset(l, x),
                       pack.object_bytes(l, x));
      for (uint32_t r = 0; r < 3; ++r) {
        const auto &e = pack.entry(l, x, static_cast<format::Role>(r));
        s += fmt::format("    {:<4} {:<8} [{}, {}] at {} ({} bytes) from {} @ {}\n", format::role_name(e.role),
                         format::ggml_type_info(static_cast<uint32_t>(e.type))->name, e.ne[0], e.ne[1], e.file_offset,
                         e.nbytes, e.source_tensor, e.source_offset);
      }
    }
  }
  const uint64_t n = static_cast<uint64_t>(h.num_layers) * h.num_experts;
  if (n > shown) s += fmt::format("  ... {} more objects (--json lists all)\n", n - shown);
  return s;
}

}  // namespace ep::pack
