// The Kimi-Linear model (KimiLinearForCausalLM of transformers 5.17) on the ep::backend::Backend
// interface: a hybrid of Kimi Delta Attention layers (q/k/v projections, depthwise causal short
// convolution + SiLU, L2-normalised q and k, β = σ(b_proj x), per-channel decay
// g = −exp(A_log)·softplus(f_b(f_a x) + dt_bias), the delta-rule state update, a gated RMSNorm on
// the output) and MLA full-attention layers without RoPE; a dense FFN on the first layers, then
// MoE with sigmoid scores + correction bias, renormalised top-k, a scale and shared experts.
// With the Kimi-K3 flags of KimiConfig also SiTU, AttnRes, latent MoE, the gated MLA
// output, the full-rank KDA output gate and the lower-bounded decay (docs/models/kimi-k3.md).
//
// Every op goes through the Backend (CPU or CUDA: short_conv_silu, kda_recurrence, causal_attention,
// attn_res_mix, ... in backend.hpp); activations and the decode state live in backend memory. The
// host sees only the routed expert ids (for the provider's acquire) and the logits. Decode state:
// per KDA layer the last conv_kernel − 1 projected q/k/v rows and the recurrent state
// [heads][dk][dv]; per MLA layer the expanded keys and values so far.
#pragma once

#include "backend/backend.hpp"
#include "experts/provider.hpp"
#include "model/backend_memory.hpp"
#include "model/logit_rows.hpp"
#include "model/kimi_config.hpp"

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace ep::model {

class WeightCatalog;

/// One layer's decode state, in backend memory.
struct KimiLayerState {
  StateBuffer conv;    ///< KDA: [3][conv_kernel − 1][kda_inner] f32: q, k, v input rows, oldest first
  StateBuffer S;       ///< KDA: [kda_heads][dk][dv] f32
  StateBuffer keys;    ///< MLA: [capacity][heads][qk_head_dim] f32 (the first n_past rows in use)
  StateBuffer values;  ///< MLA: [capacity][heads][v_head_dim] f32
  int64_t capacity = 0;  ///< MLA: tokens keys / values have room for (grows by doubling)
};

/// Decode state: prefill, then decode token by token, equals recomputing the whole sequence.
/// Holds backend memory of the model's backend (it must not outlive that backend). Copying it
/// forks the sequence: the copy gets its own backend memory with the same contents.
struct KimiState {
  int64_t n_past = 0;
  std::vector<KimiLayerState> layers;
  const void *model = nullptr;  ///< the KimiModel that made it (new_state())
};

struct KimiLoadOptions {
  /// true: read every routed expert from the source into backend memory (ResidentExperts);
  /// false: only check their tensors and leave the experts to set_experts().
  bool resident_experts = true;
  /// With resident_experts: the devices the experts are spread over (experts::ResidentShards;
  /// the model's backend first); empty: the model's backend alone.
  std::vector<backend::Backend *> expert_devices;
};

class KimiModel {
 public:
  /// Opens a `kimi-linear` / `kimi-k3` GGUF file (any shard of a split set; recognised by its
  /// bytes), or a safetensors checkpoint with its config.json (Kimi-Linear as transformers saves
  /// it, Kimi-K3's release with compressed-tensors MXFP4 experts).
  static std::unique_ptr<KimiModel> open(const std::string &path, backend::Backend &backend,
                                               const KimiLoadOptions &options = {});
  /// Loads every weight from @p catalog (fail-closed) into backend memory.
  KimiModel(const KimiConfig &config, WeightCatalog &catalog, backend::Backend &backend,
                  const KimiLoadOptions &options = {});
  ~KimiModel();
  KimiModel(const KimiModel &) = delete;
  KimiModel &operator=(const KimiModel &) = delete;

  const KimiConfig &config() const { return cfg_; }
  KimiState new_state() const;
  /// The backend memory a state holding @p tokens tokens holds: the KDA layers' convolution
  /// and recurrent state from the start (fixed), the MLA layers' f32 keys and values at
  /// state_capacity(tokens) rows once a token is in.
  uint64_t state_bytes(int64_t tokens) const;
  /// Runs @p n tokens at positions state.n_past ... and appends them to @p state. Returns the
  /// logits @p rows asks for in backend memory: f32 [vocab] (last), [vocab, n] (all; row t
  /// predicts token t+1) or an empty tensor (none); valid until the next forward() of this model.
  backend::Tensor forward(const int32_t *tokens, int64_t n, KimiState &state, LogitRows rows);
  /// After an exception the state is partly updated and must be discarded. One forward() at a
  /// time per model (it reuses the model's scratch buffers in backend memory).
  /// One forward pass over several sequences: sequence i is tokens[offsets[i] .. offsets[i+1])
  /// at states[i] (distinct states of this model). The mixers' stateful parts run per sequence,
  /// everything else (their projections too) over every token at once (one acquire of the union of
  /// the routed experts per MoE layer): each sequence's results are those of forward() on it
  /// alone (bit for bit on the CPU). Logits as forward(), with
  /// LogitRows::last giving each sequence's last token: [vocab, sequences] ([vocab] for one).
  backend::Tensor forward_batch(std::span<const int32_t> tokens, std::span<const int64_t> offsets,
                                std::span<KimiState *const> states, LogitRows rows);
  /// forward() with every row copied to @p logits (host memory, n × vocab floats), or none when
  /// @p logits is null.
  void forward(const int32_t *tokens, int64_t n, KimiState &state, float *logits);
  /// The backend the model runs on.
  backend::Backend &backend() const { return be_; }

  /// Replaces the routed-expert source. The provider's layer index is the MoE layer's ordinal
  /// (moe_index()), not the model layer: the dense first layers have no experts.
  void set_experts(std::unique_ptr<experts::ExpertProvider> experts) { experts_ = std::move(experts); }
  experts::ExpertProvider *experts() const { return experts_.get(); }
  /// The provider index of model layer @p layer, or −1 for a dense layer.
  int64_t moe_index(int64_t layer) const { return moe_index_.at(static_cast<size_t>(layer)); }
  /// Per MoE layer (in moe_index order): the routed experts' types and shapes in the source file.
  const std::vector<experts::ExpertShape> &expert_shapes() const { return expert_shapes_; }
  uint64_t weight_bytes() const { return weight_bytes_; }

  struct Weights;

 private:
  /// One sequence of a pass, as a mixer sees it: its tokens' columns, its position and its state.
  struct MixerSeq {
    int64_t offset = 0;  ///< first column of the pass
    int64_t n = 0;       ///< columns
    int64_t n_past = 0;  ///< tokens the state holds before the pass
    KimiLayerState *state = nullptr;
  };
  // x and out are [hidden, n] f32 in backend memory, the sequences' columns back to back. The
  // projections run once over every column, the state's part (short convolutions and the
  // recurrence; the cache and the causal attention) per sequence.
  void kda(int64_t il, const float *x, int64_t n, std::span<const MixerSeq> seqs, float *out);
  void mla(int64_t il, const float *x, int64_t n, std::span<const MixerSeq> seqs, float *out);
  void ffn(int64_t il, const float *x, int64_t n, float *out);
  void check_state(const KimiState &state) const;

  KimiConfig cfg_;
  backend::Backend &be_;
  std::unique_ptr<Weights> w_;
  std::unique_ptr<experts::ExpertProvider> experts_;
  std::vector<experts::ExpertShape> expert_shapes_;
  std::vector<int64_t> moe_index_;
  uint64_t weight_bytes_ = 0;
  std::unique_ptr<BackendScratch> fwd_scratch_;   ///< activations that live for one forward()
  std::unique_ptr<BackendScratch> site_scratch_;  ///< activations of one mixer / FFN site
};

}  // namespace ep::model
