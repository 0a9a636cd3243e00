// Device decoding of the ggml types that have dequantization kernels but no GEMV kernel
// (GgmlCompute::dequant in format::kGgmlTypes: q4_0, q4_1, q5_0, q5_1, iq4_nl, iq4_xs, iq2_xs,
// iq2_s, iq3_xxs, iq3_s, iq1_s and iq1_m today), 32 values
// ("one unit") at a time, bit-exact with ggml's dequantize_row_* (and backend/dequant.cpp):
// every product and sum is rounded on its own (no FMA contraction). CudaBackend::matmul runs them
// through dequantization + cuBLAS.
#pragma once

#include "backend/cuda/dispatch.cuh"
#include "backend/cuda/quant_unit.cuh"
#include "backend/iq2xxs_table.hpp"
#include "backend/iq_grids.hpp"

namespace ep::backend::cuda::quant {

// The codebooks in global memory: each thread of a dequantization launch reads its own entries,
// which constant memory would serialize.
static __device__ const uint64_t kIq1sGridDev[2048] = {EP_IQ1S_GRID_VALUES};
static __device__ const uint64_t kIq2xsGridDev[512] = {EP_IQ2XS_GRID_VALUES};
static __device__ const uint64_t kIq2sGridDev[1024] = {EP_IQ2S_GRID_VALUES};
static __device__ const uint32_t kIq3xxsGridDev[256] = {EP_IQ3XXS_GRID_VALUES};
static __device__ const uint32_t kIq3sGridDev[512] = {EP_IQ3S_GRID_VALUES};
static __device__ const uint8_t kIqSignsDev[128] = {EP_IQ2XXS_KSIGNS_VALUES};
static __device__ const int8_t kIq4nlValuesDev[16] = {EP_IQ4NL_VALUES};

__device__ __forceinline__ float fadd_rn(float a, float b) { return __fadd_rn(a, b); }

/// Byte j of a 32-value block's 16 quant bytes holds value j (low nibble) and j + 16 (high).
template <>
__device__ __forceinline__ void unit_values<kQ4_0>(const uint8_t *__restrict__ b, int, float v[32]) {
  const float d = half_at(b);
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    v[j] = fmul_rn(static_cast<float>((b[2 + j] & 0xF) - 8), d);
    v[j + 16] = fmul_rn(static_cast<float>((b[2 + j] >> 4) - 8), d);
  }
}
template <>
__device__ __forceinline__ void unit_values<kQ4_1>(const uint8_t *__restrict__ b, int, float v[32]) {
  const float d = half_at(b), m = half_at(b + 2);
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    v[j] = fadd_rn(fmul_rn(static_cast<float>(b[4 + j] & 0xF), d), m);
    v[j + 16] = fadd_rn(fmul_rn(static_cast<float>(b[4 + j] >> 4), d), m);
  }
}
template <>
__device__ __forceinline__ void unit_values<kQ5_0>(const uint8_t *__restrict__ b, int, float v[32]) {
  const float d = half_at(b);
  const uint32_t qh = u32_at(b + 2);
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const int h0 = static_cast<int>((qh >> j) & 1) << 4, h1 = static_cast<int>((qh >> (j + 16)) & 1) << 4;
    v[j] = fmul_rn(static_cast<float>(((b[6 + j] & 0xF) | h0) - 16), d);
    v[j + 16] = fmul_rn(static_cast<float>(((b[6 + j] >> 4) | h1) - 16), d);
  }
}
template <>
__device__ __forceinline__ void unit_values<kQ5_1>(const uint8_t *__restrict__ b, int, float v[32]) {
  const float d = half_at(b), m = half_at(b + 2);
  const uint32_t qh = u32_at(b + 4);
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const int h0 = static_cast<int>((qh >> j) & 1) << 4, h1 = static_cast<int>((qh >> (j + 16)) & 1) << 4;
    v[j] = fadd_rn(fmul_rn(static_cast<float>((b[8 + j] & 0xF) | h0), d), m);
    v[j + 16] = fadd_rn(fmul_rn(static_cast<float>((b[8 + j] >> 4) | h1), d), m);
  }
}
template <>
__device__ __forceinline__ void unit_values<kIQ4_NL>(const uint8_t *__restrict__ b, int, float v[32]) {
  const float d = half_at(b);
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    v[j] = fmul_rn(d, static_cast<float>(kIq4nlValuesDev[b[2 + j] & 0xF]));
    v[j + 16] = fmul_rn(d, static_cast<float>(kIq4nlValuesDev[b[2 + j] >> 4]));
  }
}
template <>
__device__ __forceinline__ void unit_values<kIQ4_XS>(const uint8_t *__restrict__ b, int sub, float v[32]) {
  const float d = half_at(b);
  const int ls = ((b[4 + sub / 2] >> (4 * (sub % 2))) & 0xF) | (static_cast<int>((u16_at(b + 2) >> (2 * sub)) & 3) << 4);
  const float dl = fmul_rn(d, static_cast<float>(ls - 32));
  const uint8_t *qs = b + 8 + 16 * sub;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    v[j] = fmul_rn(dl, static_cast<float>(kIq4nlValuesDev[qs[j] & 0xF]));
    v[j + 16] = fmul_rn(dl, static_cast<float>(kIq4nlValuesDev[qs[j] >> 4]));
  }
}

/// 8 grid values times db, value j negative where bit j of @p signs is set.
__device__ __forceinline__ void grid8(uint64_t grid, uint32_t signs, float db, float *v) {
#pragma unroll
  for (int j = 0; j < 8; ++j)
    v[j] = fmul_rn(fmul_rn(db, static_cast<float>((grid >> (8 * j)) & 0xFF)), (signs >> j) & 1 ? -1.f : 1.f);
}
/// 4 grid values times db, signed by bits [first, first + 4) of @p signs.
__device__ __forceinline__ void grid4(uint32_t grid, uint32_t signs, int first, float db, float *v) {
#pragma unroll
  for (int j = 0; j < 4; ++j)
    v[j] = fmul_rn(fmul_rn(db, static_cast<float>((grid >> (8 * j)) & 0xFF)), (signs >> (first + j)) & 1 ? -1.f : 1.f);
}
/// (0.5 + s) · d / 4: the iq2 sub-block scale.
__device__ __forceinline__ float iq2_db(float d, int s) {
  return fmul_rn(fmul_rn(d, fadd_rn(0.5f, static_cast<float>(s))), 0.25f);
}

template <>
__device__ __forceinline__ void unit_values<kIQ2_XS>(const uint8_t *__restrict__ b, int sub, float v[32]) {
  const float d = half_at(b);
  const int sc = b[66 + sub];
#pragma unroll
  for (int l = 0; l < 4; ++l) {
    const uint32_t q = u16_at(b + 2 + 2 * (4 * sub + l));
    grid8(kIq2xsGridDev[q & 511], kIqSignsDev[q >> 9], iq2_db(d, l < 2 ? sc & 0xF : sc >> 4), v + 8 * l);
  }
}
template <>
__device__ __forceinline__ void unit_values<kIQ2_S>(const uint8_t *__restrict__ b, int sub, float v[32]) {
  const float d = half_at(b);
  const int sc = b[74 + sub];
  const uint32_t qh = b[66 + sub];
#pragma unroll
  for (int l = 0; l < 4; ++l) {
    const uint32_t index = b[2 + 4 * sub + l] | ((qh << (8 - 2 * l)) & 0x300);
    grid8(kIq2sGridDev[index], b[34 + 4 * sub + l], iq2_db(d, l < 2 ? sc & 0xF : sc >> 4), v + 8 * l);
  }
}
template <>
__device__ __forceinline__ void unit_values<kIQ3_XXS>(const uint8_t *__restrict__ b, int sub, float v[32]) {
  const float d = half_at(b);
  const uint8_t *qs = b + 2 + 8 * sub;
  const uint32_t aux = u32_at(b + 66 + 4 * sub);
  const float db = fmul_rn(fmul_rn(d, fadd_rn(0.5f, static_cast<float>(aux >> 28))), 0.5f);
#pragma unroll
  for (int l = 0; l < 4; ++l) {
    const uint32_t signs = kIqSignsDev[(aux >> (7 * l)) & 127];
    grid4(kIq3xxsGridDev[qs[2 * l]], signs, 0, db, v + 8 * l);
    grid4(kIq3xxsGridDev[qs[2 * l + 1]], signs, 4, db, v + 8 * l + 4);
  }
}
template <>
__device__ __forceinline__ void unit_values<kIQ3_S>(const uint8_t *__restrict__ b, int sub, float v[32]) {
  const float d = half_at(b);
  const uint8_t *qs = b + 2 + 8 * sub, *signs = b + 74 + 4 * sub;
  const uint32_t h = b[66 + sub];
  const float db = fmul_rn(d, static_cast<float>(1 + 2 * ((b[106 + sub / 2] >> (4 * (sub % 2))) & 0xF)));
#pragma unroll
  for (int l = 0; l < 4; ++l) {
    grid4(kIq3sGridDev[qs[2 * l] | ((h << (8 - 2 * l)) & 256)], signs[l], 0, db, v + 8 * l);
    grid4(kIq3sGridDev[qs[2 * l + 1] | ((h << (7 - 2 * l)) & 256)], signs[l], 4, db, v + 8 * l + 4);
  }
}

/// 8 values of an iq1s grid entry (signed bytes −1, 0, 1): dl · (g + delta).
__device__ __forceinline__ void grid8_iq1(uint64_t grid, float dl, float delta, float *v) {
#pragma unroll
  for (int j = 0; j < 8; ++j)
    v[j] = fmul_rn(dl, fadd_rn(static_cast<float>(static_cast<int8_t>((grid >> (8 * j)) & 0xFF)), delta));
}

template <>
__device__ __forceinline__ void unit_values<kIQ1_S>(const uint8_t *__restrict__ b, int sub, float v[32]) {
  const float d = half_at(b);
  const uint8_t *qs = b + 2 + 4 * sub;
  const uint32_t qh = u16_at(b + 34 + 2 * sub);
  const float dl = fmul_rn(d, static_cast<float>(2 * ((qh >> 12) & 7) + 1));
  const float delta = qh & 0x8000 ? -kIq1sDelta : kIq1sDelta;
#pragma unroll
  for (int l = 0; l < 4; ++l) grid8_iq1(kIq1sGridDev[qs[l] | (((qh >> (3 * l)) & 7) << 8)], dl, delta, v + 8 * l);
}
template <>
__device__ __forceinline__ void unit_values<kIQ1_M>(const uint8_t *__restrict__ b, int sub, float v[32]) {
  const uint8_t *qs = b + 4 * sub, *qh = b + 32 + 2 * sub, *sc = b + 48;
  const uint32_t s0 = u16_at(sc), s1 = u16_at(sc + 2), s2 = u16_at(sc + 4), s3 = u16_at(sc + 6);
  const uint32_t bits = (s0 >> 12) | ((s1 >> 8) & 0x00F0) | ((s2 >> 4) & 0x0F00) | (s3 & 0xF000);
  const float d = __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
  const uint32_t s = u16_at(sc + 2 * (sub / 2));
  const float dl1 = fmul_rn(d, static_cast<float>(2 * ((s >> (6 * (sub % 2) + 0)) & 7) + 1));
  const float dl2 = fmul_rn(d, static_cast<float>(2 * ((s >> (6 * (sub % 2) + 3)) & 7) + 1));
#pragma unroll
  for (int l = 0; l < 4; ++l) {
    const uint32_t h = qh[l / 2] >> (4 * (l % 2));
    grid8_iq1(kIq1sGridDev[qs[l] | ((h & 7) << 8)], l < 2 ? dl1 : dl2, h & 8 ? -kIq1sDelta : kIq1sDelta, v + 8 * l);
  }
}

}  // namespace ep::backend::cuda::quant
