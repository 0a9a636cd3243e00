#include "format/gguf_writer.hpp"

#include "core/error.hpp"
#include "format/byte_source.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <future>

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
  // Every shard is written as "<name>.partial" and renamed once all are complete, so a failed or
  // killed write never leaves a file under a GGUF name (the partial files are removed on failure).
  std::vector<std::string> paths, partials;
  struct RemovePartials {
    std::vector<std::string> *files;
    ~RemovePartials() {
      if (files)
        for (const std::string &f : *files) std::remove(f.c_str());
    }
  } cleanup{&partials};
  uint64_t done = 0;
  for (uint32_t s = 0; s < n_shards; ++s) {
    const std::string shard_path = n_shards == 1 ? path : split_path(prefix, s + 1, n_shards);
    paths.push_back(shard_path);
    partials.push_back(shard_path + ".partial");
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
    std::unique_ptr<OutputFile> out = create_output_file(partials.back());
    if (wrap) out = wrap(std::move(out));
    out->write(head.data(), head.size());
    out->write_zeros(align_up(head.size(), alignment_) - head.size());
    // The shard's tensor bytes in chunks, in file order. The next chunk is filled on a helper
    // thread while this one is written, so generation and disk writes overlap (the bytes and
    // their order are the same as filling and writing one after the other).
    struct Chunk {
      size_t tensor;
      uint64_t offset;
      size_t bytes;
    };
    constexpr uint64_t kChunk = 8u << 20;
    std::vector<Chunk> chunks;
    for (size_t t = first[s]; t < first[s + 1]; ++t)
      for (uint64_t off = 0; off < tensors_[t].nbytes; off += kChunk)
        chunks.push_back({t, off, static_cast<size_t>(std::min(kChunk, tensors_[t].nbytes - off))});
    std::vector<uint8_t> buffers[2];
    auto fill_chunk = [&](size_t i) {
      std::vector<uint8_t> &b = buffers[i % 2];
      b.resize(chunks[i].bytes);
      fill(chunks[i].tensor, chunks[i].offset, std::span<uint8_t>(b.data(), b.size()));
    };
    std::future<void> next;  // declared after the buffers: destroyed (waited for) first
    if (!chunks.empty()) next = std::async(std::launch::async, fill_chunk, size_t{0});
    for (size_t i = 0; i < chunks.size(); ++i) {
      next.get();  // chunk i is filled (or its fill's exception is rethrown here)
      if (i + 1 < chunks.size()) next = std::async(std::launch::async, fill_chunk, i + 1);
      const Chunk &c = chunks[i];
      out->write(buffers[i % 2].data(), c.bytes);
      done += c.bytes;
      if (progress) progress(done, total);
      const Tensor &ten = tensors_[c.tensor];
      if (c.offset + c.bytes == ten.nbytes && c.tensor + 1 < first[s + 1])
        out->write_zeros(align_up(ten.nbytes, alignment_) - ten.nbytes);
    }
    out->sync();
  }
  for (size_t i = 0; i < paths.size(); ++i)
    if (std::rename(partials[i].c_str(), paths[i].c_str()) != 0)
      fail_errno(errno, fmt::format("rename {} to {}", partials[i], paths[i]));
  cleanup.files = nullptr;
  const std::filesystem::path dir = std::filesystem::path(paths.front()).parent_path();
  sync_directory(dir.empty() ? std::string(".") : dir.string());
  return paths;
}

}  // namespace ep::format
