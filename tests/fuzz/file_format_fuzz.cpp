// libFuzzer target: format detection by content on arbitrary bytes (the whole input as a file,
// and its first bytes as a probe of a longer file), and the first-bytes description used in
// errors. Detection never throws; a crash or a sanitizer report is a bug.
#include "format/file_format.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const std::span<const uint8_t> all(data, size);
  const ep::format::FileFormat whole = ep::format::detect_format_bytes(all, size);
  const std::span<const uint8_t> head = all.first(std::min<size_t>(size, 64));
  const ep::format::FileFormat probed = ep::format::detect_format_bytes(head, size + 1);
  // JSON kinds need the whole file; the binary kinds are decided by the first bytes alone
  const bool json = whole == ep::format::FileFormat::safetensors_index || whole == ep::format::FileFormat::hf_config;
  if (!json && probed != whole) __builtin_trap();
  if (json && !ep::format::starts_like_json(head)) __builtin_trap();
  const std::string text = ep::format::describe_bytes(all);
  const size_t shown = std::min<size_t>(size, 16);  // "hh hh |..|": 4 characters a byte, plus 2
  if (text.size() != (shown ? 4 * shown + 2 : 3)) __builtin_trap();
  (void)ep::format::file_format_name(whole);
  return 0;
}
