// iq2_xxs decode GEMV: the integer arithmetic of one 32-value sub-block in the stream kernel
// (DpIq2xxs in gemv_stream.cu), host-callable so that tests/backend/cuda/iq2xxs_dot_test.cpp checks it
// on a CPU against ggml's definition.
//
// ggml (../shared/reference): a sub-block has 8 bytes, four grid indices (byte l: values 8l..8l+7
// are the 8 bytes of iq2xxs_grid[index], each 8, 25 or 43) and a word whose bits 7l..7l+6 index
// ksigns_iq2xs (bit j of the entry set: value 8l + j negative) and whose top 4 bits are the scale
// s; value = d·(0.5 + s)·0.25 · grid byte · sign. Here a grid word (4 bytes) is signed with the
// pattern's byte mask m (0xFF where negative): (g ^ m) + (m & 0x01010101) is the two's complement
// of the masked bytes and leaves the others (no carry between bytes: g ≤ 43), and dp4a takes the
// signed bytes against x's int8 hi and lo parts (x ≈ s_x/254·(254·hi + lo), as the dp4a kernels
// carry it). The sub-block's sum (2s + 1)·(254·Σ w·hi + Σ w·lo) is below 2^31 in magnitude
// (31·255·32·43·127 < 1.4·10^9), and d·(0.5 + s)·0.25 = d/8·(2s + 1) exactly for every f16 d.
#pragma once

#include <cstdint>

#include "backend/cuda/dp4a.cuh"

#if defined(__CUDACC__)
#define EP_IQ2_HD __host__ __device__ __forceinline__
#else
#define EP_IQ2_HD inline
#endif
#if defined(__CUDA_ARCH__)  // the device pass (the host compiler would warn about the pragma)
#define EP_IQ2_UNROLL _Pragma("unroll")
#else
#define EP_IQ2_UNROLL
#endif

namespace ep::backend::cuda::iq2xxs {

/// Two 32-bit words read as one 8-byte unit (a grid entry: values 0..3, 4..7; or the byte masks
/// of a sign pattern, in the same order).
struct alignas(8) WordPair {
  uint32_t lo, hi;
};

/// The bytes of grid word `g` with those that `mask` marks (0xFF) negated, as int8 lanes.
EP_IQ2_HD uint32_t signed_word(uint32_t g, uint32_t mask) { return (g ^ mask) + (mask & 0x01010101u); }

/// The byte masks of sign pattern `signs` (bit j set: value j negative): 0xFF in byte j of the
/// pair (lo: values 0..3, hi: 4..7).
EP_IQ2_HD WordPair sign_masks(uint32_t signs) {
  uint32_t m[2] = {0, 0};
  EP_IQ2_UNROLL
  for (int j = 0; j < 8; ++j) m[j >> 2] |= ((signs >> j) & 1u) * (0xFFu << (8 * (j & 3)));
  return {m[0], m[1]};
}

/// (2s + 1)·(254·Σ w·hi + Σ w·lo) over one sub-block: `idx` its four grid indices, `aux` its sign
/// indices and scale, w its signed grid values; grid[256] and masks[128] the tables (masks[i] =
/// sign_masks(ksigns_iq2xs[i])); xh / xl x's hi and lo bytes of the sub-block's 32 values, 4 per
/// word in value order.
EP_IQ2_HD int32_t subblock_sum(uint32_t idx, uint32_t aux, const WordPair *grid, const WordPair *masks,
                               const uint32_t (&xh)[8], const uint32_t (&xl)[8]) {
  int32_t sh = 0, sl = 0;
  EP_IQ2_UNROLL
  for (int l = 0; l < 4; ++l) {
    const WordPair g = grid[(idx >> (8 * l)) & 0xFFu], m = masks[(aux >> (7 * l)) & 127u];
    const uint32_t w0 = signed_word(g.lo, m.lo), w1 = signed_word(g.hi, m.hi);
    sh = dp4a<true, true>(w0, xh[2 * l], sh);
    sl = dp4a<true, true>(w0, xl[2 * l], sl);
    sh = dp4a<true, true>(w1, xh[2 * l + 1], sh);
    sl = dp4a<true, true>(w1, xl[2 * l + 1], sl);
  }
  return static_cast<int32_t>(2 * (aux >> 28) + 1) * (sh * 254 + sl);
}

}  // namespace ep::backend::cuda::iq2xxs
