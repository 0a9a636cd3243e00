// GGUF v2/v3 reader: metadata (all 13 value types, nested arrays), tensor infos in ggml dim
// order, general.alignment, and split sets (name-00001-of-00003.gguf). Every count, length and
// offset is bounds-checked against the file size with overflow-safe arithmetic, so a hostile
// file gives an ep::Error (naming the file and offset), never a crash or a huge allocation.
#pragma once

#include "format/byte_source.hpp"
#include "format/ggml_type.hpp"

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ep::format {

/// GGUF metadata value types (gguf.h numbering).
enum class GgufType : uint32_t {
  u8 = 0, i8 = 1, u16 = 2, i16 = 3, u32 = 4, i32 = 5, f32 = 6, boolean = 7, string = 8, array = 9,
  u64 = 10, i64 = 11, f64 = 12,
};
std::string_view gguf_type_name(GgufType type) noexcept;

/// One metadata value. Scalars keep their GGUF type; integers are stored widened. Arrays are
/// stored compactly (numeric/bool elements as their little-endian bytes, strings as strings,
/// nested arrays as values) so a hostile element count cannot blow up memory.
struct GgufValue {
  GgufType type = GgufType::u32;
  uint64_t u = 0;                       ///< u8/u16/u32/u64/bool
  int64_t i = 0;                        ///< i8/i16/i32/i64
  double f = 0;                         ///< f32/f64
  std::string s;                        ///< string
  GgufType elem_type = GgufType::u8;    ///< arrays: element type
  std::vector<uint8_t> raw;             ///< arrays of numbers/bools: element bytes
  std::vector<std::string> strings;     ///< arrays of strings
  std::vector<GgufValue> arrays;        ///< arrays of arrays

  static GgufValue make_u8(uint8_t v) { GgufValue x; x.type = GgufType::u8; x.u = v; return x; }
  static GgufValue make_i8(int8_t v) { GgufValue x; x.type = GgufType::i8; x.i = v; return x; }
  static GgufValue make_u16(uint16_t v) { GgufValue x; x.type = GgufType::u16; x.u = v; return x; }
  static GgufValue make_i16(int16_t v) { GgufValue x; x.type = GgufType::i16; x.i = v; return x; }
  static GgufValue make_u32(uint32_t v) { GgufValue x; x.type = GgufType::u32; x.u = v; return x; }
  static GgufValue make_i32(int32_t v) { GgufValue x; x.type = GgufType::i32; x.i = v; return x; }
  static GgufValue make_u64(uint64_t v) { GgufValue x; x.type = GgufType::u64; x.u = v; return x; }
  static GgufValue make_i64(int64_t v) { GgufValue x; x.type = GgufType::i64; x.i = v; return x; }
  static GgufValue make_f32(float v) { GgufValue x; x.type = GgufType::f32; x.f = v; return x; }
  static GgufValue make_f64(double v) { GgufValue x; x.type = GgufType::f64; x.f = v; return x; }
  static GgufValue make_bool(bool v) { GgufValue x; x.type = GgufType::boolean; x.u = v; return x; }
  static GgufValue make_string(std::string v) { GgufValue x; x.type = GgufType::string; x.s = std::move(v); return x; }
  /// An array from element values, which must all have type @p elem.
  static GgufValue make_array(GgufType elem, const std::vector<GgufValue> &elems);

  /// Number of elements of an array (0 for scalars).
  size_t array_size() const;
  /// Element @p index of an array as a value.
  GgufValue at(size_t index) const;
  bool is_integer() const;
  /// The value as an unsigned integer; throws Status::format if it is not a non-negative integer.
  uint64_t as_uint(std::string_view context) const;
  /// Any integer (booleans as 0 / 1) as int64_t; throws Status::format naming @p context otherwise.
  int64_t as_int(std::string_view context) const;
  /// A float, or an integer converted; throws Status::format naming @p context otherwise.
  double as_float(std::string_view context) const;
  /// A short text form for listings (arrays abbreviated).
  std::string to_string(size_t max_elems = 8) const;
  bool operator==(const GgufValue &o) const;
};
/// Bytes of one numeric/bool element (0 for string/array).
size_t gguf_scalar_size(GgufType type) noexcept;

struct GgufTensorInfo {
  std::string name;
  uint32_t n_dims = 0;
  std::array<uint64_t, 4> ne{1, 1, 1, 1};  ///< ggml order; unused dims 1
  GgmlType type = GgmlType::f32;
  uint64_t offset = 0;        ///< relative to the data section, as stored
  uint64_t file_offset = 0;   ///< absolute offset in its file
  uint64_t nbytes = 0;
  uint64_t info_offset = 0;   ///< where the tensor info sits in the file (for messages)
};

/// One parsed GGUF file.
class GgufFile {
 public:
  /// Parses a file from any source (memory buffers for the fuzzers).
  static GgufFile parse(std::shared_ptr<const ByteSource> source);
  static GgufFile open(const std::string &path);

  const std::string &path() const { return source_->name(); }
  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }
  uint64_t file_size() const { return source_->size(); }
  const std::vector<std::pair<std::string, GgufValue>> &metadata() const { return kv_; }
  const std::vector<GgufTensorInfo> &tensors() const { return tensors_; }
  const GgufValue *find(std::string_view key) const;
  const GgufTensorInfo *find_tensor(std::string_view name) const;
  const ByteSource &source() const { return *source_; }
  std::shared_ptr<const ByteSource> source_ptr() const { return source_; }

 private:
  std::shared_ptr<const ByteSource> source_;
  uint32_t version_ = 0;
  uint32_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

/// A whole GGUF model: one file, or every shard of a split set found from any shard's path.
class GgufSet {
 public:
  /// Opens @p path; if it is a shard (`-0000N-of-0000M.gguf`) or carries split.count > 1, all
  /// shards are opened and checked (split.no, split.count, split.tensors.count). A missing or
  /// inconsistent shard is an error naming it.
  static GgufSet open(const std::string &path);

  const std::vector<GgufFile> &shards() const { return shards_; }
  /// Metadata of the first shard (llama.cpp keeps the model metadata there).
  const GgufFile &first() const { return shards_.front(); }
  const GgufValue *find(std::string_view key) const { return shards_.front().find(key); }
  struct Located {
    const GgufFile *file;
    const GgufTensorInfo *info;
  };
  /// A tensor by name in any shard, or nullopt.
  std::optional<Located> find_tensor(std::string_view name) const;
  size_t tensor_count() const;

 private:
  std::vector<GgufFile> shards_;
};

/// Splits "dir/name-00002-of-00003.gguf" into ("dir/name", 2, 3); nullopt if not a shard name.
struct SplitName {
  std::string prefix;
  uint32_t index;
  uint32_t count;
};
std::optional<SplitName> parse_split_name(const std::string &path);
/// "prefix-0000N-of-0000M.gguf" (N is 1-based).
std::string split_path(const std::string &prefix, uint32_t index, uint32_t count);

}  // namespace ep::format
