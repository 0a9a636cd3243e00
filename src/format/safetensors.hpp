// safetensors reader: the 8-byte header length, the JSON header (dtype, shape, data_offsets,
// __metadata__), and sharded checkpoints through model.safetensors.index.json. Offsets and
// sizes are checked against the file and against shape x dtype size.
#pragma once

#include "format/byte_source.hpp"

#include <cstdint>
#include <functional>
#include <span>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ep::format {

enum class StDtype { f64, f32, f16, bf16, f8_e4m3, f8_e5m2, f8_e8m0, i8, u8, i16, u16, i32, u32, i64, u64, boolean };
/// Bytes per element.
size_t st_dtype_size(StDtype dtype) noexcept;
std::string_view st_dtype_name(StDtype dtype) noexcept;
/// Parses "F32", "BF16", "F8_E4M3", "F8_E8M0" ...; nullopt for a dtype this reader does not know.
std::optional<StDtype> st_dtype_from_name(std::string_view name) noexcept;

struct StTensorInfo {
  std::string name;
  StDtype dtype = StDtype::u8;
  std::vector<uint64_t> shape;  ///< row-major, outermost first (PyTorch order)
  uint64_t file_offset = 0;     ///< absolute offset of the data in its file
  uint64_t nbytes = 0;
};

class SafetensorsFile {
 public:
  static SafetensorsFile parse(std::shared_ptr<const ByteSource> source);
  static SafetensorsFile open(const std::string &path);

  const std::string &path() const { return source_->name(); }
  uint64_t header_bytes() const { return header_bytes_; }  ///< 8 + JSON length
  const std::vector<StTensorInfo> &tensors() const { return tensors_; }
  const StTensorInfo *find(std::string_view name) const;
  const std::map<std::string, std::string> &metadata() const { return metadata_; }
  const ByteSource &source() const { return *source_; }

 private:
  std::shared_ptr<const ByteSource> source_;
  uint64_t header_bytes_ = 0;
  std::vector<StTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> index_;
  std::map<std::string, std::string> metadata_;
};

/// A checkpoint: one .safetensors file, or the shards listed by model.safetensors.index.json.
class SafetensorsSet {
 public:
  /// @p path: a safetensors file, an index (a weight_map JSON), or a directory holding
  /// model.safetensors.index.json or model.safetensors. Files are recognised by their bytes,
  /// whatever their names; anything else is Error(Status::format) naming it.
  static SafetensorsSet open(const std::string &path);
  /// A set of already parsed files (the fuzzer, tests).
  static SafetensorsSet of(std::vector<SafetensorsFile> files) {
    SafetensorsSet s;
    s.files_ = std::move(files);
    return s;
  }
  /// Parses an index JSON (weight_map) from memory: tensor name -> shard file name.
  static std::map<std::string, std::string> parse_index(const std::string &json_text, const std::string &name);

  const std::vector<SafetensorsFile> &files() const { return files_; }
  struct Located {
    const SafetensorsFile *file;
    const StTensorInfo *info;
  };
  std::optional<Located> find(std::string_view name) const;

 private:
  std::vector<SafetensorsFile> files_;
};

/// One tensor for write_safetensors().
struct StWriteTensor {
  std::string name;
  StDtype dtype = StDtype::bf16;
  std::vector<uint64_t> shape;
};
/// Fills @p out with bytes [offset, offset + out.size()) of tensor @p tensor.
using StFill = std::function<void(size_t tensor, uint64_t offset, std::span<uint8_t> out)>;
/// Writes a safetensors file, streaming tensor bytes from @p fill (constant memory). The JSON
/// header is padded with spaces to a multiple of 8 bytes.
void write_safetensors(const std::string &path, const std::vector<StWriteTensor> &tensors, const StFill &fill,
                       const std::map<std::string, std::string> &metadata = {});

}  // namespace ep::format
