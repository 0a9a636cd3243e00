// PackFile: the Expert Pack v1 reader. THIS IS THE INTERFACE THE STORE (src/store, src/io)
// READS PACKS THROUGH: open() validates the structure (and optionally payload hashes); then the
// store asks object_offset()/object_bytes() for the one O_DIRECT read of an expert, and
// entry() for the dtype/shape/offset of each role inside that object.
//
// Layout facts the store may rely on (docs/pack-format.md):
//   - object_offset(l, e) = data_start + (l * num_experts + e) * object_stride, a multiple of
//     alignment(); object_stride is a multiple of alignment() (4096 by default), so a whole
//     object can be read with O_DIRECT as [object_offset, object_offset + object_stride).
//   - Inside an object: gate, then up, then down, each starting at a multiple of 256 bytes
//     (RoleEntry::offset_in_object); object_bytes() = end of down <= object_stride.
//   - Pack layer l is model block first_layer() + l.
//   - A striped pack (kPackFlagStriped) holds no objects itself: object i = l * num_experts + e
//     lies in part file i mod num_parts() at offset (i div num_parts()) * object_stride; the
//     object_* and RoleEntry::file_offset values are in that file (object_file(), data_files()).
//   - A source index (kPackFlagSourceObjects) holds no objects either: each role's payload is
//     read from its source file (data_files() are the sources, RoleEntry::file_offset =
//     source_offset); offset_in_object still says where it goes in the object a pack would
//     hold, and object_offset() / object_file() are those of the object's gate payload. A role
//     of SourceLayout::fp4_e8m0 is read as its packed FP4 values (source_bytes at file_offset)
//     and its E8M0 scales (scale_bytes at scale_offset of data file scale_file) and re-laid
//     into the MXFP4 payload (format/microscale.hpp) before its hash is checked.
// A PackFile is immutable after open() and safe to share between threads.
#pragma once

#include "format/byte_source.hpp"
#include "format/ggml_type.hpp"
#include "format/pack_format.hpp"

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace ep::format {

/// How much open() checks.
enum class ValidationLevel {
  structure,  ///< header, struct sizes, counts, alignment, index digest, every entry's bounds
  sampled,    ///< structure + XXH3 of a deterministic sample of objects (the default)
  full,       ///< structure + XXH3 of every payload
};

/// One role of one expert, decoded from its index entry. Valid while its PackFile lives.
struct RoleEntry {
  Role role;
  GgmlType type;
  uint32_t n_dims;
  std::array<uint64_t, 4> ne;       ///< ggml order; unused dims are 1
  uint64_t offset_in_object;        ///< bytes from object_offset() to the payload
  uint64_t file_offset;             ///< absolute offset of the payload in its data file (data_files()[file])
  uint32_t file;                    ///< which data file holds it (0 unless striped)
  uint64_t nbytes;                  ///< payload bytes
  uint64_t xxh3;                    ///< XXH3-64 of the payload
  std::array<uint8_t, 32> source_sha256;
  std::string_view source_file;     ///< source file path recorded at build time (points into the PackFile)
  std::string_view source_tensor;   ///< source tensor name (points into the PackFile)
  uint64_t source_offset;           ///< absolute offset of the slice in the source file
  SourceLayout source_layout = SourceLayout::verbatim;  ///< how the payload comes from the source
  /// Source bytes at source_offset that make the payload: nbytes, or for an fp4_e8m0 role its
  /// packed FP4 values (nbytes · 16/17). A source index reads them at file_offset (= source_offset).
  uint64_t source_bytes = 0;
  /// An fp4_e8m0 role: the bytes of its E8M0 scales (nbytes / 17; else 0), the tensor
  /// fp4_scale_tensor_name(source_tensor). In a source index also where they lie: at
  /// scale_offset of data file scale_file (its own or another shard).
  uint64_t scale_bytes = 0;
  uint32_t scale_file = 0;
  uint64_t scale_offset = 0;
};

class PackFile {
 public:
  /// Opens and validates a pack file. Throws ep::Error with a one-line message naming the
  /// file and offset: Status::format (bad magic, truncated file, misaligned offset, bad
  /// field), Status::version, Status::struct_size, Status::corrupt (header checksum, index
  /// digest, payload hash), Status::unsupported (dtype, flags), Status::shape.
  static std::unique_ptr<PackFile> open(const std::string &path,
                                        ValidationLevel level = ValidationLevel::sampled);
  /// Parses and validates a pack held by any ByteSource (memory buffers for the fuzzers).
  /// The source must outlive the PackFile.
  static std::unique_ptr<PackFile> parse(std::shared_ptr<const ByteSource> source,
                                         ValidationLevel level = ValidationLevel::sampled);

  const std::string &path() const { return source_->name(); }
  const PackHeader &header() const { return header_; }
  uint32_t version() const { return header_.version; }
  uint32_t num_layers() const { return header_.num_layers; }
  uint32_t num_experts() const { return header_.num_experts; }
  uint32_t num_roles() const { return header_.num_roles; }
  uint32_t top_k() const { return header_.top_k; }
  uint32_t first_layer() const { return header_.first_layer; }
  uint64_t alignment() const { return header_.alignment; }
  uint64_t data_start() const { return header_.data_start; }
  uint64_t object_stride() const { return header_.object_stride; }
  uint64_t file_size() const { return header_.file_size; }

  /// Absolute offset of object (layer, expert) in its data file (object_file()). Throws
  /// Status::invalid_argument when out of range.
  uint64_t object_offset(uint32_t layer, uint32_t expert) const;
  /// The data file (index into data_files()) holding object (layer, expert).
  uint32_t object_file(uint32_t layer, uint32_t expert) const;
  /// The files the objects lie in: the pack file itself, or a striped pack's part files in part
  /// order (absolute paths, or relative to the pack's directory as recorded, resolved).
  const std::vector<std::string> &data_files() const { return data_files_; }
  /// True for a source index (kPackFlagSourceObjects): every payload is read from its source.
  bool source_objects() const { return (header_.flags & kPackFlagSourceObjects) != 0; }
  /// Part files of a striped pack (0 when the objects are in the pack file).
  uint32_t num_parts() const { return header_.num_parts; }
  /// Bytes of the object actually used (end of its down payload); <= object_stride().
  uint64_t object_bytes(uint32_t layer, uint32_t expert) const;
  /// The entry of one role of one expert.
  const RoleEntry &entry(uint32_t layer, uint32_t expert, Role role) const;
  /// All entries, in index order (layer, expert, role).
  const std::vector<RoleEntry> &entries() const { return entries_; }
  /// The largest object_bytes() of the pack.
  uint64_t max_object_bytes() const { return max_object_bytes_; }

  /// Hashes the payloads of the given objects (or, with an empty list, every object) and
  /// throws ep::Error(Status::corrupt, "...payload hash mismatch...") on the first mismatch.
  void verify_payloads(const std::vector<std::pair<uint32_t, uint32_t>> &objects) const;
  /// The deterministic sample open(sampled) checks: first, last and up to 14 spread objects.
  std::vector<std::pair<uint32_t, uint32_t>> sample_objects() const;

  /// The byte source the pack is read from (pread on the file).
  const ByteSource &source() const { return *source_; }
  /// The byte source of data file @p file (the pack's own source unless striped).
  const ByteSource &data_source(uint32_t file) const { return *data_sources_.at(file); }

 private:
  PackFile() = default;
  void parse_and_check(ValidationLevel level);
  size_t entry_index(uint32_t layer, uint32_t expert, Role role) const;

  void open_parts();
  void open_sources();

  std::shared_ptr<const ByteSource> source_;
  std::vector<std::string> data_files_;
  std::vector<std::shared_ptr<const ByteSource>> data_sources_;
  PackHeader header_{};
  std::vector<RoleEntry> entries_;
  std::vector<uint8_t> strings_;    // the string table; RoleEntry's string_views point here
  std::vector<uint64_t> object_bytes_;
  uint64_t max_object_bytes_ = 0;
};

/// Lower-case hex of a 32-byte digest.
std::string to_hex(const uint8_t *bytes, size_t n);

}  // namespace ep::format
