// A model's tensors under canonical names (llama.cpp GGUF names, e.g. "blk.3.attn_q_a.weight"),
// whatever file they come from: a GGUF file (names as they are), or a transformers / official
// DeepSeek safetensors checkpoint (names mapped, per-expert tensors stacked, dtypes kept or
// converted). Loading is fail-closed: the model asks for every tensor it needs with its exact
// shape, and finish() reports every missing, mis-shaped or unconsumed (unmapped) tensor at once.
#pragma once

#include "format/checkpoint_tensors.hpp"
#include "format/ggml_type.hpp"

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace ep::model {

struct KimiConfig;

/// One tensor as the model receives it: ggml type and ggml-order shape (ne[0] contiguous).
struct CatalogEntry {
  format::GgmlType type = format::GgmlType::f32;
  std::array<int64_t, 4> ne{1, 1, 1, 1};
  std::string origin;  ///< "file: source name" for messages
  std::function<std::vector<uint8_t>()> read;
  /// Optional: bytes of expert @p e of a stacked [.., .., n_expert] tensor (one ne[0]×ne[1] slab).
  std::function<std::vector<uint8_t>(int64_t e)> read_expert;
};

class WeightCatalog {
 public:
  /// All tensors of a GGUF file (or split set) under their own names.
  static WeightCatalog from_gguf(const std::string &path);
  /// A DeepSeek-V4 safetensors checkpoint (file, index .json or directory): transformers'
  /// save_pretrained() or DeepSeek's official release (FP8 dense weights with their block
  /// scales, FP4 routed experts with E8M0 scales: format/checkpoint_tensors.hpp), names mapped to
  /// the canonical ones (see docs/models/deepseek-v4.md). Unmappable names are kept and reported
  /// by finish() as unmapped; `mtp.*` tensors (the MTP layer, not run) are skipped.
  static WeightCatalog from_deepseek_v4_safetensors(const std::string &path, const format::CheckpointQuant &quant = {});
  /// A Kimi safetensors checkpoint: Kimi-Linear as transformers saves it, or Kimi-K3's release
  /// (text model under `language_model.`, compressed-tensors MXFP4 routed experts, AttnRes
  /// norm ⊙ proj pairs folded into score vectors, A_log folded into ssm_a = −exp(A_log)), names
  /// mapped to llama.cpp's (docs/models/kimi-linear.md, kimi-k3.md). @p config gives the layer
  /// kinds and head counts the map needs. The vision tower is skipped.
  static WeightCatalog from_kimi_safetensors(const std::string &path, const KimiConfig &config,
                                             const format::CheckpointQuant &quant = {});

  /// True when the file has a tensor of this canonical name (does not consume it).
  bool has(const std::string &name) const { return entries_.count(name) != 0; }
  /// The entry for @p name, checked against @p ne (trailing 1s may be omitted); consumes it.
  /// A missing or mis-shaped tensor is recorded (not thrown) and nullptr returned.
  const CatalogEntry *take(const std::string &name, std::vector<int64_t> ne);
  /// Marks every tensor whose name starts with @p prefix as deliberately unused (e.g. the MTP
  /// layers "blk.43."); returns how many.
  size_t skip_prefix(const std::string &prefix);
  /// Throws Error(Status::format / shape) listing every missing, mis-shaped and unconsumed tensor.
  void finish() const;
  const std::string &source() const { return source_; }
  /// The model finish()'s message names ("DeepSeek-V4" unless set).
  void set_model(std::string name) { model_ = std::move(name); }

  void add(const std::string &name, CatalogEntry entry);
  void add_unmapped(const std::string &what) { unmapped_.push_back(what); }

 private:
  std::string source_;
  std::string model_ = "DeepSeek-V4";  ///< for finish()'s message
  std::map<std::string, CatalogEntry> entries_;
  std::map<std::string, bool> taken_;
  std::vector<std::string> missing_, misshaped_, unmapped_;
  std::vector<std::shared_ptr<const void>> keep_alive_;
};

/// A safetensors checkpoint as a model opens it: its config.json and where its weights are.
struct SafetensorsCheckpoint {
  std::string weights;      ///< what from_*_safetensors() take: the path given, or the directory
  std::string config_path;  ///< <checkpoint dir>/config.json
  std::string config_text;
  format::CheckpointQuant quant;  ///< from config_text's quantization_config
};
/// For @p path (a safetensors file, an index, a directory or the config.json itself, recognised
/// by its bytes): Error(Status::format) naming @p model for anything else, Status::not_found
/// without a config.json beside it.
SafetensorsCheckpoint open_safetensors_checkpoint(const std::string &path, const std::string &model);

/// Maps a DeepSeek-V4 checkpoint tensor name (save_pretrained of transformers 5.17 — which uses
/// the official checkpoint names under a `model.` prefix — or the official names) to its GGUF
/// name. For a routed expert tensor, @p expert receives the expert index and the GGUF name is
/// the stacked tensor's. Returns "" for an unknown name.
std::string deepseek_v4_gguf_name(const std::string &checkpoint_name, int64_t *expert);

/// Maps a Kimi-Linear / Kimi-K3 checkpoint tensor name to its GGUF name, as
/// deepseek_v4_gguf_name() does. Two names get a suffix for the loader to combine: an AttnRes
/// norm / proj pair maps to "<score>.weight#norm" / "#proj", and A_log to "blk.N.ssm_a#A_log".
std::string kimi_gguf_name(const std::string &checkpoint_name, const KimiConfig &config, int64_t *expert);

/// ssm_a of one KDA head from the checkpoint's A_log: −exp(A_log), in double, rounded to f32.
float kimi_ssm_a_from_a_log(float a_log) noexcept;

}  // namespace ep::model
