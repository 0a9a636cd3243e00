#include "format/safetensors.hpp"

#include "core/error.hpp"
#include "format/file_format.hpp"
#include "format/file_writer.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

namespace ep::format {
namespace {

struct DtypeRow {
  StDtype dtype;
  std::string_view name;
  size_t size;
};
constexpr DtypeRow kDtypes[] = {
    {StDtype::f64, "F64", 8},         {StDtype::f32, "F32", 4},         {StDtype::f16, "F16", 2},
    {StDtype::bf16, "BF16", 2},       {StDtype::f8_e4m3, "F8_E4M3", 1}, {StDtype::f8_e5m2, "F8_E5M2", 1},
    {StDtype::f8_e8m0, "F8_E8M0", 1}, {StDtype::i8, "I8", 1},           {StDtype::u8, "U8", 1},
    {StDtype::i16, "I16", 2},         {StDtype::u16, "U16", 2},         {StDtype::i32, "I32", 4},
    {StDtype::u32, "U32", 4},         {StDtype::i64, "I64", 8},         {StDtype::u64, "U64", 8},
    {StDtype::boolean, "BOOL", 1},
};

constexpr uint64_t kMaxHeaderBytes = 512ull << 20;  // far above any real checkpoint

}  // namespace

size_t st_dtype_size(StDtype dtype) noexcept {
  for (const auto &r : kDtypes)
    if (r.dtype == dtype) return r.size;
  return 0;
}

std::string_view st_dtype_name(StDtype dtype) noexcept {
  for (const auto &r : kDtypes)
    if (r.dtype == dtype) return r.name;
  return "?";
}

std::optional<StDtype> st_dtype_from_name(std::string_view name) noexcept {
  for (const auto &r : kDtypes)
    if (r.name == name) return r.dtype;
  if (name == "F8_E8M0FNU") return StDtype::f8_e8m0;  // torch's name for the same e8m0 bytes
  return std::nullopt;
}

SafetensorsFile SafetensorsFile::open(const std::string &path) { return parse(std::make_shared<FileSource>(path)); }

SafetensorsFile SafetensorsFile::parse(std::shared_ptr<const ByteSource> source) {
  SafetensorsFile f;
  f.source_ = std::move(source);
  const ByteSource &src = *f.source_;
  const std::string &file = src.name();
  if (src.size() < 8) fail(Status::format, "{}: truncated file: {} bytes, a safetensors header needs 8", file, src.size());
  uint64_t json_len = 0;
  src.read(0, &json_len, 8);
  if (json_len > src.size() - 8 || json_len > kMaxHeaderBytes)
    fail(Status::format, "{}: truncated file: header length {} at offset 0 exceeds the {} bytes after it", file,
         json_len, src.size() - 8);
  f.header_bytes_ = 8 + json_len;
  std::string text(static_cast<size_t>(json_len), '\0');
  src.read(8, text.data(), text.size());
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    fail(Status::format, "{}: the header at offset 8 ({} bytes) is not a JSON object", file, json_len);
  const uint64_t data_bytes = src.size() - f.header_bytes_;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string &name = it.key();
    const nlohmann::json &v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) fail(Status::format, "{}: __metadata__ is not an object", file);
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) fail(Status::format, "{}: __metadata__ value '{}' is not a string", file, m.key());
        f.metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets") ||
        !v["dtype"].is_string() || !v["shape"].is_array() || !v["data_offsets"].is_array() ||
        v["data_offsets"].size() != 2)
      fail(Status::format, "{}: tensor '{}': header entry needs dtype, shape and data_offsets [begin, end]", file, name);
    StTensorInfo t;
    t.name = name;
    const std::string dt = v["dtype"].get<std::string>();
    auto dtype = st_dtype_from_name(dt);
    if (!dtype) fail(Status::unsupported, "{}: tensor '{}': unsupported dtype {}", file, name, dt);
    t.dtype = *dtype;
    uint64_t numel = 1;
    for (const auto &d : v["shape"]) {
      if (!d.is_number_unsigned()) fail(Status::format, "{}: tensor '{}': shape has a non-integer dimension", file, name);
      t.shape.push_back(d.get<uint64_t>());
      numel = checked_mul(numel, t.shape.back(), "safetensors shape");
    }
    const auto &offs = v["data_offsets"];
    if (!offs[0].is_number_unsigned() || !offs[1].is_number_unsigned())
      fail(Status::format, "{}: tensor '{}': data_offsets are not unsigned integers", file, name);
    const uint64_t begin = offs[0].get<uint64_t>(), end = offs[1].get<uint64_t>();
    if (begin > end || end > data_bytes)
      fail(Status::format, "{}: truncated file: tensor '{}' data_offsets [{}, {}) are outside the {} data bytes", file,
           name, begin, end, data_bytes);
    t.nbytes = end - begin;
    const uint64_t want = checked_mul(numel, st_dtype_size(t.dtype), "safetensors tensor bytes");
    if (want != t.nbytes)
      fail(Status::shape, "{}: shape mismatch: tensor '{}' {} {} elements need {} bytes, data_offsets give {}", file,
           name, st_dtype_name(t.dtype), numel, want, t.nbytes);
    t.file_offset = f.header_bytes_ + begin;
    f.index_.emplace(t.name, f.tensors_.size());
    f.tensors_.push_back(std::move(t));
  }
  // The data region is covered exactly, as the format requires: no two tensors share bytes
  // (a header that lies about offsets would alias one tensor's data as another's), no holes,
  // nothing after the last tensor.
  std::vector<const StTensorInfo *> order;
  for (const StTensorInfo &t : f.tensors_) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const StTensorInfo *a, const StTensorInfo *b) {
    return a->file_offset != b->file_offset ? a->file_offset < b->file_offset : a->nbytes < b->nbytes;
  });
  uint64_t end = f.header_bytes_;
  const StTensorInfo *prev = nullptr;
  for (const StTensorInfo *t : order) {
    if (t->file_offset < end)
      fail(Status::format, "{}: the header lies about offsets: tensor '{}' data [{}, {}) overlaps tensor '{}' [{}, {}) (data offsets)",
           file, t->name, t->file_offset - f.header_bytes_, t->file_offset - f.header_bytes_ + t->nbytes, prev->name,
           prev->file_offset - f.header_bytes_, end - f.header_bytes_);
    if (t->file_offset > end)
      fail(Status::format, "{}: the header lies about offsets: data bytes [{}, {}) before tensor '{}' belong to no tensor",
           file, end - f.header_bytes_, t->file_offset - f.header_bytes_, t->name);
    end = t->file_offset + t->nbytes;
    prev = t;
  }
  if (end != src.size())
    fail(Status::format, "{}: trailing bytes: the header's tensors end at data offset {}, the file has {} data bytes", file,
         end - f.header_bytes_, data_bytes);
  return f;
}

const StTensorInfo *SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

std::map<std::string, std::string> SafetensorsSet::parse_index(const std::string &json_text, const std::string &name) {
  nlohmann::json j = nlohmann::json::parse(json_text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    fail(Status::format, "{}: not a safetensors index (a JSON object with a \"weight_map\" object)", name);
  std::map<std::string, std::string> map;
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    if (!it.value().is_string()) fail(Status::format, "{}: weight_map['{}'] is not a string", name, it.key());
    const std::string shard = it.value().get<std::string>();
    if (shard.empty() || shard.find('/') != std::string::npos || shard == "." || shard == "..")
      fail(Status::format, "{}: weight_map['{}'] = '{}' is not a file name in the same directory", name, it.key(), shard);
    map[it.key()] = shard;
  }
  return map;
}

SafetensorsSet SafetensorsSet::open(const std::string &path) {
  namespace fs = std::filesystem;
  SafetensorsSet set;
  fs::path p(path);
  if (fs::is_directory(p)) {
    if (fs::exists(p / "model.safetensors.index.json")) {
      p = p / "model.safetensors.index.json";
    } else if (fs::exists(p / "model.safetensors")) {
      p = p / "model.safetensors";
    } else {
      fail(Status::not_found, "{}: no model.safetensors.index.json or model.safetensors in the directory", path);
    }
  }
  const FileFormat kind = detect_file_format(p.string());
  if (kind != FileFormat::safetensors && kind != FileFormat::safetensors_index)
    fail(Status::format, "{}: a {}, not a safetensors file or index", p.string(), file_format_name(kind));
  if (kind == FileFormat::safetensors_index) {
    std::ifstream in(p, std::ios::binary);
    if (!in) fail(Status::not_found, "{}: cannot open the safetensors index", p.string());
    std::stringstream ss;
    ss << in.rdbuf();
    const auto map = parse_index(ss.str(), p.string());
    std::set<std::string> shards;
    for (const auto &[tensor, shard] : map) shards.insert(shard);
    for (const std::string &shard : shards) {
      const fs::path sp = p.parent_path() / shard;
      if (!fs::exists(sp)) fail(Status::not_found, "{}: shard listed by {} is missing", sp.string(), p.string());
      set.files_.push_back(SafetensorsFile::open(sp.string()));
    }
    for (const auto &[tensor, shard] : map) {
      const fs::path sp = p.parent_path() / shard;
      auto it = std::find_if(set.files_.begin(), set.files_.end(), [&](const SafetensorsFile &f) { return f.path() == sp.string(); });
      if (it == set.files_.end() || !it->find(tensor))
        fail(Status::not_found, "{}: tensor '{}' listed by {} is not in the shard", sp.string(), tensor, p.string());
    }
    // Every tensor of a shard is the index's, in that shard: a shard of another checkpoint (or
    // of another version of this one) under the listed name holds tensors the index does not.
    for (const SafetensorsFile &f : set.files_) {
      for (const StTensorInfo &t : f.tensors()) {
        auto it = map.find(t.name);
        if (it == map.end() || (p.parent_path() / it->second).string() != f.path())
          fail(Status::format, "{}: tensor '{}' at offset {} is {} by {}: a shard of another checkpoint?", f.path(), t.name,
               t.file_offset, it == map.end() ? "not listed" : "listed in " + it->second, p.string());
      }
    }
  } else {
    set.files_.push_back(SafetensorsFile::open(p.string()));
  }
  return set;
}

std::optional<SafetensorsSet::Located> SafetensorsSet::find(std::string_view name) const {
  for (const SafetensorsFile &f : files_)
    if (const StTensorInfo *t = f.find(name)) return Located{&f, t};
  return std::nullopt;
}

void write_safetensors(const std::string &path, const std::vector<StWriteTensor> &tensors, const StFill &fill,
                       const std::map<std::string, std::string> &metadata) {
  nlohmann::json j = nlohmann::json::object();
  if (!metadata.empty()) j["__metadata__"] = metadata;
  uint64_t off = 0;
  std::vector<uint64_t> sizes;
  for (const StWriteTensor &t : tensors) {
    uint64_t n = st_dtype_size(t.dtype);
    for (uint64_t d : t.shape) n = checked_mul(n, d, "safetensors tensor bytes");
    j[t.name] = {{"dtype", st_dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {off, off + n}}};
    sizes.push_back(n);
    off += n;
  }
  std::string header = j.dump();
  header.append((8 - header.size() % 8) % 8, ' ');
  auto out = create_output_file(path);
  const uint64_t len = header.size();
  out->write(&len, 8);
  out->write(header.data(), header.size());
  std::vector<uint8_t> chunk;
  for (size_t t = 0; t < tensors.size(); ++t) {
    for (uint64_t o = 0; o < sizes[t];) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(sizes[t] - o, 8u << 20));
      chunk.resize(n);
      fill(t, o, std::span<uint8_t>(chunk.data(), n));
      out->write(chunk.data(), n);
      o += n;
    }
  }
  out->sync();
}

}  // namespace ep::format
