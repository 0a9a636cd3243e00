// Streaming GGUF v3 writer: metadata of every type, tensors with alignment, and optional split
// into N shards named like llama.cpp's gguf-split (<name>-0000k-of-0000N.gguf, split.no,
// split.count, split.tensors.count). Tensor bytes come from a callback in bounded chunks, so a
// file of any size is written with constant memory.
#pragma once

#include "format/file_writer.hpp"
#include "format/ggml_type.hpp"
#include "format/gguf.hpp"

#include <functional>
#include <span>
#include <string>
#include <vector>

namespace ep::format {

/// Fills @p out with bytes [offset, offset + out.size()) of tensor @p tensor.
using GgufFill = std::function<void(size_t tensor, uint64_t offset, std::span<uint8_t> out)>;
/// Called after each chunk with the total bytes written so far and the total to write.
using GgufProgress = std::function<void(uint64_t done_bytes, uint64_t total_bytes)>;

class GgufWriter {
 public:
  /// general.alignment (a power of two; default 32). Written as metadata when not 32.
  void set_alignment(uint32_t alignment);
  /// Appends a metadata key (keys keep their order; a duplicate key is an error).
  void add(std::string key, GgufValue value);
  /// Appends a tensor; ne in ggml order (1..4 dims). Returns its index for the fill callback.
  size_t add_tensor(std::string name, GgmlType type, std::vector<uint64_t> ne);
  size_t tensor_count() const { return tensors_.size(); }
  uint64_t tensor_bytes(size_t tensor) const { return tensors_[tensor].nbytes; }
  /// Sum of all tensor bytes.
  uint64_t total_tensor_bytes() const;

  /// Writes one file at @p path (n_shards == 1), or n_shards files named
  /// split_path(<path without .gguf>, k, n_shards). Returns the paths written, first shard
  /// first. @p wrap, when set, wraps every output file (fault injection in tests).
  std::vector<std::string> write(const std::string &path, uint32_t n_shards, const GgufFill &fill,
                                 const GgufProgress &progress = {}, const OutputWrapper &wrap = {}) const;

 private:
  struct Tensor {
    std::string name;
    GgmlType type;
    std::vector<uint64_t> ne;
    uint64_t nbytes;
  };
  uint32_t alignment_ = 32;
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::vector<Tensor> tensors_;
};

/// Serializes one metadata value (type tag not included) onto @p out.
void gguf_encode_value(const GgufValue &value, std::vector<uint8_t> &out);

}  // namespace ep::format
