// libFuzzer target: the safetensors header parser and the index (weight_map) parser.
#include "core/error.hpp"
#include "format/safetensors.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  auto src = std::make_shared<ep::format::MemorySource>(std::span<const uint8_t>(data, size), "fuzz.safetensors");
  try {
    const ep::format::SafetensorsFile f = ep::format::SafetensorsFile::parse(src);
    for (const auto &t : f.tensors()) {
      if (t.file_offset + t.nbytes > size) __builtin_trap();
    }
  } catch (const ep::Error &) {
  }
  if (size > 0 && data[0] == '{') {
    try {
      ep::format::SafetensorsSet::parse_index(std::string(reinterpret_cast<const char *>(data), size), "fuzz.json");
    } catch (const ep::Error &) {
    }
  }
  return 0;
}
