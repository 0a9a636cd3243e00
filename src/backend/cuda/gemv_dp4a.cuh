// The dp4a family's arithmetic, shared by its two kernels (gemv_dp4a.cu, gemv_stream.cu): x
// quantized per block into int8 hi + lo parts (with an optional gated activation on the input,
// GemvGlu) and the item decoders of q2_K, q3_K and mxfp4 with their dot products. Everything is
// in an anonymous namespace: each including .cu file has its own copy.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/activation.cuh"
#include "backend/cuda/dp4a.cuh"
#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/kernels.hpp"
#include "backend/cuda/mxfp4_pairs.cuh"
#include "backend/cuda/quant_unit.cuh"

namespace ep::backend::cuda {
namespace {

using namespace quant;

// The dp4a decode kernels (mxfp4, q2_K, q3_K; one token; k a multiple of 256). Each block first
// quantizes its matrix's x into shared memory, per group of D::kScaleGroup values
// (32 for mxfp4 and iq2_xxs, 128 for q2_K and q3_K), as two int8 parts: hi = rint(x/s),
// lo = rint((x − hi·s)·254/s) with s = max|x|/127, so that x ≈ s/254·(254·hi + lo) (~15 bits, any
// f32 range); q2_K/q3_K also get the exact f32 sum of every 16 values (for the min / −4 offsets),
// and the q2_K stream kernel per item the integer sums of its four 16-value pieces (XQuant::xi).
// x is stored permuted so that the 16-byte pieces the lanes of a warp read at one time are
// consecutive (no bank conflicts). Weights stay packed:
// 2-bit fields are masked in place (value·4^j) and fed to dp4a against hi and lo; mxfp4 nibbles
// go through a byte-permute table to int8. Block scales are applied per 16 (q2_K, q3_K) or 32
// (mxfp4) values in f32. A warp owns RW consecutive rows; lane l takes work items l, l + 32, ..
// (64 or 128 values) of every one of them, so each piece of x read from shared memory serves
// RW rows; the next item's weights load while the current one is computed.
constexpr int kDpWarps = 8;

struct XQuant {
  const int8_t *hi, *lo;  // permuted: 16-byte piece p of item ii at (p·ipr + ii)·16
  const float2 *xs;       // q2_K/q3_K: (s/254, Σx of the 16 values) at p·ipr + ii; mxfp4: (s/254, -) at c·ipr + ii
  int ipr;                // items per row
  // q2_K's stream kernel (D::kItemSums): per item, the integer sums S_p = Σ(254·hi + lo) of its four 16-value
  // pieces p as bytes — x: byte p = S_p & 0xFF, y: (S_p >> 8) & 0xFF, z: S_p >> 16 (signed) — and
  // w: the bits of the item's s/254 (one x scale per 128 values, DpKq::kScaleGroup)
  const uint4 *xi = nullptr;
  const uint8_t *tab = nullptr;  // the decoder's lookup tables in shared memory (D::kTableBytes; iq2_xxs)
};

__device__ __forceinline__ uint32_t ldg32(const uint8_t *p) { return __ldg(reinterpret_cast<const unsigned int *>(p)); }
// Where D::load reads an item's words: global memory through the read-only cache (dp4a) or a
// shared-memory copy of the rows (stream). Word reads are 4-byte aligned, half reads 2-byte.
struct GlobalWords {
  __device__ static uint32_t w(const uint8_t *p) { return ldg32(p); }
  __device__ static uint32_t h(const uint8_t *p) { return __ldg(reinterpret_cast<const unsigned short *>(p)); }
};
struct SharedWords {
  __device__ static uint32_t w(const uint8_t *p) { return *reinterpret_cast<const uint32_t *>(p); }
  __device__ static uint32_t h(const uint8_t *p) { return *reinterpret_cast<const unsigned short *>(p); }
};
// The dot products of 16 weight bytes (words w[0..3], masked) with x's hi and lo int8 parts.
template <size_t N>
__device__ __forceinline__ int2 dp4a_hi_lo(const uint32_t (&w)[N], uint32_t mask, const uint4 &xh, const uint4 &xl) {
  const uint32_t w0 = w[0] & mask, w1 = w[1] & mask, w2 = w[2] & mask, w3 = w[3] & mask;
  int sh = dp4a<false, true>(w0, xh.x, 0), sl = dp4a<false, true>(w0, xl.x, 0);
  sh = dp4a<false, true>(w1, xh.y, sh);
  sl = dp4a<false, true>(w1, xl.y, sl);
  sh = dp4a<false, true>(w2, xh.z, sh);
  sl = dp4a<false, true>(w2, xl.z, sl);
  sh = dp4a<false, true>(w3, xh.w, sh);
  sl = dp4a<false, true>(w3, xl.w, sl);
  return make_int2(sh, sl);
}
// Small non-negative integer n (< 2^23) times 2^-e as f32 without a conversion instruction.
__device__ __forceinline__ float small_int_scaled(uint32_t n, int e = 0) {
  const uint32_t bits = (150u - static_cast<uint32_t>(e)) << 23;
  return __uint_as_float(bits | n) - __uint_as_float(bits);
}

// Four values of x as int8 hi and lo parts (scale s = max/127 of their scale group, inv =
// 127/max, inv254 = 254·inv), packed into a word each in value order.
// rint through the f32 mantissa: fma(v, inv, 1.5·2^23) holds rint(v·inv) in its low bits (two's
// complement, |v·inv| <= 127·(1 + a few ulp)), so the low byte is the int8 and no clamp or
// conversion instruction is needed; |lo| <= 127 likewise since |x - hi·s| <= s/2.
__device__ __forceinline__ void quantize4(const float4 &v, float s, float inv, float inv254, uint32_t &ph, uint32_t &pl) {
  constexpr float kMagic = 12582912.0f;
  const float vals[4] = {v.x, v.y, v.z, v.w};
  uint32_t hb[4], lb[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float hm = fmaf(vals[e], inv, kMagic);
    const float r = fmaf(-(hm - kMagic), s, vals[e]);
    hb[e] = __float_as_uint(hm);
    lb[e] = __float_as_uint(fmaf(r, inv254, kMagic));
  }
  ph = __byte_perm(__byte_perm(hb[0], hb[1], 0x0040u), __byte_perm(hb[2], hb[3], 0x0040u), 0x5410u);
  pl = __byte_perm(__byte_perm(lb[0], lb[1], 0x0040u), __byte_perm(lb[2], lb[3], 0x0040u), 0x5410u);
}

// Quantizes x[0, k) (load(i): values 4i .. 4i + 3) into the permuted XQuant layout of D (D::piece:
// value index (a multiple of 4) → byte offset of its 4 values; D::scale_slot: value index → xs
// slot), a thread per 16 values: a scale group's max takes one shuffle per doubling past 16 values
// (32: one, 128: three), the sum of 16 values none, and hi / lo go out as one 16-byte store each
// (measured faster on the stream kernel than a thread per 4 values writing the same bytes).
template <typename D, typename Load>
__device__ __forceinline__ void quantize_x(const Load &load, int64_t k, int ipr, int8_t *hi, int8_t *lo,
                                             float2 *xs, uint8_t *xi) {
  const int n16 = static_cast<int>(k / 16);  // a multiple of 16: half warps are in or out together
  for (int base = 0; base < n16; base += static_cast<int>(blockDim.x)) {
    const int p = base + static_cast<int>(threadIdx.x);  // this thread's values 16p .. 16p + 15
    const bool active = p < n16;
    float4 v[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) v[q] = active ? load(4 * p + q) : make_float4(0.f, 0.f, 0.f, 0.f);
    float m = 0.0f;
#pragma unroll
    for (int q = 0; q < 4; ++q)
      m = fmaxf(m, fmaxf(fmaxf(fabsf(v[q].x), fabsf(v[q].y)), fmaxf(fabsf(v[q].z), fabsf(v[q].w))));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));  // a 32-value group: threads p and p ^ 1
    if constexpr (D::kScaleGroup >= 64) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
    if constexpr (D::kScaleGroup >= 128) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 4));  // 128: p .. p ^ 7
    static_assert(D::kScaleGroup == 32 || D::kScaleGroup == 64 || D::kScaleGroup == 128, "x scale groups of 32-128 values");
    const float s = m * (1.0f / 127.0f);
    const float inv = m > 0.0f ? __frcp_rn(m) * 127.0f : 0.0f, inv254 = inv * 254.0f;
    uint32_t ph[4], pl[4];
    float t[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      quantize4(v[q], s, inv, inv254, ph[q], pl[q]);
      t[q] = (v[q].x + v[q].y) + (v[q].z + v[q].w);
    }
    const float sum16 = (t[0] + t[1]) + (t[2] + t[3]);  // pairs, then pairs of pairs
    const bool upper = (p & 1) != 0;
    if constexpr (D::kPairHalves) {
      // the lower thread (values 0..15 of the group, words A0..A3) writes the group's first 16
      // bytes, A_q and B_q interleaved for q = 0, 1; the upper one (16..31, B0..B3) the last 16,
      // q = 2, 3: each sends the other the two words it lacks
      const uint32_t sh0 = __shfl_xor_sync(0xffffffffu, upper ? ph[0] : ph[2], 1);
      const uint32_t sh1 = __shfl_xor_sync(0xffffffffu, upper ? ph[1] : ph[3], 1);
      const uint32_t sl0 = __shfl_xor_sync(0xffffffffu, upper ? pl[0] : pl[2], 1);
      const uint32_t sl1 = __shfl_xor_sync(0xffffffffu, upper ? pl[1] : pl[3], 1);
      if (active) {
        const uint32_t ah0 = upper ? sh0 : ph[0], bh0 = upper ? ph[2] : sh0;
        const uint32_t ah1 = upper ? sh1 : ph[1], bh1 = upper ? ph[3] : sh1;
        const uint32_t al0 = upper ? sl0 : pl[0], bl0 = upper ? pl[2] : sl0;
        const uint32_t al1 = upper ? sl1 : pl[1], bl1 = upper ? pl[3] : sl1;
        // value 8 of a group sits at byte 16, the start of its second piece (DpMxfp4::piece)
        const int dst = D::piece(upper ? 16 * p - 8 : 16 * p, ipr);
        *reinterpret_cast<uint4 *>(hi + dst) = make_uint4(mxfp4::lower_word(ah0, bh0), mxfp4::upper_word(bh0, ah0),
                                                          mxfp4::lower_word(ah1, bh1), mxfp4::upper_word(bh1, ah1));
        *reinterpret_cast<uint4 *>(lo + dst) = make_uint4(mxfp4::lower_word(al0, bl0), mxfp4::upper_word(bl0, al0),
                                                          mxfp4::lower_word(al1, bl1), mxfp4::upper_word(bl1, al1));
      }
    } else if (active) {
      const int dst = D::piece(16 * p, ipr);
      *reinterpret_cast<uint4 *>(hi + dst) = make_uint4(ph[0], ph[1], ph[2], ph[3]);
      *reinterpret_cast<uint4 *>(lo + dst) = make_uint4(pl[0], pl[1], pl[2], pl[3]);
    }
    if (active && (D::kSums || !upper)) xs[D::scale_slot(16 * p, ipr)] = make_float2(s * (1.0f / 254.0f), sum16);
    if constexpr (D::kItemSums) {
      // the piece's integer sum Σ(254·hi + lo) (|S| <= 16·32385 < 2^20), as three bytes of its
      // item's record (XQuant::xi)
      int shi = 0, slo = 0;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        shi = dp4a<true, false>(ph[q], 0x01010101u, shi);
        slo = dp4a<true, false>(pl[q], 0x01010101u, slo);
      }
      const int sum = shi * 254 + slo;
      if (active) {
        // (slot % ipr and slot / ipr of scale_slot instead measured slower)
        const int item = D::item_of(16 * p), piece = D::field_of(16 * p);  // slot = piece·ipr + item
        uint8_t *rec = xi + 16 * item;
        rec[piece] = static_cast<uint8_t>(sum);
        rec[4 + piece] = static_cast<uint8_t>(sum >> 8);
        rec[8 + piece] = static_cast<uint8_t>(sum >> 16);
        if (piece == 0) *reinterpret_cast<float *>(rec + 12) = s * (1.0f / 254.0f);
      }
    }
  }
}

// The quantized x at the start of a dp4a / stream block's dynamic shared memory: hi bytes [k],
// lo bytes [k], the float2 scales [k / 16], then the item records [k / 64] (D::kItemSums: XQuant::xi;
// the space is reserved for every decoder).
template <typename D>
__device__ __forceinline__ XQuant x_smem_view(uint8_t *smem, int64_t k) {
  const int8_t *hi = reinterpret_cast<const int8_t *>(smem);
  XQuant xq{hi, hi + k, reinterpret_cast<const float2 *>(smem + 2 * k), static_cast<int>(k / D::kValues)};
  if constexpr (D::kItemSums) xq.xi = reinterpret_cast<const uint4 *>(smem + 2 * k + k / 16 * 8);
  return xq;
}
// x's values 4i .. 4i + 3 (quantize_x's loader): a row of f32 in global memory.
struct LoadRow {
  const float *x;
  __device__ float4 operator()(int i) const { return __ldg(reinterpret_cast<const float4 *>(x) + i); }
};
template <typename D, typename Load>
__device__ __forceinline__ void quantize_x_smem(const Load &load, int64_t k, uint8_t *smem) {
  int8_t *hi = reinterpret_cast<int8_t *>(smem);
  quantize_x<D>(load, k, static_cast<int>(k / D::kValues), hi, hi + k, reinterpret_cast<float2 *>(smem + 2 * k),
                smem + 2 * k + k / 16 * 8);
}
template <typename D>
__device__ __forceinline__ void quantize_x_smem(const float *__restrict__ x, int64_t k, uint8_t *smem) {
  quantize_x_smem<D>(LoadRow{x}, k, smem);
}
// act(gate, up) of two f32 rows, values 4i .. 4i + 3 (GemvGlu): glu_activation, the f32 function
// of launch_glu, on the same inputs, so the values are those launch_glu would have written.
struct LoadGlu {
  const float *gate, *up;
  GemvGlu act;
  __device__ float4 operator()(int i) const {
    const float4 g = __ldg(reinterpret_cast<const float4 *>(gate) + i), u = __ldg(reinterpret_cast<const float4 *>(up) + i);
    return make_float4(glu_activation(g.x, u.x, act.kind, act.limit, act.beta_g, act.beta_u),
                       glu_activation(g.y, u.y, act.kind, act.limit, act.beta_g, act.beta_u),
                       glu_activation(g.z, u.z, act.kind, act.limit, act.beta_g, act.beta_u),
                       glu_activation(g.w, u.w, act.kind, act.limit, act.beta_g, act.beta_u));
  }
};
// The GEMV input of matrix m into the block's quantized x: row x_rows[m] (or m) of x, or with
// GLU of act(x, glu.up) (GemvArgs::glu; a template parameter: behind a run-time branch in every
// kernel, the activation's code measured 4-9 % slower decode for the kernels that do not apply
// it, mxfp4 and q3_K). After
// griddepcontrol.wait (x is often the previous kernel's output); the caller synchronizes the
// block before reading it.
template <typename D, bool GLU>
__device__ __forceinline__ void quantize_input_smem(const GemvArgs &a, int m, uint8_t *smem) {
  const int64_t row = static_cast<int64_t>(a.x_rows ? a.x_rows[m] : m) * a.k;
  if constexpr (GLU) {
    quantize_x_smem<D>(LoadGlu{a.x + row, a.glu.up + row, a.glu}, a.k, smem);
  } else {
    quantize_x_smem<D>(a.x + row, a.k, smem);
  }
}

// q2_K item ii of a row: block ii/4, half h = (ii/2)%2, 16-byte group g = ii%2 of that half's
// 32 quant bytes, all four 2-bit fields j (values 128h + 32j + 16g + 0..15, scale 8h + 2j + g).
// x piece j of item ii = those 16 values of field j.
struct DpKq {
  static constexpr int kValues = 64;
  static constexpr bool kSums = true;
  static constexpr bool kItemSums = false;  // XQuant::xi: only SQ2K reads it
  // one x scale per 128 values (half a block: an item's four pieces share it, so the stream
  // kernels add their pieces' integer dots before one conversion)
  static constexpr int kScaleGroup = 128;
  static constexpr bool kPairHalves = false;  // x in value order within a piece (see DpMxfp4)
  static constexpr int kTableBytes = 0;  // no lookup tables (see DpIq2xxs)
  __device__ static void init_tables(uint8_t *) {}
  // value v's item (4 per 256-value block: half h, 16-byte group g) and field j (its x piece): v
  // sits at byte v % 16 of piece j·ipr + item, which is also its scale slot (no division)
  __device__ static int item_of(int v) { return 4 * (v >> 8) + 2 * ((v >> 7) & 1) + ((v >> 4) & 1); }
  __device__ static int field_of(int v) { return (v >> 5) & 3; }
  __device__ static int piece(int v, int ipr) { return (field_of(v) * ipr + item_of(v)) * 16 + (v & 15); }
  __device__ static int scale_slot(int v, int ipr) { return piece(v, ipr) >> 4; }
  struct XPiece {
    uint4 hi, lo;
    float2 s;
  };
  // x piece j of item ii: hi, lo and (s/254, Σx)
  __device__ static XPiece x_piece(const XQuant &xq, int j, int ii) {
    const int slot = j * xq.ipr + ii;
    return {*reinterpret_cast<const uint4 *>(xq.hi + 16 * slot), *reinterpret_cast<const uint4 *>(xq.lo + 16 * slot),
            xq.xs[slot]};
  }
};
struct DpQ2K : DpKq {
  static constexpr int kWords = 7, kBytes256 = 84;
  template <typename L = GlobalWords>
  __device__ static void load(const uint8_t *row, int ii, uint32_t (&r)[kWords]) {
    const uint8_t *b = row + (ii >> 2) * 84;
    const int h = (ii >> 1) & 1, g = ii & 1;
    const uint8_t *q = b + 16 + 32 * h + 16 * g;
#pragma unroll
    for (int i = 0; i < 4; ++i) r[i] = L::w(q + 4 * i);
    r[4] = L::w(b + 8 * h);
    r[5] = L::w(b + 8 * h + 4);
    r[6] = L::w(b + 80);
  }
  template <int RW>
  __device__ static void dot(const uint32_t (&r)[RW][kWords], const uint8_t *const *, int ii, const XQuant &xq,
                             float (&acc)[RW]) {
    const int g = ii & 1;
    float A[RW], B[RW];
#pragma unroll
    for (int rr = 0; rr < RW; ++rr) A[rr] = B[rr] = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const XPiece xp = x_piece(xq, j, ii);
      const uint4 xh = xp.hi, xl = xp.lo;
      const float2 xs = xp.s;
      const uint32_t mask = 0x03030303u << (2 * j);
#pragma unroll
      for (int rr = 0; rr < RW; ++rr) {
        const int2 d = dp4a_hi_lo(r[rr], mask, xh, xl);
        const int sh = d.x, sl = d.y;
        const uint32_t sc = (r[rr][4 + (j >> 1)] >> (16 * (j & 1) + 8 * g)) & 0xFFu;
        const float dl = small_int_scaled(sc & 0xFu, 2 * j);  // (sc & 15)·4^-j: undoes the in-place mask
        A[rr] = fmaf(dl * xs.x, static_cast<float>(sh * 254 + sl), A[rr]);
        B[rr] = fmaf(small_int_scaled(sc >> 4), xs.y, B[rr]);
      }
    }
#pragma unroll
    for (int rr = 0; rr < RW; ++rr) {
      const float2 dd = __half22float2(bits_h2(r[rr][6]));
      acc[rr] += fmaf(dd.x, A[rr], -dd.y * B[rr]);
    }
  }
};

// q3_K item: as q2_K (hmask bytes 16g..16g+15, bit 4h + j). Blocks are 110 bytes, so every
// field of an odd block sits 2 bytes off a word boundary: aligned words + a funnel shift.
struct DpQ3K : DpKq {
  static constexpr int kWords = 15, kBytes256 = 110;
  template <typename L = GlobalWords>
  __device__ static void load(const uint8_t *row, int ii, uint32_t (&r)[kWords]) {
    const uint8_t *b = row + (ii >> 2) * 110;
    const int off = static_cast<int>(reinterpret_cast<uintptr_t>(b) & 3);  // 0 or 2
    const uint8_t *a = b - off;
    const int h = (ii >> 1) & 1, g = ii & 1;
    const uint8_t *hm = a + 16 * g, *q = a + 32 + 32 * h + 16 * g, *sc = a + 96;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      r[i] = L::w(hm + 4 * i);
      r[5 + i] = L::w(q + 4 * i);
    }
    r[10] = L::w(sc);
    r[11] = L::w(sc + 4);
    r[12] = L::w(sc + 8);
    // the fifth word only when misaligned: an aligned block's words end at its last byte
    r[4] = off ? L::w(hm + 16) : 0u;
    r[9] = off ? L::w(q + 16) : 0u;
    r[13] = off ? L::w(sc + 12) : 0u;
    r[14] = L::h(b + 108);
  }
  template <int RW>
  __device__ static void dot(const uint32_t (&r)[RW][kWords], const uint8_t *const *rows, int ii, const XQuant &xq,
                             float (&acc)[RW]) {
    const int h = (ii >> 1) & 1, g = ii & 1;
    const float hb_scale0 = h ? 0.25f : 4.0f;  // 4·2^-(4h): the high bit sits at bit 4h + j
    uint32_t hm[RW][4], q[RW][4], S0[RW], S1[RW], S2[RW];
#pragma unroll
    for (int rr = 0; rr < RW; ++rr) {
      const uint32_t fs = static_cast<uint32_t>(reinterpret_cast<uintptr_t>(rows[rr] + (ii >> 2) * 110) & 3) * 8;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        hm[rr][i] = __funnelshift_r(r[rr][i], r[rr][i + 1], fs);
        q[rr][i] = __funnelshift_r(r[rr][5 + i], r[rr][6 + i], fs);
      }
      const uint32_t sh_sc = 8 * g + 4 * h;
      S0[rr] = __funnelshift_r(r[rr][10], r[rr][11], fs) >> sh_sc;
      S1[rr] = __funnelshift_r(r[rr][11], r[rr][12], fs) >> sh_sc;
      S2[rr] = __funnelshift_r(r[rr][12], r[rr][13], fs) >> sh_sc;
    }
    float sum[RW];
#pragma unroll
    for (int rr = 0; rr < RW; ++rr) sum[rr] = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const XPiece xp = x_piece(xq, j, ii);
      const uint4 xh = xp.hi, xl = xp.lo;
      const float2 xs = xp.s;
      const uint32_t xhw[4] = {xh.x, xh.y, xh.z, xh.w}, xlw[4] = {xl.x, xl.y, xl.z, xl.w};
      const uint32_t qm = 0x03030303u << (2 * j), hmk = 0x01010101u << (4 * h + j);
      const float hscale = hb_scale0 * (1.0f / static_cast<float>(1 << j)), qscale = 1.0f / static_cast<float>(1 << (2 * j));
#pragma unroll
      for (int rr = 0; rr < RW; ++rr) {
        int qh = 0, ql = 0, bh = 0, bl = 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const uint32_t wq = q[rr][i] & qm, wh = hm[rr][i] & hmk;
          qh = dp4a<false, true>(wq, xhw[i], qh);
          ql = dp4a<false, true>(wq, xlw[i], ql);
          bh = dp4a<false, true>(wh, xhw[i], bh);
          bl = dp4a<false, true>(wh, xlw[i], bl);
        }
        const uint32_t low4 = ((j < 2 ? S0[rr] : S1[rr]) >> (16 * (j & 1))) & 0xFu;
        const uint32_t high2 = (S2[rr] >> (16 * (j & 1) + 2 * (j >> 1))) & 3u;
        const float sc = small_int_scaled(low4 | (high2 << 4)) - 32.0f;
        // Σx·(ql + 4·hb − 4) in x units: ql·4^j and hb·2^(4h+j) come out of the in-place masks
        const float inner = fmaf(static_cast<float>(bh * 254 + bl), hscale, static_cast<float>(qh * 254 + ql) * qscale);
        sum[rr] = fmaf(sc, fmaf(xs.x, inner, -4.0f * xs.y), sum[rr]);
      }
    }
#pragma unroll
    for (int rr = 0; rr < RW; ++rr)
      acc[rr] = fmaf(__half2float(__ushort_as_half(static_cast<unsigned short>(r[rr][14]))), sum[rr], acc[rr]);
  }
};

// mxfp4 item: 4 blocks of 32 values (68 bytes, word-aligned since rows are multiples of 136).
// x pieces 2c, 2c + 1 of item ii = the 32 values of its block c in the order the table lookup
// yields the weights (cuda/mxfp4_pairs.cuh: byte p of the 32 is value p/2 + 16·(p % 2)), so that
// each looked-up word goes to dp4a as it comes out.
struct DpMxfp4 {
  static constexpr int kWords = 17, kValues = 128, kBytes256 = 136;
  static constexpr bool kSums = false;
  static constexpr bool kItemSums = false;
  static constexpr int kScaleGroup = 32;  // the block's: one e8m0 scale per 32 values
  static constexpr bool kPairHalves = true;
  static constexpr int kTableBytes = 0;
  __device__ static void init_tables(uint8_t *) {}
  // byte offset of the x word that holds values v .. v + 3 (v a multiple of 4) interleaved with
  // v + 16 .. v + 19: position 2s (s = v % 16) of the block's 32 for the lower half, 2s + 4 for
  // the upper (see above)
  __device__ static int piece(int v, int ipr) {
    const int item = v >> 7, c = (v >> 5) & 3, pos = 2 * (v & 15) + 4 * ((v >> 4) & 1);
    return ((2 * c + (pos >> 4)) * ipr + item) * 16 + (pos & 15);
  }
  __device__ static int scale_slot(int v, int ipr) { return ((v >> 5) & 3) * ipr + (v >> 7); }
  // x of 32-value chunk c of item ii: hi and lo bytes in the piece order (DpMxfp4: interleaved
  // halves; DpIq2xxs: words 0..3 the first 16 values, 4..7 the second 16) and s/254
  struct XChunk {
    uint32_t hi[8], lo[8];
    float s;
  };
  __device__ static XChunk x_chunk(const XQuant &xq, int c, int ii) {
    const uint4 xa = *reinterpret_cast<const uint4 *>(xq.hi + 16 * ((2 * c) * xq.ipr + ii));
    const uint4 xb = *reinterpret_cast<const uint4 *>(xq.hi + 16 * ((2 * c + 1) * xq.ipr + ii));
    const uint4 la = *reinterpret_cast<const uint4 *>(xq.lo + 16 * ((2 * c) * xq.ipr + ii));
    const uint4 lb = *reinterpret_cast<const uint4 *>(xq.lo + 16 * ((2 * c + 1) * xq.ipr + ii));
    return {{xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w}, {la.x, la.y, la.z, la.w, lb.x, lb.y, lb.z, lb.w},
            xq.xs[c * xq.ipr + ii].x};
  }
  template <typename L = GlobalWords>
  __device__ static void load(const uint8_t *row, int ii, uint32_t (&r)[kWords]) {
    const uint8_t *p = row + ii * 68;
#pragma unroll
    for (int i = 0; i < kWords; ++i) r[i] = L::w(p + 4 * i);
  }
  template <int RW>
  __device__ static void dot(const uint32_t (&r)[RW][kWords], const uint8_t *const *, int ii, const XQuant &xq,
                             float (&acc)[RW]) {
    dot_tables<RW>(r, ii, xq, acc, mxfp4::PairTables{}, [](uint8_t e) { return e8m0_half(e); });
  }
  // dot with the lookup's register table words given, and the block scale e8m0_half(e) of a scale
  // byte e by `scale` (SMxfp4: from a table)
  template <int RW, typename Scale>
  __device__ static void dot_tables(const uint32_t (&r)[RW][kWords], int ii, const XQuant &xq, float (&acc)[RW],
                                    const mxfp4::PairTables &tab, const Scale &scale) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int off = 17 * c, start = off + 1, wi = start / 4, fs = 8 * (start % 4);
      const XChunk x = x_chunk(xq, c, ii);
#pragma unroll
      for (int rr = 0; rr < RW; ++rr) {
        const uint32_t e = (r[rr][off / 4] >> (8 * (off % 4))) & 0xFFu;
        int sh = 0, sl = 0;
#pragma unroll
        for (int t = 0; t < 4; ++t) {
          const uint32_t q = fs ? __funnelshift_r(r[rr][wi + t], r[rr][wi + t + 1], fs) : r[rr][wi + t];
          const mxfp4::Pairs v = mxfp4::pairs(q, tab);
          sh = dp4a<true, true>(v.x, x.hi[2 * t], sh);
          sl = dp4a<true, true>(v.x, x.lo[2 * t], sl);
          sh = dp4a<true, true>(v.y, x.hi[2 * t + 1], sh);
          sl = dp4a<true, true>(v.y, x.lo[2 * t + 1], sl);
        }
        acc[rr] = fmaf(scale(static_cast<uint8_t>(e)) * x.s, static_cast<float>(sh * 254 + sl), acc[rr]);
      }
    }
  }
};

template <int T> struct DpOf;
template <> struct DpOf<kQ2_K> { using type = DpQ2K; };
template <> struct DpOf<kQ3_K> { using type = DpQ3K; };
template <> struct DpOf<kMXFP4> { using type = DpMxfp4; };

constexpr int64_t dp4a_smem_bytes(int64_t k) { return 2 * k + k / 16 * 8 + k / 64 * 16; }  // x_smem_view
constexpr int64_t kDp4aMaxSmem = 200 * 1024;

}  // namespace
}  // namespace ep::backend::cuda
