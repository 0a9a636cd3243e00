// The exact tensor-core GEMM's number format (GemmMode::split_f16): an f32 value v of a weight
// row or an activation token, times that row's (token's) power of two 2^e, as two IEEE halves
// hi + lo: hi = f16(v·2^e) and lo = f16(v·2^e − hi). e brings the row's largest |v| into
// [2^14, 2^15), so hi never overflows (f16 max 65504) and the row's small values stay clear of
// f16's subnormals. Each product of two halves is exact in f32 (11 × 11 significant bits), so
// W·x ≈ W_hi·x_hi + W_hi·x_lo + W_lo·x_hi summed in f32 keeps about 22 bits of each factor; the
// dropped W_lo·x_lo is below 2^-22 of the product.
//
// Bound (tests/backend/cuda/split_f16_test.cpp, every exponent): with w = v·2^e,
// |w − hi − lo| <= max(2^-22·|w|, 2^-25): 22 significant bits for the values down to 2^-18 of the
// row's largest |v|, and 2^-39 of that largest below. e is clamped to [−120, 120]: a row whose
// largest |v| is below 2^-106 is scaled by 2^120 only (the absolute bound becomes 2^-145).
// Non-finite values: a NaN stays NaN in hi and lo; ±inf gives hi = ±inf and lo = NaN (inf − inf),
// and its row's scale is the clamp's 2^-114, so the outputs an inf touches come out NaN, never a
// finite number.
//
// Host-callable: on the device the conversions are the hardware's (cvt.rn.f16.f32), on the host
// backend::fp32_to_fp16 / fp16_to_fp32 (round to nearest even, subnormals, exact), so CPU tests
// check the same arithmetic the kernels run (dequant.cu's split kernels).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#define EP_SPLIT_HD __host__ __device__ __forceinline__
#else
#define EP_SPLIT_HD inline
#endif

#if !defined(__CUDA_ARCH__)
#include <cstring>

#include "backend/dequant.hpp"
#endif

namespace ep::backend::cuda::split {

/// The largest |value| of a row is scaled into [2^kTargetExponent, 2^(kTargetExponent + 1)).
inline constexpr int kTargetExponent = 14;
/// |scale exponent| <= kMaxExponent (2^e must be a normal f32).
inline constexpr int kMaxExponent = 120;

EP_SPLIT_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

EP_SPLIT_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

/// The exponent e of a row (token) whose largest |value| is @p max_abs: max_abs·2^e in
/// [2^14, 2^15) for a normal max_abs in [2^-106, 2^128); clamped to [−120, 120] otherwise (zero
/// and subnormal: 120; inf and NaN: −114).
EP_SPLIT_HD int scale_exponent(float max_abs) {
  const int e = static_cast<int>((float_bits(max_abs) >> 23) & 0xFFu) - 127;  // floor(log2) of a normal value
  const int s = kTargetExponent - e;
  return s < -kMaxExponent ? -kMaxExponent : (s > kMaxExponent ? kMaxExponent : s);
}

/// 2^e for |e| <= kMaxExponent, exactly.
EP_SPLIT_HD float pow2(int e) { return bits_float(static_cast<uint32_t>(e + 127) << 23); }

/// IEEE half bits of @p f rounded to nearest even.
EP_SPLIT_HD uint16_t to_f16(float f) {
#if defined(__CUDA_ARCH__)
  return __half_as_ushort(__float2half_rn(f));
#else
  return ep::backend::fp32_to_fp16(f);
#endif
}

/// The value of IEEE half bits @p h (exact).
EP_SPLIT_HD float from_f16(uint16_t h) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(h));
#else
  return ep::backend::fp16_to_fp32(h);
#endif
}

/// The halves of one value: hi + lo ≈ v·scale.
struct Halves {
  uint16_t hi, lo;
};

/// hi = f16(v·scale), lo = f16(v·scale − hi), @p scale = pow2(scale_exponent(max |v| of the row)).
/// The product is exact (a power of two; below 2^-126 it may round, far under the bound) and so
/// is the difference (|v·scale − hi| is at most half an f16 ulp of hi, within f32's precision).
EP_SPLIT_HD Halves split(float v, float scale) {
#if defined(__CUDA_ARCH__)
  const float w = __fmul_rn(v, scale);  // not contracted into the subtraction below
#else
  const float w = v * scale;
#endif
  const uint16_t hi = to_f16(w);
  return Halves{hi, to_f16(w - from_f16(hi))};
}

}  // namespace ep::backend::cuda::split
