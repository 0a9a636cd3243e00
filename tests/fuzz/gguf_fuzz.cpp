// libFuzzer target: the GGUF parser on arbitrary bytes. Any ep::Error is a clean rejection;
// a crash, a sanitizer report or a huge allocation is a bug.
#include "core/error.hpp"
#include "format/gguf.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  auto src = std::make_shared<ep::format::MemorySource>(std::span<const uint8_t>(data, size), "fuzz.gguf");
  try {
    const ep::format::GgufFile g = ep::format::GgufFile::parse(src);
    for (const auto &[key, value] : g.metadata()) (void)value.to_string(4);
    for (const auto &t : g.tensors()) {
      if (t.file_offset + t.nbytes > size) __builtin_trap();  // the parser promised in-bounds data
    }
  } catch (const ep::Error &) {
  }
  return 0;
}
