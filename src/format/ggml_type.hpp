// The ggml tensor type table: ids as GGUF files store them, block sizes and names, so that
// any file can be listed and any row size computed. Dequantization lives in src/backend.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace ep::format {

/// ggml_type ids (ggml.h). Gaps are ids ggml has retired; they are rejected.
enum class GgmlType : uint32_t {
  f32 = 0, f16 = 1, q4_0 = 2, q4_1 = 3, q5_0 = 6, q5_1 = 7, q8_0 = 8, q8_1 = 9,
  q2_k = 10, q3_k = 11, q4_k = 12, q5_k = 13, q6_k = 14, q8_k = 15,
  iq2_xxs = 16, iq2_xs = 17, iq3_xxs = 18, iq1_s = 19, iq4_nl = 20, iq3_s = 21, iq2_s = 22,
  iq4_xs = 23, i8 = 24, i16 = 25, i32 = 26, i64 = 27, f64 = 28, iq1_m = 29, bf16 = 30,
  tq1_0 = 34, tq2_0 = 35, mxfp4 = 39, nvfp4 = 40,
};

/// Storage facts of one ggml type: `block_bytes` bytes hold `block_elems` consecutive values
/// of the contiguous dimension (ne[0]).
struct GgmlTypeInfo {
  GgmlType type;
  std::string_view name;    ///< ggml's name: "f32", "q2_K", "mxfp4", ...
  uint32_t block_elems;     ///< values per block (1 for plain types)
  uint32_t block_bytes;     ///< bytes per block
  bool quantized;           ///< true for block-quantized types
};

/// Facts of a type id, or nullopt for an id ggml does not define (or has retired).
std::optional<GgmlTypeInfo> ggml_type_info(uint32_t type_id) noexcept;
/// Like ggml_type_info() but throws ep::Error(Status::unsupported) naming @p context.
GgmlTypeInfo require_ggml_type(uint32_t type_id, std::string_view context);
/// Looks a type up by ggml's name ("q4_K", case-insensitive).
std::optional<GgmlTypeInfo> ggml_type_by_name(std::string_view name) noexcept;

/// Bytes of one row of @p row_elems values; throws ep::Error(Status::shape) when the row is
/// not a whole number of blocks, naming @p context.
uint64_t ggml_row_bytes(GgmlType type, uint64_t row_elems, std::string_view context);

}  // namespace ep::format
