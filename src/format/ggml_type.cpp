#include "format/ggml_type.hpp"

#include "core/error.hpp"

#include <cctype>

namespace ep::format {
namespace {

bool equal_ignore_case(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i])))
      return false;
  }
  return true;
}

}  // namespace

std::optional<GgmlTypeInfo> ggml_type_info(uint32_t type_id) noexcept {
  if (const GgmlTypeInfo *row = ggml_type_row(type_id)) return *row;
  return std::nullopt;
}

GgmlTypeInfo require_ggml_type(uint32_t type_id, std::string_view context) {
  if (auto info = ggml_type_info(type_id)) return *info;
  fail(Status::unsupported, "{}: ggml type id {} is not a type this library knows", context, type_id);
}

std::optional<GgmlTypeInfo> ggml_type_by_name(std::string_view name) noexcept {
  for (const auto &info : kGgmlTypes) {
    if (equal_ignore_case(info.name, name)) return info;
  }
  return std::nullopt;
}

uint64_t ggml_row_bytes(GgmlType type, uint64_t row_elems, std::string_view context) {
  const GgmlTypeInfo info = require_ggml_type(static_cast<uint32_t>(type), context);
  if (row_elems % info.block_elems != 0) {
    fail(Status::shape, "{}: a row of {} values is not a whole number of {} blocks of {}", context,
         row_elems, info.name, info.block_elems);
  }
  return row_elems / info.block_elems * info.block_bytes;
}

}  // namespace ep::format
