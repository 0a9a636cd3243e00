// DeepSeek-V4 hyper-parameters, read from a GGUF file (llama.cpp `deepseek4.*` keys) or from a
// transformers config.json. Every dimension comes from the file; nothing is hard-coded, so the
// tiny test models, full-width models with few layers and the real 43-layer model all load.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ep::format {
class GgufSet;
}

namespace ep::model {

/// Attention kind of one layer: sliding window only, compressed sparse (overlapping windows +
/// lightning indexer, "CSA") or heavily compressed (non-overlapping windows, "HCA").
enum class AttnKind : uint8_t { sliding = 0, csa = 1, hca = 2 };

const char *attn_kind_name(AttnKind kind) noexcept;

struct DeepseekV4Config {
  int64_t vocab = 0;
  int64_t hidden = 0;          ///< D
  int64_t n_layers = 0;         ///< layers that run (MTP layers excluded)
  int64_t n_mtp_layers = 0;     ///< MTP (nextn) layers stored after them in the file, not run
  int64_t n_heads = 0;         ///< H
  int64_t head_dim = 0;        ///< one shared K=V head of head_dim
  int64_t rope_dim = 0;        ///< RoPE on the last rope_dim dims of each head (interleaved pairs)
  int64_t q_lora_rank = 0;
  int64_t o_groups = 0;
  int64_t o_lora_rank = 0;
  int64_t n_experts = 0;
  int64_t n_experts_used = 0;
  int64_t moe_ff = 0;          ///< routed expert width F
  int64_t n_shared_experts = 1;  ///< shared expert width = F · n_shared_experts
  int64_t n_hash_layers = 0;   ///< the first n layers route by token id (tid2eid)
  int64_t index_n_heads = 0;
  int64_t index_head_dim = 0;
  int64_t index_topk = 0;
  int64_t sliding_window = 0;  ///< raw window W: a query sees the last W tokens, itself included
  int64_t hc_mult = 0;         ///< hyper-connection streams
  int64_t hc_sinkhorn_iters = 0;
  float hc_eps = 0.0f;
  float rms_eps = 0.0f;
  float routed_scale = 1.0f;
  bool norm_topk = true;
  std::vector<float> swiglu_limit;         ///< per layer, routed experts
  std::vector<float> swiglu_limit_shared;  ///< per layer, shared expert
  std::vector<int32_t> compress_ratio;     ///< per layer; 0 = sliding only
  std::vector<AttnKind> attn_kind;         ///< per layer
  float rope_theta = 10000.0f;             ///< sliding-only layers (no YaRN)
  float compress_rope_theta = 10000.0f;    ///< compressed layers, their compressors and indexer
  float yarn_factor = 1.0f;                ///< YaRN on compressed layers (off when <= 1)
  int64_t yarn_original_max_positions = 0;
  float yarn_beta_fast = 32.0f;
  float yarn_beta_slow = 1.0f;
  float compress_attention_factor = 1.0f;  ///< DeepSeek-V4 forces 1 (no YaRN mscale)
  int64_t max_positions = 0;

  /// Mix width of a hyper-connection: (2 + hc) · hc.
  int64_t hc_mix() const { return (2 + hc_mult) * hc_mult; }
  /// Checks every dimension and relation; throws Error(Status::format) naming @p source.
  void validate(const std::string &source) const;
  /// A one-line summary for logs.
  std::string summary() const;

  /// From llama.cpp deepseek4 metadata. A layer with a compress ratio is CSA when the file has
  /// its indexer (`blk.N.indexer.proj.weight`), HCA otherwise.
  static DeepseekV4Config from_gguf(const format::GgufSet &gguf);
  /// From a transformers config.json (modern keys layer_types / compress_rates /
  /// mlp_layer_types / rope_parameters, or the legacy compress_ratios / num_hash_layers /
  /// qk_rope_head_dim / rope_scaling of the official checkpoint).
  static DeepseekV4Config from_hf_json(const std::string &json_text, const std::string &source);
};

}  // namespace ep::model
