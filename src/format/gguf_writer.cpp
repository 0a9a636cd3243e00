#include "format/gguf_writer.hpp"

#include "core/error.hpp"
#include "format/byte_source.hpp"

#include <algorithm>
#include <cstring>

namespace ep::format {
namespace {

template <typename T>
void put(std::vector<uint8_t> &out, T v) {
  uint8_t b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.insert(out.end(), b, b + sizeof(T));
}

void put_string(std::vector<uint8_t> &out, const std::string &s) {
  put<uint64_t>(out, s.size());
  out.insert(out.end(), s.begin(), s.end());
}

}  // namespace

void gguf_encode_value(const GgufValue &v, std::vector<uint8_t> &out) {
  switch (v.type) {
    case GgufType::u8: case GgufType::boolean: put<uint8_t>(out, static_cast<uint8_t>(v.u)); break;
    case GgufType::i8: put<int8_t>(out, static_cast<int8_t>(v.i)); break;
    case GgufType::u16: put<uint16_t>(out, static_cast<uint16_t>(v.u)); break;
    case GgufType::i16: put<int16_t>(out, static_cast<int16_t>(v.i)); break;
    case GgufType::u32: put<uint32_t>(out, static_cast<uint32_t>(v.u)); break;
    case GgufType::i32: put<int32_t>(out, static_cast<int32_t>(v.i)); break;
    case GgufType::u64: put<uint64_t>(out, v.u); break;
    case GgufType::i64: put<int64_t>(out, v.i); break;
    case GgufType::f32: put<float>(out, static_cast<float>(v.f)); break;
    case GgufType::f64: put<double>(out, v.f); break;
    case GgufType::string: put_string(out, v.s); break;
    case GgufType::array: {
      put<uint32_t>(out, static_cast<uint32_t>(v.elem_type));
      put<uint64_t>(out, v.array_size());
      if (gguf_scalar_size(v.elem_type)) {
        out.insert(out.end(), v.raw.begin(), v.raw.end());
      } else if (v.elem_type == GgufType::string) {
        for (const std::string &s : v.strings) put_string(out, s);
      } else {
        for (const GgufValue &a : v.arrays) gguf_encode_value(a, out);
      }
      break;
    }
  }
}

void GgufWriter::set_alignment(uint32_t alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0)
    fail(Status::invalid_argument, "GGUF alignment {} is not a power of two", alignment);
  alignment_ = alignment;
}

void GgufWriter::add(std::string key, GgufValue value) {
  for (const auto &kv : kv_)
    if (kv.first == key) fail(Status::invalid_argument, "GGUF writer: duplicate key '{}'", key);
  kv_.emplace_back(std::move(key), std::move(value));
}

size_t GgufWriter::add_tensor(std::string name, GgmlType type, std::vector<uint64_t> ne) {
  if (ne.empty() || ne.size() > 4) fail(Status::invalid_argument, "GGUF writer: tensor '{}' has {} dims", name, ne.size());
  uint64_t rows = 1;
  for (size_t d = 1; d < ne.size(); ++d) rows = checked_mul(rows, ne[d], "tensor size");
  const uint64_t nbytes = checked_mul(ggml_row_bytes(type, ne[0], name), rows, "tensor size");
  for (const Tensor &t : tensors_)
    if (t.name == name) fail(Status::invalid_argument, "GGUF writer: duplicate tensor '{}'", name);
  tensors_.push_back(Tensor{std::move(name), type, std::move(ne), nbytes});
  return tensors_.size() - 1;
}

uint64_t GgufWriter::total_tensor_bytes() const {
  uint64_t n = 0;
  for (const Tensor &t : tensors_) n += t.nbytes;
  return n;
}

std::vector<std::string> GgufWriter::write(const std::string &path, uint32_t n_shards, const GgufFill &fill,
                                           const GgufProgress &progress, const OutputWrapper &wrap) const {
  if (n_shards == 0) fail(Status::invalid_argument, "GGUF writer: 0 shards");
  if (n_shards > 1 && n_shards > tensors_.size())
    fail(Status::invalid_argument, "GGUF writer: {} shards for {} tensors", n_shards, tensors_.size());
  // Contiguous groups balanced by bytes, at least one tensor each.
  std::vector<size_t> first(n_shards + 1, tensors_.size());
  first[0] = 0;
  const uint64_t total = total_tensor_bytes();
  {
    uint64_t acc = 0;
    uint32_t shard = 1;
    for (size_t t = 0; t < tensors_.size() && shard < n_shards; ++t) {
      const size_t left_tensors = tensors_.size() - t;
      const bool must_split = left_tensors == n_shards - shard;
      if (t > first[shard - 1] && (must_split || acc >= total / n_shards * shard)) first[shard++] = t;
      acc += tensors_[t].nbytes;
    }
  }
  std::string prefix = path;
  if (n_shards > 1) {
    if (prefix.size() > 5 && prefix.compare(prefix.size() - 5, 5, ".gguf") == 0) prefix.resize(prefix.size() - 5);
  }
  std::vector<std::string> paths;
  std::vector<uint8_t> chunk;
  uint64_t done = 0;
  for (uint32_t s = 0; s < n_shards; ++s) {
    const std::string shard_path = n_shards == 1 ? path : split_path(prefix, s + 1, n_shards);
    std::vector<uint8_t> head;
    put<uint32_t>(head, 0x46554747);
    put<uint32_t>(head, 3);
    put<uint64_t>(head, first[s + 1] - first[s]);
    std::vector<std::pair<std::string, GgufValue>> kv;
    if (s == 0) kv = kv_;
    if (alignment_ != 32 && s != 0) kv.emplace_back("general.alignment", GgufValue::make_u32(alignment_));
    if (s == 0 && alignment_ != 32 && std::none_of(kv_.begin(), kv_.end(), [](auto &p) { return p.first == "general.alignment"; }))
      kv.emplace_back("general.alignment", GgufValue::make_u32(alignment_));
    if (n_shards > 1) {
      kv.emplace_back("split.no", GgufValue::make_u16(static_cast<uint16_t>(s)));
      kv.emplace_back("split.count", GgufValue::make_u16(static_cast<uint16_t>(n_shards)));
      kv.emplace_back("split.tensors.count", GgufValue::make_i32(static_cast<int32_t>(tensors_.size())));
    }
    put<uint64_t>(head, kv.size());
    for (const auto &[key, value] : kv) {
      put_string(head, key);
      put<uint32_t>(head, static_cast<uint32_t>(value.type));
      gguf_encode_value(value, head);
    }
    uint64_t rel = 0;
    for (size_t t = first[s]; t < first[s + 1]; ++t) {
      const Tensor &ten = tensors_[t];
      put_string(head, ten.name);
      put<uint32_t>(head, static_cast<uint32_t>(ten.ne.size()));
      for (uint64_t d : ten.ne) put<uint64_t>(head, d);
      put<uint32_t>(head, static_cast<uint32_t>(ten.type));
      put<uint64_t>(head, rel);
      rel = align_up(rel + ten.nbytes, alignment_);
    }
    std::unique_ptr<OutputFile> out = create_output_file(shard_path);
    if (wrap) out = wrap(std::move(out));
    out->write(head.data(), head.size());
    out->write_zeros(align_up(head.size(), alignment_) - head.size());
    for (size_t t = first[s]; t < first[s + 1]; ++t) {
      const Tensor &ten = tensors_[t];
      constexpr uint64_t kChunk = 8u << 20;
      for (uint64_t off = 0; off < ten.nbytes;) {
        const size_t n = static_cast<size_t>(std::min(kChunk, ten.nbytes - off));
        chunk.resize(n);
        fill(t, off, std::span<uint8_t>(chunk.data(), n));
        out->write(chunk.data(), n);
        off += n;
        done += n;
        if (progress) progress(done, total);
      }
      if (t + 1 < first[s + 1]) out->write_zeros(align_up(ten.nbytes, alignment_) - ten.nbytes);
    }
    out->sync();
    paths.push_back(shard_path);
  }
  return paths;
}

}  // namespace ep::format
