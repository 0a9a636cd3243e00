// What the expert-store tests (experts_capi_test, experts_gpu_test) share: the synthetic
// source they open and where each (layer, expert, role) lies in it.
#pragma once

#include "format/gguf.hpp"
#include "support/catch.hpp"
#include "testkit/checkpoint.hpp"

#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace ep::test::experts {

constexpr uint32_t kLayers = 2, kExperts = 6, kTopK = 2;

inline ep::testkit::SyntheticSpec spec(ep::format::GgmlType type) {
  ep::testkit::SyntheticSpec s;
  s.num_layers = kLayers;
  s.num_experts = kExperts;
  s.top_k = kTopK;
  s.n_embd = 256;
  s.n_ff = 128;
  s.expert_type = type;
  s.down_type = type;
  s.seed = 11;
  return s;
}

inline std::vector<uint8_t> read_range(const std::string &path, uint64_t offset, uint64_t bytes) {
  std::ifstream in(path, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(offset));
  std::vector<uint8_t> out(bytes);
  in.read(reinterpret_cast<char *>(out.data()), static_cast<std::streamsize>(bytes));
  REQUIRE(static_cast<uint64_t>(in.gcount()) == bytes);
  return out;
}

/// Where the bytes of (layer, expert, role) lie in the source: file, offset, bytes.
struct Slice {
  std::string file;
  uint64_t offset = 0, bytes = 0;
};
using SliceFn = std::function<Slice(uint32_t block, uint32_t expert, int role)>;

/// A GGUF's 3-D expert tensors: expert e is the e-th of ne[2] equal slices.
inline SliceFn gguf_slices(const std::string &path) {
  auto g = std::make_shared<ep::format::GgufFile>(ep::format::GgufFile::open(path));
  return [g, path](uint32_t block, uint32_t expert, int role) {
    static const char *names[3] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};
    const auto *t = g->find_tensor("blk." + std::to_string(block) + "." + names[role] + ".weight");
    REQUIRE(t);
    const uint64_t per = t->nbytes / t->ne[2];
    return Slice{path, t->file_offset + expert * per, per};
  };
}

}  // namespace ep::test::experts
