// The tensor-core decode-GEMV kernel (mxfp4, q2_K, q3_K, q8_0, iq2_xxs; k a multiple of 256;
// 1..kGemvMaxTokens tokens). Each warp owns 16 rows and streams them through a cp.async ring, 256
// values per stage; the block stages x once per phase as f16 hi + lo halves (x·2^e per token, so
// that hi + lo carry ~22 bits and never overflow); weights decode with bit tricks straight into
// f16 mma fragments as exact small integers (mxfp4: e2m1 values scaled by 2^-15) and mma.sync
// m16n8k16 accumulates in f32. Scales that are small integers are folded into the fragments
// (q2_K's and q3_K's sub-block scales, iq2_xxs's 2s + 1); the others multiply f32 sums: q8_0's
// and mxfp4's per 32 values (each block's mma products accumulated apart), the super-block scales
// per 256. q8_0 and iq2_xxs decode in the "pairs" k order of mma_pairs.cuh (checked on a CPU by
// tests/backend/cuda/mma_pairs_test.cpp); iq2_xxs reads its grid from a table in shared memory
// (see mma_iq2xxs_block). The 8 mma columns are the tokens: one mma serves 1..8 tokens, and at 16
// and 32 tokens every decoded A fragment feeds two or four mmas, one per tile of 8 tokens
// (mma_tiles.cuh: the token side's index arithmetic, checked on a CPU by mma_pairs_test; the
// fragment decode, not the tensor cores, bounds the kernel, so more tokens per decode are nearly
// free). Instantiated for 1, 2, 4, 8, 16 and 32 tokens (mma::tokens_rounded; fewer tokens, longer
// x phases: 16 KB of staging, 4096 values per token at one token down to 256 at 16; 32 KB, 256
// values, at 32); tiles wholly past the launch's tokens skip their mmas. Matrices of few rows
// split k over a block's warps (kMmaSplitBelowRows). launch_gemv (gemv.cu) runs it for 2..8
// tokens and, the only family that takes them, 9..32 (the chunks of a prompt's experts).
#include "backend/cuda/dispatch.cuh"
#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/gemv_families.hpp"
#include "backend/cuda/kernels.hpp"
#include "backend/cuda/mma_pairs.cuh"
#include "backend/cuda/mma_tiles.cuh"
#include "backend/cuda/quant_unit.cuh"
#include "backend/cuda/reduce.cuh"
#include "core/status.hpp"
#include "gpu/check.hpp"

#include <cstdint>
#include <string>

namespace ep::backend::cuda {
namespace {

using namespace quant;

// Layout of mma.sync m16n8k16 (f16 in, f32 out), lane = 4·g + t: A (16 rows × 16 k) reg0 = row g,
// k 2t..2t+1; reg1 = row g+8, k 2t..; reg2 = row g, k 2t+8..2t+9; reg3 = row g+8, k 2t+8..;
// B (16 k × 8 tokens) b0 = k 2t..2t+1 of token g, b1 = k 2t+8..; C c0,c1 = row g, tokens 2t, 2t+1;
// c2,c3 = row g+8. The k order inside a step is free as long as A and B agree: every type here
// gives lane t four values v0..v3 of a 16-value "step", (v0, v2) in k 2t..2t+1 and (v1, v3) in k
// 2t+8..2t+9: mxfp4, q2_K and q3_K the step's values 4t..4t+3 (bytes 0, 2 and 1, 3 of a 32-bit
// word of packed weights), q8_0 and iq2_xxs those of the pairs order (mma_pairs.cuh: lane t owns
// values 8t..8t+7 of each 32-value block, over the block's two steps).
constexpr int kMmaChunk = mma::kChunkValues;  // values of a row per pipeline stage
constexpr uint32_t kHalfMagic = 0x64006400u;  // f16 1024 in both halves: 1024 + i for mantissa bits i
// Warps per block. A matrix of fewer than kMmaSplitBelowRows rows runs with the block's warps
// sharing 16 rows and splitting k four ways (KSPLIT 4), others with each warp on its own 16 rows:
// four times the blocks for one small dense matrix (DeepSeek-V4's q8_0 q_a, kv and o_a at 2..8
// tokens: 512-1024 rows, 8-16 blocks unsplit against the GPU's 132 SMs; not measured). The rule
// looks at the matrix, not at how many matrices share the launch: the split changes the order in
// which a row's chunks are summed, and a matrix's outputs must not depend on the launch it is in
// (the MoE's expert-major pass runs subsets of a step's expert chunks). The expert matrices
// (2048 rows and more) stay unsplit: with 16 rows per block, each block's staging of x would
// read several times the bytes of its weights.
constexpr int kMmaWarps = 4;
constexpr int64_t kMmaSplitBelowRows = 2048;

// Per type: the bytes of a 256-value chunk of a row; whether the offset term needs x's per-group
// sums (q2_K, q3_K); whether the weights decode in the pairs order (mma_pairs.cuh; x staged to
// match); the bytes of a shared-memory decode table; the pipeline stages.
struct MmaQuantBase {
  static constexpr bool sums = false, pairs = false;
  static constexpr int table_bytes = 0, stages = 4;
};
template <int T> struct MmaQuant;
template <> struct MmaQuant<kMXFP4> : MmaQuantBase { static constexpr int chunk_bytes = 136; };
template <> struct MmaQuant<kQ2_K> : MmaQuantBase { static constexpr int chunk_bytes = 84; static constexpr bool sums = true; };
template <> struct MmaQuant<kQ3_K> : MmaQuantBase { static constexpr int chunk_bytes = 110; static constexpr bool sums = true; };
// q8_0: 8 blocks of 34 bytes. Three stages (two chunks in flight per warp, 8.7 KB: more than the
// others' three of 84-136 bytes per row) keep a block at 74 KiB of shared memory, three per SM.
template <> struct MmaQuant<kQ8_0> : MmaQuantBase {
  static constexpr int chunk_bytes = 272, stages = 3;
  static constexpr bool pairs = true;
};
// iq2_xxs: one 66-byte block; the grid as f16 (mma::GridF16, 256 entries of 16 bytes).
template <> struct MmaQuant<kIQ2_XXS> : MmaQuantBase {
  static constexpr int chunk_bytes = 66, table_bytes = 256 * static_cast<int>(sizeof(mma::GridF16));
  static constexpr bool pairs = true;
};
template <int T> constexpr int mma_granules() { return (MmaQuant<T>::chunk_bytes + 30) / 16; }
template <int T> constexpr int mma_slot() { return 16 * mma_granules<T>() + 16; }  // + slack for lds_words
// x's staging: mma::x_bytes (16 KB up to 16 tokens, 32 KB at 32), mma::phase_values per token.
template <int NTOK> constexpr int mma_phase_values() { return mma::phase_values(NTOK); }
static_assert(mma::phase_values(1) % kMmaChunk == 0 && mma::phase_values(2) % kMmaChunk == 0 &&
                  mma::phase_values(4) % kMmaChunk == 0 && mma::phase_values(8) % kMmaChunk == 0 &&
                  mma::phase_values(16) % kMmaChunk == 0 && mma::phase_values(32) % kMmaChunk == 0,
              "a phase of x holds whole chunks at every token count");
// The ring (one per warp), x's fragments, the decode table, x's group sums, the per-token maxima
// and inverse scales.
template <int T, int NTOK, int WARPS, int STAGES>
constexpr int mma_smem_bytes() {
  return WARPS * STAGES * 16 * mma_slot<T>() + mma::x_bytes(NTOK) + MmaQuant<T>::table_bytes +
         NTOK * (mma_phase_values<NTOK>() / 16) * 4 + NTOK * 8;
}

__device__ __forceinline__ void mma16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// x ≈ hi + lo with hi = f16(x) and lo = f16(x − hi): two f16 mma passes give ~22 bits of x.
__device__ __forceinline__ void split_hi_lo(float a, float b, uint32_t &hi, uint32_t &lo) {
  const __half2 h = __floats2half2_rn(a, b);
  const float2 back = __half22float2(h);
  hi = h2_bits(h);
  lo = h2_bits(__floats2half2_rn(a - back.x, b - back.y));
}
// N 32-bit words at any byte address of shared memory.
template <int N>
__device__ __forceinline__ void lds_words(const uint8_t *p, uint32_t (&out)[N]) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(p);
  const uint32_t *q = reinterpret_cast<const uint32_t *>(at & ~uintptr_t(3));
  const uint32_t sh = static_cast<uint32_t>(at & 3) * 8;
  if (sh == 0) {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = q[i];
  } else {
    uint32_t prev = q[0];
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const uint32_t next = q[i + 1];
      out[i] = __funnelshift_r(prev, next, sh);
      prev = next;
    }
  }
}
// Byte i of N words held in registers (selects, not a dynamically indexed local array).
template <int N>
__device__ __forceinline__ uint32_t byte_at(const uint32_t (&words)[N], int i) {
  uint32_t word = words[0];
#pragma unroll
  for (int k = 1; k < N; ++k) word = (i >> 2) == k ? words[k] : word;
  return (word >> (8 * (i & 3))) & 0xFFu;
}
// Power-of-two scale per token that brings max |x| into [2^14, 2^15) (f16 range with headroom).
__device__ __forceinline__ int x_exponent(uint32_t max_bits) {
  const int e = static_cast<int>(max_bits >> 23) - 127;  // floor(log2(max)) for normal max
  const int s = 14 - e;
  return s < -120 ? -120 : (s > 120 ? 120 : s);
}

// Stages x[v0, v0 + pv) of every token as mma B fragments: for each 16-value step and token,
// 4 uint4 (one per t: hi b0, hi b1, lo b0, lo b1; b0 holds a unit's values 0 and 2, b1 its 1 and
// 3), and (sums) the per-token sums of each 16 values of the scaled x. q2_K / q3_K permute steps
// so that lane t sees whole scale groups (see mma_kquant_block); q8_0 and iq2_xxs take the pairs
// order (mma_pairs.cuh: unit u of a 32-value block to step pair_unit_step(u), lane
// pair_unit_lane(u)); mxfp4 keeps the natural order. Block-wide; ends with __syncthreads.
template <int T, int NTOK, int THREADS>
__device__ void mma_stage_x(const float *xm, int64_t k, int n_tok, int64_t v0, int pv, uint4 *xfrag, float *sumx,
                            uint32_t *xmax, float *inv_s) {
  static_assert(NTOK <= THREADS);
  constexpr int kPer = mma::x_bytes(NTOK) / 16 / THREADS;  // 4-value units per thread at most (one read of x)
  constexpr mma::XOrder kOrder = MmaQuant<T>::sums    ? mma::XOrder::kquant
                                 : MmaQuant<T>::pairs ? mma::XOrder::pairs
                                                      : mma::XOrder::natural;
  const int units_per_tok = pv / 4;               // a multiple of 64
  const int total = n_tok * units_per_tok;        // <= mma::x_bytes(NTOK) / 16
  if (threadIdx.x < NTOK) xmax[threadIdx.x] = 0;
  float4 f[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) {  // all loads in flight together
    const int u = threadIdx.x + j * THREADS;
    if (u < total) {
      const int tok = u / units_per_tok, q4 = u - tok * units_per_tok;
      f[j] = __ldg(reinterpret_cast<const float4 *>(xm + tok * k + v0) + q4);
    }
  }
  __syncthreads();  // xmax cleared
#pragma unroll
  for (int j = 0; j < kPer; ++j) {  // whole warps: total is a multiple of 64, a warp's 32 units one token
    const int u = threadIdx.x + j * THREADS;
    if (u - static_cast<int>(threadIdx.x & 31) < total) {
      float m = u < total ? fmaxf(fmaxf(fabsf(f[j].x), fabsf(f[j].y)), fmaxf(fabsf(f[j].z), fabsf(f[j].w))) : 0.0f;
      m = warp_reduce(m, MaxOp{});
      if ((threadIdx.x & 31) == 0) atomicMax(&xmax[u / units_per_tok], __float_as_uint(m));
    }
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int u = threadIdx.x + j * THREADS;
    if (u - static_cast<int>(threadIdx.x & 31) >= total) continue;  // whole warps (shuffles below)
    const int tok = u / units_per_tok, q4 = u - tok * units_per_tok;
    const float sc = ldexpf(1.0f, x_exponent(xmax[tok]));
    const float4 x = make_float4(f[j].x * sc, f[j].y * sc, f[j].z * sc, f[j].w * sc);
    uint4 frag;
    split_hi_lo(x.x, x.z, frag.x, frag.z);
    split_hi_lo(x.y, x.w, frag.y, frag.w);
    xfrag[mma::x_slot(kOrder, q4, tok, NTOK)] = frag;
    if constexpr (MmaQuant<T>::sums) {
      const int q = q4 >> 2, r = q4 & 3;  // 16-value group q of the phase, quarter r
      float part = (x.x + x.y) + (x.z + x.w);
      part += __shfl_xor_sync(0xffffffffu, part, 1);
      part += __shfl_xor_sync(0xffffffffu, part, 2);
      if (r == 0) sumx[tok * (pv / 16) + q] = part;
    }
  }
  if (threadIdx.x < NTOK) inv_s[threadIdx.x] = ldexpf(1.0f, -x_exponent(xmax[threadIdx.x]));
  __syncthreads();
}

// The B fragments (hi b0, hi b1, lo b0, lo b1) of one step and token tile j for this lane
// (token 8j + g); zero for lanes whose token is past n_tok.
template <int NTOK>
__device__ __forceinline__ uint4 x_frag(const uint4 *xfrag, int step, int j, int g, int t, int n_tok) {
  if (mma::kTileTokens * j + g >= (NTOK == 1 ? 1 : n_tok)) return make_uint4(0u, 0u, 0u, 0u);
  return xfrag[mma::x_read_slot(step, j, g, t, NTOK)];
}
// Whether token tile j has a token of the launch (warp-uniform: skips the mmas of tiles of padding).
template <int NTOK>
__device__ __forceinline__ bool tile_live(int j, int n_tok) {
  return mma::tiles(NTOK) == 1 || mma::kTileTokens * j < n_tok;
}

// Per-lane constants of the k-quant decoders: lane t owns the scale groups G = t + 4u (u < 4)
// of every super-block, i.e. half h = u / 2, shift j = t / 2 + 2·(u % 2), 16-byte half g16 = t % 2.
struct KquantLane {
  int t, g16;
  uint32_t qmask[4];  // 2-bit field j of each byte, in both halves
  uint32_t hmask[4];  // q3_K: bit 2j + 2 (the high bit, as 4·hbit above the 2-bit field)
  int hshift[4];      // q3_K: right shift of (hmask word << 8) that moves bit 4h + j to 2j + 2
  uint32_t fac[4];    // half2 4^-j: the field is read in place, as 4^j·q
  uint32_t off[4];    // half2 −(1024 + bias)·4^-j: s1 = (1024 + raw scale)·4^-j + off = sc·4^-j
};
// bias: 32 for q3_K's 6-bit scales stored as sc + 32, 0 for q2_K's 4-bit ones.
__device__ __forceinline__ KquantLane kquant_lane(int lane, bool bias) {
  KquantLane k;
  k.t = lane & 3;
  k.g16 = k.t & 1;
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const int h = u >> 1, j = (k.t >> 1) + 2 * (u & 1);
    k.qmask[u] = 0x00030003u << (2 * j);
    k.hmask[u] = 0x00040004u << (2 * j);
    k.hshift[u] = 6 + 4 * h - j;
    const float f = 1.0f / static_cast<float>(1 << (2 * j));
    k.fac[u] = h2_bits(__float2half2_rn(f));
    k.off[u] = h2_bits(__float2half2_rn(-(1024.0f + (bias ? 32.0f : 0.0f)) * f));
  }
  return k;
}

// One q2_K or q3_K super-block (256 values) of rows g and g+8 (block bytes at pa, pb in shared
// memory): acc += d·Σ sc·q·x − dmin·Σ m·Σx (q2_K) or d·Σ sc·(q + 4·hbit)·x − d·Σ 4·sc·Σx (q3_K),
// with the 6-bit or 4-bit scale sc folded into the f16 weights (exact small integers) and the
// offset term as one more mma over the 16 per-group sums of x.
template <int T, int NTOK>
__device__ __forceinline__ void mma_kquant_block(const uint8_t *pa, const uint8_t *pb, const KquantLane &kl,
                                                 const uint4 *xf, const float *sx, int sx_stride, int g, int n_tok,
                                                 const float (&inv)[mma::tiles(NTOK)][2],
                                                 float (&acc)[mma::tiles(NTOK)][4]) {
  constexpr bool q3 = T == kQ3_K;
  constexpr int NT = mma::tiles(NTOK);
  constexpr int qs_off = q3 ? 32 : 16;
  const uint8_t *rows[2] = {pa, pb};
  uint32_t s1[2][4], s2[2][4], am[2][2];
  float d[2], dm[2];
  uint32_t qw[2][2][4], hw[2][4];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const uint8_t *p = rows[r];
    lds_words<4>(p + qs_off + 16 * kl.g16, qw[r][0]);
    lds_words<4>(p + qs_off + 32 + 16 * kl.g16, qw[r][1]);
    uint32_t sc[4];  // raw scale of G = t + 4u (q3_K: sc + 32, 0..63)
    int sm[4];       // offset multiplier of G = 2t, 2t+1, 2t+8, 2t+9
    if constexpr (q3) {
      lds_words<4>(p + 16 * kl.g16, hw[r]);
      uint32_t raw[3], dw[1];
      lds_words<3>(p + 96, raw);
      lds_words<1>(p + 108, dw);
      auto q3sc = [&](int G) {
        const uint32_t low = G < 8 ? byte_at(raw, G) & 0xF : byte_at(raw, G - 8) >> 4;
        const uint32_t high = (byte_at(raw, 8 + (G & 3)) >> (2 * (G >> 2))) & 3;
        return static_cast<int>(low | (high << 4)) - 32;
      };
#pragma unroll
      for (int u = 0; u < 4; ++u) {  // G = t + 4u: low nibble in byte t of word u % 2, high bits in byte 8 + t
        const uint32_t low = (raw[u & 1] >> (8 * kl.t + (u >= 2 ? 4 : 0))) & 0xF;
        const uint32_t high = (raw[2] >> (8 * kl.t + 2 * u)) & 3;
        sc[u] = low | (high << 4);
      }
      sm[0] = 4 * q3sc(2 * kl.t);
      sm[1] = 4 * q3sc(2 * kl.t + 1);
      sm[2] = 4 * q3sc(2 * kl.t + 8);
      sm[3] = 4 * q3sc(2 * kl.t + 9);
      d[r] = __half2float(__ushort_as_half(static_cast<unsigned short>(dw[0] & 0xFFFF)));
      dm[r] = d[r];
    } else {
      uint32_t sw[4], dw[1];
      lds_words<4>(p, sw);
      lds_words<1>(p + 80, dw);
#pragma unroll
      for (int u = 0; u < 4; ++u) sc[u] = (sw[u] >> (8 * kl.t)) & 0xF;  // G = t + 4u
      sm[0] = static_cast<int>(byte_at(sw, 2 * kl.t) >> 4);
      sm[1] = static_cast<int>(byte_at(sw, 2 * kl.t + 1) >> 4);
      sm[2] = static_cast<int>(byte_at(sw, 2 * kl.t + 8) >> 4);
      sm[3] = static_cast<int>(byte_at(sw, 2 * kl.t + 9) >> 4);
      d[r] = __half2float(__ushort_as_half(static_cast<unsigned short>(dw[0] & 0xFFFF)));
      dm[r] = __half2float(__ushort_as_half(static_cast<unsigned short>(dw[0] >> 16)));
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      // weight = h·s1 + s2 with h = 1024 + 4^j·v (v the 2- or 3-bit field): exactly sc·v, where
      // s1 = sc·4^-j (from f16 1024 + raw scale) and s2 = −1024·s1, all exact in f16
      const __half2 s = __hfma2(bits_h2(kHalfMagic | (sc[u] * 0x00010001u)), bits_h2(kl.fac[u]), bits_h2(kl.off[u]));
      s1[r][u] = h2_bits(s);
      s2[r][u] = h2_bits(__hmul2(s, __float2half2_rn(-1024.0f)));
    }
    // offset multipliers ×32 (exact): the group sums of x go in as Σx/32, which keeps them
    // inside the f16 range (16 values of up to 2^15 each)
    am[r][0] = h2_bits(__floats2half2_rn(32.0f * static_cast<float>(sm[0]), 32.0f * static_cast<float>(sm[1])));
    am[r][1] = h2_bits(__floats2half2_rn(32.0f * static_cast<float>(sm[2]), 32.0f * static_cast<float>(sm[3])));
  }
  float c1[NT][4] = {}, c1lo[NT][4] = {};  // per tile two mma chains, not one
#pragma unroll
  for (int u = 0; u < 4; ++u) {
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      uint32_t a[4];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const uint32_t w = qw[r][u >> 1][v];
        uint32_t p02 = (w & kl.qmask[u]) | kHalfMagic, p13 = ((w >> 8) & kl.qmask[u]) | kHalfMagic;
        if constexpr (q3) {
          p02 |= ((hw[r][v] << 8) >> kl.hshift[u]) & kl.hmask[u];
          p13 |= ((hw[r][v] & 0xFFFFFF00u) >> kl.hshift[u]) & kl.hmask[u];
        }
        a[r] = h2_bits(__hfma2(bits_h2(p02), bits_h2(s1[r][u]), bits_h2(s2[r][u])));
        a[2 + r] = h2_bits(__hfma2(bits_h2(p13), bits_h2(s1[r][u]), bits_h2(s2[r][u])));
      }
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        if (!tile_live<NTOK>(j, n_tok)) continue;
        const uint4 b = x_frag<NTOK>(xf, 4 * u + v, j, g, kl.t, n_tok);
        mma16816(c1[j], a, b.x, b.y);
        mma16816(c1lo[j], a, b.z, b.w);
      }
    }
  }
  // offset term: k = scale group G, A = m_G (q2_K) or 4·sc_G (q3_K), B = Σx of the group
  float c2[NT][4] = {};
  const uint32_t am4[4] = {am[0][0], am[1][0], am[0][1], am[1][1]};
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    if (!tile_live<NTOK>(j, n_tok)) continue;
    uint32_t bh0 = 0, bh1 = 0, bl0 = 0, bl1 = 0;
    const int tok = mma::kTileTokens * j + g;
    if (tok < (NTOK == 1 ? 1 : n_tok)) {
      const float *s = sx + tok * sx_stride + 2 * kl.t;
      constexpr float k1_32 = 1.0f / 32.0f;
      split_hi_lo(s[0] * k1_32, s[1] * k1_32, bh0, bl0);
      split_hi_lo(s[8] * k1_32, s[9] * k1_32, bh1, bl1);
    }
    mma16816(c2[j], am4, bh0, bh1);
    mma16816(c2[j], am4, bl0, bl1);
  }
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i)
      acc[j][i] = fmaf(fmaf(d[i >> 1], c1[j][i] + c1lo[j][i], -dm[i >> 1] * c2[j][i]), inv[j][i & 1], acc[j][i]);
}

// One mxfp4 chunk (8 blocks of 32) of rows g and g+8. e2m1 nibbles become f16 by moving their
// bits: s·eem → sign bit 15 and exponent/mantissa bits 11..9, which is the value ·2^-15 (the
// smallest, 1, as an f16 subnormal); the block scale and 2^15 are applied to the f32 result.
__device__ __forceinline__ uint32_t e2m1_pair(uint32_t w, int eem_shift_left, int sign_shift_left) {
  const uint32_t e = eem_shift_left >= 0 ? w << eem_shift_left : w >> -eem_shift_left;
  const uint32_t s = w << sign_shift_left;
  return (e & 0x0E000E00u) | (s & 0x80008000u);
}
template <int NTOK>
__device__ __forceinline__ void mma_mxfp4_chunk(const uint8_t *pa, const uint8_t *pb, const uint4 *xf, int g, int t,
    int n_tok, const float (&inv)[mma::tiles(NTOK)][2], float (&acc)[mma::tiles(NTOK)][4]) {
  constexpr int NT = mma::tiles(NTOK);
  const uint8_t *rows[2] = {pa, pb};
#pragma unroll
  for (int b = 0; b < 8; ++b) {
    uint32_t a0[4], a1[4];
    float d[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const uint8_t *p = rows[r] + 17 * b;
      uint32_t w[1];
      lds_words<1>(p + 1 + 4 * t, w);
      d[r] = e8m0_half(p[0]) * 32768.0f;
      a0[r] = e2m1_pair(w[0], 9, 12);       // low nibbles of bytes 0, 2: values 4t, 4t+2
      a0[2 + r] = e2m1_pair(w[0], 1, 4);    // low nibbles of bytes 1, 3: values 4t+1, 4t+3
      a1[r] = e2m1_pair(w[0], 5, 8);        // high nibbles: values 16 + ...
      a1[2 + r] = e2m1_pair(w[0], -3, 0);
    }
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      if (!tile_live<NTOK>(j, n_tok)) continue;
      const uint4 x0 = x_frag<NTOK>(xf, 2 * b, j, g, t, n_tok), x1 = x_frag<NTOK>(xf, 2 * b + 1, j, g, t, n_tok);
      float c[4] = {0.0f, 0.0f, 0.0f, 0.0f}, clo[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      mma16816(c, a0, x0.x, x0.y);
      mma16816(clo, a0, x0.z, x0.w);
      mma16816(c, a1, x1.x, x1.y);
      mma16816(clo, a1, x1.z, x1.w);
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[j][i] = fmaf(c[i] + clo[i], d[i >> 1] * inv[j][i & 1], acc[j][i]);
    }
  }
}

// One q8_0 chunk (8 blocks of 32) of rows g and g+8, in the pairs order: lane t's bytes 8t..8t+7
// of a block become its A registers (mma::q8_0_lane: exact f16 integers); each block's two steps
// accumulate apart (hi and lo chains), and its scale d multiplies their sum in f32.
template <int NTOK>
__device__ __forceinline__ void mma_q8_0_chunk(const uint8_t *pa, const uint8_t *pb, const uint4 *xf, int g, int t,
    int n_tok, const float (&inv)[mma::tiles(NTOK)][2], float (&acc)[mma::tiles(NTOK)][4]) {
  constexpr int NT = mma::tiles(NTOK);
  const uint8_t *rows[2] = {pa, pb};
#pragma unroll
  for (int b = 0; b < 8; ++b) {
    uint32_t a0[4], a1[4];
    float d[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const uint8_t *p = rows[r] + 34 * b;
      uint32_t w[2], dw[1], f[4];
      lds_words<2>(p + 2 + 8 * t, w);
      lds_words<1>(p, dw);
      d[r] = __half2float(__ushort_as_half(static_cast<unsigned short>(dw[0] & 0xFFFF)));
      mma::q8_0_lane(w, f);
      a0[r] = f[0];      // (v0, v2) of values 8t..8t+3: k 2t, 2t+1 of the block's first step
      a0[2 + r] = f[1];  // (v1, v3): k 2t+8, 2t+9
      a1[r] = f[2];      // the same of 8t+4..8t+7, second step
      a1[2 + r] = f[3];
    }
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      if (!tile_live<NTOK>(j, n_tok)) continue;
      const uint4 x0 = x_frag<NTOK>(xf, 2 * b, j, g, t, n_tok), x1 = x_frag<NTOK>(xf, 2 * b + 1, j, g, t, n_tok);
      float c[4] = {0.0f, 0.0f, 0.0f, 0.0f}, clo[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      mma16816(c, a0, x0.x, x0.y);
      mma16816(clo, a0, x0.z, x0.w);
      mma16816(c, a1, x1.x, x1.y);
      mma16816(clo, a1, x1.z, x1.w);
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[j][i] = fmaf(c[i] + clo[i], d[i >> 1] * inv[j][i & 1], acc[j][i]);
    }
  }
}

// One iq2_xxs block (256 values: 8 sub-blocks of 8 bytes after the f16 d) of rows g and g+8, in
// the pairs order: lane t takes grid entry t of each sub-block (its index byte t, its sign bits
// 7t..7t+6) as the integers (2s + 1)·grid·sign (mma::iq2xxs_lane: exact in f16), the whole block
// accumulates in f32 (hi and lo chains) and d/8 multiplies the sum.
//
// The grid is read from a copy in shared memory (`table`, filled by each block from the constant
// table): a lane reads one 16-byte entry (the 8 magnitudes as f16) per sub-block and row with
// one 128-bit load. A __constant__ table serializes a warp's reads of different entries (up to
// 32 per load here: the lanes' indices are the data's). In shared memory a 128-bit load is served
// a quarter-warp (8 lanes, 4 of each of 2 rows) per pass, one pass when its entries sit in 8
// different 4-bank groups (entry e: group e % 8); the indices are random, so about 2.2 passes on
// average instead of 1 (a copy of the table per bank group, 32 KB per block, would remove the
// conflicts at the price of residency). Entries of the raw grid bytes (8 bytes, 2 KB) conflict
// less (16 lanes per pass over 16 two-bank pairs) but cost four more integer operations and a
// second scale register per sub-block to make f16 of them; the f16 entries were chosen.
template <int NTOK>
__device__ __forceinline__ void mma_iq2xxs_block(const uint8_t *pa, const uint8_t *pb, const mma::GridF16 *table,
                                                 const uint4 *xf, int g, int t, int n_tok,
                                                 const float (&inv)[mma::tiles(NTOK)][2],
                                                 float (&acc)[mma::tiles(NTOK)][4]) {
  constexpr int NT = mma::tiles(NTOK);
  const uint8_t *rows[2] = {pa, pb};
  uint32_t q[2][16];  // per row: sub-block s's grid indices in word 2s, its signs and scale in 2s + 1
  float d8[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    uint32_t dw[1];
    lds_words<16>(rows[r] + 2, q[r]);
    lds_words<1>(rows[r], dw);
    d8[r] = __half2float(__ushort_as_half(static_cast<unsigned short>(dw[0] & 0xFFFF))) * 0.125f;  // exact
  }
  float c[NT][4] = {}, clo[NT][4] = {};
#pragma unroll
  for (int sb = 0; sb < 8; ++sb) {
    uint32_t a0[4], a1[4];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      uint32_t f[4];
      mma::iq2xxs_lane(q[r][2 * sb], q[r][2 * sb + 1], t, table, f);
      a0[r] = f[0];
      a0[2 + r] = f[1];
      a1[r] = f[2];
      a1[2 + r] = f[3];
    }
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      if (!tile_live<NTOK>(j, n_tok)) continue;
      const uint4 x0 = x_frag<NTOK>(xf, 2 * sb, j, g, t, n_tok), x1 = x_frag<NTOK>(xf, 2 * sb + 1, j, g, t, n_tok);
      mma16816(c[j], a0, x0.x, x0.y);
      mma16816(clo[j], a0, x0.z, x0.w);
      mma16816(c[j], a1, x1.x, x1.y);
      mma16816(clo[j], a1, x1.z, x1.w);
    }
  }
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[j][i] = fmaf(c[j][i] + clo[j][i], d8[i >> 1] * inv[j][i & 1], acc[j][i]);
}

// WARPS warps per block; KSPLIT of them share 16 rows and take every KSPLIT-th chunk of k (their
// sums meet in shared memory at the end), so a block covers 16·WARPS/KSPLIT rows.
template <int T, int NTOK, int WARPS, int STAGES, int KSPLIT>
__global__ void __launch_bounds__(WARPS * 32) gemv_mma_kernel(GemvArgs a) {
  static_assert(WARPS % KSPLIT == 0 && STAGES >= 2);
  constexpr int kCB = MmaQuant<T>::chunk_bytes, kG = mma_granules<T>(), kSlot = mma_slot<T>();
  constexpr int kPV = mma_phase_values<NTOK>(), kXBytes = mma::x_bytes(NTOK), NT = mma::tiles(NTOK);
  static_assert(WARPS * NT * 32 * 16 <= kXBytes, "the KSPLIT partial sums fit x's staging");
  extern __shared__ __align__(16) uint8_t smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int kpart = warp % KSPLIT;
  uint8_t *ring = smem + warp * STAGES * 16 * kSlot;
  uint8_t *after_ring = smem + WARPS * STAGES * 16 * kSlot;
  uint4 *xfrag = reinterpret_cast<uint4 *>(after_ring);
  [[maybe_unused]] auto *table = reinterpret_cast<mma::GridF16 *>(after_ring + kXBytes);
  float *sumx = reinterpret_cast<float *>(after_ring + kXBytes + MmaQuant<T>::table_bytes);
  uint32_t *xmax = reinterpret_cast<uint32_t *>(sumx + NTOK * (kPV / 16));
  float *inv_s = reinterpret_cast<float *>(xmax + NTOK);

  const int m = blockIdx.y;
  const int n_tok = NTOK == 1 ? 1 : a.n_tok;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * (WARPS / KSPLIT) + warp / KSPLIT) * 16;
  const uint8_t *w = static_cast<const uint8_t *>(a.w_ptrs ? a.w_ptrs[m] : a.w);
  const int64_t row_bytes = a.k / kMmaChunk * kCB;
  const uintptr_t w_end = reinterpret_cast<uintptr_t>(w) + static_cast<uintptr_t>(a.n * row_bytes);
  const float *xm = a.x + static_cast<int64_t>(a.x_rows ? a.x_rows[m] : m) * a.k;
  const int nchunks = static_cast<int>(a.k / kMmaChunk);
  const int nlocal = nchunks > kpart ? (nchunks - kpart + KSPLIT - 1) / KSPLIT : 0;  // this warp's chunks

  // Copies this warp's local chunk i (chunk kpart + i·KSPLIT of its 16 rows) into ring stage
  // i % STAGES: lane-fixed (row, granule) pairs, a row's granules from the 16-byte boundary at or
  // before its chunk (warps whose rows are all past n copy nothing but still take part in the
  // block's barriers).
  constexpr int kIters = (16 * kG + 31) / 32;
  const uint8_t *rsrc[kIters];
  int rdst[kIters], rgi[kIters];
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int i = lane + 32 * it, r = i / kG;
    rgi[it] = i - r * kG;
    rdst[it] = r * kSlot + 16 * rgi[it];
    rsrc[it] = i < 16 * kG && row0 + r < a.n ? w + (row0 + r) * row_bytes : nullptr;
  }
  auto issue = [&](int i) {
    if (i >= nlocal) return;
    uint8_t *dst = ring + (i % STAGES) * 16 * kSlot;
    const int64_t at = static_cast<int64_t>(kpart + i * KSPLIT) * kCB;
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      if (rsrc[it] == nullptr) continue;
      const RowSpan sp = row_span(rsrc[it] + at, kCB, true);
      if (rgi[it] < sp.n16) copy16_async(dst + rdst[it], sp.start + rgi[it], w_end);
    }
  };
  auto row_in_stage = [&](int i, int r) {
    const int64_t at = static_cast<int64_t>(kpart + i * KSPLIT) * kCB;
    const uintptr_t src = reinterpret_cast<uintptr_t>(w + (row0 + r) * row_bytes + at);
    return ring + ((i % STAGES) * 16 + r) * kSlot + static_cast<int>(src & 15);
  };

#pragma unroll
  for (int i = 0; i < STAGES - 1; ++i) {
    issue(i);
    cp_async_commit();
  }
  if constexpr (T == kIQ2_XXS) {  // read after the first phase's barriers (mma_stage_x)
    for (int e = static_cast<int>(threadIdx.x); e < 256; e += WARPS * 32) table[e] = mma::iq2xxs_table_entry(kIq2xxsGridDev[e]);
  }
  float acc[NT][4] = {};
  [[maybe_unused]] const KquantLane kl = kquant_lane(lane, T == kQ3_K);
  int i = 0;
  for (int64_t v0 = 0; v0 < a.k; v0 += kPV) {  // phases of x, block-wide
    const int pv = static_cast<int>(a.k - v0 < kPV ? a.k - v0 : kPV);
    __syncthreads();  // every warp is done with the previous phase
    mma_stage_x<T, NTOK, WARPS * 32>(xm, a.k, n_tok, v0, pv, xfrag, sumx, xmax, inv_s);
    float inv[NT][2];
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int tok = mma::c_token(j, t, e);
        inv[j][e] = tok < n_tok ? inv_s[tok] : 0.0f;
      }
    const int c_end = static_cast<int>((v0 + pv) / kMmaChunk);
    for (; i < nlocal && kpart + i * KSPLIT < c_end; ++i) {
      cp_async_wait<STAGES - 2>();
      __syncwarp();
      const int sb = kpart + i * KSPLIT - static_cast<int>(v0 / kMmaChunk);  // chunk within the phase
      const uint8_t *pa = row_in_stage(i, g), *pb = row_in_stage(i, g + 8);
      if constexpr (T == kMXFP4) {
        mma_mxfp4_chunk<NTOK>(pa, pb, xfrag + sb * 16 * NTOK * 4, g, t, n_tok, inv, acc);
      } else if constexpr (T == kQ8_0) {
        mma_q8_0_chunk<NTOK>(pa, pb, xfrag + sb * 16 * NTOK * 4, g, t, n_tok, inv, acc);
      } else if constexpr (T == kIQ2_XXS) {
        mma_iq2xxs_block<NTOK>(pa, pb, table, xfrag + sb * 16 * NTOK * 4, g, t, n_tok, inv, acc);
      } else {
        mma_kquant_block<T, NTOK>(pa, pb, kl, xfrag + sb * 16 * NTOK * 4, sumx + sb * 16, pv / 16, g, n_tok, inv, acc);
      }
      __syncwarp();
      issue(i + STAGES - 1);
      cp_async_commit();
    }
  }
  if constexpr (KSPLIT > 1) {  // the KSPLIT partial sums of each row tile meet in shared memory
    float4 *part = reinterpret_cast<float4 *>(xfrag);
    __syncthreads();
#pragma unroll
    for (int j = 0; j < NT; ++j) part[(warp * NT + j) * 32 + lane] = make_float4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]);
    __syncthreads();
    if (kpart != 0) return;
#pragma unroll
    for (int q = 1; q < KSPLIT; ++q) {
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const float4 o = part[((warp + q) * NT + j) * 32 + lane];
        acc[j][0] += o.x; acc[j][1] += o.y; acc[j][2] += o.z; acc[j][3] += o.w;
      }
    }
  }
  float *y = a.y + static_cast<int64_t>(m) * a.n * n_tok;
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t row = row0 + g + 8 * (e >> 1);
      const int tok = mma::c_token(j, t, e);
      if (row < a.n && tok < n_tok) y[static_cast<int64_t>(tok) * a.n + row] = acc[j][e];
    }
}

template <int T, int NTOK, int WARPS, int STAGES, int KSPLIT>
void launch_mma(const GemvArgs &args, cudaStream_t stream) {
  constexpr int smem = mma_smem_bytes<T, NTOK, WARPS, STAGES>();
  auto *kernel = gemv_mma_kernel<T, NTOK, WARPS, STAGES, KSPLIT>;
  EP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  constexpr int rows = 16 * WARPS / KSPLIT;
  const dim3 grid(static_cast<unsigned>((args.n + rows - 1) / rows), static_cast<unsigned>(args.n_mat));
  kernel<<<grid, WARPS * 32, smem, stream>>>(args);
  EP_CUDA_CHECK_LAUNCH("gemv_mma_kernel");
}

template <int T, int WARPS, int STAGES, int KSPLIT>
void launch_mma_tokens(const GemvArgs &args, cudaStream_t stream) {
  static_assert(mma::kMaxTokens == kGemvMaxWideTokens && mma::tokens_rounded(kGemvMaxTokens) == kGemvMaxTokens);
  switch (mma::tokens_rounded(args.n_tok)) {
    case 1: return launch_mma<T, 1, WARPS, STAGES, KSPLIT>(args, stream);
    case 2: return launch_mma<T, 2, WARPS, STAGES, KSPLIT>(args, stream);
    case 4: return launch_mma<T, 4, WARPS, STAGES, KSPLIT>(args, stream);
    case 8: return launch_mma<T, 8, WARPS, STAGES, KSPLIT>(args, stream);
    case 16: return launch_mma<T, 16, WARPS, STAGES, KSPLIT>(args, stream);
    default: return launch_mma<T, 32, WARPS, STAGES, KSPLIT>(args, stream);
  }
}

}  // namespace

bool gemv_mma_covers(uint32_t type, int64_t k) {
  return format::ggml_gemv_family(type, format::kGemvMma) && k % kMmaChunk == 0;
}

void launch_gemv_mma(uint32_t type, const GemvArgs &args, cudaStream_t stream) {
  dispatch_gemv_family<format::kGemvMma>(type, "launch_gemv_mma", [&](auto tag) {
    constexpr int T = decltype(tag)::value;
    if (args.n < kMmaSplitBelowRows) return launch_mma_tokens<T, kMmaWarps, MmaQuant<T>::stages, kMmaWarps>(args, stream);
    launch_mma_tokens<T, kMmaWarps, MmaQuant<T>::stages, 1>(args, stream);
  });
}

}  // namespace ep::backend::cuda
