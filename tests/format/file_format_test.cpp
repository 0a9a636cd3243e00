// Format detection by content: GGUF, safetensors, a safetensors index, a transformers config,
// checkpoint directories and Expert Packs are told apart by their bytes whatever their names;
// anything else is an error naming the file and showing its first bytes.
#include "format/file_format.hpp"
#include "format/gguf_writer.hpp"
#include "format/pack_format.hpp"
#include "format/safetensors.hpp"
#include "testkit/checkpoint.hpp"
#include "support/catch.hpp"
#include "support/expect_error.hpp"
#include "support/temp_dir.hpp"

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

using namespace ep::format;
using namespace std::string_view_literals;
using ep::test::expect_error;
using ep::test::TempDir;
using ep::test::write_file;

namespace {

std::vector<uint8_t> bytes_of(std::string_view s) { return std::vector<uint8_t>(s.begin(), s.end()); }

FileFormat whole(const std::vector<uint8_t> &b) { return detect_format_bytes(b, b.size()); }

std::vector<uint8_t> safetensors_head(uint64_t header_len, char first) {
  std::vector<uint8_t> b(16, ' ');
  std::memcpy(b.data(), &header_len, 8);
  b[8] = static_cast<uint8_t>(first);
  return b;
}

}  // namespace

TEST_CASE("format: the first bytes decide, not the name", "[format][detect]") {
  CHECK(whole(bytes_of("GGUF\x03\0\0\0"sv)) == FileFormat::gguf);
  CHECK(whole(bytes_of("GGU")) == FileFormat::unknown);
  std::vector<uint8_t> pack(kPackMagic.begin(), kPackMagic.end());
  CHECK(whole(pack) == FileFormat::expert_pack);
  // safetensors: a plausible header length, then '{'; the length is not checked against the
  // file size (a truncated file is the reader's to report, with offsets)
  CHECK(detect_format_bytes(safetensors_head(8, '{'), 1000) == FileFormat::safetensors);
  CHECK(detect_format_bytes(safetensors_head(1ull << 40, '{'), 1000) == FileFormat::unknown);
  CHECK(detect_format_bytes(safetensors_head(8, '['), 1000) == FileFormat::unknown);
  CHECK(detect_format_bytes(safetensors_head(1, '{'), 1000) == FileFormat::unknown);
  // JSON only when the bytes are the whole file
  const auto index = bytes_of(R"(  {"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors"}})");
  CHECK(whole(index) == FileFormat::safetensors_index);
  CHECK(detect_format_bytes(index, index.size() + 1) == FileFormat::unknown);
  CHECK(starts_like_json(index));
  CHECK(whole(bytes_of(R"({"model_type": "deepseek_v4", "hidden_size": 4})")) == FileFormat::hf_config);
  CHECK(whole(bytes_of(R"({"model_type": 3})")) == FileFormat::unknown);
  CHECK(whole(bytes_of(R"({"weight_map": []})")) == FileFormat::unknown);
  CHECK(whole(bytes_of(R"({"model_type": "x", "weight_map)")) == FileFormat::unknown);  // not JSON
  CHECK(whole(bytes_of("[1, 2]")) == FileFormat::unknown);
  CHECK(whole({}) == FileFormat::unknown);
  CHECK(describe_bytes(bytes_of("PK\x03\x04zz")) == "50 4b 03 04 7a 7a |PK..zz|");
  CHECK(describe_bytes(bytes_of("0123456789abcdefXYZ"), 4) == "30 31 32 33 |0123|");
}

TEST_CASE("format: files and directories by content", "[format][detect]") {
  TempDir dir;
  // a GGUF under an Ollama blob name (no extension)
  GgufWriter w;
  w.add("general.architecture", GgufValue::make_string("test"));
  w.add_tensor("t", GgmlType::f32, {4});
  const std::string blob = dir / ("sha256-" + std::string(64, 'a'));
  w.write(blob, 1, [](size_t, uint64_t, std::span<uint8_t> out) { std::fill(out.begin(), out.end(), uint8_t{0}); });
  CHECK(detect_file_format(blob) == FileFormat::gguf);
  CHECK(is_gguf_file(blob));
  // a safetensors file named .gguf, and an index without its usual name
  const std::string st = dir / "weights.gguf";
  write_safetensors(st, {{"x", StDtype::f32, {2}}},
                    [](size_t t, uint64_t off, std::span<uint8_t> out) { ep::testkit::synthetic_bytes(1, t, off, out); });
  CHECK(detect_file_format(st) == FileFormat::safetensors);
  CHECK_FALSE(is_gguf_file(st));
  const std::string idx = dir / "index";
  write_file(idx, bytes_of(R"({"weight_map": {"x": "weights.gguf"}})"));
  CHECK(detect_file_format(idx) == FileFormat::safetensors_index);
  CHECK(SafetensorsSet::open(idx).files().size() == 1);  // the index is followed whatever its name
  // a directory with or without config.json
  CHECK(detect_file_format(dir.str()) == FileFormat::directory);
  const std::string cfg = dir / "config.json";
  write_file(cfg, bytes_of(R"({"model_type": "deepseek_v4"})"));
  CHECK(detect_file_format(dir.str()) == FileFormat::checkpoint_dir);
  CHECK(detect_file_format(cfg) == FileFormat::hf_config);
  CHECK(checkpoint_dir_of(cfg, FileFormat::hf_config) == dir.str());
  CHECK(checkpoint_dir_of("config.json", FileFormat::hf_config) == ".");
  CHECK(checkpoint_dir_of(dir.str(), FileFormat::checkpoint_dir) == dir.str());
  // anything else: the file, its size and its first bytes
  const std::string zip = dir / "model.gguf";
  write_file(zip, bytes_of("PK\x03\x04\x14\0\0\0\x08\0 archive bytes"sv));
  CHECK(probe_file_format(zip) == FileFormat::unknown);
  expect_error([&] { detect_file_format(zip); }, ep::Status::format, zip + ": not a GGUF or safetensors file");
  expect_error([&] { detect_file_format(zip); }, ep::Status::format, "50 4b 03 04 14 00 00 00 08 00 20 61 72 63 68 69 |PK........ archi|");
  expect_error([&] { detect_file_format(zip); }, ep::Status::format, "24 bytes");
  expect_error([&] { SafetensorsSet::open(zip); }, ep::Status::format, "|PK");
  const std::string empty = dir / "empty.safetensors";
  write_file(empty, {});
  expect_error([&] { detect_file_format(empty); }, ep::Status::format, empty + ": an empty file");
  expect_error([&] { SafetensorsSet::open(blob); }, ep::Status::format, "a gguf, not a safetensors file or index");
  expect_error([&] { detect_file_format(dir / "missing"); }, ep::Status::not_found, "missing: no such file or directory");
  CHECK_FALSE(is_gguf_file(dir / "missing"));
  CHECK_FALSE(is_gguf_file(dir.str()));
}
