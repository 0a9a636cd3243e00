#include "format/ggml_type.hpp"

#include "core/error.hpp"

#include <array>
#include <cctype>

namespace ep::format {
namespace {

// Sizes from ggml-common.h's block structs (QK_K = 256).
constexpr std::array<GgmlTypeInfo, 33> kTypes = {{
    {GgmlType::f32, "f32", 1, 4, false},
    {GgmlType::f16, "f16", 1, 2, false},
    {GgmlType::q4_0, "q4_0", 32, 18, true},
    {GgmlType::q4_1, "q4_1", 32, 20, true},
    {GgmlType::q5_0, "q5_0", 32, 22, true},
    {GgmlType::q5_1, "q5_1", 32, 24, true},
    {GgmlType::q8_0, "q8_0", 32, 34, true},
    {GgmlType::q8_1, "q8_1", 32, 36, true},
    {GgmlType::q2_k, "q2_K", 256, 84, true},
    {GgmlType::q3_k, "q3_K", 256, 110, true},
    {GgmlType::q4_k, "q4_K", 256, 144, true},
    {GgmlType::q5_k, "q5_K", 256, 176, true},
    {GgmlType::q6_k, "q6_K", 256, 210, true},
    {GgmlType::q8_k, "q8_K", 256, 292, true},
    {GgmlType::iq2_xxs, "iq2_xxs", 256, 66, true},
    {GgmlType::iq2_xs, "iq2_xs", 256, 74, true},
    {GgmlType::iq3_xxs, "iq3_xxs", 256, 98, true},
    {GgmlType::iq1_s, "iq1_s", 256, 50, true},
    {GgmlType::iq4_nl, "iq4_nl", 32, 18, true},
    {GgmlType::iq3_s, "iq3_s", 256, 110, true},
    {GgmlType::iq2_s, "iq2_s", 256, 82, true},
    {GgmlType::iq4_xs, "iq4_xs", 256, 136, true},
    {GgmlType::i8, "i8", 1, 1, false},
    {GgmlType::i16, "i16", 1, 2, false},
    {GgmlType::i32, "i32", 1, 4, false},
    {GgmlType::i64, "i64", 1, 8, false},
    {GgmlType::f64, "f64", 1, 8, false},
    {GgmlType::iq1_m, "iq1_m", 256, 56, true},
    {GgmlType::bf16, "bf16", 1, 2, false},
    {GgmlType::tq1_0, "tq1_0", 256, 54, true},
    {GgmlType::tq2_0, "tq2_0", 256, 66, true},
    {GgmlType::mxfp4, "mxfp4", 32, 17, true},
    {GgmlType::nvfp4, "nvfp4", 64, 36, true},
}};

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
  for (const auto &info : kTypes) {
    if (static_cast<uint32_t>(info.type) == type_id) return info;
  }
  return std::nullopt;
}

GgmlTypeInfo require_ggml_type(uint32_t type_id, std::string_view context) {
  if (auto info = ggml_type_info(type_id)) return *info;
  fail(Status::unsupported, "{}: ggml type id {} is not a type this library knows", context, type_id);
}

std::optional<GgmlTypeInfo> ggml_type_by_name(std::string_view name) noexcept {
  for (const auto &info : kTypes) {
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
