// Safetensors checkpoints in the layouts users download, made from a (small) GGUF of the
// project's, together with a reference GGUF holding exactly the values the checkpoint holds:
//
// - DeepSeek-V4 as DeepSeek releases it: official names, FP8 e4m3 dense matrices with E8M0
//   block scales (the GGUF's values quantized to FP8 here), FP4 routed experts with E8M0 scales
//   (the GGUF's MXFP4 bytes re-laid, no value changes), BF16 / F32 small tensors, I64 tid2eid,
//   MTP tensors (to be skipped), sharded with model.safetensors.index.json.
// - Kimi-Linear as transformers saves it (F32, per-expert w1/w2/w3).
// - Kimi-K3 as Moonshot releases it: the text model under `language_model.`, BF16 dense,
//   compressed-tensors MXFP4 experts (weight_packed / weight_scale), AttnRes norm and proj
//   tensors, a padded A_log.
//
// The reference GGUF has the source's metadata and, per tensor, the checkpoint's values in the
// type that holds them exactly (FP8 × 2^k as bf16, FP4 as the MXFP4 bytes, ...): a loader that
// converts exactly gives bit-identical logits from both.
#pragma once

#include <cstdint>
#include <string>

namespace ep::testkit {

struct OfficialCheckpointOptions {
  uint32_t shards = 2;
  uint64_t fp8_block_rows = 128;  ///< written to quantization_config.weight_block_size
  uint64_t fp8_block_cols = 128;
  uint64_t seed = 7;
  /// Kimi-K3: store the dense matrices as F32 (the GGUF's values exactly) instead of BF16.
  bool k3_f32 = false;
};

/// @p gguf: a DeepSeek-V4 GGUF with MXFP4 routed experts. Writes config.json, the shards and the
/// index into @p dir, and @p reference_gguf (empty: none). Holds the checkpoint in memory.
void write_deepseek_v4_official(const std::string &gguf, const std::string &dir, const std::string &reference_gguf,
                                const OfficialCheckpointOptions &options = {});

enum class KimiCheckpointLayout {
  transformers,  ///< KimiLinearForCausalLM.save_pretrained(): F32, model.* names
  k3_official,   ///< Kimi-K3's release (needs MXFP4 routed experts in @p gguf)
};

/// @p gguf: a kimi-linear / kimi-k3 GGUF. Writes config.json and the shards (+ index) into @p dir,
/// and @p reference_gguf (empty: none). Holds the checkpoint in memory.
void write_kimi_checkpoint(const std::string &gguf, KimiCheckpointLayout layout, const std::string &dir,
                           const std::string &reference_gguf, const OfficialCheckpointOptions &options = {});

}  // namespace ep::testkit
