// A runnable synthetic DeepSeek-V4 GGUF (llama.cpp `deepseek4` names, keys and shapes) with
// seeded random weights of sane magnitudes: any dimensions, any compress ratios, routed experts
// as random raw blocks of a chosen ggml type (mxfp4, q2_K, q4_K, q8_0, iq2_xxs, f16, ...). The
// bytes are a pure function of (seed, tensor, block), so a file of any size (the full-width
// DeepSeek-V4-Flash shape too) is written with constant memory and is reproducible. The ds4
// layout writes the tensor types, metadata and tokenizer entries antirez/ds4 requires, so the
// same file runs in that engine too (at the Flash shape it compiles in).
#pragma once

#include "format/ggml_type.hpp"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ep::testkit {

/// Which tensor types (and extra entries) the writer uses for the dense part of the model.
enum class DeepseekV4SyntheticLayout {
  /// Every matrix in DeepseekV4SyntheticSpec::dense (f16 where its rows do not divide into the
  /// type's blocks); the router, the indexer projection and the compressor position biases in f32.
  generic,
  /// What antirez/ds4 validates (ds4.c: weights_validate_layout, config_validate_model,
  /// vocab_load): token embedding, hyper-connection mixers, router, compressor and indexer
  /// tensors (their position biases included) in f16; attention, shared expert and output
  /// matrices in q8_0 (`dense` is not used); norms, sinks and router biases in f32; plus the
  /// `deepseek4.vocab_size` key, a `tokenizer.ggml.merges` array (empty) and a `｜DSML｜` token
  /// (id 262) in the chat tokenizer. ds4 also wants IQ2_XXS, Q2_K or Q4_K routed experts (gate
  /// and up alike) and the Flash dimensions; at other dimensions the file keeps the same names
  /// and types (q8_0 falls back to f16 where rows do not divide into its blocks of 32).
  ds4,
};

struct DeepseekV4SyntheticSpec {
  uint64_t seed = 1;
  int64_t vocab = 256;
  int64_t hidden = 128;
  int64_t n_heads = 4;
  int64_t head_dim = 64;
  int64_t rope_dim = 16;
  int64_t q_lora_rank = 64;
  int64_t o_groups = 2;
  int64_t o_lora_rank = 32;
  int64_t n_experts = 8;
  int64_t n_experts_used = 2;
  int64_t moe_ff = 64;
  int64_t n_hash_layers = 1;
  int64_t index_n_heads = 4;
  int64_t index_head_dim = 32;
  int64_t index_topk = 4;
  int64_t sliding_window = 16;
  int64_t hc_mult = 4;
  int64_t hc_sinkhorn_iters = 20;
  /// Per layer: 0 = sliding only, csa_ratio = CSA (with indexer), anything else = HCA.
  std::vector<int32_t> compress_ratios = {0, 4, 16, 4};
  int32_t csa_ratio = 4;
  float swiglu_limit = 10.0f;
  float routed_scale = 1.5f;
  float rms_eps = 1e-6f;
  float hc_eps = 1e-6f;
  float rope_theta = 10000.0f;
  float compress_rope_theta = 160000.0f;
  float yarn_factor = 16.0f;
  int64_t yarn_original_max_positions = 65536;
  format::GgmlType expert_gate_up = format::GgmlType::mxfp4;
  format::GgmlType expert_down = format::GgmlType::mxfp4;
  /// Type of the dense matrices (rows that do not divide into its blocks fall back to f16).
  format::GgmlType dense = format::GgmlType::f16;
  /// Also write a tokenizer (tokenizer.ggml.*): synthetic_chat_vocab(vocab) (chat_vocab.hpp), a
  /// byte-level vocabulary with DeepSeek-V4's chat markers; needs vocab >= 262.
  bool chat_tokenizer = false;
  DeepseekV4SyntheticLayout layout = DeepseekV4SyntheticLayout::generic;
  /// Routing shape (ep-synth --zipf). < 0: random router biases and uniform hash tables (the
  /// default). >= 0: each layer ranks its experts by a seeded permutation; the router's
  /// correction bias of the expert of rank r (0-based) is -router_zipf * kRouterZipfBiasScale *
  /// ln(1 + r), and hash layers (ffn_gate_tid2eid) draw each token's experts with weights
  /// 1 / (1 + r)^router_zipf. 0 = uniform (zero biases), larger = more skewed popularity.
  double router_zipf = -1.0;
  static constexpr double kRouterZipfBiasScale = 0.25;

  /// DeepSeek-V4-Flash dimensions (hidden 4096, 64 heads × 512, 256 experts × 2048, vocab
  /// 129280, ...) with @p n_layers layers following the real compress-ratio pattern.
  static DeepseekV4SyntheticSpec flash_shaped(int64_t n_layers);
  /// DeepSeek-V4-Flash's structure at a width a CPU runs 2,000-token prompts at in seconds: the
  /// same window (128), compress ratios (4 / 128 by layer), indexer top-512, 3 hash layers and
  /// top-6 routing, with hidden 512, 8 heads × 128, 32 experts × 256 and vocab 4096.
  static DeepseekV4SyntheticSpec flash_reduced(int64_t n_layers);
  /// flash_shaped() in the ds4 layout with IQ2_XXS gate/up and Q2_K down experts and the chat
  /// tokenizer: a file antirez/ds4 loads once its compiled-in layer count is @p n_layers.
  static DeepseekV4SyntheticSpec flash_ds4(int64_t n_layers);
};

/// The token id the ds4 layout gives `｜DSML｜` in the chat tokenizer.
inline constexpr int64_t kDs4DsmlTokenId = 262;

/// The expert ranks of layer @p layer under router_zipf >= 0: rank[e] (0 = most popular).
std::vector<uint32_t> deepseek_v4_synthetic_expert_ranks(const DeepseekV4SyntheticSpec &spec, int64_t layer);

/// Writes the model to @p path; @p progress (optional) gets (bytes done, bytes total).
void write_deepseek_v4_synthetic_gguf(const DeepseekV4SyntheticSpec &spec, const std::string &path,
                               const std::function<void(uint64_t, uint64_t)> &progress = {});

}  // namespace ep::testkit
