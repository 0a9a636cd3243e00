// Which format a path holds, decided by its bytes, never by its name: an Ollama blob
// (`sha256-<hex>`, no extension) is a GGUF like any other. A file that is neither a model format
// nor an Expert Pack is an error that names it and shows its first bytes.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace ep::format {

enum class FileFormat : uint8_t {
  unknown = 0,
  gguf,               ///< "GGUF" magic
  safetensors,        ///< u64 header length (1 byte .. 512 MiB), then a JSON object ('{')
  safetensors_index,  ///< JSON object with a "weight_map" object (model.safetensors.index.json)
  hf_config,          ///< JSON object with a "model_type" string and no "weight_map" (config.json)
  checkpoint_dir,     ///< a directory holding a config.json
  directory,          ///< any other directory
  expert_pack,        ///< an Expert Pack (format/pack_format.hpp magic)
};

/// "gguf", "safetensors", "safetensors index", ...
std::string_view file_format_name(FileFormat format) noexcept;

/// The format shown by the first bytes of a file of @p file_size bytes. JSON kinds
/// (safetensors_index, hf_config) are recognised only when @p head is the whole file; a head that
/// starts like a JSON object but is shorter than the file gives unknown (starts_like_json()).
FileFormat detect_format_bytes(std::span<const uint8_t> head, uint64_t file_size) noexcept;
/// True when the first non-blank byte of @p head is '{'.
bool starts_like_json(std::span<const uint8_t> head) noexcept;
/// Up to @p max_bytes of @p bytes as hex and printable ASCII, for messages:
/// `50 4b 03 04 14 00 |PK....|`.
std::string describe_bytes(std::span<const uint8_t> bytes, size_t max_bytes = 16);

/// The format of @p path (a file or a directory) by its contents; unknown for a regular file
/// that matches nothing. Throws Error(Status::not_found) when @p path does not exist,
/// Status::io when it cannot be read.
FileFormat probe_file_format(const std::string &path);
/// probe_file_format(), but a file that matches nothing is Error(Status::format) naming the
/// file, its size and its first bytes.
FileFormat detect_file_format(const std::string &path);

/// True when @p path is a readable file whose first bytes are a GGUF's (no JSON is parsed, so
/// this is cheap for a large tokenizer.json); false for anything else, a missing file included.
bool is_gguf_file(const std::string &path) noexcept;

/// The directory of a transformers checkpoint given by @p path of format @p kind: @p path itself
/// for a directory, else the directory holding the file ("." for a bare file name).
std::string checkpoint_dir_of(const std::string &path, FileFormat kind);

}  // namespace ep::format
