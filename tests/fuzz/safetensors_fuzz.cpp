// libFuzzer target: the safetensors header parser, the index (weight_map) parser, the
// resolution of companion scale tensors with the exact FP8 / FP4 conversions of the tensors it
// finds, and the config.json readers of the checkpoints (quantization_config, DeepSeek-V4, Kimi).
#include "core/error.hpp"
#include "format/checkpoint_tensors.hpp"
#include "format/safetensors.hpp"
#include "model/deepseek_v4_config.hpp"
#include "model/kimi_config.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  auto src = std::make_shared<ep::format::MemorySource>(std::span<const uint8_t>(data, size), "fuzz.safetensors");
  try {
    ep::format::SafetensorsFile f = ep::format::SafetensorsFile::parse(src);
    for (const auto &t : f.tensors()) {
      if (t.file_offset + t.nbytes > size) __builtin_trap();
    }
    const ep::format::SafetensorsSet set = ep::format::SafetensorsSet::of({std::move(f)});
    const ep::format::StResolved r = ep::format::resolve_checkpoint_tensors(set, {8, 16});
    for (const ep::format::StLogical &l : r.tensors) {
      if (l.nbytes() > (1u << 20)) continue;
      try {
        if (l.read().size() != l.nbytes()) __builtin_trap();
      } catch (const ep::Error &) {
      }
    }
  } catch (const ep::Error &) {
  }
  if (size > 0 && data[0] == '{') {
    const std::string text(reinterpret_cast<const char *>(data), size);
    try {
      ep::format::SafetensorsSet::parse_index(text, "fuzz.json");
    } catch (const ep::Error &) {
    }
    try {
      ep::format::CheckpointQuant::from_config_json(text, "config.json");
    } catch (const ep::Error &) {
    }
    try {
      ep::model::KimiConfig::from_hf_json(text, "config.json");
    } catch (const ep::Error &) {
    }
    try {
      ep::model::DeepseekV4Config::from_hf_json(text, "config.json");
    } catch (const ep::Error &) {
    }
  }
  return 0;
}
