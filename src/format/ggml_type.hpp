// The ggml tensor type table: one row per type, as ggml's type_traits has it. A row holds the id
// GGUF files store, ggml's name, the block size and bytes, and which compute kernels the backends
// have for it (the CPU dequantization, the CUDA dequantization and decode-GEMV families), so that
// every list of types (the supported weight types, the CPU and CUDA dispatch, the GEMV picker) is
// derived from this one. The kernels themselves live in src/backend; adding a type is one row
// here plus its kernels (docs/howto/adding-a-quant-type.md).
//
// This header is read by nvcc too (the CUDA kernels take their block facts and dispatch from the
// table): it includes no fmt and only constexpr standard headers.
#pragma once

#include <cstddef>
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

/// What the compute backends run for a type's weights; each level includes the one before.
enum class GgmlCompute : uint8_t {
  none = 0,     ///< listed and sized only: a weight of this type is refused (Status::unsupported)
  dequant = 1,  ///< CPU dequantize_row (the reference) and the CUDA dequantization kernel (matmul:
                ///< dequantize, then cuBLAS)
  gemv = 2,     ///< also the CUDA decode-GEMV kernels: the families of GgmlTypeInfo::gemv
};

/// The CUDA decode-GEMV kernel families (src/backend/cuda/gemv_families.hpp) as bits of
/// GgmlTypeInfo::gemv. generic and pipe decode any type that has a unit decoder
/// (quant_unit.cuh); the others are specialised kernels written per type.
enum GemvFamily : uint8_t {
  kGemvGeneric = 1u << 0,  ///< gemv_generic.cu: per-lane 32-value units
  kGemvPipe = 1u << 1,     ///< gemv_pipe.cu: the per-lane split with a cp.async double buffer
  kGemvMma = 1u << 2,      ///< gemv_mma.cu: tensor cores, 2..32 tokens
  kGemvDp4a = 1u << 3,     ///< gemv_dp4a.cu: x quantized to int8, dp4a, weights in registers
  kGemvStream = 1u << 4,   ///< gemv_stream.cu: dp4a with the weights streamed through shared memory
  kGemvRows = 1u << 5,     ///< gemv_rows.cu: lanes sharing a row, 16-byte loads
};

/// One row of the type table. Storage: `block_bytes` bytes hold `block_elems` consecutive values
/// of the contiguous dimension (ne[0]). Compute: which backend kernels exist for the type.
struct GgmlTypeInfo {
  GgmlType type;
  std::string_view name;    ///< ggml's name: "f32", "q2_K", "mxfp4", ...
  uint32_t block_elems;     ///< values per block (1 for plain types)
  uint32_t block_bytes;     ///< bytes per block
  bool quantized;           ///< true for block-quantized types
  GgmlCompute compute = GgmlCompute::none;  ///< the kernels the backends have for it
  uint8_t gemv = 0;         ///< GemvFamily bits that run it (compute == gemv only)
  /// The per-lane family launch_gemv falls back to where no specialised family covers the
  /// arguments (kGemvGeneric or kGemvPipe, whichever `ep-bench kernels` measured faster).
  GemvFamily gemv_lane = kGemvPipe;
};

namespace detail {
inline constexpr GgmlCompute kNo = GgmlCompute::none, kDq = GgmlCompute::dequant, kGv = GgmlCompute::gemv;
inline constexpr uint8_t kLane = kGemvGeneric | kGemvPipe;
inline constexpr uint8_t kKquant = kLane | kGemvMma | kGemvDp4a | kGemvStream;  // mxfp4, q2_K, q3_K
}  // namespace detail

/// The table, by id. Sizes from ggml-common.h's block structs (QK_K = 256). Compute: every type
/// with kernels is dequantized bit-exactly on both backends (backend/dequant.cpp's
/// dequant_blocks<T>, CUDA unit_values<T> in quant_unit.cuh / dequant_unit.cuh).
inline constexpr GgmlTypeInfo kGgmlTypes[] = {
    // type             name       elems bytes quant  compute    gemv families                       lane
    {GgmlType::f32,     "f32",     1,    4,    false, detail::kGv, detail::kLane | kGemvRows,         kGemvPipe},
    {GgmlType::f16,     "f16",     1,    2,    false, detail::kGv, detail::kLane | kGemvRows,         kGemvPipe},
    {GgmlType::q4_0,    "q4_0",    32,   18,   true,  detail::kDq},
    {GgmlType::q4_1,    "q4_1",    32,   20,   true,  detail::kDq},
    {GgmlType::q5_0,    "q5_0",    32,   22,   true,  detail::kDq},
    {GgmlType::q5_1,    "q5_1",    32,   24,   true,  detail::kDq},
    {GgmlType::q8_0,    "q8_0",    32,   34,   true,  detail::kGv, detail::kLane | kGemvRows | kGemvMma, kGemvPipe},
    {GgmlType::q8_1,    "q8_1",    32,   36,   true},
    {GgmlType::q2_k,    "q2_K",    256,  84,   true,  detail::kGv, detail::kKquant,                   kGemvPipe},
    {GgmlType::q3_k,    "q3_K",    256,  110,  true,  detail::kGv, detail::kKquant,                   kGemvPipe},
    {GgmlType::q4_k,    "q4_K",    256,  144,  true,  detail::kGv, detail::kLane,                     kGemvGeneric},
    {GgmlType::q5_k,    "q5_K",    256,  176,  true,  detail::kGv, detail::kLane,                     kGemvGeneric},
    {GgmlType::q6_k,    "q6_K",    256,  210,  true,  detail::kGv, detail::kLane,                     kGemvPipe},
    {GgmlType::q8_k,    "q8_K",    256,  292,  true},
    {GgmlType::iq2_xxs, "iq2_xxs", 256,  66,   true,  detail::kGv, detail::kLane | kGemvStream | kGemvMma, kGemvPipe},
    {GgmlType::iq2_xs,  "iq2_xs",  256,  74,   true,  detail::kDq},
    {GgmlType::iq3_xxs, "iq3_xxs", 256,  98,   true,  detail::kDq},
    {GgmlType::iq1_s,   "iq1_s",   256,  50,   true,  detail::kDq},
    {GgmlType::iq4_nl,  "iq4_nl",  32,   18,   true,  detail::kDq},
    {GgmlType::iq3_s,   "iq3_s",   256,  110,  true,  detail::kDq},
    {GgmlType::iq2_s,   "iq2_s",   256,  82,   true,  detail::kDq},
    {GgmlType::iq4_xs,  "iq4_xs",  256,  136,  true,  detail::kDq},
    {GgmlType::i8,      "i8",      1,    1,    false},
    {GgmlType::i16,     "i16",     1,    2,    false},
    {GgmlType::i32,     "i32",     1,    4,    false},
    {GgmlType::i64,     "i64",     1,    8,    false},
    {GgmlType::f64,     "f64",     1,    8,    false},
    {GgmlType::iq1_m,   "iq1_m",   256,  56,   true,  detail::kDq},
    {GgmlType::bf16,    "bf16",    1,    2,    false, detail::kGv, detail::kLane | kGemvRows,         kGemvPipe},
    {GgmlType::tq1_0,   "tq1_0",   256,  54,   true},
    {GgmlType::tq2_0,   "tq2_0",   256,  66,   true},
    {GgmlType::mxfp4,   "mxfp4",   32,   17,   true,  detail::kGv, detail::kKquant,                   kGemvGeneric},
    {GgmlType::nvfp4,   "nvfp4",   64,   36,   true},
};

/// Rows of kGgmlTypes.
inline constexpr size_t kGgmlTypeCount = sizeof(kGgmlTypes) / sizeof(kGgmlTypes[0]);

/// The row of a type id, or nullptr for an id ggml does not define (or has retired).
constexpr const GgmlTypeInfo *ggml_type_row(uint32_t type_id) noexcept {
  for (const GgmlTypeInfo &row : kGgmlTypes)
    if (static_cast<uint32_t>(row.type) == type_id) return &row;
  return nullptr;
}

/// The kernels the backends have for a type id (GgmlCompute::none for an unknown id).
constexpr GgmlCompute ggml_compute(uint32_t type_id) noexcept {
  const GgmlTypeInfo *row = ggml_type_row(type_id);
  return row ? row->compute : GgmlCompute::none;
}

/// Whether the GEMV family (a GemvFamily bit) runs a type id.
constexpr bool ggml_gemv_family(uint32_t type_id, GemvFamily family) noexcept {
  const GgmlTypeInfo *row = ggml_type_row(type_id);
  return row && row->compute == GgmlCompute::gemv && (row->gemv & family) != 0;
}

namespace detail {
constexpr bool table_is_consistent() {
  for (size_t i = 0; i < kGgmlTypeCount; ++i) {
    const GgmlTypeInfo &r = kGgmlTypes[i];
    if (r.block_elems == 0 || r.block_bytes == 0 || r.quantized != (r.block_elems > 1)) return false;
    for (size_t j = 0; j < i; ++j)
      if (kGgmlTypes[j].type == r.type) return false;  // one row per id
    // the CUDA kernels decode 32-value units: a block is one unit, or whole units
    if (r.compute != GgmlCompute::none && r.block_elems != 1 && r.block_elems % 32 != 0) return false;
    if (r.compute == GgmlCompute::gemv) {
      if ((r.gemv & kLane) != kLane) return false;  // the per-lane families decode every GEMV type
      if (r.gemv_lane != kGemvGeneric && r.gemv_lane != kGemvPipe) return false;
    } else if (r.gemv != 0) {
      return false;
    }
  }
  return true;
}
static_assert(table_is_consistent(), "kGgmlTypes: a row breaks the table's rules (see table_is_consistent)");
}  // namespace detail

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
