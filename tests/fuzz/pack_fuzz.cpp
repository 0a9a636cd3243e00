// libFuzzer target: the Expert Pack header/index parser at full validation, and the
// manifest JSON parser (inputs starting with '{').
#include "core/error.hpp"
#include "format/pack_file.hpp"
#include "pack/manifest.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 0 && data[0] == '{') {
    try {
      ep::pack::Manifest::parse(std::string(reinterpret_cast<const char *>(data), size), "fuzz.json");
    } catch (const ep::Error &) {
    }
    return 0;
  }
  auto src = std::make_shared<ep::format::MemorySource>(std::span<const uint8_t>(data, size), "fuzz.epk");
  try {
    auto pack = ep::format::PackFile::parse(src, ep::format::ValidationLevel::full);
    for (uint32_t l = 0; l < pack->num_layers(); ++l)
      for (uint32_t x = 0; x < pack->num_experts(); ++x)
        if (pack->object_offset(l, x) + pack->object_bytes(l, x) > size) __builtin_trap();
  } catch (const ep::Error &) {
  }
  return 0;
}
