// The tensor-core GEMV's (gemv_mma.cu) weight decoders of q8_0 and iq2_xxs into f16 mma A
// fragments, and the k order they share, host-callable so that
// tests/backend/cuda/mma_pairs_test.cpp checks on a CPU that the values a lane places in its A
// registers, times the f32 scale the kernel applies to the mma sums, are the CPU backend's
// dequantized values (bit-exact with ggml).
//
// The "pairs" k order: inside each 32-value block (q8_0: a block; iq2_xxs: a sub-block), lane t
// (lane % 4) of a row owns the 8 consecutive values 8t..8t+7, values 8t..8t+3 in the block's first
// 16-value mma step and 8t+4..8t+7 in its second. Within a step a lane's four values v0..v3 go to
// m16n8k16's A registers as gemv_mma.cu's other types place theirs: (v0, v2) at k 2t, 2t+1 and
// (v1, v3) at k 2t+8, 2t+9 (pair_value). x is staged to match: unit u of a block (its values
// 4u..4u+3) goes to step pair_unit_step(u) of the block, in lane quarter pair_unit_lane(u). So a
// lane reads 8 consecutive bytes of q8_0 and one whole grid entry of iq2_xxs per block.
//
// q8_0: the int8 q as an exact f16 integer: the byte with its top bit flipped (q + 128) as the
// mantissa under f16 1024's exponent is 1152 + q; minus 1152 is q (integers below 2048: exact).
// The block's scale d multiplies the block's mma sums in f32.
// iq2_xxs (ggml, ../shared/reference): value = d·(0.5 + s)·0.25 · grid byte · sign = d/8 · (2s + 1)
// · grid · sign (iq2xxs_dot_test checks the identity); (2s + 1)·grid·sign is an integer of magnitude
// at most 31·43 = 1333, exact in f16: the grid entry's magnitudes (8, 25 or 43) as f16 from a
// 16-byte table entry (iq2xxs_table_entry), times 2s + 1 (one f16 multiply of exact integers), the
// sign bit flipped from the pattern. d/8 multiplies the 256-value block's mma sums in f32.
//
// The f16 operations are the device's instructions; on the host an exact emulation (each result
// rounded once, to nearest even), so that the CPU test runs the functions the kernel runs.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#define EP_MMA_HD __host__ __device__ __forceinline__
#else
#define EP_MMA_HD inline
#endif
#if defined(__CUDA_ARCH__)  // the device pass (the host compiler would warn about the pragma)
#define EP_MMA_UNROLL _Pragma("unroll")
#else
#define EP_MMA_UNROLL
#endif

namespace ep::backend::cuda::mma {

#if !defined(__CUDA_ARCH__)
namespace host {
/// The value of f16 bits (the low 16 bits of h), exactly.
inline double f16_value(uint32_t h) {
  const int e = static_cast<int>((h >> 10) & 31u), m = static_cast<int>(h & 1023u);
  double v = e == 0 ? std::ldexp(static_cast<double>(m), -24)
                    : e == 31 ? (m == 0 ? INFINITY : NAN) : std::ldexp(static_cast<double>(1024 + m), e - 25);
  return (h & 0x8000u) != 0 ? -v : v;
}
/// v rounded to f16 (to nearest, ties to even; overflow to infinity), as bits.
inline uint32_t f16_round(double v) {
  const uint32_t sign = std::signbit(v) ? 0x8000u : 0u;
  const double a = std::fabs(v);
  if (std::isnan(a)) return 0x7E00u;
  if (a >= 65520.0) return sign | 0x7C00u;  // 65504 + half an ulp rounds to infinity
  if (a < 0x1p-14) return sign | static_cast<uint32_t>(std::nearbyint(a * 0x1p24));  // subnormal (1024: the smallest normal)
  int e = 0;
  (void)std::frexp(a, &e);  // a in [2^(e-1), 2^e)
  double q = std::nearbyint(std::ldexp(a, 11 - e));  // 1024 .. 2048
  if (q == 2048.0) {
    q = 1024.0;
    ++e;
  }
  if (e - 1 > 15) return sign | 0x7C00u;
  return sign | (static_cast<uint32_t>(e - 1 + 15) << 10) | static_cast<uint32_t>(q - 1024.0);
}
// Both halves of two half2 words through op (on doubles: sums and products of two f16 values are
// exact there, so the one rounding is f16_round's).
template <typename Op>
inline uint32_t h2_op(uint32_t a, uint32_t b, Op op) {
  const uint32_t lo = f16_round(op(f16_value(a & 0xFFFFu), f16_value(b & 0xFFFFu)));
  const uint32_t hi = f16_round(op(f16_value(a >> 16), f16_value(b >> 16)));
  return lo | (hi << 16);
}
}  // namespace host
#endif

/// a · b per f16 half of two half2 words.
EP_MMA_HD uint32_t hmul2(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  const __half2 r = __hmul2(*reinterpret_cast<const __half2 *>(&a), *reinterpret_cast<const __half2 *>(&b));
  return *reinterpret_cast<const uint32_t *>(&r);
#else
  return host::h2_op(a, b, [](double x, double y) { return x * y; });
#endif
}
/// a − b per f16 half of two half2 words.
EP_MMA_HD uint32_t hsub2(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  const __half2 r = __hsub2(*reinterpret_cast<const __half2 *>(&a), *reinterpret_cast<const __half2 *>(&b));
  return *reinterpret_cast<const uint32_t *>(&r);
#else
  return host::h2_op(a, b, [](double x, double y) { return x - y; });
#endif
}
/// Set bits of x.
EP_MMA_HD uint32_t popc(uint32_t x) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint32_t>(__popc(x));
#else
  uint32_t n = 0;
  for (; x != 0; x &= x - 1) ++n;
  return n;
#endif
}

/// The value (0..31) of a 32-value block that lane t (0..3) holds in half h (0: the low 16 bits)
/// of its A register i (0..3: q8_0_lane's and iq2xxs_lane's order; registers 0, 1 belong to the
/// block's first mma step, at k 2t + h and 2t + 8 + h, registers 2, 3 to its second).
EP_MMA_HD int pair_value(int t, int i, int h) { return 8 * t + 4 * (i >> 1) + (i & 1) + 2 * h; }
/// The mma step (0, 1) of its block where x's unit u (the block's values 4u..4u+3) is staged.
EP_MMA_HD int pair_unit_step(int u) { return u & 1; }
/// The lane quarter (t) whose B fragments hold x's unit u of a block: its values 4u, 4u+2 in b0
/// (k 2t, 2t+1) and 4u+1, 4u+3 in b1 (k 2t+8, 2t+9).
EP_MMA_HD int pair_unit_lane(int u) { return u >> 1; }

/// f16 1152 in both halves: q8_0's bias (1024 + 128).
inline constexpr uint32_t kQ8Bias = 0x64806480u;
/// f16 1024 in both halves: 1024 + i for mantissa bits i.
inline constexpr uint32_t kHalf1024 = 0x64006400u;

/// The A registers of a q8_0 block for lane t: w its bytes 8t..8t+7 (the int8 values, value order).
/// a[0] = (v0, v2), a[1] = (v1, v3) of values 8t..8t+3; a[2], a[3] the same of 8t+4..8t+7; f16
/// integers, exactly the values.
EP_MMA_HD void q8_0_lane(const uint32_t (&w)[2], uint32_t (&a)[4]) {
  EP_MMA_UNROLL
  for (int j = 0; j < 2; ++j) {
    // bytes 0, 2 (then 1, 3) with the top bit flipped under f16 1024: 1152 + q, exact
    a[2 * j] = hsub2((w[j] & 0x00FF00FFu) ^ kQ8Bias, kQ8Bias);
    a[2 * j + 1] = hsub2(((w[j] >> 8) & 0x00FF00FFu) ^ kQ8Bias, kQ8Bias);
  }
}

/// An iq2_xxs grid entry's 8 magnitudes as f16, in the A registers' order: (g0, g2), (g1, g3),
/// (g4, g6), (g5, g7) (g_j: byte j of the entry).
struct alignas(16) GridF16 {
  uint32_t w[4];
};
EP_MMA_HD GridF16 iq2xxs_table_entry(uint64_t grid) {
  const uint32_t half[2] = {static_cast<uint32_t>(grid), static_cast<uint32_t>(grid >> 32)};
  GridF16 e{};
  EP_MMA_UNROLL
  for (int j = 0; j < 2; ++j) {  // magnitudes (at most 43) under f16 1024, minus 1024: exact
    e.w[2 * j] = hsub2((half[j] & 0x00FF00FFu) | kHalf1024, kHalf1024);
    e.w[2 * j + 1] = hsub2(((half[j] >> 8) & 0x00FF00FFu) | kHalf1024, kHalf1024);
  }
  return e;
}

/// The A registers of an iq2_xxs sub-block for lane t: idx its four grid indices (byte l: values
/// 8l..8l+7), aux its four 7-bit sign indices (bits 7l..7l+6) and its scale s (bits 28..31);
/// table[256] = iq2xxs_table_entry of each grid entry. Lane t takes grid entry t: a[0] = (v0, v2),
/// a[1] = (v1, v3) of values 8t..8t+3, a[2], a[3] the same of 8t+4..8t+7; each the integer
/// (2s + 1)·grid·sign as f16, exactly.
EP_MMA_HD void iq2xxs_lane(uint32_t idx, uint32_t aux, int t, const GridF16 *table, uint32_t (&a)[4]) {
  const GridF16 g = table[(idx >> (8 * t)) & 0xFFu];
  const uint32_t s7 = (aux >> (7 * t)) & 127u;
  // ksigns_iq2xs[s7] = s7 | parity(s7) << 7: the parity is bit 0 of the count (its higher bits land
  // on 8 and 9, which the products below move outside the sign bits)
  const uint32_t signs = s7 | (popc(s7) << 7);
  const uint32_t scale = hsub2(((2u * (aux >> 28) + 1u) * 0x00010001u) | kHalf1024, kHalf1024);  // 2s + 1, exact
  // sign bit j of the entry to bit 15 or 31 of register i's half: the two shifted copies of
  // `signs` in each product do not overlap (no carries), the mask keeps the two sign bits
  constexpr uint32_t kMove[4] = {0x20008000u, 0x10004000u, 0x02000800u, 0x01000400u};  // bits 0,2 / 1,3 / 4,6 / 5,7
  EP_MMA_UNROLL
  for (int i = 0; i < 4; ++i) a[i] = hmul2(g.w[i], scale) ^ ((signs * kMove[i]) & 0x80008000u);
}

}  // namespace ep::backend::cuda::mma
