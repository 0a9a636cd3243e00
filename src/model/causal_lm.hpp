// The model interface the C API (ep_model, sessions, ep_generate, ep_score, the text API) runs:
// a causal language model over token ids with a per-sequence state, whose routed experts come
// from an ExpertProvider. One adapter (causal_lm.cpp) wraps each model class: DeepseekV4Model
// for `deepseek4`, KimiModel for `kimi-linear` and `kimi-k3`.
//
// Architectures are found from the source: a GGUF file's general.architecture, or a safetensors
// checkpoint's config.json model_type (mapped to the GGUF name: deepseek_v4 → deepseek4,
// kimi_linear → kimi-linear, kimi_k3 → kimi-k3). Each architecture says which devices it runs
// on, so that EP_DEVICE_AUTO can pick one before anything is loaded.
//
// Expert provider layers: provider layer i is pack layer i is model block
// first_expert_layer() + i. The MoE layers of every supported architecture are contiguous (the
// dense layers come first), so this is the MoE ordinal: DeepSeek-V4 starts at block 0, Kimi at
// leading_dense_block_count (its packs have first_layer = 1 for the published models).
#pragma once

#include "backend/backend.hpp"
#include "experts/provider.hpp"
#include "model/logit_rows.hpp"

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace ep::model {

/// One sequence's decode state on a CausalLm (made by CausalLm::new_state()). It may hold
/// backend memory of its model: it must not outlive that model.
class LmState {
 public:
  virtual ~LmState() = default;
  /// Tokens run so far (the next position).
  virtual int64_t n_past() const = 0;
  /// A copy of the state (its backend memory copied on the backend): the same sequence, forked.
  virtual std::unique_ptr<LmState> clone() const = 0;
  /// Bytes of backend memory the state holds (allocated, not only in use: buffers that grow keep
  /// room ahead), which a copy of it (clone()) holds too.
  virtual uint64_t state_bytes() const = 0;
};

/// What a model is (ep_model_info()).
struct CausalLmInfo {
  std::string architecture;  ///< the GGUF architecture name: "deepseek4", "kimi-linear", "kimi-k3"
  int64_t vocab = 0;         ///< logits per position
  int64_t n_layers = 0;      ///< blocks that run
  int64_t hidden = 0;
  int64_t n_experts = 0;       ///< routed experts per MoE layer
  int64_t n_experts_used = 0;  ///< routed experts per token
  int64_t context_length = 0;  ///< positions a sequence may hold, as the source states it; 0 = the source states none
};

struct CausalLmOptions {
  /// true: read every routed expert from the source into backend memory; false: check their
  /// tensors only and leave them to a provider installed with set_experts() before forward().
  bool resident_experts = true;
  /// With resident_experts: the devices the experts are spread over, the model's backend first
  /// (docs/multi-device.md); empty: the model's backend alone.
  std::vector<backend::Backend *> expert_devices;
};

class CausalLm {
 public:
  virtual ~CausalLm() = default;
  virtual const CausalLmInfo &info() const = 0;
  virtual std::unique_ptr<LmState> new_state() const = 0;
  /// The backend memory a state of this model holding @p tokens tokens holds at most, whatever
  /// appends made it (the model's growth rule; equal when each token was appended by itself):
  /// the number the engine's KV budget counts.
  virtual uint64_t state_bytes(int64_t tokens) const = 0;
  /// Runs @p n tokens at positions state.n_past() ... and appends them to @p state (which must
  /// come from this model's new_state()). Returns the logits @p rows asks for, in backend
  /// memory: f32 [vocab] (LogitRows::last), [vocab, n] (all; row t predicts token t+1) or an
  /// empty tensor (none); valid until the next forward() of this model. After an exception the
  /// state must be discarded.
  virtual backend::Tensor forward(const int32_t *tokens, int64_t n, LmState &state, LogitRows rows) = 0;
  /// forward() with every row copied to @p logits (host memory, n × vocab floats), or none when
  /// @p logits is null.
  void forward(const int32_t *tokens, int64_t n, LmState &state, float *logits);
  /// One forward pass over several sequences: sequence i is tokens[offsets[i] .. offsets[i+1])
  /// (at least one token) appended to states[i] (distinct states of this model). Each
  /// sequence's results are those of forward() on it alone; the routed experts of all of them
  /// are acquired together, once per MoE layer. LogitRows::last gives each sequence's last
  /// token's logits, [vocab, sequences]; all gives every row, [vocab, tokens].
  virtual backend::Tensor forward_batch(std::span<const int32_t> tokens, std::span<const int64_t> offsets,
                                        std::span<LmState *const> states, LogitRows rows) = 0;
  /// The backend the model runs on.
  virtual backend::Backend &backend() const = 0;
  /// Per provider layer (= pack layer): the routed experts' types and shapes in the source.
  virtual const std::vector<experts::ExpertShape> &expert_shapes() const = 0;
  /// The model block of provider / pack layer 0 (the number of leading dense blocks).
  virtual int64_t first_expert_layer() const = 0;
  /// Replaces the routed-expert source (e.g. PackedExperts with first_layer = first_expert_layer()).
  virtual void set_experts(std::unique_ptr<experts::ExpertProvider> experts) = 0;
  /// Bytes of weights held in backend memory.
  virtual uint64_t weight_bytes() const = 0;
};

/// The architecture of a model source (see the file comment): a GGUF file (magic) or a
/// safetensors checkpoint (directory with config.json, or a file beside it). Status::not_found /
/// Status::format when it cannot be read; unknown names are returned as they are.
std::string source_architecture(const std::string &source);
/// True when @p architecture is one open_causal_lm() opens.
bool architecture_known(const std::string &architecture);
/// The architectures open_causal_lm() opens, by their GGUF names, comma-separated (for messages).
std::string known_architectures();
/// True when the architecture's model runs on @p device (false for unknown architectures).
bool architecture_runs_on(const std::string &architecture, backend::Device device);
/// Opens the model of @p source on @p backend, dispatching on source_architecture().
/// Status::unsupported (naming the file and the architecture) for an unknown architecture.
std::unique_ptr<CausalLm> open_causal_lm(const std::string &source, backend::Backend &backend,
                                         const CausalLmOptions &options = {});

}  // namespace ep::model
