// Device-side decoding of ggml blocks, 32 values ("one unit") at a time, bit-exact with ggml's
// dequantize_row_* (products and differences are rounded separately: no FMA contraction).
// Weights of plain types (f32, f16, bf16) are treated as blocks of 32 values. The decoders here are
// those of the GEMV types (GgmlCompute::gemv); dequant_unit.cuh has the dequantization-only ones.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/iq2xxs_table.hpp"
#include "format/ggml_type.hpp"

namespace ep::backend::cuda::quant {

// Short names of the ggml type ids the kernels specialise on; the ids, block sizes and which
// kernels a type has are format::kGgmlTypes' (dispatch.cuh).
enum : int {
  kF32 = static_cast<int>(format::GgmlType::f32), kF16 = static_cast<int>(format::GgmlType::f16),
  kBF16 = static_cast<int>(format::GgmlType::bf16), kQ8_0 = static_cast<int>(format::GgmlType::q8_0),
  kQ4_0 = static_cast<int>(format::GgmlType::q4_0), kQ4_1 = static_cast<int>(format::GgmlType::q4_1),
  kQ5_0 = static_cast<int>(format::GgmlType::q5_0), kQ5_1 = static_cast<int>(format::GgmlType::q5_1),
  kQ2_K = static_cast<int>(format::GgmlType::q2_k), kQ3_K = static_cast<int>(format::GgmlType::q3_k),
  kQ4_K = static_cast<int>(format::GgmlType::q4_k), kQ5_K = static_cast<int>(format::GgmlType::q5_k),
  kQ6_K = static_cast<int>(format::GgmlType::q6_k), kMXFP4 = static_cast<int>(format::GgmlType::mxfp4),
  kIQ2_XXS = static_cast<int>(format::GgmlType::iq2_xxs), kIQ2_XS = static_cast<int>(format::GgmlType::iq2_xs),
  kIQ2_S = static_cast<int>(format::GgmlType::iq2_s), kIQ3_XXS = static_cast<int>(format::GgmlType::iq3_xxs),
  kIQ3_S = static_cast<int>(format::GgmlType::iq3_s), kIQ1_S = static_cast<int>(format::GgmlType::iq1_s),
  kIQ1_M = static_cast<int>(format::GgmlType::iq1_m), kIQ4_NL = static_cast<int>(format::GgmlType::iq4_nl),
  kIQ4_XS = static_cast<int>(format::GgmlType::iq4_xs),
};

/// A type's block as the kernels see it, from its table row: `bytes` bytes hold `elems` values,
/// a whole number of 32-value units. Plain types (one value per ggml block) are read as blocks of
/// 32 values.
template <int T>
struct Traits {
  static constexpr const format::GgmlTypeInfo *row = format::ggml_type_row(static_cast<uint32_t>(T));
  static_assert(row != nullptr && row->compute != format::GgmlCompute::none,
                "Traits<T>: T is not a type with compute kernels in format::kGgmlTypes");
  static constexpr int elems = row->block_elems == 1 ? 32 : static_cast<int>(row->block_elems);
  static constexpr int bytes = static_cast<int>(row->block_elems == 1 ? 32 * row->block_bytes : row->block_bytes);
};

__device__ __forceinline__ uint32_t u16_at(const uint8_t *p) { return p[0] | (uint32_t(p[1]) << 8); }
__device__ __forceinline__ uint32_t u32_at(const uint8_t *p) {
  return p[0] | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
}
__device__ __forceinline__ float half_at(const uint8_t *p) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(u16_at(p))));
}
__device__ __forceinline__ float e8m0_half(uint8_t e) {
  return __uint_as_float(e < 2 ? 0x00200000u << e : uint32_t(e - 1) << 23);
}
__device__ __forceinline__ float fmul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float fsub_rn(float a, float b) { return __fsub_rn(a, b); }

__device__ __forceinline__ int8_t q3_scale(const uint8_t *raw, int i) {
  const int low = i < 8 ? (raw[i] & 0xF) : (raw[i - 8] >> 4);
  const int high = (raw[8 + (i & 3)] >> (2 * (i >> 2))) & 3;
  return static_cast<int8_t>(low | (high << 4));
}
__device__ __forceinline__ void scale_min_k4(int j, const uint8_t *q, int &d, int &m) {
  if (j < 4) {
    d = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

/// Values 32·sub .. 32·sub+31 of the block at @p b (sub < elems/32).
template <int T>
__device__ __forceinline__ void unit_values(const uint8_t *__restrict__ b, int sub, float v[32]);

template <>
__device__ __forceinline__ void unit_values<kF32>(const uint8_t *__restrict__ b, int, float v[32]) {
#pragma unroll
  for (int l = 0; l < 32; ++l) v[l] = __uint_as_float(u32_at(b + 4 * l));
}
template <>
__device__ __forceinline__ void unit_values<kF16>(const uint8_t *__restrict__ b, int, float v[32]) {
#pragma unroll
  for (int l = 0; l < 32; ++l) v[l] = half_at(b + 2 * l);
}
template <>
__device__ __forceinline__ void unit_values<kBF16>(const uint8_t *__restrict__ b, int, float v[32]) {
#pragma unroll
  for (int l = 0; l < 32; ++l) v[l] = __uint_as_float(u16_at(b + 2 * l) << 16);
}
template <>
__device__ __forceinline__ void unit_values<kQ8_0>(const uint8_t *__restrict__ b, int, float v[32]) {
  const float d = half_at(b);
#pragma unroll
  for (int l = 0; l < 32; ++l) v[l] = fmul_rn(static_cast<float>(static_cast<int8_t>(b[2 + l])), d);
}
template <>
__device__ __forceinline__ void unit_values<kMXFP4>(const uint8_t *__restrict__ b, int, float v[32]) {
  const float d = e8m0_half(b[0]);
  // kvalues_mxfp4 = {0,1,2,3,4,6,8,12, 0,-1,-2,-3,-4,-6,-8,-12}: packed as signed bytes.
  constexpr uint32_t lo = 0x03020100u, hi = 0x0C080604u;
#pragma unroll
  for (int l = 0; l < 16; ++l) {
    const uint32_t q = b[1 + l];
    const uint32_t n0 = q & 0xF, n1 = q >> 4;
    const int m0 = static_cast<int>((((n0 & 7) < 4 ? lo : hi) >> (8 * (n0 & 3))) & 0xFF);
    const int m1 = static_cast<int>((((n1 & 7) < 4 ? lo : hi) >> (8 * (n1 & 3))) & 0xFF);
    v[l] = fmul_rn(static_cast<float>(n0 & 8 ? -m0 : m0), d);
    v[l + 16] = fmul_rn(static_cast<float>(n1 & 8 ? -m1 : m1), d);
  }
}
template <>
__device__ __forceinline__ void unit_values<kQ2_K>(const uint8_t *__restrict__ b, int sub, float v[32]) {
  const float d = half_at(b + 80), dmin = half_at(b + 82);
  const int h = sub >> 2, j = sub & 3, shift = 2 * j;
  const uint8_t *q = b + 16 + 32 * h;
  const int is = 8 * h + 2 * j;
#pragma unroll
  for (int g = 0; g < 2; ++g) {
    const int sc = b[is + g];
    const float dl = fmul_rn(d, static_cast<float>(sc & 0xF)), ml = fmul_rn(dmin, static_cast<float>(sc >> 4));
#pragma unroll
    for (int l = 0; l < 16; ++l) v[16 * g + l] = fsub_rn(fmul_rn(dl, static_cast<float>((q[16 * g + l] >> shift) & 3)), ml);
  }
}
template <>
__device__ __forceinline__ void unit_values<kQ3_K>(const uint8_t *__restrict__ b, int sub, float v[32]) {
  const float d = half_at(b + 108);
  const int h = sub >> 2, j = sub & 3, shift = 2 * j;
  const uint8_t *hm = b, *q = b + 32 + 32 * h;
  const uint32_t m = 1u << (4 * h + j);
  const int is = 8 * h + 2 * j;
#pragma unroll
  for (int g = 0; g < 2; ++g) {
    const float dl = fmul_rn(d, static_cast<float>(q3_scale(b + 96, is + g) - 32));
#pragma unroll
    for (int l = 0; l < 16; ++l) {
      const int idx = 16 * g + l;
      v[idx] = fmul_rn(dl, static_cast<float>(((q[idx] >> shift) & 3) - ((hm[idx] & m) ? 0 : 4)));
    }
  }
}
template <>
__device__ __forceinline__ void unit_values<kQ4_K>(const uint8_t *__restrict__ b, int sub, float v[32]) {
  const float d = half_at(b), dmin = half_at(b + 2);
  int sc, mn;
  scale_min_k4(sub, b + 4, sc, mn);
  const float d1 = fmul_rn(d, static_cast<float>(sc)), m1 = fmul_rn(dmin, static_cast<float>(mn));
  const uint8_t *q = b + 16 + 32 * (sub >> 1);
  const int shift = 4 * (sub & 1);
#pragma unroll
  for (int l = 0; l < 32; ++l) v[l] = fsub_rn(fmul_rn(d1, static_cast<float>((q[l] >> shift) & 0xF)), m1);
}
template <>
__device__ __forceinline__ void unit_values<kQ5_K>(const uint8_t *__restrict__ b, int sub, float v[32]) {
  const float d = half_at(b), dmin = half_at(b + 2);
  int sc, mn;
  scale_min_k4(sub, b + 4, sc, mn);
  const float d1 = fmul_rn(d, static_cast<float>(sc)), m1 = fmul_rn(dmin, static_cast<float>(mn));
  const uint8_t *qh = b + 16, *q = b + 48 + 32 * (sub >> 1);
  const int shift = 4 * (sub & 1);
#pragma unroll
  for (int l = 0; l < 32; ++l) {
    const int val = ((q[l] >> shift) & 0xF) + (((qh[l] >> sub) & 1) << 4);
    v[l] = fsub_rn(fmul_rn(d1, static_cast<float>(val)), m1);
  }
}
template <>
__device__ __forceinline__ void unit_values<kQ6_K>(const uint8_t *__restrict__ b, int sub, float v[32]) {
  const float d = half_at(b + 208);
  const int h = sub >> 2, r = sub & 3;
  const uint8_t *ql = b + 64 * h + ((r & 1) ? 32 : 0), *qh = b + 128 + 32 * h;
  const int8_t *sc = reinterpret_cast<const int8_t *>(b + 192 + 8 * h);
  const int lshift = (r >> 1) * 4, hshift = 2 * r;
#pragma unroll
  for (int l = 0; l < 32; ++l) {
    const int q = (((ql[l] >> lshift) & 0xF) | (((qh[l] >> hshift) & 3) << 4)) - 32;
    v[l] = fmul_rn(fmul_rn(d, static_cast<float>(sc[l / 16 + 2 * r])), static_cast<float>(q));
  }
}

static __constant__ uint64_t kIq2xxsGridDev[256] = {EP_IQ2XXS_GRID_VALUES};
static __constant__ uint8_t kIq2xsSignsDev[128] = {EP_IQ2XXS_KSIGNS_VALUES};

template <>
__device__ __forceinline__ void unit_values<kIQ2_XXS>(const uint8_t *__restrict__ b, int sub, float v[32]) {
  const float d = half_at(b);
  const uint8_t *aux8 = b + 2 + 8 * sub;
  const uint32_t aux1 = u32_at(aux8 + 4);
  const float db = fmul_rn(fmul_rn(d, __fadd_rn(0.5f, static_cast<float>(aux1 >> 28))), 0.25f);
#pragma unroll
  for (int l = 0; l < 4; ++l) {
    const uint64_t grid = kIq2xxsGridDev[aux8[l]];
    const uint32_t signs = kIq2xsSignsDev[(aux1 >> (7 * l)) & 127];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float g = static_cast<float>((grid >> (8 * j)) & 0xFF);
      v[8 * l + j] = fmul_rn(fmul_rn(db, g), (signs >> j) & 1 ? -1.f : 1.f);
    }
  }
}

}  // namespace ep::backend::cuda::quant
