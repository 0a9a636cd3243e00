// The Kimi-Linear model (KimiLinearForCausalLM of transformers 5.17) on the ep::backend::Backend
// interface: a hybrid of Kimi Delta Attention layers (q/k/v projections, depthwise causal short
// convolution + SiLU, L2-normalised q and k, β = σ(b_proj x), per-channel decay
// g = −exp(A_log)·softplus(f_b(f_a x) + dt_bias), the delta-rule state update, a gated RMSNorm on
// the output) and MLA full-attention layers without RoPE; a dense FFN on the first layers, then
// MoE with sigmoid scores + correction bias, renormalised top-k, a scale and shared experts.
// With the Kimi-K3 flags of KimiLinearConfig also SiTU, AttnRes, latent MoE, the gated MLA
// output, the full-rank KDA output gate and the lower-bounded decay (docs/models/kimi-k3.md).
//
// Matmuls, norms, routing and experts go through the Backend; the Kimi-specific ops run as CPU
// reference code (kimi_ops.hpp), so this first version needs a CPU backend (Status::unsupported
// otherwise). Decode state: per KDA layer the last conv_kernel − 1 projected rows and the
// recurrent state [heads][dk][dv]; per MLA layer the expanded keys and values so far.
#pragma once

#include "backend/backend.hpp"
#include "model/expert_provider.hpp"
#include "model/kimi_linear_config.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ep::model {

class WeightCatalog;

struct KimiLayerState {
  std::vector<float> conv;    ///< KDA: [(conv_kernel − 1)][3 · kda_inner] (q | k | v projections)
  std::vector<float> S;       ///< KDA: [kda_heads][dk][dv]
  std::vector<float> keys;    ///< MLA: [n_past][heads][qk_head_dim]
  std::vector<float> values;  ///< MLA: [n_past][heads][v_head_dim]
};

/// Decode state: prefill, then decode token by token, equals recomputing the whole sequence.
/// A plain value: copying it forks the sequence.
struct KimiLinearState {
  int64_t n_past = 0;
  std::vector<KimiLayerState> layers;
};

struct KimiLinearLoadOptions {
  /// true: read every routed expert from the source into backend memory (ResidentExperts);
  /// false: only check their tensors and leave the experts to set_experts().
  bool resident_experts = true;
};

class KimiLinearModel {
 public:
  /// Opens a `kimi-linear` .gguf file (first shard of a set).
  static std::unique_ptr<KimiLinearModel> open(const std::string &path, backend::Backend &backend,
                                               const KimiLinearLoadOptions &options = {});
  /// Loads every weight from @p catalog (fail-closed) into backend memory.
  KimiLinearModel(const KimiLinearConfig &config, WeightCatalog &catalog, backend::Backend &backend,
                  const KimiLinearLoadOptions &options = {});
  ~KimiLinearModel();
  KimiLinearModel(const KimiLinearModel &) = delete;
  KimiLinearModel &operator=(const KimiLinearModel &) = delete;

  const KimiLinearConfig &config() const { return cfg_; }
  KimiLinearState new_state() const;
  /// Runs @p n tokens at positions state.n_past ... and appends them to @p state. When
  /// @p logits is not null it receives n rows of vocab logits (row t predicts token t+1).
  /// After an exception the state is partly updated and must be discarded.
  void forward(const int32_t *tokens, int64_t n, KimiLinearState &state, float *logits);

  /// Replaces the routed-expert source. The provider's layer index is the MoE layer's ordinal
  /// (moe_index()), not the model layer: the dense first layers have no experts.
  void set_experts(std::unique_ptr<ExpertProvider> experts) { experts_ = std::move(experts); }
  ExpertProvider *experts() const { return experts_.get(); }
  /// The provider index of model layer @p layer, or −1 for a dense layer.
  int64_t moe_index(int64_t layer) const { return moe_index_.at(static_cast<size_t>(layer)); }
  /// Per MoE layer (in moe_index order): the routed experts' types and shapes in the source file.
  const std::vector<ExpertShape> &expert_shapes() const { return expert_shapes_; }
  uint64_t weight_bytes() const { return weight_bytes_; }

  struct Weights;

 private:
  void kda(int64_t il, const float *x, int64_t n, KimiLayerState &st, float *out);
  void mla(int64_t il, const float *x, int64_t n, int64_t n_past, KimiLayerState &st, float *out);
  void ffn(int64_t il, const float *x, int64_t n, float *out);

  KimiLinearConfig cfg_;
  backend::Backend &be_;
  std::unique_ptr<Weights> w_;
  std::unique_ptr<ExpertProvider> experts_;
  std::vector<ExpertShape> expert_shapes_;
  std::vector<int64_t> moe_index_;
  uint64_t weight_bytes_ = 0;
};

}  // namespace ep::model
