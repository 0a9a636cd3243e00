// libFuzzer target: the GGUF parser on arbitrary bytes, then the dequantization of every tensor
// of a supported weight type (so every block decoder reads fuzzed bytes under the sanitizers).
// Any ep::Error is a clean rejection; a crash, a sanitizer report or a huge allocation is a bug.
#include "backend/backend.hpp"
#include "backend/dequant.hpp"
#include "core/error.hpp"
#include "format/gguf.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  auto src = std::make_shared<ep::format::MemorySource>(std::span<const uint8_t>(data, size), "fuzz.gguf");
  try {
    const ep::format::GgufFile g = ep::format::GgufFile::parse(src);
    for (const auto &[key, value] : g.metadata()) (void)value.to_string(4);
    for (const auto &t : g.tensors()) {
      if (t.file_offset + t.nbytes > size) __builtin_trap();  // the parser promised in-bounds data
      const uint64_t n = t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3];
      if (!ep::backend::is_supported_weight_type(t.type) || n == 0 || n > (1u << 16)) continue;
      std::vector<float> y(static_cast<size_t>(n));
      ep::backend::dequantize_row(t.type, data + t.file_offset, y.data(), static_cast<int64_t>(n));
    }
  } catch (const ep::Error &) {
  }
  return 0;
}
