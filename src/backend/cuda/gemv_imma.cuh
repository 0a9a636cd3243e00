// q2_K decode GEMV on int8 tensor cores: the per-lane arithmetic of gemv_imma_kernel
// (gemv_quant.cu), host-callable so that tests/backend/cuda/gemv_imma_emulation_test.cpp checks it on
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
// 32h + 16s + l (l < 16), i.e. of qs bytes 16c + l for the block's "slot" c = 2h + s. Four groups
// with the same field j — the four slots — share one "set" of two mmas (m = 0, 1): slot c owns the
// k of lane t = c, {4c..4c+3} ∪ {16+4c..16+4c+3}, which hold its values l = 8m..8m+7, so a lane's
// A registers a0, a2 (a1, a3: row g+8) are the 8 adjacent qs bytes 16t + 8m.. of its own slot,
// masked to field j (values ·4^j, in place). B's eight columns are x's hi and lo parts of slot c
// (columns 2c, 2c+1), zero outside that slot's k: after the two mmas lane t holds the hi and lo
// sums of slot t for its rows g and g+8, i.e. one whole 16-value group per lane and row, every
// lane of a quad busy. Only the lanes with t = g / 2 hold non-zero B registers: their x words are
// stored once (8 lanes per set), and the other lanes read an all-zero table.
//
// x is carried like the dp4a kernels' (int8 hi + lo, x ≈ s/254·(254·hi + lo), ~15 bits) with one
// scale s per slot of a block (the 64 values of the slot's four groups), so that a lane's four
// group sums of a block add up in int32 before one conversion:
//   row result += s/254·(d·Σ_j sc_G·((254·hi_sum + lo_sum) >> 2j) − dmin·Σ_j m_G·X_G),
// with X_G = Σ (254·hi + lo) over the group (the quantized x's sum, |X_G| < 2^19), the mins' sum
// taken by three dp4a over X_G's bytes. |254·hi_sum + lo_sum| <= 4^j·255·127·3·16 < 2^27, the
// int32 sums of a lane's block < 2^27.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "backend/cuda/dp4a.cuh"

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

namespace ep::backend::cuda::imma {

inline constexpr int kBlockValues = 256, kBlockBytes = 84;  // q2_K: scales[16], qs[64], d, dmin

/// x of one 256-value block: the non-zero B registers of its eight mmas (set j = 0..3, half
/// m = 0, 1: b[2j + m][2c + p] = {b0, b1} of the lane whose column is slot c's part p, 0 hi,
/// 1 lo), the bytes of each group's quantized sum X (planes[c][4·i + j] = byte i of X of slot c,
/// field j; i = 2 the signed top byte, i = 3 unused) and the x scale s/254 of each slot.
struct XBlock {
  uint32_t b[8][8][2];
  uint8_t planes[4][16];
  float scale[4];
};
/// Bytes of the all-zero B table the lanes without x words read (one set's worth per (j, m)).
inline constexpr int kZeroTableBytes = 8 * 8 * 2 * 4;

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
/// (slot_max): its B words in the two mmas of set j, the bytes of its quantized sum, and for
/// j = 0 the slot's scale. The rounding of quantize_x (cuda/gemv_stream.cuh):
/// hi = rint(x·127/max), lo = rint((x − hi·s)·254/s).
EP_IMMA_HD void quantize_group(const float (&v)[16], int c, int j, float slot_max, XBlock &xq) {
  const float scale = slot_max * (1.0f / 127.0f);
  const float inv = slot_max > 0.0f ? 127.0f / slot_max : 0.0f;
  uint32_t hw[4] = {0, 0, 0, 0}, lw[4] = {0, 0, 0, 0};
  int32_t sum = 0;
  EP_IMMA_UNROLL
  for (int l = 0; l < 16; ++l) {
    const float hq = fminf(fmaxf(rintf(v[l] * inv), -127.0f), 127.0f);
    const float lq = fminf(fmaxf(rintf((v[l] - hq * scale) * inv * 254.0f), -127.0f), 127.0f);
    const int hi = static_cast<int>(hq), lo = static_cast<int>(lq);
    hw[l >> 2] |= static_cast<uint32_t>(hi & 0xFF) << (8 * (l & 3));
    lw[l >> 2] |= static_cast<uint32_t>(lo & 0xFF) << (8 * (l & 3));
    sum += 254 * hi + lo;
  }
  if (j == 0) xq.scale[c] = scale * (1.0f / 254.0f);
  EP_IMMA_UNROLL
  for (int m = 0; m < 2; ++m) {
    xq.b[2 * j + m][2 * c][0] = hw[2 * m];
    xq.b[2 * j + m][2 * c][1] = hw[2 * m + 1];
    xq.b[2 * j + m][2 * c + 1][0] = lw[2 * m];
    xq.b[2 * j + m][2 * c + 1][1] = lw[2 * m + 1];
  }
  const uint32_t u = static_cast<uint32_t>(sum);
  xq.planes[c][j] = static_cast<uint8_t>(u);
  xq.planes[c][4 + j] = static_cast<uint8_t>(u >> 8);
  xq.planes[c][8 + j] = static_cast<uint8_t>(u >> 16);  // sum >> 16 in [-8, 7]: the signed top byte
}

/// Whether the lane's B registers hold x words (column g = lane / 4 is slot t = lane % 4's).
EP_IMMA_HD bool b_active(int lane) { return ((lane >> 2) >> 1) == (lane & 3); }
/// Byte offset of the lane's B words of set (j, m) = (0, 0) in an XBlock (active lanes).
EP_IMMA_HD int b_offset(int lane) { return 8 * (2 * (lane & 3) + ((lane >> 2) & 1)); }
/// Byte offset of set (j, m)'s words from those of (0, 0).
EP_IMMA_HD int b_set_offset(int j, int m) { return 64 * (2 * j + m); }

/// The lane's B registers of set j, half m.
EP_IMMA_HD void b_regs(const XBlock &xq, int lane, int j, int m, uint32_t (&b)[2]) {
  const bool on = b_active(lane);
  const int e = b_offset(lane) / 8;
  b[0] = on ? xq.b[2 * j + m][e][0] : 0u;
  b[1] = on ? xq.b[2 * j + m][e][1] : 0u;
}

/// Byte offset, in a block, of the lane's A words of half m: qs bytes 16t + 8m .. + 7.
EP_IMMA_HD int a_offset(int lane, int m) { return 16 + 16 * (lane & 3) + 8 * m; }

/// The lane's A registers of set j, half m: qs words of the blocks of rows g (bg) and g+8 (bg8)
/// masked to field j.
EP_IMMA_HD void a_regs(const uint8_t *bg, const uint8_t *bg8, int lane, int j, int m, uint32_t (&a)[4]) {
  const int off = a_offset(lane, m);
  const uint32_t mask = 0x03030303u << (2 * j);
  a[0] = load_u32(bg + off) & mask;
  a[1] = load_u32(bg8 + off) & mask;
  a[2] = load_u32(bg + off + 4) & mask;
  a[3] = load_u32(bg8 + off + 4) & mask;
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

/// Byte j of w.
EP_IMMA_HD int32_t byte_of(uint32_t w, int j) {
#if defined(__CUDA_ARCH__)
  return static_cast<int32_t>(__byte_perm(w, 0u, 0x4440u + j));
#else
  return static_cast<int32_t>((w >> (8 * j)) & 0xFFu);
#endif
}

/// Adds set j's group of the lane (c0, c1: row g; c2, c3: row g+8) times its scale to the int32
/// block sums; sc_g, sc_g8: the rows' slot_scales & 0x0F0F0F0F.
EP_IMMA_HD void add_set(const int32_t (&c)[4], int j, uint32_t sc_g, uint32_t sc_g8, int32_t &acc_g, int32_t &acc_g8) {
  const int32_t vg = (254 * c[0] + c[1]) >> (2 * j), vg8 = (254 * c[2] + c[3]) >> (2 * j);  // exact: divisible
  acc_g += byte_of(sc_g, j) * vg;
  acc_g8 += byte_of(sc_g8, j) * vg8;
}

/// Σ_j m_G·X_G of the lane's four groups (scales: slot_scales; planes: XBlock::planes[t] as words).
EP_IMMA_HD int32_t min_sum(uint32_t scales, const uint32_t (&planes)[3]) {
  const uint32_t mins = (scales >> 4) & 0x0F0F0F0Fu;
  return dp4a<false, false>(mins, planes[0], 0) + dp4a<false, false>(mins, planes[1], 0) * 256 +
         dp4a<false, true>(mins, planes[2], 0) * 65536;
}

/// The XBlock planes of slot t as words.
EP_IMMA_HD void plane_words(const XBlock &xq, int t, uint32_t (&planes)[3]) {
  EP_IMMA_UNROLL
  for (int i = 0; i < 3; ++i) planes[i] = load_u32(xq.planes[t] + 4 * i);
}

/// One row's contribution of a block: s/254·(d·acc − dmin·mins) (d, dmin the block's f16 values
/// as f32, xs = XBlock::scale[t]).
EP_IMMA_HD float block_term(int32_t acc, int32_t mins, float d, float dmin, float xs) {
  return xs * fmaf(d, static_cast<float>(acc), -dmin * static_cast<float>(mins));
}

}  // namespace ep::backend::cuda::imma
