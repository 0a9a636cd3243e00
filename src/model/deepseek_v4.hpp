// The DeepSeek-V4 model (DeepseekV4ForCausalLM without MTP) on the ep::backend::Backend
// interface: 4-stream hyper-connections with Sinkhorn mixing, attention with a low-rank query,
// one shared K=V head, partial RoPE (YaRN on compressed layers), a sliding window, per-head sinks,
// inverse RoPE and a grouped low-rank output; compressed (CSA, with the lightning indexer) and
// heavily compressed (HCA) KV; MoE with hash-routed first layers, sqrt-softplus scores plus the
// correction bias, clamped SwiGLU and a shared expert; the final hyper-connection head.
//
// Every op goes through the Backend (CPU or CUDA); activations and the decode state (K=V window,
// compressor rows and entries, CSA overlap) live in backend memory. The host only sees what it
// must: the routed expert ids (for the provider's acquire), the indexer's top-k ids (to build the
// attention's visibility mask) and the logits.
#pragma once

#include "backend/backend.hpp"
#include "experts/provider.hpp"
#include "model/backend_memory.hpp"
#include "model/deepseek_v4_config.hpp"
#include "model/logit_rows.hpp"

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace ep::model {

class WeightCatalog;

/// Running state of one compressor (attention or indexer) of one layer; rows in backend memory.
struct CompressorState {
  StateBuffer buf_kv, buf_gate;         ///< [ratio][c·d]: projected rows not yet in a closed window
  int64_t buf_rows = 0;                 ///< how many of them are in use
  int64_t n_entries = 0;                ///< closed windows so far
  StateBuffer entries;                  ///< [capacity][d]: the first n_entries rows, normed and RoPE'd
  int64_t entries_capacity = 0;
  bool has_overlap = false;             ///< CSA: the last closed window's first-half rows
  StateBuffer overlap_kv, overlap_gate;  ///< [ratio][d] (gate includes the position bias)
};

struct LayerState {
  StateBuffer window;              ///< [W − 1][head_dim]: the last K=V rows (window_pos.size() in use)
  std::vector<int32_t> window_pos; ///< their positions (host: positions are known on the host)
  CompressorState comp, index;
};

/// Decode state: prefill, then decode token by token, equals recomputing the whole sequence.
/// Holds backend memory of the model that made it: it must not outlive that model. Copying it
/// copies that memory on the backend (a fork of the sequence).
struct DeepseekV4State {
  int64_t n_past = 0;
  std::vector<LayerState> layers;
};

struct DeepseekV4LoadOptions {
  /// true: read every routed expert from the source into backend memory (ResidentExperts);
  /// false: only check their tensors (names, types, shapes: expert_shapes()) and leave the
  /// experts to a provider installed with set_experts() (PackedExperts) before forward().
  bool resident_experts = true;
  /// With resident_experts: the devices the experts are spread over (experts::ResidentShards;
  /// the model's backend first); empty: the model's backend alone.
  std::vector<backend::Backend *> expert_devices;
};

class DeepseekV4Model {
 public:
  /// Opens a model: a GGUF file (any shard of a split set; any name, e.g. an Ollama blob), or a
  /// safetensors checkpoint (directory with config.json, or a safetensors file / index / the
  /// config.json itself). Formats are recognised by their bytes (format/file_format.hpp).
  static std::unique_ptr<DeepseekV4Model> open(const std::string &path, backend::Backend &backend,
                                               const DeepseekV4LoadOptions &options = {});
  /// Loads every weight from @p catalog (fail-closed) into backend memory.
  DeepseekV4Model(const DeepseekV4Config &config, WeightCatalog &catalog, backend::Backend &backend,
                  const DeepseekV4LoadOptions &options = {});
  ~DeepseekV4Model();
  DeepseekV4Model(const DeepseekV4Model &) = delete;
  DeepseekV4Model &operator=(const DeepseekV4Model &) = delete;

  const DeepseekV4Config &config() const { return cfg_; }
  DeepseekV4State new_state() const;
  /// The backend memory a state holding @p tokens tokens holds at most, whatever appends made
  /// it (equal for one appended token at a time): per layer the K=V window once a token is in,
  /// and per compressor its pending rows (once a token is in), its CSA overlap (once a window
  /// closed) and its entries at state_capacity(tokens / ratio) rows.
  uint64_t state_bytes(int64_t tokens) const;
  /// Runs @p n tokens at positions state.n_past ... and appends them to @p state. Returns the
  /// logits @p rows asks for in backend memory: f32 [vocab] (last), [vocab, n] (all; row t
  /// predicts token t+1) or an empty tensor (none); valid until the next forward() of this model.
  backend::Tensor forward(const int32_t *tokens, int64_t n, DeepseekV4State &state, LogitRows rows);
  /// One forward pass over several sequences: sequence i is tokens[offsets[i] .. offsets[i+1])
  /// at states[i] (distinct states of this model). The per-token work runs over every token at
  /// once (the attention's projections too, and one acquire of the union of the routed experts
  /// per MoE layer), the attention's core per sequence: each sequence's results are those of
  /// forward() on it alone (bit for bit on the CPU). Logits as forward(),
  /// with LogitRows::last giving each sequence's last token: [vocab, sequences] (or [vocab] for
  /// one sequence).
  backend::Tensor forward_batch(std::span<const int32_t> tokens, std::span<const int64_t> offsets,
                                std::span<DeepseekV4State *const> states, LogitRows rows);
  /// forward() with every row copied to @p logits (host memory, n × vocab floats), or none when
  /// @p logits is null.
  void forward(const int32_t *tokens, int64_t n, DeepseekV4State &state, float *logits);
  /// The backend the model runs on.
  backend::Backend &backend() const { return be_; }
  /// Replaces the routed-expert source (e.g. the ExpertStore); layouts must match.
  void set_experts(std::unique_ptr<experts::ExpertProvider> experts) { experts_ = std::move(experts); }
  experts::ExpertProvider *experts() const { return experts_.get(); }
  /// Per layer: the routed experts' types and shapes as the source file has them.
  const std::vector<experts::ExpertShape> &expert_shapes() const { return expert_shapes_; }
  /// Bytes of weights held in backend memory (dense + resident experts).
  uint64_t weight_bytes() const { return weight_bytes_; }

  struct Weights;

 private:
  struct Scratch;
  struct Step;
  struct Batch;
  struct AttentionProjections;
  /// The attention of layer @p il over every sequence of @p batch: the per-token projections
  /// (queries, keys, compressor and indexer inputs) and the output projections run once over all
  /// tokens; the core (windows, compressed entries, indexer, softmax) per sequence on its state.
  void attention(int64_t il, const float *x, const Batch &batch, float *out);
  void project_attention(int64_t il, const float *x, const Batch &batch, AttentionProjections &p);
  void attention_core(int64_t il, const AttentionProjections &p, const Step &step, LayerState &st, float *att);
  /// Appends a sequence's compressor rows (@p kv, @p gate: [width, step.n], projected from its
  /// tokens) to @p st, closing every window they complete into a compressed entry.
  void compress(int64_t il, bool indexer, const float *kv, const float *gate, const Step &step, CompressorState &st);
  void moe(int64_t il, const float *x, const Batch &batch, float *out);
  void hc_site(int64_t il, bool ffn, float *h, const Batch &batch);
  /// y[w.ne1, n] = w · x[k, n]; zero-pads x when w's rows were padded past k (Loader::matrix).
  void mm(const backend::Tensor &w, const float *x, int64_t k, int64_t n, float *y);

  DeepseekV4Config cfg_;
  backend::Backend &be_;
  std::unique_ptr<Weights> w_;
  std::unique_ptr<experts::ExpertProvider> experts_;
  std::vector<experts::ExpertShape> expert_shapes_;
  uint64_t weight_bytes_ = 0;
  std::unique_ptr<Scratch> fwd_scratch_;   ///< activations that live for one forward()
  std::unique_ptr<Scratch> site_scratch_;  ///< activations of one attention / FFN site
};

}  // namespace ep::model
