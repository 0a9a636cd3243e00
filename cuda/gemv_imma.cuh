// q2_K decode GEMV on int8 tensor cores: the per-lane arithmetic of gemv_imma_kernel
// (cuda/gemv_quant.cu), host-callable so that tests/cuda/gemv_imma_emulation_test.cu checks it on
// a CPU against a reference, with the tensor-core instruction emulated from its documented
// fragment layout.
//
// mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 (PTX ISA, "Matrix Fragments for mma.m16n8k32"),
// lane = 4·g + t:  A (16 × 32, u8): a0 = row g, k 4t..4t+3; a1 = row g+8, k 4t..; a2 = row g,
// k 16+4t..; a3 = row g+8, k 16+4t.. .  B (32 × 8, s8): b0 = column g, k 4t..4t+3; b1 = column g,
// k 16+4t.. .  C (16 × 8, s32): c0, c1 = row g, columns 2t, 2t+1; c2, c3 = row g+8. The lowest k
// of a register is its lowest byte.
//
// The warp's 16 rows are the A rows (a tile). A q2_K block (256 values) has 16 groups of 16 values
// with a 4-bit scale and min each: group G = 8h + 2j + s holds the 2-bit field j of qs bytes
// 32h + 16s + l (l < 16). Four groups with the same field j — slots c = 2h + s, c = 0..3 — share
// one "set" of two mmas: the mma's 32 k are 8 values of each slot (k 8c..8c+7 = values l = 8m..8m+7
// of slot c in mma m = 0, 1), so that a lane's A register holds one word of qs masked to field j
// (values ·4^j, in place). B's eight columns are x's hi and lo parts of slot c (columns 2c, 2c+1),
// zero outside that slot's k: after the two mmas lane t holds the hi and lo sums of slot t for its
// rows g and g+8, i.e. one whole 16-value group per lane and row, every lane of a quad busy.
//
// x is carried like the dp4a kernels' (int8 hi + lo, x ≈ s/254·(254·hi + lo), ~15 bits) with one
// scale s per slot of a block ("item": the 64 values of the slot's four groups), so that a lane's
// four group sums of a block add up in int32 before one conversion:
//   row result += d·s/254·Σ_j sc_G·((254·hi_sum + lo_sum) >> 2j) − dmin·Σ_j m_G·Σx_G.
// |254·hi_sum + lo_sum| <= 4^j·255·127·3·16 < 2^27, the int32 sum of a lane's block < 2^27.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define EP_IMMA_HD __host__ __device__ __forceinline__
#else
#define EP_IMMA_HD inline
#endif
#if defined(__CUDA_ARCH__)  // the device pass (the host compiler would warn about the pragma)
#define EP_IMMA_UNROLL _Pragma("unroll")
#else
#define EP_IMMA_UNROLL
#endif

namespace ep::cuda::imma {

inline constexpr int kBlockValues = 256, kBlockBytes = 84;  // q2_K: scales[16], qs[64], d, dmin

/// x of one 256-value block as the B fragments of its eight mmas (set j = 0..3, half m = 0, 1:
/// frag[2j + m][lane], the one non-zero register of the lane), the x scale s/254 of each slot and
/// the exact f32 sum of each group (slot c, field j).
struct XBlock {
  uint32_t frag[8][32];
  float scale[4];
  float sum[4][4];
};

/// The 4-byte word at p (4-byte aligned on the device: shared memory).
EP_IMMA_HD uint32_t load_u32(const uint8_t *p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const uint32_t *>(p);
#else
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
#endif
}

/// Whether the lane's non-zero B register is b1 (columns 4..7: slots 2, 3, k 16..31).
EP_IMMA_HD bool frag_is_b1(int lane) { return (lane >> 2) >= 4; }

/// The 16 values of group (slot c, field j) of one block (xb: its 256 values): 64 bytes at a
/// 64-byte offset (16-byte loads on the device, where x is 16-byte aligned).
EP_IMMA_HD void load_group(const float *xb, int c, int j, float (&v)[16]) {
  const float *g = xb + 128 * (c >> 1) + 32 * j + 16 * (c & 1);
#if defined(__CUDA_ARCH__)
  EP_IMMA_UNROLL
  for (int i = 0; i < 4; ++i) {
    const float4 q = __ldg(reinterpret_cast<const float4 *>(g) + i);
    v[4 * i] = q.x;
    v[4 * i + 1] = q.y;
    v[4 * i + 2] = q.z;
    v[4 * i + 3] = q.w;
  }
#else
  for (int l = 0; l < 16; ++l) v[l] = g[l];
#endif
}

/// max |x| of a group; a slot's x scale comes from the largest of its four groups.
EP_IMMA_HD float group_absmax(const float (&v)[16]) {
  float mx = 0.0f;
  EP_IMMA_UNROLL
  for (int l = 0; l < 16; ++l) mx = fmaxf(mx, fabsf(v[l]));
  return mx;
}

/// Quantizes group (slot c, field j) of one block, its values v, with its slot's max |x|
/// (slot_max): the group's sum, its B fragment words in the two mmas of set j (the 8 lanes whose
/// columns are the slot's, 2c and 2c + 1; zero where the lane's k range is another slot's), and
/// for j = 0 the slot's scale. The rounding of quantize_x (cuda/gemv_quant.cu):
/// hi = rint(x·127/max), lo = rint((x − hi·s)·254/s).
EP_IMMA_HD void quantize_group(const float (&v)[16], int c, int j, float slot_max, XBlock &xq) {
  const float scale = slot_max * (1.0f / 127.0f);
  const float inv = slot_max > 0.0f ? 127.0f / slot_max : 0.0f;
  int8_t hi[16], lo[16];
  float sum = 0.0f;
  EP_IMMA_UNROLL
  for (int l = 0; l < 16; ++l) {
    const float hq = fminf(fmaxf(rintf(v[l] * inv), -127.0f), 127.0f);
    const float lq = fminf(fmaxf(rintf((v[l] - hq * scale) * inv * 254.0f), -127.0f), 127.0f);
    hi[l] = static_cast<int8_t>(hq);
    lo[l] = static_cast<int8_t>(lq);
    sum += v[l];
  }
  xq.sum[c][j] = sum;
  if (j == 0) xq.scale[c] = scale * (1.0f / 254.0f);
  EP_IMMA_UNROLL
  for (int m = 0; m < 2; ++m)
    EP_IMMA_UNROLL
    for (int col = 0; col < 2; ++col)
      EP_IMMA_UNROLL
      for (int t = 0; t < 4; ++t) {
        uint32_t word = 0;
        if ((t >> 1) == (c & 1)) {  // this lane's k range (4t.. or 16 + 4t..) lies in slot c
          const int8_t *src = (col ? lo : hi) + 8 * m + 4 * (t & 1);
          EP_IMMA_UNROLL
          for (int i = 0; i < 4; ++i) word |= uint32_t(static_cast<uint8_t>(src[i])) << (8 * i);
        }
        xq.frag[2 * j + m][4 * (2 * c + col) + t] = word;
      }
}

/// The lane's A registers of set j, half m: qs words of the blocks of rows g (bg) and g+8 (bg8)
/// masked to field j.
EP_IMMA_HD void a_regs(const uint8_t *bg, const uint8_t *bg8, int lane, int j, int m, uint32_t (&a)[4]) {
  const int t = lane & 3;
  const int off = 16 + 16 * (t >> 1) + 4 * (t & 1) + 8 * m;  // qs starts at byte 16
  const uint32_t mask = 0x03030303u << (2 * j);
  a[0] = load_u32(bg + off) & mask;
  a[1] = load_u32(bg8 + off) & mask;
  a[2] = load_u32(bg + off + 32) & mask;
  a[3] = load_u32(bg8 + off + 32) & mask;
}

/// The lane's B registers of set j, half m.
EP_IMMA_HD void b_regs(const XBlock &xq, int lane, int j, int m, uint32_t (&b)[2]) {
  const uint32_t w = xq.frag[2 * j + m][lane];
  const bool one = frag_is_b1(lane);
  b[0] = one ? 0u : w;
  b[1] = one ? w : 0u;
}

/// The four scale bytes (sc | m << 4) of the lane's groups in a block: G = 8h + 2j + s for slot
/// t = 2h + s, j = 0..3 (byte j of the result).
EP_IMMA_HD uint32_t slot_scales(const uint8_t *block, int lane) {
  const int t = lane & 3;
  const uint32_t w0 = load_u32(block + 8 * (t >> 1)), w1 = load_u32(block + 8 * (t >> 1) + 4);
  // bytes s, s + 2, s + 4, s + 6 of the 8 bytes w0:w1
#if defined(__CUDA_ARCH__)
  return __byte_perm(w0, w1, (t & 1) ? 0x7531u : 0x6420u);
#endif
  uint32_t out = 0;
  EP_IMMA_UNROLL
  for (int j = 0; j < 4; ++j) {
    const int i = (t & 1) + 2 * j;
    out |= ((i < 4 ? w0 >> (8 * i) : w1 >> (8 * (i - 4))) & 0xFFu) << (8 * j);
  }
  return out;
}

/// Adds set j's group of the lane (c0, c1: row g; c2, c3: row g+8) to the int32 block sums.
EP_IMMA_HD void add_set(const int32_t (&c)[4], int j, uint32_t scales_g, uint32_t scales_g8, int32_t &acc_g,
                        int32_t &acc_g8) {
  const int32_t vg = (254 * c[0] + c[1]) >> (2 * j), vg8 = (254 * c[2] + c[3]) >> (2 * j);  // exact: divisible
  acc_g += static_cast<int32_t>((scales_g >> (8 * j)) & 0xFu) * vg;
  acc_g8 += static_cast<int32_t>((scales_g8 >> (8 * j)) & 0xFu) * vg8;
}

/// One row's contribution of a block: d·s/254·acc − dmin·Σ_j m_j·Σx_j (d, dmin the block's f16
/// values as f32).
EP_IMMA_HD float block_term(int32_t acc, uint32_t scales, float d, float dmin, const XBlock &xq, int lane) {
  const int t = lane & 3;
  float mins = 0.0f;
  EP_IMMA_UNROLL
  for (int j = 0; j < 4; ++j) mins = fmaf(static_cast<float>((scales >> (8 * j + 4)) & 0xFu), xq.sum[t][j], mins);
  return fmaf(d * xq.scale[t], static_cast<float>(acc), -dmin * mins);
}

}  // namespace ep::cuda::imma
