// Exact conversions of the block-scaled encodings official checkpoints ship into ggml types,
// so that a checkpoint runs with the values its authors stored and nothing is requantized:
//
// - FP4 (OCP e2m1, two values per byte, element 2i in the low nibble) with one E8M0 scale per
//   32 values along a row, as DeepSeek-V4's routed experts (`w1.weight` I8 + `w1.scale`) and
//   compressed-tensors `mxfp4-pack-quantized` (`weight_packed` U8 + `weight_scale` U8) store
//   them, is re-laid byte for byte into ggml MXFP4 blocks: the scale byte is kept (ggml doubles
//   its value table and halves the scale, so v = e2m1 · 2^(e−127) either way) and the nibbles
//   are reordered (ggml: element j low, element j+16 high). No value changes.
// - FP8 e4m3 with one scale per block of rows × columns (DeepSeek-V4's dense weights: E8M0
//   scales on 128 × 128 blocks) is multiplied out. An e4m3 value has 4 significant bits, so
//   value · 2^k is exact in bf16 whenever it lies in bf16's range; scales that are not powers of
//   two (F32 scales) give f32, which is exactly what a reference that dequantizes in f32 gets.
#pragma once

#include "format/ggml_type.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace ep::format {

/// Bytes of the MXFP4 blocks of a [rows, cols] matrix (cols a multiple of 32).
inline uint64_t mxfp4_bytes(uint64_t rows, uint64_t cols) { return rows * (cols / 32) * 17; }

/// Re-lays one row-major FP4 matrix [rows, cols]: @p packed holds rows × cols/2 bytes, @p scales
/// rows × cols/32 E8M0 bytes; @p out receives mxfp4_bytes(rows, cols) bytes. A scale of 0xFF
/// (E8M0's NaN, which MXFP4 cannot hold) is Error(Status::corrupt) naming @p what and the scale's
/// byte offset in @p scales.
void fp4_e8m0_to_mxfp4(const uint8_t *packed, const uint8_t *scales, uint64_t rows, uint64_t cols, uint8_t *out,
                       const std::string &what);
/// The inverse (for writers of test checkpoints): MXFP4 blocks → packed FP4 + E8M0 scales.
void mxfp4_to_fp4_e8m0(const uint8_t *mxfp4, uint64_t rows, uint64_t cols, uint8_t *packed, uint8_t *scales);

/// Value of one FP8 e4m3 (fn: no infinities, 0x7F / 0xFF are NaN) byte.
double e4m3_value(uint8_t b) noexcept;
/// The e4m3 byte nearest to @p v (ties to even), saturating at ±448; for writers of test
/// checkpoints.
uint8_t e4m3_from_value(double v) noexcept;

/// How a block scale is stored.
enum class ScaleType { e8m0, f32 };

/// The type fp8_block_dequant() gives for these block scales: bf16 when every e4m3 value times
/// every scale is exact in bf16 (powers of two 2^k with −124 <= k <= 119), else f32.
GgmlType fp8_block_type(const uint8_t *scales, uint64_t n_scales, ScaleType scale_type);

/// A dense FP8 e4m3 matrix [rows, cols] times its block scales [ceil(rows/block_rows),
/// ceil(cols/block_cols)] (row-major), in @p type (fp8_block_type() of the scales): bf16 holds
/// every value exactly; f32 holds the f32 product (exact for power-of-two scales; the rounded
/// product a reference computes in f32 otherwise). A NaN weight or scale, or a product outside
/// f32's range, is Error(Status::corrupt) naming @p what and the element.
std::vector<uint8_t> fp8_block_dequant(const uint8_t *weights, const uint8_t *scales, ScaleType scale_type, uint64_t rows,
                                       uint64_t cols, uint64_t block_rows, uint64_t block_cols, GgmlType type,
                                       const std::string &what);

}  // namespace ep::format
