// The logical tensors of a safetensors checkpoint: a weight stored with a companion scale tensor
// becomes one tensor of a ggml type, converted exactly (format/microscale.hpp):
//
//   X.weight F8_E4M3 [r, c]   + X.scale F8_E8M0|F32 [ceil(r/br), ceil(c/bc)]  → X.weight bf16 (or f32)
//   X.weight I8|U8 [r, c/2]   + X.scale F8_E8M0|U8 [r, c/32]                  → X.weight mxfp4 [r, c]
//   X.weight_packed U8 [r, c/2] + X.weight_scale U8|F8_E8M0 [r, c/32]         → X.weight mxfp4 [r, c]
//     (compressed-tensors `mxfp4-pack-quantized`; an optional X.weight_shape [2] must say [r, c])
//
// The first two are DeepSeek-V4's official checkpoint (128 × 128 FP8 blocks unless config.json's
// quantization_config.weight_block_size says otherwise), the third Kimi-K3's. F32 / F16 / BF16
// and integer tensors stand as they are. Anything else (a scale without its weight, a weight of
// an 8-bit dtype without its scale, a scale of the wrong dtype or shape) is reported, naming the
// file, the tensors and what was expected, and never guessed.
#pragma once

#include "format/ggml_type.hpp"
#include "format/safetensors.hpp"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ep::format {

enum class StEncoding { plain, fp8_block, fp4_e8m0 };

struct CheckpointQuant {
  uint64_t fp8_block_rows = 128;  ///< FP8 scale block (quantization_config.weight_block_size)
  uint64_t fp8_block_cols = 128;
  /// Reads quantization_config (top level, or text_config's) from a config.json text; keeps the
  /// defaults where it is absent. Error(Status::unsupported) for an FP8 format other than e4m3
  /// or a scale format other than ue8m0 / float.
  static CheckpointQuant from_config_json(const std::string &json_text, const std::string &source);
};

struct StLogical {
  std::string name;  ///< the checkpoint name of the tensor (X.weight for a pair)
  StEncoding encoding = StEncoding::plain;
  const SafetensorsFile *file = nullptr;        ///< holds `data`
  const StTensorInfo *data = nullptr;           ///< the weight / packed values
  const SafetensorsFile *scale_file = nullptr;  ///< holds `scale` (fp8_block, fp4_e8m0)
  const StTensorInfo *scale = nullptr;
  GgmlType type = GgmlType::f32;   ///< what read() returns
  std::vector<uint64_t> shape;     ///< logical shape, outermost first (torch order)
  std::string origin;              ///< "file: tensor (+ scale)" for messages
  uint64_t block_rows = 0, block_cols = 0;  ///< fp8_block

  /// The tensor's bytes in `type` (the file's bytes, converted when encoded). Error naming the
  /// file, tensor and offset when the bytes cannot be read or decoded.
  std::vector<uint8_t> read() const;
  /// Bytes read() returns.
  uint64_t nbytes() const;
};

struct StResolved {
  std::vector<StLogical> tensors;
  std::vector<std::string> rejected;  ///< "file: tensor (why)" for every tensor that is not usable
};

/// Resolves every tensor of @p set; tensors whose name starts with one of @p skip_prefixes are
/// left out silently (e.g. the MTP layer "mtp.", a vision tower).
StResolved resolve_checkpoint_tensors(const SafetensorsSet &set, const CheckpointQuant &quant,
                                      const std::vector<std::string> &skip_prefixes = {});

/// The scale tensor's name of a packed FP4 tensor: X.weight → X.scale, X.weight_packed →
/// X.weight_scale ("" for another name).
std::string fp4_scale_tensor_name(const std::string &data_name);

/// Where the scale tensor (fp4_scale_tensor_name()) of FP4 tensor @p data_name of
/// @p files[@p own] lies: in that file, else in the first other one of @p files holding it (a
/// sharded checkpoint may put a tensor's scales in the next shard), else in the shard that the
/// checkpoint index beside files[own] (model.safetensors.index.json in its directory) lists for
/// it when none of @p files is that shard (a scale tensor alone in a shard of non-expert
/// tensors): @p open_shard opens it (the caller keeps it) and it is appended to @p files. The
/// file's index in @p files and the tensor; nullopt when none holds it.
struct Fp4ScaleLocation {
  size_t file = 0;
  const StTensorInfo *tensor = nullptr;
};
using OpenShard = std::function<const SafetensorsFile *(const std::string &path)>;
std::optional<Fp4ScaleLocation> find_fp4_scale(std::vector<const SafetensorsFile *> &files, size_t own, const std::string &data_name,
                                               const OpenShard &open_shard);

/// The ggml type of a plain safetensors dtype (f32, f16, bf16, f64, i8, i16, i32, i64), or nullopt.
std::optional<GgmlType> ggml_type_of(StDtype dtype) noexcept;

}  // namespace ep::format
