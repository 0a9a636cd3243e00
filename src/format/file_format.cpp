#include "format/file_format.hpp"

#include "core/error.hpp"
#include "format/byte_source.hpp"
#include "format/pack_format.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <vector>

namespace ep::format {
namespace {

namespace fs = std::filesystem;

constexpr size_t kHeadBytes = 64;
constexpr uint64_t kMaxSafetensorsHeaderBytes = 512ull << 20;  // the safetensors reader's own limit
constexpr uint64_t kMaxJsonBytes = 64ull << 20;                // far above any index or config.json

bool is_blank(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

struct Probe {
  FileFormat format = FileFormat::unknown;
  uint64_t size = 0;
  std::vector<uint8_t> head;
};

Probe probe(const std::string &path) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) {
    if (ec && ec != std::errc::no_such_file_or_directory)
      fail(Status::io, "{}: cannot stat: {}", path, ec.message());
    fail(Status::not_found, "{}: no such file or directory", path);
  }
  Probe p;
  if (fs::is_directory(st)) {
    p.format = fs::is_regular_file(fs::path(path) / "config.json", ec) ? FileFormat::checkpoint_dir : FileFormat::directory;
    return p;
  }
  const FileSource src(path);
  p.size = src.size();
  p.head = src.read_vector(0, static_cast<size_t>(std::min<uint64_t>(p.size, kHeadBytes)));
  p.format = detect_format_bytes(p.head, p.size);
  if (p.format == FileFormat::unknown && starts_like_json(p.head) && p.size > p.head.size() && p.size <= kMaxJsonBytes) {
    const std::vector<uint8_t> all = src.read_vector(0, static_cast<size_t>(p.size));
    p.format = detect_format_bytes(all, p.size);
  }
  return p;
}

}  // namespace

std::string_view file_format_name(FileFormat format) noexcept {
  switch (format) {
    case FileFormat::unknown: return "unknown";
    case FileFormat::gguf: return "gguf";
    case FileFormat::safetensors: return "safetensors";
    case FileFormat::safetensors_index: return "safetensors index";
    case FileFormat::hf_config: return "transformers config";
    case FileFormat::checkpoint_dir: return "checkpoint directory";
    case FileFormat::directory: return "directory";
    case FileFormat::expert_pack: return "expert pack";
  }
  return "?";
}

bool starts_like_json(std::span<const uint8_t> head) noexcept {
  for (uint8_t c : head) {
    if (is_blank(c)) continue;
    return c == '{';
  }
  return false;
}

FileFormat detect_format_bytes(std::span<const uint8_t> head, uint64_t file_size) noexcept {
  if (head.size() >= 4 && std::memcmp(head.data(), "GGUF", 4) == 0) return FileFormat::gguf;
  if (head.size() >= kPackMagic.size() && std::memcmp(head.data(), kPackMagic.data(), kPackMagic.size()) == 0)
    return FileFormat::expert_pack;
  if (head.size() >= 9) {
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | head[static_cast<size_t>(i)];
    // The header must begin with '{' (the safetensors specification). Its length is not checked
    // against the file size here: a truncated file is the reader's to report, with offsets.
    if (n >= 2 && n <= kMaxSafetensorsHeaderBytes && head[8] == '{') return FileFormat::safetensors;
  }
  if (head.size() != file_size || !starts_like_json(head)) return FileFormat::unknown;
  const nlohmann::json j = nlohmann::json::parse(head.begin(), head.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return FileFormat::unknown;
  if (const auto w = j.find("weight_map"); w != j.end() && w->is_object()) return FileFormat::safetensors_index;
  if (const auto m = j.find("model_type"); m != j.end() && m->is_string() && !j.contains("weight_map"))
    return FileFormat::hf_config;
  return FileFormat::unknown;
}

std::string describe_bytes(std::span<const uint8_t> bytes, size_t max_bytes) {
  const size_t n = std::min(bytes.size(), max_bytes);
  std::string hex, text;
  static constexpr char kDigits[] = "0123456789abcdef";
  for (size_t i = 0; i < n; ++i) {
    if (i) hex += ' ';
    hex += kDigits[bytes[i] >> 4];
    hex += kDigits[bytes[i] & 0xF];
    text += (bytes[i] >= 0x20 && bytes[i] < 0x7F) ? static_cast<char>(bytes[i]) : '.';
  }
  return hex + " |" + text + "|";
}

std::string checkpoint_dir_of(const std::string &path, FileFormat kind) {
  if (kind == FileFormat::checkpoint_dir || kind == FileFormat::directory) return path;
  const fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

bool is_gguf_file(const std::string &path) noexcept {
  try {
    std::error_code ec;
    if (!fs::is_regular_file(path, ec)) return false;
    const FileSource src(path);
    const std::vector<uint8_t> head = src.read_vector(0, static_cast<size_t>(std::min<uint64_t>(src.size(), 16)));
    return detect_format_bytes(head, src.size()) == FileFormat::gguf;
  } catch (const std::exception &) {
    return false;
  }
}

FileFormat probe_file_format(const std::string &path) { return probe(path).format; }

FileFormat detect_file_format(const std::string &path) {
  const Probe p = probe(path);
  if (p.format != FileFormat::unknown) return p.format;
  if (p.size == 0)
    fail(Status::format, "{}: an empty file, not a GGUF or safetensors file (nor a safetensors index or config.json)", path);
  fail(Status::format,
       "{}: not a GGUF or safetensors file (nor a safetensors index or config.json): {} bytes, starting {} (a GGUF "
       "starts with 'GGUF', a safetensors file with an 8-byte header length and then '{{')",
       path, p.size, describe_bytes(p.head));
}

}  // namespace ep::format
