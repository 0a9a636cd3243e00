#include "format/pack_file.hpp"

#include "core/error.hpp"
#include "format/checkpoint_tensors.hpp"
#include "format/hash.hpp"
#include "format/microscale.hpp"
#include "format/safetensors.hpp"

#include <algorithm>
#include <cstring>
#include <filesystem>

namespace ep::format {

std::string_view role_name(Role role) noexcept {
  switch (role) {
    case Role::gate: return "gate";
    case Role::up: return "up";
    case Role::down: return "down";
  }
  return "?";
}

std::string to_hex(const uint8_t *bytes, size_t n) {
  static const char *digits = "0123456789abcdef";
  std::string s;
  s.reserve(n * 2);
  for (size_t i = 0; i < n; ++i) {
    s.push_back(digits[bytes[i] >> 4]);
    s.push_back(digits[bytes[i] & 15]);
  }
  return s;
}

std::unique_ptr<PackFile> PackFile::open(const std::string &path, ValidationLevel level) {
  return parse(std::make_shared<FileSource>(path), level);
}

std::unique_ptr<PackFile> PackFile::parse(std::shared_ptr<const ByteSource> source, ValidationLevel level) {
  std::unique_ptr<PackFile> pack(new PackFile());
  pack->source_ = std::move(source);
  pack->parse_and_check(level);
  return pack;
}

namespace {

bool is_power_of_two(uint64_t v) { return v && (v & (v - 1)) == 0; }

std::string_view string_at(const std::vector<uint8_t> &table, uint32_t offset, const std::string &file,
                           size_t entry, const char *field) {
  if (offset >= table.size())
    fail(Status::format, "{}: index entry {}: {} string offset {} is past the string table ({} bytes)", file,
         entry, field, offset, table.size());
  const auto *begin = reinterpret_cast<const char *>(table.data()) + offset;
  return std::string_view(begin, strnlen(begin, table.size() - offset));
}

}  // namespace

void PackFile::parse_and_check(ValidationLevel level) {
  const ByteSource &src = *source_;
  const std::string &file = src.name();
  const uint64_t actual_size = src.size();
  PackHeader &h = header_;
  std::memset(&h, 0, sizeof h);

  // Fields are checked in the order a reader of another version can rely on: magic, version,
  // struct sizes, then the checksum of the rest.
  if (actual_size < sizeof h.magic)
    fail(Status::format, "{}: truncated file: {} bytes, a pack header needs {}", file, actual_size, sizeof h);
  src.read(0, h.magic, sizeof h.magic);
  if (std::memcmp(h.magic, kPackMagic.data(), kPackMagic.size()) != 0)
    fail(Status::format, "{}: bad magic at offset 0: expected {}, found {} (not an Expert Pack)", file,
         to_hex(kPackMagic.data(), 8), to_hex(h.magic, 8));
  if (actual_size < 24)
    fail(Status::format, "{}: truncated file: {} bytes, a pack header needs {}", file, actual_size, sizeof h);
  src.read(8, &h.version, 4);
  if (h.version != kPackVersion)
    fail(Status::version, "{}: unsupported version {} at offset 8 (this library reads Expert Pack version {})",
         file, h.version, kPackVersion);
  src.read(12, &h.header_size, 4);
  src.read(16, &h.entry_size, 4);
  if (h.header_size != sizeof(PackHeader))
    fail(Status::struct_size, "{}: wrong struct size: header_size at offset 12 is {}, expected {}", file,
         h.header_size, sizeof(PackHeader));
  if (h.entry_size != sizeof(PackEntry))
    fail(Status::struct_size, "{}: wrong struct size: entry_size at offset 16 is {}, expected {}", file,
         h.entry_size, sizeof(PackEntry));
  if (actual_size < sizeof h)
    fail(Status::format, "{}: truncated file: {} bytes, a pack header needs {}", file, actual_size, sizeof h);
  src.read(0, &h, sizeof h);
  const uint64_t header_hash = xxh3_64(&h, kPackHeaderHashedBytes);
  if (header_hash != h.header_xxh3)
    fail(Status::corrupt, "{}: header checksum mismatch at offset {}: stored {:016x}, computed {:016x}", file,
         kPackHeaderHashedBytes, h.header_xxh3, header_hash);
  if (h.flags & ~kPackKnownFlags)
    fail(Status::unsupported, "{}: unsupported flags {:#x} at offset 20 (this library knows {:#x})", file, h.flags,
         kPackKnownFlags);
  const bool striped = (h.flags & kPackFlagStriped) != 0;
  if (!striped && (h.num_parts != 0 || h.parts_string != 0))
    fail(Status::format, "{}: reserved header bytes at offset 232 are not zero (num_parts {}, parts_string {} without the striped flag)",
         file, h.num_parts, h.parts_string);
  const bool source_objects = (h.flags & kPackFlagSourceObjects) != 0;
  if (striped && source_objects)
    fail(Status::format, "{}: flags {:#x} at offset 20: a source index (bit 1) cannot be striped (bit 0)", file, h.flags);
  if (striped && (h.num_parts < 2 || h.num_parts > kPackMaxParts))
    fail(Status::format, "{}: striped pack: num_parts at offset 232 is {}, expected 2..{}", file, h.num_parts, kPackMaxParts);
  for (uint8_t b : h.reserved) {
    if (b) fail(Status::format, "{}: reserved header bytes at offset 240 are not zero", file);
  }
  if (h.num_roles != kPackNumRoles)
    fail(Status::format, "{}: num_roles at offset 32 is {}, expected {}", file, h.num_roles, kPackNumRoles);
  if (h.num_layers == 0 || h.num_experts == 0)
    fail(Status::format, "{}: empty pack: num_layers {} num_experts {}", file, h.num_layers, h.num_experts);
  if (!is_power_of_two(h.alignment) || h.alignment < kPackMinAlignment || h.alignment > kPackMaxAlignment)
    fail(Status::format, "{}: alignment at offset 40 is {}, expected a power of two in [{}, {}]", file, h.alignment,
         kPackMinAlignment, kPackMaxAlignment);
  if (h.data_start % h.alignment != 0)
    fail(Status::format, "{}: misaligned offset: data_start {} is not a multiple of the alignment {}", file,
         h.data_start, h.alignment);
  if (h.object_stride == 0 || h.object_stride % h.alignment != 0)
    fail(Status::format, "{}: misaligned offset: object_stride {} is not a positive multiple of the alignment {}",
         file, h.object_stride, h.alignment);
  if (actual_size < h.file_size)
    fail(Status::format, "{}: truncated file: {} bytes, the header says {}", file, actual_size, h.file_size);
  if (actual_size != h.file_size)
    fail(Status::format, "{}: file has {} bytes but the header says {} (trailing bytes)", file, actual_size,
         h.file_size);

  const uint64_t num_objects = checked_mul(h.num_layers, h.num_experts, "num_layers * num_experts");
  const uint64_t num_entries = checked_mul(num_objects, kPackNumRoles, "entry count");
  const uint64_t data_bytes = checked_mul(num_objects, h.object_stride, "objects * object_stride");
  const uint64_t data_end = checked_add(h.data_start, data_bytes, "data_start + data bytes");
  if (striped && h.file_size != h.data_start)
    fail(Status::format, "{}: a striped pack ends at data_start {} (its objects are in the parts), but the file size field is {}",
         file, h.data_start, h.file_size);
  if (source_objects && h.file_size != h.data_start)
    fail(Status::format, "{}: a source index ends at data_start {} (its payloads are in the sources), but the file size field is {}",
         file, h.data_start, h.file_size);
  if (!striped && !source_objects && data_end != h.file_size)
    fail(Status::format, "{}: {} objects of {} bytes from offset {} end at {}, but the file size field is {}", file,
         num_objects, h.object_stride, h.data_start, data_end, h.file_size);
  if (h.index_offset < sizeof(PackHeader))
    fail(Status::format, "{}: index_offset {} overlaps the header", file, h.index_offset);
  if (h.index_size != checked_mul(num_entries, sizeof(PackEntry), "index size"))
    fail(Status::format, "{}: index_size {} at offset 72, expected {} entries of {} bytes", file, h.index_size,
         num_entries, sizeof(PackEntry));
  const uint64_t index_end = checked_add(h.index_offset, h.index_size, "index end");
  const uint64_t strings_end = checked_add(h.strings_offset, h.strings_size, "string table end");
  if (h.strings_offset < index_end || strings_end > h.data_start)
    fail(Status::format, "{}: index [{}, {}) and string table [{}, {}) must lie in order before data_start {}",
         file, h.index_offset, index_end, h.strings_offset, strings_end, h.data_start);

  // Sizes are bounded by the (verified) file size, so these allocations are safe.
  const std::vector<uint8_t> index = src.read_vector(h.index_offset, static_cast<size_t>(h.index_size));
  strings_ = src.read_vector(h.strings_offset, static_cast<size_t>(h.strings_size));
  const std::vector<uint8_t> &strings = strings_;
  Sha256Hasher digest;
  digest.update(index.data(), index.size());
  digest.update(strings.data(), strings.size());
  const Sha256 index_sha = digest.finish();
  if (std::memcmp(index_sha.data(), h.index_sha256, 32) != 0)
    fail(Status::corrupt, "{}: index digest mismatch: the index at offset {} hashes to {}, the header says {}", file,
         h.index_offset, hex(index_sha), to_hex(h.index_sha256, 32));
  if (!strings.empty() && strings.back() != 0)
    fail(Status::format, "{}: the string table at offset {} does not end with NUL", file, h.strings_offset);
  if (striped) {
    open_parts();
  } else if (source_objects) {
    data_files_.clear();  // the sources, once the entries are read
    data_sources_.clear();
  } else {
    data_files_ = {file};
    data_sources_ = {source_};
  }

  entries_.clear();
  entries_.reserve(static_cast<size_t>(num_entries));
  object_bytes_.assign(static_cast<size_t>(num_objects), 0);
  max_object_bytes_ = 0;
  for (uint64_t i = 0; i < num_entries; ++i) {
    PackEntry e;
    std::memcpy(&e, index.data() + i * sizeof(PackEntry), sizeof e);
    const uint64_t entry_off = h.index_offset + i * sizeof(PackEntry);
    const uint64_t obj = i / kPackNumRoles;
    const uint32_t want_layer = static_cast<uint32_t>(obj / h.num_experts);
    const uint32_t want_expert = static_cast<uint32_t>(obj % h.num_experts);
    const uint32_t want_role = static_cast<uint32_t>(i % kPackNumRoles);
    if (e.layer != want_layer || e.expert != want_expert || e.role != want_role)
      fail(Status::format, "{}: index entry {} at offset {} is (layer {}, expert {}, role {}), expected ({}, {}, {})",
           file, i, entry_off, e.layer, e.expert, e.role, want_layer, want_expert, want_role);
    const char *rname = role_name(static_cast<Role>(e.role)).data();
    auto info = ggml_type_info(e.ggml_type);
    if (!info)
      fail(Status::unsupported, "{}: unsupported dtype: index entry {} (layer {}, expert {}, {}) at offset {} has ggml type id {}",
           file, i, e.layer, e.expert, rname, entry_off, e.ggml_type);
    if (e.n_dims < 1 || e.n_dims > 4)
      fail(Status::shape, "{}: shape mismatch: index entry {} (layer {}, expert {}, {}) has n_dims {}", file, i,
           e.layer, e.expert, rname, e.n_dims);
    if (e.source_layout > static_cast<uint32_t>(SourceLayout::fp4_e8m0) ||
        (e.source_layout == static_cast<uint32_t>(SourceLayout::fp4_e8m0) && e.ggml_type != static_cast<uint32_t>(GgmlType::mxfp4)))
      fail(Status::format, "{}: index entry {} at offset {}: source layout {} is not one this reader knows for ggml type {}", file, i,
           entry_off, e.source_layout, e.ggml_type);
    uint64_t rows = 1;
    bool shape_ok = e.ne[0] > 0 && e.ne[0] % info->block_elems == 0;
    for (uint32_t d = 1; d < 4 && shape_ok; ++d) {
      if (d >= e.n_dims && e.ne[d] != 1) shape_ok = false;
      if (e.ne[d] == 0 || __builtin_mul_overflow(rows, e.ne[d], &rows)) shape_ok = false;
    }
    uint64_t expect_bytes = 0;
    if (shape_ok && __builtin_mul_overflow(e.ne[0] / info->block_elems * info->block_bytes, rows, &expect_bytes))
      shape_ok = false;
    if (!shape_ok || expect_bytes != e.nbytes)
      fail(Status::shape,
           "{}: shape mismatch: index entry {} (layer {}, expert {}, {}): {} [{}, {}, {}, {}] needs {} bytes, entry says {}",
           file, i, e.layer, e.expert, rname, info->name, e.ne[0], e.ne[1], e.ne[2], e.ne[3], expect_bytes, e.nbytes);
    if (e.expert > 0) {
      const RoleEntry &first = entries_[static_cast<size_t>(i - static_cast<uint64_t>(e.expert) * kPackNumRoles)];
      if (static_cast<uint32_t>(first.type) != e.ggml_type || first.n_dims != e.n_dims ||
          !std::equal(first.ne.begin(), first.ne.end(), e.ne))
        fail(Status::shape, "{}: shape mismatch: layer {} expert {} {} is {} [{}, {}, {}, {}], expert 0 is {} [{}, {}, {}, {}]",
             file, e.layer, e.expert, rname, info->name, e.ne[0], e.ne[1], e.ne[2], e.ne[3],
             ggml_type_info(static_cast<uint32_t>(first.type))->name, first.ne[0], first.ne[1], first.ne[2], first.ne[3]);
    }
    // pack_offset is the place in an unstriped file (the index is the same either way).
    const uint64_t obj_off = h.data_start + obj * h.object_stride;
    const uint64_t in_obj = e.role == 0 ? 0 : align_up(object_bytes_[static_cast<size_t>(obj)], kPackRoleAlignment);
    if (e.pack_offset != obj_off + in_obj)
      fail(Status::format, "{}: misaligned offset: index entry {} (layer {}, expert {}, {}) has pack offset {}, expected {}",
           file, i, e.layer, e.expert, rname, e.pack_offset, obj_off + in_obj);
    const uint64_t end_in_obj = checked_add(in_obj, e.nbytes, "payload end");
    if (end_in_obj > h.object_stride)
      fail(Status::format, "{}: index entry {} (layer {}, expert {}, {}) ends {} bytes into its object, past the stride {}",
           file, i, e.layer, e.expert, rname, end_in_obj, h.object_stride);
    object_bytes_[static_cast<size_t>(obj)] = end_in_obj;
    max_object_bytes_ = std::max(max_object_bytes_, end_in_obj);

    RoleEntry r;
    r.role = static_cast<Role>(e.role);
    r.type = info->type;
    r.n_dims = e.n_dims;
    std::copy(std::begin(e.ne), std::end(e.ne), r.ne.begin());
    r.offset_in_object = in_obj;
    r.file = striped ? static_cast<uint32_t>(obj % h.num_parts) : 0;
    r.file_offset = striped ? (obj / h.num_parts) * h.object_stride + in_obj : e.pack_offset;
    r.nbytes = e.nbytes;
    r.xxh3 = e.payload_xxh3;
    std::memcpy(r.source_sha256.data(), e.source_sha256, 32);
    r.source_file = string_at(strings, e.source_file, file, static_cast<size_t>(i), "source file");
    r.source_tensor = string_at(strings, e.source_tensor, file, static_cast<size_t>(i), "source tensor");
    r.source_offset = e.source_offset;
    r.source_layout = static_cast<SourceLayout>(e.source_layout);
    // fp4_e8m0: MXFP4's 17 bytes per 32 values are 16 of packed values and 1 scale in the source.
    const bool fp4 = r.source_layout == SourceLayout::fp4_e8m0;
    r.source_bytes = fp4 ? r.nbytes / 17 * 16 : r.nbytes;
    r.scale_bytes = fp4 ? r.nbytes / 17 : 0;
    entries_.push_back(std::move(r));
  }
  if (source_objects) open_sources();

  if (level == ValidationLevel::sampled) verify_payloads(sample_objects());
  if (level == ValidationLevel::full) verify_payloads({});
}

size_t PackFile::entry_index(uint32_t layer, uint32_t expert, Role role) const {
  if (layer >= header_.num_layers || expert >= header_.num_experts || static_cast<uint32_t>(role) >= kPackNumRoles)
    fail(Status::invalid_argument, "{}: (layer {}, expert {}, role {}) is out of range ({} layers, {} experts)", path(),
         layer, expert, static_cast<uint32_t>(role), header_.num_layers, header_.num_experts);
  return (static_cast<size_t>(layer) * header_.num_experts + expert) * kPackNumRoles + static_cast<size_t>(role);
}

uint64_t PackFile::object_offset(uint32_t layer, uint32_t expert) const {
  const size_t first = entry_index(layer, expert, Role::gate);
  if (source_objects()) return entries_[first].file_offset;
  const uint64_t obj = static_cast<uint64_t>(layer) * header_.num_experts + expert;
  if (header_.num_parts) return obj / header_.num_parts * header_.object_stride;
  return header_.data_start + obj * header_.object_stride;
}

uint32_t PackFile::object_file(uint32_t layer, uint32_t expert) const {
  const size_t first = entry_index(layer, expert, Role::gate);
  if (source_objects()) return entries_[first].file;
  if (!header_.num_parts) return 0;
  return static_cast<uint32_t>((static_cast<uint64_t>(layer) * header_.num_experts + expert) % header_.num_parts);
}

void PackFile::open_parts() {
  const PackHeader &h = header_;
  const std::string &file = path();
  const uint64_t num_objects = static_cast<uint64_t>(h.num_layers) * h.num_experts;
  const std::filesystem::path dir = std::filesystem::path(file).parent_path();
  uint64_t at = h.parts_string;
  data_files_.clear();
  data_sources_.clear();
  for (uint32_t k = 0; k < h.num_parts; ++k) {
    if (at >= strings_.size())
      fail(Status::format, "{}: striped pack: the path of part {} of {} (string-table offset {}) is past the string table ({} bytes)",
           file, k, h.num_parts, at, strings_.size());
    const auto *begin = reinterpret_cast<const char *>(strings_.data()) + at;
    const std::string name(begin, strnlen(begin, strings_.size() - at));
    at += name.size() + 1;
    if (name.empty()) fail(Status::format, "{}: striped pack: part {} has an empty path", file, k);
    const std::filesystem::path p(name);
    const std::string part = (p.is_absolute() ? p : dir / p).lexically_normal().string();
    std::shared_ptr<const ByteSource> src;
    try {
      src = std::make_shared<FileSource>(part);
    } catch (const Error &e) {
      fail(e.status(), "{}: part {} of {} ({}) cannot be opened: {}", file, k, h.num_parts,
           part, e.what());
    }
    const uint64_t objects = num_objects > k ? (num_objects - k + h.num_parts - 1) / h.num_parts : 0;
    const uint64_t want = objects * h.object_stride;
    if (src->size() != want)
      fail(Status::format, "{}: part {} of {} ({}) has {} bytes, expected {} ({} objects of {} bytes)", file, k, h.num_parts, part,
           src->size(), want, objects, h.object_stride);
    data_files_.push_back(part);
    data_sources_.push_back(std::move(src));
  }
}

void PackFile::open_sources() {
  const std::string &file = path();
  auto where = [&](size_t i) {
    const RoleEntry &r = entries_[i];
    return fmt::format("layer {} expert {} {} (tensor '{}')", i / kPackNumRoles / header_.num_experts,
                       i / kPackNumRoles % header_.num_experts, role_name(r.role), r.source_tensor);
  };
  // The sources, in order of first use.
  for (size_t i = 0; i < entries_.size(); ++i) {
    RoleEntry &r = entries_[i];
    const std::string src(r.source_file);
    auto it = std::find(data_files_.begin(), data_files_.end(), src);
    if (it == data_files_.end()) {
      std::shared_ptr<const ByteSource> bs;
      try {
        bs = std::make_shared<FileSource>(src);
      } catch (const Error &e) {
        fail(e.status(), "{}: source file {} cannot be opened: {}", file, src, e.what());
      }
      data_files_.push_back(src);
      data_sources_.push_back(std::move(bs));
      it = data_files_.end() - 1;
    }
    r.file = static_cast<uint32_t>(it - data_files_.begin());
    r.file_offset = r.source_offset;
  }
  // FP4 roles: their scale tensors, in their own source or another one (the sources' safetensors
  // headers, parsed once each when first needed), or in a shard that the checkpoint's index lists
  // and no role's values are in (it becomes a data file too).
  // headers[f] and parsed[f] are data file f's.
  std::vector<std::unique_ptr<SafetensorsFile>> headers;
  std::vector<const SafetensorsFile *> parsed;
  auto parse = [&](size_t f, size_t i) {
    try {
      headers.push_back(std::make_unique<SafetensorsFile>(SafetensorsFile::parse(data_sources_[f])));
    } catch (const Error &e) {
      fail(e.status(), "{}: source index: {} is FP4 with separate scales, and {} does not parse as safetensors: {}", file, where(i),
           data_files_[f], e.what());
    }
    return headers.back().get();
  };
  for (size_t i = 0; i < entries_.size(); ++i) {
    RoleEntry &r = entries_[i];
    if (r.source_layout == SourceLayout::fp4_e8m0) {
      if (parsed.empty())
        for (size_t f = 0; f < data_files_.size(); ++f) parsed.push_back(parse(f, i));
      auto add_shard = [&](const std::string &path) {
        try {
          data_sources_.push_back(std::make_shared<FileSource>(path));
        } catch (const Error &e) {
          fail(e.status(), "{}: source index: the shard {} holding the scales of {} cannot be opened: {}", file, path, where(i),
               e.what());
        }
        data_files_.push_back(path);
        return parse(data_files_.size() - 1, i);
      };
      const std::string scale_name = fp4_scale_tensor_name(std::string(r.source_tensor));
      const auto sc = find_fp4_scale(parsed, r.file, std::string(r.source_tensor), add_shard);
      if (!sc)
        fail(Status::format, "{}: source index: {}: {} (nor another source of the index) has no scale tensor '{}' for the FP4 "
             "tensor '{}'", file, where(i), data_files_[r.file], scale_name, r.source_tensor);
      if (sc->tensor->nbytes != r.scale_bytes)
        fail(Status::shape, "{}: source index: {}: scale tensor '{}' of {} has {} bytes, the {}-byte MXFP4 payload needs {}", file,
             where(i), scale_name, data_files_[sc->file], sc->tensor->nbytes, r.nbytes, r.scale_bytes);
      r.scale_file = static_cast<uint32_t>(sc->file);
      r.scale_offset = sc->tensor->file_offset;
    }
    const uint64_t size = data_sources_[r.file]->size();
    if (r.source_offset > size || r.source_bytes > size - r.source_offset)
      fail(Status::format, "{}: truncated source: {} has {} bytes, {} lies at [{}, {})", file, data_files_[r.file], size, where(i),
           r.source_offset, r.source_offset + r.source_bytes);
    const uint64_t scale_size = data_sources_[r.scale_file]->size();
    if (r.scale_bytes && (r.scale_offset > scale_size || r.scale_bytes > scale_size - r.scale_offset))
      fail(Status::format, "{}: truncated source: {} has {} bytes, the scales of {} lie at [{}, {})", file,
           data_files_[r.scale_file], scale_size, where(i), r.scale_offset, r.scale_offset + r.scale_bytes);
  }
}

uint64_t PackFile::object_bytes(uint32_t layer, uint32_t expert) const {
  entry_index(layer, expert, Role::gate);
  return object_bytes_[static_cast<size_t>(layer) * header_.num_experts + expert];
}

const RoleEntry &PackFile::entry(uint32_t layer, uint32_t expert, Role role) const {
  return entries_[entry_index(layer, expert, role)];
}

std::vector<std::pair<uint32_t, uint32_t>> PackFile::sample_objects() const {
  const uint64_t n = static_cast<uint64_t>(header_.num_layers) * header_.num_experts;
  constexpr uint64_t kSpread = 14;
  std::vector<uint64_t> picks = {0, n - 1};
  // A multiplicative spread (golden ratio) so the sample is not stuck on one expert column.
  for (uint64_t k = 1; k <= kSpread && k < n; ++k) picks.push_back((k * 0x9E3779B97F4A7C15ull) % n);
  std::sort(picks.begin(), picks.end());
  picks.erase(std::unique(picks.begin(), picks.end()), picks.end());
  std::vector<std::pair<uint32_t, uint32_t>> out;
  for (uint64_t p : picks)
    out.emplace_back(static_cast<uint32_t>(p / header_.num_experts), static_cast<uint32_t>(p % header_.num_experts));
  return out;
}

void PackFile::verify_payloads(const std::vector<std::pair<uint32_t, uint32_t>> &objects) const {
  std::vector<uint8_t> buffer;
  auto check = [&](uint32_t layer, uint32_t expert) {
    for (uint32_t r = 0; r < kPackNumRoles; ++r) {
      const RoleEntry &e = entry(layer, expert, static_cast<Role>(r));
      uint64_t got = 0;
      if (e.source_layout == SourceLayout::fp4_e8m0 && source_objects()) {
        // Re-laid from the source's values and scales, as the store does when it reads them.
        const std::vector<uint8_t> values = data_sources_[e.file]->read_vector(e.file_offset, static_cast<size_t>(e.source_bytes));
        const std::vector<uint8_t> scales =
            data_sources_[e.scale_file]->read_vector(e.scale_offset, static_cast<size_t>(e.scale_bytes));
        buffer.resize(static_cast<size_t>(e.nbytes));
        fp4_e8m0_to_mxfp4(values.data(), scales.data(), e.ne[1] * e.ne[2] * e.ne[3], e.ne[0], buffer.data(),
                          fmt::format("{}: layer {} expert {} {} (tensor '{}' at offset {}, scales at offset {} of {})", data_files_[e.file],
                                      layer, expert, role_name(e.role), e.source_tensor, e.file_offset, e.scale_offset,
                                      data_files_[e.scale_file]));
        got = xxh3_64(buffer.data(), buffer.size());
      } else {
        Xxh3Hasher hasher;
        constexpr uint64_t kChunk = 8u << 20;
        for (uint64_t done = 0; done < e.nbytes;) {
          const size_t n = static_cast<size_t>(std::min(kChunk, e.nbytes - done));
          buffer.resize(n);
          data_sources_[e.file]->read(e.file_offset + done, buffer.data(), n);
          hasher.update(buffer.data(), n);
          done += n;
        }
        got = hasher.finish();
      }
      if (got != e.xxh3)
        fail(Status::corrupt, "{}: payload hash mismatch: layer {} expert {} {} at offset {} ({} bytes) hashes to {:016x}, the index says {:016x}",
             data_files_[e.file], layer, expert, role_name(e.role), e.file_offset, e.nbytes, got, e.xxh3);
    }
  };
  if (objects.empty()) {
    for (uint32_t l = 0; l < header_.num_layers; ++l)
      for (uint32_t x = 0; x < header_.num_experts; ++x) check(l, x);
  } else {
    for (auto [l, x] : objects) check(l, x);
  }
}

}  // namespace ep::format
