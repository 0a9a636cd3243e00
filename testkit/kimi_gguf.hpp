// A runnable synthetic Kimi GGUF (llama.cpp `kimi-k3` names, keys and shapes; `kimi-linear` when
// the K3 features are off) with seeded random weights of sane magnitudes: KDA and MLA layers in
// any pattern, dense first layers, MoE with shared experts, and the K3 features (SiTU, AttnRes,
// latent MoE, gated MLA output, full-rank KDA gate, lower-bounded decay). Routed experts are
// random raw blocks of a chosen ggml type (Q2_K gate/up + Q3_K down like the published Q2_K
// GGUF, or MXFP4, ...). The bytes are a pure function of (seed, tensor, block), so the
// full-width Kimi-K3 shape (hidden 7168, 896 latent experts of 3584 × 3072) is written with
// constant memory, reproducibly, in one file or a split set.
#pragma once

#include "format/ggml_type.hpp"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ep::testkit {

struct KimiSyntheticSpec {
  uint64_t seed = 1;
  int64_t vocab = 512;
  int64_t hidden = 256;
  /// Per layer: true = MLA (full attention), false = KDA. The layer count is its size.
  std::vector<bool> mla_layers = {false, false, false, true, false, true};
  int64_t n_heads = 4;
  int64_t q_lora_rank = 64;   ///< 0: a direct attn_q
  int64_t kv_lora_rank = 64;
  int64_t qk_nope_dim = 32;
  int64_t qk_rope_dim = 16;
  int64_t v_head_dim = 32;
  int64_t kda_heads = 4;
  int64_t kda_head_dim = 32;
  int64_t conv_kernel = 4;
  int64_t n_dense_layers = 1;
  int64_t dense_ff = 512;
  int64_t n_experts = 32;
  int64_t n_experts_used = 4;
  int64_t moe_ff = 256;
  int64_t n_shared_experts = 1;
  float routed_scale = 1.0f;
  float rms_eps = 1e-5f;
  // Kimi-K3 features (all on by default; k3 = false writes a plain `kimi-linear` file)
  bool k3 = true;
  int64_t expert_latent_dim = 256;   ///< 0 = experts at full width (no routed down/up)
  int64_t attn_res_block_size = 2;   ///< 0 = plain residuals
  float situ_beta = 4.0f;
  float situ_linear_beta = 25.0f;
  float gate_lower_bound = -5.0f;
  format::GgmlType expert_gate_up = format::GgmlType::q2_k;
  format::GgmlType expert_down = format::GgmlType::q3_k;
  /// Type of the dense matrices (rows that do not divide into its blocks fall back to f16).
  format::GgmlType dense = format::GgmlType::f16;
  /// Also write a tokenizer: synthetic_kimi_chat_vocab(vocab) (chat_vocab.hpp) (needs vocab >= 262).
  bool chat_tokenizer = true;
  /// Routing shape (ep-synth --zipf), as DeepseekV4SyntheticSpec::router_zipf: < 0 random router
  /// biases; >= 0 the correction bias of the expert of rank r is -router_zipf · 0.25 · ln(1 + r).
  double router_zipf = -1.0;
  /// Files of the written set (1 = one .gguf; n > 1 = llama.cpp split files -0000k-of-0000n).
  uint32_t shards = 1;

  int64_t n_layers() const { return static_cast<int64_t>(mla_layers.size()); }
  int64_t latent() const { return expert_latent_dim > 0 ? expert_latent_dim : hidden; }
  /// The GGUF architecture: "kimi-k3" or "kimi-linear".
  const char *arch() const { return k3 ? "kimi-k3" : "kimi-linear"; }

  /// A small runnable model for tests (the defaults above with @p n_layers layers: MLA every
  /// fourth layer and the last, like Kimi-K3).
  static KimiSyntheticSpec tiny(int64_t n_layers);
  /// Kimi-K3's published dimensions (hidden 7168, 96 heads, q_lora 1536, kv_lora 512, KDA
  /// 96 × 128, dense layer 0 with ff 33792, 896 experts top-16 of ff 3072 in the latent width
  /// 3584, 2 shared experts, AttnRes block 12, vocab 163840) with @p n_layers layers; q8_0 dense.
  static KimiSyntheticSpec k3_shaped(int64_t n_layers);
  /// Kimi-K3's structure (top-16 latent MoE, 2 shared experts, AttnRes block 12, the layer
  /// pattern) at a width a CPU runs 2,000-token prompts at: hidden 512, 8 heads, KDA 8 × 64,
  /// 64 experts × 256 in a latent width of 256, vocab 4096; q8_0 dense.
  static KimiSyntheticSpec k3_reduced(int64_t n_layers);
};

/// Kimi-K3's layer pattern for @p n_layers layers: MLA at 0-based layers 3, 7, 11, ... and the last.
std::vector<bool> kimi_k3_mla_pattern(int64_t n_layers);

/// Routed expert bytes of one MoE layer (gate + up + down of every expert).
uint64_t kimi_synthetic_expert_layer_bytes(const KimiSyntheticSpec &spec);
/// Every tensor byte of the file (the GGUF headers not counted).
uint64_t kimi_synthetic_tensor_bytes(const KimiSyntheticSpec &spec);

/// Writes the model to @p path (with shards > 1, the split set whose first file
/// split_path(path without .gguf, 1, shards) is returned; else @p path). @p progress (optional)
/// gets (bytes done, bytes total).
std::string write_kimi_synthetic_gguf(const KimiSyntheticSpec &spec, const std::string &path,
                                      const std::function<void(uint64_t, uint64_t)> &progress = {});

}  // namespace ep::testkit
