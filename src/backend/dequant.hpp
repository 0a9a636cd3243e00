// Dequantization of ggml rows to f32, bit-exact with ggml's reference (ggml-quants.c) for every
// type whose row in format::kGgmlTypes has compute kernels (backend::is_supported_weight_type()):
// f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_K..q6_K, mxfp4, iq1_s, iq1_m, iq2_xxs, iq2_xs,
// iq2_s, iq3_xxs, iq3_s, iq4_nl and iq4_xs today.
#pragma once

#include "format/ggml_type.hpp"

#include <cstdint>

namespace ep::backend {

/// IEEE half → float, exact (subnormals, inf, NaN).
float fp16_to_fp32(uint16_t h) noexcept;
/// float → IEEE half, round to nearest even (used to build test blocks).
uint16_t fp32_to_fp16(float f) noexcept;
/// bfloat16 → float, exact.
float bf16_to_fp32(uint16_t h) noexcept;
/// float → bfloat16, round to nearest even (NaN stays NaN).
uint16_t fp32_to_bf16(float f) noexcept;
/// ggml's GGML_E8M0_TO_FP32_HALF: 2^(e−128) (0x00200000 << e for e < 2).
float e8m0_to_fp32_half(uint8_t e) noexcept;
/// ggml's kvalues_mxfp4 (twice the e2m1 values).
extern const int8_t kMxfp4Values[16];

/// Dequantizes @p n values (a whole number of blocks) of type @p type from @p src to @p dst.
/// Throws Error(Status::unsupported) for a type without compute kernels, Error(Status::shape)
/// when @p n is not a whole number of blocks.
void dequantize_row(format::GgmlType type, const void *src, float *dst, int64_t n);

}  // namespace ep::backend
