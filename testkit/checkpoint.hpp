// Synthetic MoE checkpoints with random (seeded, reproducible) bytes, shaped like DeepSeek-V4
// or Kimi-K3 as llama.cpp writes them (GGUF) or as transformers saves them (safetensors).
// Used by the tests, the fuzz seed corpus, the pack benchmark and `ep-pack synth`.
#pragma once

#include "format/ggml_type.hpp"

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace ep::testkit {

struct SyntheticSpec {
  std::string arch = "deepseek4";     ///< "deepseek4" or "kimi-k3" (metadata keys and layer layout)
  uint32_t num_layers = 2;            ///< block_count
  uint32_t first_moe_layer = 0;       ///< blocks before it are dense (kimi-k3: 1)
  uint32_t num_experts = 4;
  uint32_t top_k = 2;
  uint64_t n_embd = 256;              ///< expert input width D (K3: the latent width)
  uint64_t n_ff = 128;                ///< expert hidden width F
  format::GgmlType expert_type = format::GgmlType::mxfp4;  ///< gate and up
  format::GgmlType down_type = format::GgmlType::mxfp4;
  uint64_t seed = 1;
  uint32_t n_shards = 1;
  uint32_t alignment = 32;            ///< general.alignment
  bool small_extras = true;           ///< add small non-expert tensors and metadata of every type
};

/// Deterministic bytes: out[i] is byte (offset + i) of the stream for (seed, stream).
void synthetic_bytes(uint64_t seed, uint64_t stream, uint64_t offset, std::span<uint8_t> out);

/// Writes a GGUF (or n_shards shards; @p path is then the prefix "<name>.gguf") and returns the
/// paths written, first shard first.
std::vector<std::string> write_synthetic_gguf(const SyntheticSpec &spec, const std::string &path,
                                              const std::function<void(uint64_t, uint64_t)> &progress = {});

enum class StLayout {
  fused,             ///< model.layers.N.mlp.experts.gate_up_proj [E,2F,D] + down_proj [E,D,F]
  per_expert,        ///< model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight
  per_expert_w123,   ///< model.layers.N.block_sparse_moe.experts.E.{w1,w3,w2}.weight
};

/// Writes a BF16 safetensors checkpoint into directory @p dir: model.safetensors, or
/// n_shards files model-0000k-of-0000n.safetensors plus model.safetensors.index.json.
/// Returns the path to pass to the builder (the file or the index).
std::string write_synthetic_safetensors(const SyntheticSpec &spec, const std::string &dir, StLayout layout);

}  // namespace ep::testkit
