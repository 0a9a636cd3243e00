// Kimi-Linear hyper-parameters (KimiLinearForCausalLM), read from a GGUF file with `kimi-linear.*`
// keys (docs/models/kimi-linear.md: llama.cpp's key names where they exist, ours otherwise).
// Every dimension comes from the file, so the tiny oracle models and the real 48B-A3B load alike.
//
// The Kimi-K3 additions (SiTU, AttnRes, latent MoE, MLA output gate, full-rank KDA output gate,
// the lower-bounded decay) are flags here, read from `kimi-k3.*` keys and tensor presence; see
// docs/models/kimi-k3.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ep::format {
class GgufSet;
}

namespace ep::model {

/// Mixer of one layer: Kimi Delta Attention (linear, recurrent) or MLA (full attention, no RoPE).
enum class KimiMixer : uint8_t { kda = 0, mla = 1 };

struct KimiConfig {
  std::string arch = "kimi-linear";
  int64_t vocab = 0;
  int64_t hidden = 0;          ///< D
  int64_t n_layers = 0;
  float rms_eps = 1e-5f;
  std::vector<KimiMixer> mixer;  ///< per layer

  // MLA (full-attention layers)
  int64_t n_heads = 0;         ///< H
  int64_t q_lora_rank = 0;     ///< 0: a direct attn_q projection
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_dim = 0;
  int64_t qk_rope_dim = 0;     ///< the shared "rope" key dims; Kimi applies no RoPE to them
  int64_t v_head_dim = 0;

  // KDA (linear-attention layers)
  int64_t kda_heads = 0;
  int64_t kda_head_dim = 0;    ///< key and value head dim
  int64_t conv_kernel = 0;     ///< depthwise causal short convolution width

  // FFN / MoE
  int64_t n_dense_layers = 0;  ///< the first n layers have a dense FFN
  int64_t dense_ff = 0;
  int64_t n_experts = 0;
  int64_t n_experts_used = 0;
  int64_t moe_ff = 0;
  int64_t n_shared_experts = 0;  ///< shared expert width = moe_ff · n_shared_experts
  float routed_scale = 1.0f;
  bool norm_topk = true;

  // Kimi-K3 additions (docs/models/kimi-k3.md); all off for Kimi-Linear
  float kda_gate_lower_bound = 0.0f;  ///< < 0: decay g = lb·σ(exp(A_log)·(f + dt_bias)); 0 = unset (softplus form)
  int64_t expert_latent_dim = 0;      ///< > 0: routed experts run on routed_down(x) (latent MoE)
  int64_t attn_res_block_size = 0;    ///< > 0: AttnRes replaces the residual (checkpoint period)
  bool situ = false;                  ///< SiTU instead of SiLU in every GLU
  float situ_beta = 4.0f;
  float situ_linear_beta = 25.0f;     ///< <= 0: the up branch is not transformed
  bool mla_output_gate = false;       ///< MLA layers have attn_gate (σ(W·x) on the attention output)
  bool kda_full_rank_gate = false;    ///< KDA output gate is ssm_g [D → Di] instead of g_b·g_a

  int64_t max_positions = 0;

  int64_t kda_inner() const { return kda_heads * kda_head_dim; }
  int64_t qk_head_dim() const { return qk_nope_dim + qk_rope_dim; }
  bool is_moe(int64_t il) const { return il >= n_dense_layers; }
  /// Checks every dimension and relation; throws Error(Status::format / unsupported) naming @p source.
  void validate(const std::string &source) const;
  std::string summary() const;

  /// From `kimi-linear.*` or `kimi-k3.*` metadata.
  static KimiConfig from_gguf(const format::GgufSet &gguf);
  /// From a config.json: KimiLinearForCausalLM's as transformers writes it, or Kimi-K3's
  /// (KimiK3ForConditionalGeneration: the text model's keys under text_config, with the K3
  /// features: hidden_act situ, attn_res_block_size, routed_expert_hidden_size,
  /// mla_use_output_gate, linear_attn_config.gate_lower_bound / use_full_rank_gate).
  static KimiConfig from_hf_json(const std::string &json_text, const std::string &source);
};

}  // namespace ep::model
