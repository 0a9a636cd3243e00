// Decode GEMV (and small-batch GEMM, up to kGemvMaxTokens tokens) on quantized weights, batched
// over many matrices per launch (the experts of a MoE layer). Five kernels:
//  - dp4a (mxfp4, q2_K, q3_K; one token; k a multiple of 256). x quantized per
//    block into int8 hi + lo parts per 32 values (128 for q2_K, q3_K), packed weights masked in place (2-bit fields) or
//    mapped through a byte-permute table (e2m1) and multiplied with dp4a; persistent blocks, a
//    warp reuses each piece of x for 1-4 rows. Details at its section below.
//  - stream (same types and shapes; the decode default since session 5, faster than dp4a in 10 of
//    12 type x shape cells): dp4a's x quantization and item layout, the weights streamed
//    through a per-warp ring in shared memory (one bulk copy per chunk on sm_90, cp.async before),
//    scales folded into the integer dots (q2_K: a row's whole item in integers, mins included)
//    and the q3_K high bit merged into the 2-bit field; programmatic dependent launch.
//  - mma (mxfp4, q2_K, q3_K; k a multiple of 256; used for 2..8 tokens): tensor cores. Each warp
//    owns 16 rows and streams them through a cp.async ring, 256 values per stage; the block
//    stages x once per phase as f16 hi + lo halves (x·2^e per token, so that hi + lo carry ~22 bits and never overflow);
//    weights decode with bit tricks straight into f16 mma fragments (block scales folded in where
//    they are small integers) and mma.sync m16n8k16 accumulates in f32. The 8 mma columns are the
//    tokens: one mma serves 1..8 tokens (more tokens only shorten the x phases).
//  - generic (every type): per-lane decode of 32-value units, x read through the read-only cache.
//  - pipe (every type): as generic with a cp.async double buffer and table-driven decoders.
// launch_gemv picks per type (pick_gemv_kernel); GemvArgs::kernel or EP_GEMV_KERNEL overrides.
// Numbers: docs/benchmarks.md, "Kernels".
#include "gpu/check.hpp"
#include "backend/cuda/dispatch.cuh"
#include "backend/cuda/gemv_imma.cuh"
#include "backend/cuda/gemv_stream.cuh"
#include "backend/cuda/kernels.hpp"
#include "backend/cuda/reduce.cuh"

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace ep::backend::cuda {
namespace {

using namespace quant;

constexpr int kWarps = 4;           // warps per block
constexpr int kRows = 2;            // rows per warp
constexpr int kChunkBytes = 2048;   // bytes of one row staged at a time (whole blocks)
constexpr int kStageBytes = kChunkBytes + 256;  // + alignment slack and one partial block
constexpr int kLoadsPerLane = (kStageBytes / 16 + 31) / 32;

// The 16-byte granules that hold `bytes` bytes at src: a row's staged bytes start at the
// 16-byte boundary at or before src, so the data sits at offset `off` of its shared-memory copy.
struct RowSpan {
  const uint4 *start = nullptr;
  uintptr_t end = 0;  // one past the last byte of the span
  int off = 0;
  int n16 = 0;        // granules to copy (0 for a row past the matrix)
};
__device__ __forceinline__ RowSpan row_span(const uint8_t *src, int64_t bytes, bool valid) {
  RowSpan s;
  const uintptr_t at = reinterpret_cast<uintptr_t>(src);
  const uintptr_t start = at & ~uintptr_t(15);
  s.start = reinterpret_cast<const uint4 *>(start);
  s.end = at + static_cast<uintptr_t>(bytes);
  s.off = static_cast<int>(at - start);
  s.n16 = valid ? static_cast<int>((s.end - start + 15) / 16) : 0;
  return s;
}

template <int T, int NTOK>
__global__ void __launch_bounds__(kWarps * 32) gemv_generic_kernel(GemvArgs a) {
  using Tr = Traits<T>;
  constexpr int kUnits = Tr::elems / 32;
  constexpr int kBlocksPerChunk = kChunkBytes / Tr::bytes > 0 ? kChunkBytes / Tr::bytes : 1;
  __shared__ __align__(16) uint8_t stage[kWarps][kRows][kStageBytes];

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int m = blockIdx.y;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * kRows;
  if (row0 >= a.n) return;
  const int n_tok = NTOK == 1 ? 1 : a.n_tok;
  const uint8_t *w = static_cast<const uint8_t *>(a.w_ptrs ? a.w_ptrs[m] : a.w);
  const int64_t nblocks = a.k / Tr::elems;
  const int64_t row_bytes = nblocks * Tr::bytes;
  const float *x = a.x + static_cast<int64_t>(a.x_rows ? a.x_rows[m] : m) * a.k;
  float *y = a.y + static_cast<int64_t>(m) * a.n * n_tok;

  float acc[kRows][NTOK];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int t = 0; t < NTOK; ++t) acc[r][t] = 0.0f;

  for (int64_t b0 = 0; b0 < nblocks; b0 += kBlocksPerChunk) {
    const int nb = static_cast<int>(nblocks - b0 < kBlocksPerChunk ? nblocks - b0 : kBlocksPerChunk);
    RowSpan span[kRows];
    int offs[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      span[r] = row_span(w + (row0 + r) * row_bytes + b0 * Tr::bytes, static_cast<int64_t>(nb) * Tr::bytes, row0 + r < a.n);
      offs[r] = span[r].off;
    }
    uint4 buf[kRows][kLoadsPerLane];
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int i = 0; i < kLoadsPerLane; ++i) {
        const int idx = lane + 32 * i;
        if (idx < span[r].n16) buf[r][i] = load16_bounded(span[r].start + idx, span[r].end);
      }
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int i = 0; i < kLoadsPerLane; ++i) {
        const int idx = lane + 32 * i;
        if (idx < span[r].n16) reinterpret_cast<uint4 *>(stage[warp][r])[idx] = buf[r][i];
      }
    __syncwarp();
    const int units = nb * kUnits;
    for (int u = lane; u < units; u += 32) {
      const int blk = u / kUnits, sub = u % kUnits;
      const int64_t col = (b0 + blk) * Tr::elems + 32 * sub;
      if constexpr (NTOK == 1) {
        float xv[32];
        const float4 *xp = reinterpret_cast<const float4 *>(x + col);
#pragma unroll
        for (int q = 0; q < 8; ++q) {
          const float4 f = __ldg(xp + q);
          xv[4 * q] = f.x; xv[4 * q + 1] = f.y; xv[4 * q + 2] = f.z; xv[4 * q + 3] = f.w;
        }
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          float v[32];
          unit_values<T>(stage[warp][r] + offs[r] + blk * Tr::bytes, sub, v);
          float s = 0.0f;
#pragma unroll
          for (int l = 0; l < 32; ++l) s = fmaf(v[l], xv[l], s);
          acc[r][0] += s;
        }
      } else {
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          float v[32];
          unit_values<T>(stage[warp][r] + offs[r] + blk * Tr::bytes, sub, v);
#pragma unroll
          for (int t = 0; t < NTOK; ++t) {
            if (t < n_tok) {
              const float4 *xp = reinterpret_cast<const float4 *>(x + t * a.k + col);
              float s = 0.0f;
#pragma unroll
              for (int q = 0; q < 8; ++q) {
                const float4 f = __ldg(xp + q);
                s = fmaf(v[4 * q], f.x, s);
                s = fmaf(v[4 * q + 1], f.y, s);
                s = fmaf(v[4 * q + 2], f.z, s);
                s = fmaf(v[4 * q + 3], f.w, s);
              }
              acc[r][t] += s;
            }
          }
        }
      }
    }
    __syncwarp();
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int t = 0; t < NTOK; ++t) {
      float s = acc[r][t];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      if (lane == 0 && row0 + r < a.n && t < n_tok) y[t * a.n + row0 + r] = s;
    }
}


// ---- the pipelined kernel ----------------------------------------------------------------
// Same work split as above, but the row chunks are copied with cp.async into a per-warp double
// buffer (the next chunk is in flight while the current one is decoded), and MXFP4, Q2_K and
// Q3_K use table-driven decoders (a 256-entry table turns one quant byte into 2 or 4 floats)
// with the block scales factored out of the inner sums.
constexpr int kChunk2 = 1024;        // bytes of one row chunk (whole blocks)
constexpr int kStage2 = 1024 + 48;   // + alignment slack + 4 bytes read past the end by lds_u32

// 4 bytes at any shared-memory address (reads the aligned word after it too).
__device__ __forceinline__ uint32_t lds_u32(const uint8_t *p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const uint32_t *q = reinterpret_cast<const uint32_t *>(a & ~uintptr_t(3));
  return __funnelshift_r(q[0], q[1], static_cast<uint32_t>(a & 3) * 8);
}

struct NoLut {};
struct LutMx {
  float2 v[256];  // byte → (value of the low nibble, value of the high nibble), kvalues_mxfp4
};
struct LutQ {
  float4 q2[256];  // byte → its four 2-bit fields as floats (bits 0-1, 2-3, 4-5, 6-7)
  float4 h3[16];   // q3_K: 4 hmask bits → 4·bit − 4 for each
};
// items: work items per block; min_blocks: resident blocks per SM asked of the register allocator.
template <int T> struct LutOf { using type = NoLut; static constexpr int items = Traits<T>::elems / 32, min_blocks = 4; };
template <> struct LutOf<kMXFP4> { using type = LutMx; static constexpr int items = 1, min_blocks = 6; };
template <> struct LutOf<kQ2_K> { using type = LutQ; static constexpr int items = 16, min_blocks = 6; };
template <> struct LutOf<kQ3_K> { using type = LutQ; static constexpr int items = 16, min_blocks = 6; };

__device__ __forceinline__ void init_lut(NoLut &) {}
__device__ __forceinline__ void init_lut(LutMx &l) {
  constexpr float kv[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
  for (int i = threadIdx.x; i < 256; i += blockDim.x) l.v[i] = make_float2(kv[i & 15], kv[i >> 4]);
}
__device__ __forceinline__ void init_lut(LutQ &l) {
  for (int i = threadIdx.x; i < 256; i += blockDim.x)
    l.q2[i] = make_float4(static_cast<float>(i & 3), static_cast<float>((i >> 2) & 3), static_cast<float>((i >> 4) & 3),
                          static_cast<float>(i >> 6));
  for (int i = threadIdx.x; i < 16; i += blockDim.x)
    l.h3[i] = make_float4(4.0f * (i & 1) - 4, 4.0f * ((i >> 1) & 1) - 4, 4.0f * ((i >> 2) & 1) - 4, 4.0f * (i >> 3) - 4);
}

__device__ __forceinline__ void load_x32(const float *x, float xv[32]) {
  const float4 *xp = reinterpret_cast<const float4 *>(x);
#pragma unroll
  for (int q = 0; q < 8; ++q) {
    const float4 f = __ldg(xp + q);
    xv[4 * q] = f.x; xv[4 * q + 1] = f.y; xv[4 * q + 2] = f.z; xv[4 * q + 3] = f.w;
  }
}

// One work item (`item` of the block) for every staged row: acc[r] += Σ w·x. x points at the
// block's first value for this token.
template <int T, int R>
__device__ __forceinline__ void item_dot(const typename LutOf<T>::type &, const uint8_t *const bp[R], int item,
                                         const float *x, float acc[R]) {
  float xv[32];
  load_x32(x + 32 * item, xv);
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float v[32];
    unit_values<T>(bp[r], item, v);
    float s = 0.0f;
#pragma unroll
    for (int l = 0; l < 32; ++l) s = fmaf(v[l], xv[l], s);
    acc[r] += s;
  }
}

template <>
__device__ __forceinline__ void item_dot<kMXFP4, kRows>(const LutMx &lut, const uint8_t *const bp[kRows], int,
                                                        const float *x, float acc[kRows]) {
  float xv[32];
  load_x32(x, xv);
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const uint8_t *b = bp[r];
    float s = 0.0f;
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const uint32_t word = lds_u32(b + 1 + 4 * w);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 v = lut.v[(word >> (8 * i)) & 0xFF];
        s = fmaf(v.x, xv[4 * w + i], s);
        s = fmaf(v.y, xv[16 + 4 * w + i], s);
      }
    }
    acc[r] = fmaf(s, e8m0_half(b[0]), acc[r]);
  }
}

// q2_K / q3_K item: half h = item / 8, bytes l = 4·(item % 8) .. +3 of that half, all four
// 2-bit fields (j = 0..3: values 128h + 32j + l).
__device__ __forceinline__ void load_x16(const float *x, int item, float xv[4][4]) {
  const int h = item >> 3, l0 = 4 * (item & 7);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float4 f = __ldg(reinterpret_cast<const float4 *>(x + 128 * h + 32 * j + l0));
    xv[j][0] = f.x; xv[j][1] = f.y; xv[j][2] = f.z; xv[j][3] = f.w;
  }
}

template <>
__device__ __forceinline__ void item_dot<kQ2_K, kRows>(const LutQ &lut, const uint8_t *const bp[kRows], int item,
                                                       const float *x, float acc[kRows]) {
  float xv[4][4], sx[4];
  load_x16(x, item, xv);
#pragma unroll
  for (int j = 0; j < 4; ++j) sx[j] = (xv[j][0] + xv[j][1]) + (xv[j][2] + xv[j][3]);
  const int h = item >> 3, l0 = 4 * (item & 7), g = (item & 7) >> 2;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const uint8_t *b = bp[r];
    const uint32_t word = lds_u32(b + 16 + 32 * h + l0);
    float sq[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float4 q = lut.q2[(word >> (8 * i)) & 0xFF];
      sq[0] = fmaf(q.x, xv[0][i], sq[0]);
      sq[1] = fmaf(q.y, xv[1][i], sq[1]);
      sq[2] = fmaf(q.z, xv[2][i], sq[2]);
      sq[3] = fmaf(q.w, xv[3][i], sq[3]);
    }
    const float d = half_at(b + 80), dmin = half_at(b + 82);
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int sc = b[8 * h + 2 * j + g];
      s = fmaf(d * static_cast<float>(sc & 0xF), sq[j], s);
      s = fmaf(-dmin * static_cast<float>(sc >> 4), sx[j], s);
    }
    acc[r] += s;
  }
}

template <>
__device__ __forceinline__ void item_dot<kQ3_K, kRows>(const LutQ &lut, const uint8_t *const bp[kRows], int item,
                                                       const float *x, float acc[kRows]) {
  float xv[4][4];
  load_x16(x, item, xv);
  const int h = item >> 3, l0 = 4 * (item & 7), g = (item & 7) >> 2;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const uint8_t *b = bp[r];
    const uint32_t word = lds_u32(b + 32 + 32 * h + l0);
    const uint32_t hword = lds_u32(b + l0) >> (4 * h);  // bits 4h..4h+3 of each hmask byte
    float sq[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float4 q = lut.q2[(word >> (8 * i)) & 0xFF];
      const float4 hv = lut.h3[(hword >> (8 * i)) & 0xF];
      sq[0] = fmaf(q.x + hv.x, xv[0][i], sq[0]);
      sq[1] = fmaf(q.y + hv.y, xv[1][i], sq[1]);
      sq[2] = fmaf(q.z + hv.z, xv[2][i], sq[2]);
      sq[3] = fmaf(q.w + hv.w, xv[3][i], sq[3]);
    }
    const float d = half_at(b + 108);
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) s = fmaf(d * static_cast<float>(q3_scale(b + 96, 8 * h + 2 * j + g) - 32), sq[j], s);
    acc[r] += s;
  }
}

template <int T, int NTOK>
__global__ void __launch_bounds__(kWarps * 32, LutOf<T>::min_blocks) gemv_pipe_kernel(GemvArgs a) {
  using Tr = Traits<T>;
  constexpr int kItems = LutOf<T>::items;
  constexpr int kBlocksPerChunk = kChunk2 / Tr::bytes > 0 ? kChunk2 / Tr::bytes : 1;
  __shared__ __align__(16) uint8_t stage[kWarps][2][kRows][kStage2];
  __shared__ typename LutOf<T>::type lut;
  init_lut(lut);
  __syncthreads();

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int m = blockIdx.y;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * kRows;
  if (row0 >= a.n) return;
  const int n_tok = NTOK == 1 ? 1 : a.n_tok;
  const uint8_t *w = static_cast<const uint8_t *>(a.w_ptrs ? a.w_ptrs[m] : a.w);
  const int64_t nblocks = a.k / Tr::elems;
  const int64_t row_bytes = nblocks * Tr::bytes;
  const float *x = a.x + static_cast<int64_t>(a.x_rows ? a.x_rows[m] : m) * a.k;
  float *y = a.y + static_cast<int64_t>(m) * a.n * n_tok;
  const int64_t nchunks = (nblocks + kBlocksPerChunk - 1) / kBlocksPerChunk;

  auto issue = [&](int64_t c, int buf) {
    const int64_t b0 = c * kBlocksPerChunk;
    const int nb = static_cast<int>(nblocks - b0 < kBlocksPerChunk ? nblocks - b0 : kBlocksPerChunk);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const RowSpan s = row_span(w + (row0 + r) * row_bytes + b0 * Tr::bytes, static_cast<int64_t>(nb) * Tr::bytes,
                                 row0 + r < a.n);
      for (int i = lane; i < s.n16; i += 32) copy16_async(stage[warp][buf][r] + 16 * i, s.start + i, s.end);
    }
  };

  float acc[kRows][NTOK];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int t = 0; t < NTOK; ++t) acc[r][t] = 0.0f;

  issue(0, 0);
  cp_async_commit();
  for (int64_t c = 0; c < nchunks; ++c) {
    const int buf = static_cast<int>(c & 1);
    if (c + 1 < nchunks) issue(c + 1, buf ^ 1);
    cp_async_commit();
    cp_async_wait1();
    __syncwarp();
    const int64_t b0 = c * kBlocksPerChunk;
    const int nb = static_cast<int>(nblocks - b0 < kBlocksPerChunk ? nblocks - b0 : kBlocksPerChunk);
    for (int it = lane; it < nb * kItems; it += 32) {
      const int blk = it / kItems, item = it % kItems;
      const uint8_t *bp[kRows];
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        // the chunk was staged from its 16-byte aligned start: the same offset within 16 bytes
        const uintptr_t src = reinterpret_cast<uintptr_t>(w + (row0 + r) * row_bytes + b0 * Tr::bytes);
        bp[r] = stage[warp][buf][r] + (src & 15) + blk * Tr::bytes;
      }
      const float *xb = x + (b0 + blk) * Tr::elems;
#pragma unroll
      for (int t = 0; t < NTOK; ++t) {
        if (t < n_tok) {
          float part[kRows];
#pragma unroll
          for (int r = 0; r < kRows; ++r) part[r] = 0.0f;
          item_dot<T, kRows>(lut, bp, item, xb + t * a.k, part);
#pragma unroll
          for (int r = 0; r < kRows; ++r) acc[r][t] += part[r];
        }
      }
    }
    __syncwarp();
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int t = 0; t < NTOK; ++t) {
      float sum = acc[r][t];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      if (lane == 0 && row0 + r < a.n && t < n_tok) y[t * a.n + row0 + r] = sum;
    }
}

// ---- the tensor-core kernel (mxfp4, q2_K, q3_K) ------------------------------------------
// Layout of mma.sync m16n8k16 (f16 in, f32 out), lane = 4·g + t: A (16 rows × 16 k) reg0 = row g,
// k 2t..2t+1; reg1 = row g+8, k 2t..; reg2 = row g, k 2t+8..2t+9; reg3 = row g+8, k 2t+8..;
// B (16 k × 8 tokens) b0 = k 2t..2t+1 of token g, b1 = k 2t+8..; C c0,c1 = row g, tokens 2t, 2t+1;
// c2,c3 = row g+8. The k order inside a step is free as long as A and B agree: every type here
// gives lane t the values {4t, 4t+2} in k 2t..2t+1 and {4t+1, 4t+3} in k 2t+8..2t+9 of a
// 16-value "step" (bytes 0, 2 and 1, 3 of a 32-bit word of packed weights).
constexpr int kMmaChunk = 256;        // values of a row per pipeline stage
constexpr int kMmaXBytes = 16384;     // x fragments of one phase (hi + lo f16: 4 bytes per value, token)
constexpr uint32_t kHalfMagic = 0x64006400u;  // f16 1024 in both halves: 1024 + i for mantissa bits i

template <int T> struct MmaQuant;
template <> struct MmaQuant<kMXFP4> { static constexpr int chunk_bytes = 136; static constexpr bool sums = false; };
template <> struct MmaQuant<kQ2_K> { static constexpr int chunk_bytes = 84; static constexpr bool sums = true; };
template <> struct MmaQuant<kQ3_K> { static constexpr int chunk_bytes = 110; static constexpr bool sums = true; };
template <int T> constexpr int mma_granules() { return (MmaQuant<T>::chunk_bytes + 30) / 16; }
template <int T> constexpr int mma_slot() { return 16 * mma_granules<T>() + 16; }  // + slack for lds_words
template <int NTOK> constexpr int mma_phase_values() { return kMmaXBytes / (4 * NTOK); }
template <int T, int NTOK, int WARPS, int STAGES>
constexpr int mma_smem_bytes() {
  return WARPS * STAGES * 16 * mma_slot<T>() + kMmaXBytes + NTOK * (mma_phase_values<NTOK>() / 16) * 4 + NTOK * 8;
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
// 4 uint4 (one per t: hi b0, hi b1, lo b0, lo b1), and (sums) the per-token sums of each 16
// values of the scaled x. q2_K / q3_K permute steps so that lane t sees whole scale groups
// (see mma_kquant_step); mxfp4 keeps the natural order. Block-wide; ends with __syncthreads.
template <int T, int NTOK, int THREADS>
__device__ void mma_stage_x(const float *xm, int64_t k, int n_tok, int64_t v0, int pv, uint4 *xfrag, float *sumx,
                            uint32_t *xmax, float *inv_s) {
  constexpr int kPer = kMmaXBytes / 16 / THREADS;  // 4-value units per thread at most (one read of x)
  const int units_per_tok = pv / 4;               // a multiple of 64
  const int total = n_tok * units_per_tok;        // <= kMmaXBytes / 16
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
    const int q = q4 >> 2, r = q4 & 3;  // 16-value group q of the phase, quarter r
    if constexpr (MmaQuant<T>::sums) {
      const int gl = q & 15, sb = q >> 4;
      xfrag[((sb * 16 + 4 * (gl >> 2) + r) * NTOK + tok) * 4 + (gl & 3)] = frag;
      float part = (x.x + x.y) + (x.z + x.w);
      part += __shfl_xor_sync(0xffffffffu, part, 1);
      part += __shfl_xor_sync(0xffffffffu, part, 2);
      if (r == 0) sumx[tok * (pv / 16) + q] = part;
    } else {
      xfrag[(q * NTOK + tok) * 4 + r] = frag;
    }
  }
  if (threadIdx.x < NTOK) inv_s[threadIdx.x] = ldexpf(1.0f, -x_exponent(xmax[threadIdx.x]));
  __syncthreads();
}

// The B fragments (hi b0, hi b1, lo b0, lo b1) of one step for this lane; zero for lanes whose
// token is past n_tok.
template <int NTOK>
__device__ __forceinline__ uint4 x_frag(const uint4 *xfrag, int step, int g, int t, int n_tok) {
  if (g >= (NTOK == 1 ? 1 : n_tok)) return make_uint4(0u, 0u, 0u, 0u);
  return xfrag[(step * NTOK + g) * 4 + t];
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
                                                 const float inv[2], float acc[4]) {
  constexpr bool q3 = T == kQ3_K;
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
  float c1[4] = {0.0f, 0.0f, 0.0f, 0.0f}, c1lo[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // two mma chains, not one
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
      const uint4 b = x_frag<NTOK>(xf, 4 * u + v, g, kl.t, n_tok);
      mma16816(c1, a, b.x, b.y);
      mma16816(c1lo, a, b.z, b.w);
    }
  }
  // offset term: k = scale group G, A = m_G (q2_K) or 4·sc_G (q3_K), B = Σx of the group
  float c2[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  {
    const uint32_t a[4] = {am[0][0], am[1][0], am[0][1], am[1][1]};
    uint32_t bh0 = 0, bh1 = 0, bl0 = 0, bl1 = 0;
    if (g < (NTOK == 1 ? 1 : n_tok)) {
      const float *s = sx + g * sx_stride + 2 * kl.t;
      constexpr float k1_32 = 1.0f / 32.0f;
      split_hi_lo(s[0] * k1_32, s[1] * k1_32, bh0, bl0);
      split_hi_lo(s[8] * k1_32, s[9] * k1_32, bh1, bl1);
    }
    mma16816(c2, a, bh0, bh1);
    mma16816(c2, a, bl0, bl1);
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) acc[i] = fmaf(fmaf(d[i >> 1], c1[i] + c1lo[i], -dm[i >> 1] * c2[i]), inv[i & 1], acc[i]);
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
                                                int n_tok, const float inv[2], float acc[4]) {
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
    const uint4 x0 = x_frag<NTOK>(xf, 2 * b, g, t, n_tok), x1 = x_frag<NTOK>(xf, 2 * b + 1, g, t, n_tok);
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f}, clo[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    mma16816(c, a0, x0.x, x0.y);
    mma16816(clo, a0, x0.z, x0.w);
    mma16816(c, a1, x1.x, x1.y);
    mma16816(clo, a1, x1.z, x1.w);
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[i] = fmaf(c[i] + clo[i], d[i >> 1] * inv[i & 1], acc[i]);
  }
}

// WARPS warps per block; KSPLIT of them share 16 rows and take every KSPLIT-th chunk of k (their
// sums meet in shared memory at the end), so a block covers 16·WARPS/KSPLIT rows.
template <int T, int NTOK, int WARPS, int STAGES, int KSPLIT>
__global__ void __launch_bounds__(WARPS * 32) gemv_mma_kernel(GemvArgs a) {
  static_assert(WARPS % KSPLIT == 0 && STAGES >= 2);
  constexpr int kCB = MmaQuant<T>::chunk_bytes, kG = mma_granules<T>(), kSlot = mma_slot<T>();
  constexpr int kPV = mma_phase_values<NTOK>();
  extern __shared__ __align__(16) uint8_t smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int kpart = warp % KSPLIT;
  uint8_t *ring = smem + warp * STAGES * 16 * kSlot;
  uint4 *xfrag = reinterpret_cast<uint4 *>(smem + WARPS * STAGES * 16 * kSlot);
  float *sumx = reinterpret_cast<float *>(smem + WARPS * STAGES * 16 * kSlot + kMmaXBytes);
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
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  [[maybe_unused]] const KquantLane kl = kquant_lane(lane, T == kQ3_K);
  int i = 0;
  for (int64_t v0 = 0; v0 < a.k; v0 += kPV) {  // phases of x, block-wide
    const int pv = static_cast<int>(a.k - v0 < kPV ? a.k - v0 : kPV);
    __syncthreads();  // every warp is done with the previous phase
    mma_stage_x<T, NTOK, WARPS * 32>(xm, a.k, n_tok, v0, pv, xfrag, sumx, xmax, inv_s);
    const float inv[2] = {2 * t < n_tok ? inv_s[2 * t] : 0.0f, 2 * t + 1 < n_tok ? inv_s[2 * t + 1] : 0.0f};
    const int c_end = static_cast<int>((v0 + pv) / kMmaChunk);
    for (; i < nlocal && kpart + i * KSPLIT < c_end; ++i) {
      cp_async_wait<STAGES - 2>();
      __syncwarp();
      const int sb = kpart + i * KSPLIT - static_cast<int>(v0 / kMmaChunk);  // chunk within the phase
      const uint8_t *pa = row_in_stage(i, g), *pb = row_in_stage(i, g + 8);
      if constexpr (T == kMXFP4) {
        mma_mxfp4_chunk<NTOK>(pa, pb, xfrag + sb * 16 * NTOK * 4, g, t, n_tok, inv, acc);
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
    part[warp * 32 + lane] = make_float4(acc[0], acc[1], acc[2], acc[3]);
    __syncthreads();
    if (kpart != 0) return;
#pragma unroll
    for (int q = 1; q < KSPLIT; ++q) {
      const float4 o = part[(warp + q) * 32 + lane];
      acc[0] += o.x; acc[1] += o.y; acc[2] += o.z; acc[3] += o.w;
    }
  }
  float *y = a.y + static_cast<int64_t>(m) * a.n * n_tok;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int64_t row = row0 + g + 8 * (e >> 1);
    const int tok = 2 * t + (e & 1);
    if (row < a.n && tok < n_tok) y[static_cast<int64_t>(tok) * a.n + row] = acc[e];
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
  if (args.n_tok == 1) {
    launch_mma<T, 1, WARPS, STAGES, KSPLIT>(args, stream);
  } else {
    launch_mma<T, kGemvMaxTokens, WARPS, STAGES, KSPLIT>(args, stream);
  }
}


// Persistent over row tiles: block (bx, m) takes tiles bx, bx + gridDim.x, .. of matrix m (a tile
// = kDpWarps·RW rows), so x is quantized once per block and the weight loads of the next step
// (next item, or the first item of the next tile) are in flight while the current one computes.
template <typename D, int RW, bool GLU>
__global__ void __launch_bounds__(kDpWarps * 32, 1) gemv_dp4a_kernel(GemvArgs a) {
  extern __shared__ __align__(16) uint8_t smem[];
  const XQuant xq = x_smem_view<D>(smem, a.k);
  const int ipr = xq.ipr;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, m = blockIdx.y;
  const uint8_t *w = static_cast<const uint8_t *>(a.w_ptrs ? a.w_ptrs[m] : a.w);
  float *y = a.y + static_cast<int64_t>(m) * a.n;
  const int64_t row_bytes = a.k / 256 * D::kBytes256;
  const int64_t tiles = (a.n + kDpWarps * RW - 1) / (kDpWarps * RW);
  const int my_tiles = static_cast<int>((tiles - blockIdx.x + gridDim.x - 1) / gridDim.x);
  const int spt = (ipr + 31) / 32;  // steps (32 items) per row of a tile
  auto first_row = [&](int kt) { return ((blockIdx.x + static_cast<int64_t>(kt) * gridDim.x) * kDpWarps + warp) * RW; };
  auto rows_of = [&](int kt, const uint8_t *(&rp)[RW]) {
    const int64_t r0 = first_row(kt);
#pragma unroll
    for (int rr = 0; rr < RW; ++rr) rp[rr] = r0 + rr < a.n ? w + (r0 + rr) * row_bytes : nullptr;
  };
  auto load_step = [&](auto &dst, int kt, int q) {
    const int ii = lane + 32 * q;
    if (kt < my_tiles && ii < ipr) {
      const uint8_t *rp[RW];
      rows_of(kt, rp);
#pragma unroll
      for (int rr = 0; rr < RW; ++rr)
        if (rp[rr] != nullptr) D::load(rp[rr], ii, dst[rr]);
    }
  };

  uint32_t cur[RW][D::kWords], nxt[RW][D::kWords];
  load_step(cur, 0, 0);  // in flight while x is quantized
  quantize_input_smem<D, GLU>(a, m, smem);
  __syncthreads();

  float acc[RW];
#pragma unroll
  for (int rr = 0; rr < RW; ++rr) acc[rr] = 0.0f;
  for (int kt = 0, q = 0; kt < my_tiles;) {
    const bool tile_end = q + 1 == spt;
    const int kt2 = tile_end ? kt + 1 : kt, q2 = tile_end ? 0 : q + 1;
    load_step(nxt, kt2, q2);
    const uint8_t *rp[RW];
    rows_of(kt, rp);
    const int ii = lane + 32 * q;
    if (ii < ipr) D::template dot<RW>(cur, rp, ii, xq, acc);
    if (tile_end) {
      const int64_t r0 = first_row(kt);
#pragma unroll
      for (int rr = 0; rr < RW; ++rr) {
        const float sum = warp_reduce(acc[rr], SumOp{});
        if (lane == 0 && rp[rr] != nullptr) y[r0 + rr] = sum;
        acc[rr] = 0.0f;
      }
    }
#pragma unroll
    for (int rr = 0; rr < RW; ++rr)
#pragma unroll
      for (int i = 0; i < D::kWords; ++i) cur[rr][i] = nxt[rr][i];
    kt = kt2;
    q = q2;
  }
}

// Rows per warp, the fastest measured (docs/benchmarks.md): 4 for q2_K (7-word items), 2 for
// q3_K (15 words), 1 for mxfp4 (17 words).
template <int T, bool GLU>
void launch_dp4a_variant(const GemvArgs &args, cudaStream_t stream) {
  using D = typename DpOf<T>::type;
  constexpr int RW = T == kQ2_K ? 4 : T == kQ3_K ? 2 : 1;
  auto *kernel = gemv_dp4a_kernel<D, RW, GLU>;
  const int64_t smem = dp4a_smem_bytes(args.k);
  // one wave of resident blocks over all matrices (at least one block per matrix)
  const Residency r = residency<gemv_dp4a_kernel<D, RW, GLU>>(kDpWarps * 32, smem);
  const int64_t tiles = (args.n + kDpWarps * RW - 1) / (kDpWarps * RW);
  const int64_t slots = static_cast<int64_t>(r.sms) * r.per_sm;
  const int64_t per_mat = (slots + args.n_mat - 1) / args.n_mat;
  const dim3 grid(static_cast<unsigned>(tiles < per_mat ? tiles : per_mat), static_cast<unsigned>(args.n_mat));
  kernel<<<grid, kDpWarps * 32, static_cast<size_t>(smem), stream>>>(args);
  EP_CUDA_CHECK_LAUNCH("gemv_dp4a_kernel");
}
template <int T>
void launch_dp4a(const GemvArgs &args, cudaStream_t stream) {
  if (args.glu.up != nullptr) {
    launch_dp4a_variant<T, true>(args, stream);
  } else {
    launch_dp4a_variant<T, false>(args, stream);
  }
}


#if defined(EP_GEMV_SWEEP)
// Measurement probe (sweep builds only, EP_GEMV_PROBE): bit 0 skips the stream kernel's dot
// products, bit 1 its weight copies (results are then wrong), bit 2 launches it without
// programmatic dependent launch, bit 4 (16) skips the imma kernel's x prologue, bits 5 and 6 (32,
// 64) address the imma kernel's shared memory as the other layout's (see the kernel), bit 3 (8)
// issues all of the stream kernel's stages before x (StreamWarp), bit 7 (128) skips its x
// quantization, bit 8 (256) skips its griddepcontrol.wait (x must then be constant), bits 11 and
// 12 (2048, 4096) issue its first chunks after the wait in every warp or in the odd warps, so that
// ep-bench can time the kernels' parts. A plain build compiles the stream kernel's bits 0, 1, 3, 7
// and 8 in as a constant with -DEP_GEMV_PROBE_CONST=P (no sweep build, whose extra configurations
// cost the default 2-5 %: the probes then compare with the plain build; docs/benchmarks.md,
// session 15).
__device__ int g_gemv_probe = 0;
int g_gemv_probe_host = 0;
// EP_GEMV_PROBE, read and copied to the device once
int sweep_probe() {
  static const int probe = [] {
    const char *v = std::getenv("EP_GEMV_PROBE");
    const int p = v != nullptr ? std::atoi(v) : 0;
    EP_CUDA_CHECK(cudaMemcpyToSymbol(g_gemv_probe, &p, sizeof p));
    g_gemv_probe_host = p;
    return p;
  }();
  return probe;
}
#endif
// A warp works on G = 2^glog rows groups at once: lane group l / (32 / G) takes RW rows of a
// chunk of G·RW rows and its 32 / G lanes split their items (G > 1 when a row has fewer items
// than 32, or a number that 32 lanes would leave partly idle: 48 items are 3 steps of 16 lanes).
// WARPS warps per block: x is quantized once per block, so fewer, larger blocks spend less on it.
// Blocks of more than 8 warps are bounded for one block per SM (up to 128 registers for 16 warps:
// the wide plans of q2_K and q3_K, StreamConfig; bounded for two such blocks, 64, they spilled —
// session 13's 16-warp figures; up to 168 for mxfp4's 12-warp fill plan). Registers for two 8-warp
// blocks per SM (at most 128): q3_K's default configuration used 139, which left one block per
// SM; with the bound, no spills, q3_K 2-12 % and mxfp4 up to 3 % faster at 8 experts
// (docs/benchmarks.md, session 10). Three blocks (at most 80 registers; only k = 2048 then fits
// three in shared memory): q2_K 0.905-1.007x at 8 experts, 0.947-1.003x at the engine's sizes
// (session 14).
#if defined(EP_GEMV_TIMELINE)
// Timeline probe (builds with -DEP_GEMV_TIMELINE only; scripts/gemv-timeline): every block of the
// stream kernel whose launch has the k and n of EP_GEMV_TIMELINE_KN ("k,n") records when it
// started, when griddepcontrol.wait returned, when x was quantized, when its warps' first chunks
// had landed and when its first and last warps finished (%globaltimer, ns), and its SM; the
// records go to EP_GEMV_TIMELINE_OUT after EP_GEMV_TIMELINE_LAUNCHES such launches (default 64),
// or at the first launch of another shape after some. A record is 8 little-endian u64: start, wait
// returned, x quantized, first chunks landed, first warp done, last warp done, SM, blockIdx.y << 32
// | blockIdx.x — in the order the blocks finished (scripts/gemv-timeline-summary reads them).
constexpr int kTimelineSlots = 32768, kTimelineWords = 8;
__device__ unsigned long long g_timeline[kTimelineSlots][kTimelineWords];
__device__ unsigned g_timeline_next = 0;
__device__ int g_timeline_kn[2] = {0, 0};
__device__ __forceinline__ unsigned long long timeline_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
#endif

template <typename D, int RW, int NS, int WARPS, bool GLU>
__global__ void __launch_bounds__(WARPS * 32, WARPS > 8 ? 1 : 2) gemv_stream_kernel(GemvArgs a, int stage_bytes, int glog) {
  extern __shared__ __align__(16) uint8_t smem[];
#if defined(EP_GEMV_TIMELINE)
  __shared__ unsigned long long tl[8];
  const unsigned long long tl_start = timeline_now();
  const bool tl_on = a.k == g_timeline_kn[0] && a.n == g_timeline_kn[1];
#endif
  XQuant xq = x_smem_view<D>(smem, a.k);
  const int warp = threadIdx.x >> 5, m = blockIdx.y;
  // after x: the decoder's tables (iq2_xxs), then one ring per warp
  uint8_t *tables = smem + stream_x_bytes(a.k);
  if constexpr (D::kTableBytes > 0) xq.tab = tables;
  uint8_t *ring = smem + stream_x_bytes(a.k) + D::kTableBytes + static_cast<int64_t>(warp) * NS * stage_bytes;
#if defined(EP_GEMV_SWEEP)
  const int probe = g_gemv_probe;
#elif defined(EP_GEMV_PROBE_CONST)
  constexpr int probe = EP_GEMV_PROBE_CONST;  // a probe in a plain build (see g_gemv_probe)
#else
  constexpr int probe = 0;
#endif
  // after the rings: each warp's NS mbarriers (bulk copies, stream_barrier_bytes)
  uint64_t *bars = reinterpret_cast<uint64_t *>(smem + stream_x_bytes(a.k) + D::kTableBytes +
                                                static_cast<int64_t>(WARPS) * NS * stage_bytes) + warp * NS;
  const StreamWarp<D, RW, NS> rows(static_cast<const uint8_t *>(a.w_ptrs ? a.w_ptrs[m] : a.w), a.n, a.k,
                                   static_cast<int>(blockIdx.x) * WARPS + warp, static_cast<int>(gridDim.x) * WARPS, glog,
                                   ring, stage_bytes, probe, bars);
#if defined(EP_GEMV_SWEEP)
  // probe bit 11 (2048): no warp prefetches before the wait; bit 12 (4096): only even warps do
  const bool prefetch_early = (probe & 2048) == 0 && ((probe & 4096) == 0 || (warp & 1) == 0);
#else
  constexpr bool prefetch_early = true;
#endif
  if (prefetch_early) rows.prefetch();  // (after the wait instead: up to 11 % slower, session 11; chunk NS − 1 too, right after the wait: 3-11 % slower, session 12)
  D::init_tables(tables);  // constants: before the wait too
  // Up to here only the weights, w_ptrs and the shape were read: the previous kernel may still be
  // running when this launch's blocks start (programmatic dependent launch). The only kernel that
  // lets its successor start early is this one, past this wait, and it writes nothing but y; x
  // (often the previous kernel's output) is read, and y written, after the wait.
  if ((probe & 256) == 0) grid_dependency_wait();  // probe bit 8: no wait (timing only: x must not change)
  if (!prefetch_early) rows.prefetch();
#if defined(EP_GEMV_TIMELINE)
  if (threadIdx.x == 0) {
    tl[0] = tl_start;
    tl[1] = timeline_now();
    tl[3] = 0;
    tl[4] = ~0ull;
    tl[5] = 0;
  }
#endif
  // (at the end of the block instead: up to 9 % slower, session 11; in each warp after its last
  // chunk request: 0.94-1.01x, session 15)
  grid_dependents_launch();
  if ((probe & 128) == 0) quantize_input_smem<D, GLU>(a, m, smem);  // probe bit 7: x not quantized (timing only)
  __syncthreads();
#if defined(EP_GEMV_TIMELINE)
  if (threadIdx.x == 0) tl[2] = timeline_now();
  if (rows.chunks > 0) rows.wait_chunk(0);
  if ((threadIdx.x & 31) == 0) atomicMax(&tl[3], timeline_now());
#endif
  rows.run(xq, a.y + static_cast<int64_t>(m) * a.n);
#if defined(EP_GEMV_TIMELINE)
  if ((threadIdx.x & 31) == 0) {
    const unsigned long long t = timeline_now();
    atomicMin(&tl[4], t);
    atomicMax(&tl[5], t);
  }
  __syncthreads();
  if (threadIdx.x == 0 && tl_on) {
    const unsigned slot = atomicAdd(&g_timeline_next, 1u);
    if (slot < kTimelineSlots) {
      unsigned smid;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
      for (int i = 0; i < 6; ++i) g_timeline[slot][i] = tl[i];
      g_timeline[slot][6] = smid;
      g_timeline[slot][7] = (static_cast<unsigned long long>(blockIdx.y) << 32) | blockIdx.x;
    }
  }
#endif
}

#if defined(EP_GEMV_TIMELINE)
// The host side of the timeline probe: called before every stream launch of k x n.
void timeline_before_launch(int64_t k, int64_t n) {
  static long long kn[2] = {-1, -1}, launches = 0, dump_at = 64;
  static bool done = false;
  if (kn[0] < 0) {
    kn[0] = kn[1] = 0;
    if (const char *v = std::getenv("EP_GEMV_TIMELINE_KN")) {
      char *end = nullptr;
      kn[0] = std::strtoll(v, &end, 10);
      kn[1] = *end == ',' ? std::strtoll(end + 1, nullptr, 10) : 0;
    }
    if (const char *c = std::getenv("EP_GEMV_TIMELINE_LAUNCHES")) dump_at = std::atoll(c);
    const int dkn[2] = {static_cast<int>(kn[0]), static_cast<int>(kn[1])};
    EP_CUDA_CHECK(cudaMemcpyToSymbol(g_timeline_kn, dkn, sizeof dkn));
  }
  if (done) return;
  // dump after dump_at launches of k x n, or at the first launch of another shape after some
  if (k != kn[0] || n != kn[1]) {
    if (launches == 0) return;
  } else if (launches++ < dump_at) {
    return;
  }
  done = true;
  EP_CUDA_CHECK(cudaDeviceSynchronize());
  unsigned used = 0;
  EP_CUDA_CHECK(cudaMemcpyFromSymbol(&used, g_timeline_next, sizeof used));
  used = used < kTimelineSlots ? used : kTimelineSlots;
  static unsigned long long rec[kTimelineSlots][kTimelineWords];
  EP_CUDA_CHECK(cudaMemcpyFromSymbol(rec, g_timeline, sizeof(rec[0]) * used));
  const char *env_out = std::getenv("EP_GEMV_TIMELINE_OUT");
  const char *out = env_out != nullptr ? env_out : "gemv-timeline.bin";
  FILE *f = std::fopen(out, "wb");
  bool ok = f != nullptr && std::fwrite(rec, sizeof(rec[0]), used, f) == used;
  if (f != nullptr && std::fclose(f) != 0) ok = false;
  if (ok) {
    std::fprintf(stderr, "gemv timeline: %u block records of %lldx%lld launches written to %s\n", used, kn[0], kn[1], out);
  } else {
    std::fprintf(stderr, "gemv timeline: could not write %s: %s\n", out, std::strerror(errno));
  }
}
#endif

template <int T, int RW, int NS, int WARPS, bool GLU = false>
void launch_stream_cfg(const GemvArgs &args, const StreamPlan &plan, cudaStream_t stream) {
  using D = typename StreamOf<T>::type;
  bool pdl = true;
#if defined(EP_GEMV_SWEEP)
  pdl = (g_gemv_probe_host & 4) == 0;
#endif
#if defined(EP_GEMV_TIMELINE)
  timeline_before_launch(args.k, args.n);
#endif
  // at most one warp per row
  launch_one_wave<gemv_stream_kernel<D, RW, NS, WARPS, GLU>>("gemv_stream_kernel", WARPS * 32, plan.smem, args.n_mat,
                                                        (args.n + WARPS - 1) / WARPS, pdl, stream, args,
                                                        static_cast<int>(plan.stage), plan.glog);
}

// The measurement variables EP_GEMV_KERNEL, EP_GEMV_STREAM_CFG and EP_GEMV_STREAM_GLOG: while
// none of them is set (what a deployment runs), a launch reads none of them — one relaxed atomic
// load instead of three getenv scans per decode GEMV launch; gemv_env_changed() makes the next
// launch look again.
std::atomic<int> g_gemv_env_set{-1};  // -1: not looked at yet, 0: none set, 1: at least one set
const char *gemv_env(const char *name) {
  int set = g_gemv_env_set.load(std::memory_order_relaxed);
  if (set < 0) {
    set = std::getenv("EP_GEMV_KERNEL") != nullptr || std::getenv("EP_GEMV_STREAM_CFG") != nullptr ||
                  std::getenv("EP_GEMV_STREAM_GLOG") != nullptr
              ? 1
              : 0;
    g_gemv_env_set.store(set, std::memory_order_relaxed);
  }
  return set != 0 ? std::getenv(name) : nullptr;
}

// EP_GEMV_STREAM_CFG = "RWxNS" (rows per warp step x stages) or "RWxNSxW" (and W warps per
// block) overrides the per-type default for measurements; a configuration over the
// shared-memory limit for this k, or not compiled in, keeps the default. With an activation on
// the input (GemvArgs::glu) the default configuration runs (its variants are instantiated for
// the default only). (3x2, three rows per step in one row group, was slower than the default in
// 10 of 12 benchmark cells, and no faster than the default with session 11's row-group rule in
// the other two, though it left two blocks per SM where the default leaves one: docs/benchmarks.md,
// session 11; no longer compiled.)
template <int T>
void launch_stream(const GemvArgs &args, cudaStream_t stream) {
  using C = StreamConfig<T>;
  // EP_GEMV_STREAM_GLOG = 0, 1 or 2 caps the row groups per warp (2^glog; fewer groups: more rows
  // per lane, so each x piece read from shared memory serves more rows, and more lanes may idle)
  int max_glog = 2;
  if (const char *env = gemv_env("EP_GEMV_STREAM_GLOG"); env != nullptr && env[0] >= '0' && env[0] <= '2' && env[1] == 0)
    max_glog = env[0] - '0';
  StreamPlan plan = default_stream_plan<T>(args.k, max_glog);
  if (args.glu.up != nullptr) {
    static_assert(C::rw == 4 && (C::split_rw == 4 || C::split_rw == 8), "the default's rows per lane group are 4, 2 or 1");
    if constexpr (C::wide_warps > 0) {
      if (plan.warps == C::wide_warps) return launch_stream_cfg<T, C::rw, C::ns, C::wide_warps, true>(args, plan, stream);
    }
    if constexpr (C::fill_warps > 0) {
      if (plan.warps == C::fill_warps) return launch_stream_cfg<T, C::rw, C::ns, C::fill_warps, true>(args, plan, stream);
    }
    if (plan.rw == 4) return launch_stream_cfg<T, 4, C::ns, C::warps, true>(args, plan, stream);
    if (plan.rw == 2) return launch_stream_cfg<T, 2, C::ns, C::warps, true>(args, plan, stream);
    return launch_stream_cfg<T, 1, C::ns, C::warps, true>(args, plan, stream);
  }
  if (const char *env = gemv_env("EP_GEMV_STREAM_CFG"); env != nullptr && std::strlen(env) >= 3 && env[1] == 'x') {
    const int warps = env[3] == 'x' ? std::atoi(env + 4) : C::warps;
    const StreamPlan want = stream_plan<T>(args.k, env[0] - '0', env[2] - '0', warps, max_glog);
    if (want.smem <= kStreamMaxSmem) plan = want;
  }
#if defined(EP_GEMV_SWEEP)
  sweep_probe();
#endif
  auto run = [&](const StreamPlan &p) {  // false: no kernel instantiated for p
#define EP_STREAM_CFG(R, N, W)                         \
  if (p.rw == R && p.ns == N && p.warps == W) {        \
    launch_stream_cfg<T, R, N, W>(args, p, stream);    \
    return true;                                       \
  }
#define EP_STREAM_CFGS(W)                                                                       \
  EP_STREAM_CFG(1, 2, W) EP_STREAM_CFG(1, 3, W) EP_STREAM_CFG(1, 4, W) EP_STREAM_CFG(2, 2, W) \
  EP_STREAM_CFG(2, 3, W) EP_STREAM_CFG(2, 4, W) EP_STREAM_CFG(4, 2, W) EP_STREAM_CFG(4, 3, W)
    EP_STREAM_CFGS(C::warps)
    if constexpr (C::wide_warps > 0) { EP_STREAM_CFG(C::rw, C::ns, C::wide_warps) }
    if constexpr (C::fill_warps > 0) { EP_STREAM_CFG(C::rw, C::ns, C::fill_warps) }
#if defined(EP_GEMV_SWEEP)  // every block size, for ep-bench sweeps (-DEP_GEMV_SWEEP)
    if constexpr (C::warps != 8) { EP_STREAM_CFGS(8) }
    if constexpr (C::warps != 16) { EP_STREAM_CFGS(16) }
    if constexpr (C::warps != 32) { EP_STREAM_CFGS(32) }
#endif
#undef EP_STREAM_CFGS
#undef EP_STREAM_CFG
    return false;
  };
  // the defaults (rows 2 or 4 split over 1, 2 or 4 row groups) are instantiated
  static_assert((C::rw == 2 || C::rw == 4) && (C::ns == 2 || C::ns == 3), "instantiate the default configuration");
  if (!run(plan)) run(default_stream_plan<T>(args.k));
}

// ---- the int8 tensor-core decode kernel (q2_K; one token; k a multiple of 256) ---------
// The arithmetic is cuda/gemv_imma.cuh's (checked on a CPU with an emulated warp). Warps form
// groups of KS (the k-split); a group owns 16-row tiles of one matrix (tile_i = blockIdx.x·groups +
// group + i·gridDim.x·groups) and warp kp of the group takes the blocks [kp·nb/KS, (kp+1)·nb/KS)
// of each row, streaming them through its own ring of NS stages, SB blocks of k (SB·84 bytes of
// each of the 16 rows) at a time: on sm_90+ one bulk copy per row (lanes 0..15) completing on
// the stage's mbarrier, else 16-byte cp.async with two lanes per row. The block
// quantizes x once into the B words of every block (one thread per group of 16 values). A lane
// holds two rows' sums (g and g + 8) for its slot of every block; the four lanes of a quad add
// theirs at the end of a tile, and with KS > 1 the group's warps add theirs through shared memory
// behind a named barrier. Programmatic dependent launch as the stream kernel.
//
// Measured (docs/benchmarks.md, "Kernels", session 7): about 40 % fewer instructions than the
// stream kernel but slower (0.38–0.40 of HBM at 8 experts against 0.46–0.53): a chunk reads 16
// rows' SB·84-byte pieces 1 row apart, and that strided pattern, not the arithmetic, sets its
// speed — the same kernel reading contiguous chunks (the IL timing probe, as if each tile were
// stored block-interleaved) reaches 0.51–0.55 at 8 experts and 0.77–0.81 at 32; the row-major
// stage's 4-way bank conflicts on the A loads cost a further 5–13 % (probes 32 and 64). A bulk copy
// per row instead of cp.async (session 14): 0.396 / 0.403 / 0.429 / 0.438 at 8 experts against
// 0.37–0.40, still 0.72–0.76x the stream kernel; its schedulers issue in 29 % of active cycles with
// two warps each (one 16-row tile per warp at 8 experts of 2048 rows: 1,024 tiles).
__device__ __forceinline__ void mma_u8s8(int32_t (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

// Bytes of one row's stage segment: SB blocks starting 0..12 bytes into a granule, whole granules.
constexpr int imma_seg_stride(int sb) { return (12 + sb * imma::kBlockBytes + 15) / 16 * 16; }
// x's XBlocks, the all-zero B table, the k-split partial sums (two tiles' worth: 16 floats per
// warp each), each warp's ring, then each warp's NS mbarriers (bulk copies; reserved on every
// architecture, as the stream kernel's)
constexpr int64_t imma_smem_bytes(int64_t k, int warps, int sb, int ns) {
  return k / 256 * static_cast<int64_t>(sizeof(imma::XBlock)) + imma::kZeroTableBytes + 2 * 64 * warps +
         static_cast<int64_t>(warps) * ns * 16 * imma_seg_stride(sb) + stream_barrier_bytes(warps, ns);
}
// Named barrier `id` (1..15; 0 is __syncthreads) of `threads` threads.
[[maybe_unused]] __device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
static_assert(sizeof(imma::XBlock) % 16 == 0 && imma::kZeroTableBytes % 16 == 0, "16-byte aligned XBlocks and ring");

// IL (sweep builds only, a timing probe): read the weights as if each 16-row tile were stored
// block-interleaved (block b of rows 0..15 adjacent), so that a chunk is one contiguous range as
// in the stream kernel; the results are then wrong for row-major matrices.
template <int WARPS, int SB, int NS, int KS, bool IL = false>
__global__ void __launch_bounds__(WARPS * 32, 1) gemv_imma_kernel(GemvArgs a) {
  static_assert(WARPS % KS == 0 && WARPS / KS <= 15, "whole k-split groups, one named barrier each");
  constexpr int kGroups = WARPS / KS;
  extern __shared__ __align__(16) uint8_t smem[];
  constexpr int kSeg = imma_seg_stride(SB), kStage = 16 * kSeg;
  const int nb = static_cast<int>(a.k / 256);
  imma::XBlock *xq = reinterpret_cast<imma::XBlock *>(smem);
  uint8_t *zero = smem + static_cast<int64_t>(nb) * sizeof(imma::XBlock);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, m = blockIdx.y;
  float *partial = reinterpret_cast<float *>(zero + imma::kZeroTableBytes);  // [2][WARPS][16]
  uint8_t *ring = zero + imma::kZeroTableBytes + 2 * 64 * WARPS + warp * NS * kStage;
  // sm_90+ (not the IL probe): a chunk is 16 bulk copies, one per row by lanes 0..15, completing
  // on the stage's mbarrier (16 arrivals); else 16-byte cp.async, two lanes per row
  constexpr bool kBulk = kStreamBulkCopy && !IL;
  uint64_t *bars = reinterpret_cast<uint64_t *>(zero + imma::kZeroTableBytes + 2 * 64 * WARPS + WARPS * NS * kStage) + warp * NS;
  if constexpr (kBulk) {
    if (lane == 0) {
      for (int st = 0; st < NS; ++st) mbar_init(bars + st, 16);
      mbar_init_fence();
    }
    __syncwarp();
  }
  const uint8_t *w = static_cast<const uint8_t *>(a.w_ptrs ? a.w_ptrs[m] : a.w);
  const int n = static_cast<int>(a.n);
  const int64_t row_bytes = static_cast<int64_t>(nb) * imma::kBlockBytes;
  const uintptr_t mat_end = reinterpret_cast<uintptr_t>(w + n * row_bytes);
  // k-split: the KS warps of a group share tiles, warp kp of the group takes blocks
  // [kp·nbk, (kp + 1)·nbk) of each row; the group adds its partial sums through shared memory
  const int kp = warp % KS, grp = warp / KS;
  const int nbk = (nb + KS - 1) / KS, kb0 = kp * nbk, kb1 = min(nb, kb0 + nbk);
  const int tiles = (n + 15) / 16, slices = kb1 > kb0 ? (kb1 - kb0 + SB - 1) / SB : 0;
  const int stride = static_cast<int>(gridDim.x) * kGroups, first = static_cast<int>(blockIdx.x) * kGroups + grp;
  const int my_tiles = first < tiles ? (tiles - first + stride - 1) / stride : 0;
  const int chunks = my_tiles * slices;
  const int tile_count = my_tiles;  // the same for the group's KS warps
  auto row_src = [&](int tile, int r, int b0) {  // rows past n read the last row (not stored)
    const int row = min(tile * 16 + r, n - 1);
    return w + row * row_bytes + b0 * imma::kBlockBytes;
  };
  // row r's part of chunk q (q < chunks): its 16-byte granules from `from` (n16, of which `whole`
  // inside the matrix: the last row's end may cut the last granule) and where they go in the stage
  struct RowGranules {
    const uint8_t *from;
    uint8_t *dst;
    int n16, whole;
  };
  auto row_granules = [&](int q, int r) {
    const int tile = first + (q / slices) * stride, b0 = kb0 + (q % slices) * SB;
    const int bytes = min(SB, kb1 - b0) * imma::kBlockBytes;
    const uintptr_t src = reinterpret_cast<uintptr_t>(row_src(tile, r, b0));
    const uintptr_t start = src & ~uintptr_t(15);
    const int n16 = static_cast<int>((src - start + bytes + 15) / 16);
    const int whole = start + 16 * static_cast<uintptr_t>(n16) <= mat_end ? n16 : n16 - 1;
    return RowGranules{reinterpret_cast<const uint8_t *>(start), ring + (q % NS) * kStage + r * kSeg, n16, whole};
  };
  // chunk q: slice q % slices of tile (q / slices) into stage q % NS — one bulk copy per row by
  // lanes 0..15 (kBulk), or two lanes per row taking alternate granules by cp.async (one commit
  // group per call); a granule past the matrix's end (the last row's) byte by byte
  auto issue = [&](int q) {
    if (IL && q < chunks) {
      const int tile = first + (q / slices) * stride, b0 = kb0 + (q % slices) * SB;
      const uintptr_t src = reinterpret_cast<uintptr_t>(w + tile * 16 * row_bytes + b0 * 16 * imma::kBlockBytes);
      const uintptr_t start = src & ~uintptr_t(15);
      const int n16 = static_cast<int>((src - start + 16 * min(SB, kb1 - b0) * imma::kBlockBytes + 15) / 16);
      const int whole = start + 16 * static_cast<uintptr_t>(n16) <= mat_end ? n16 : n16 - 1;
      const uint8_t *from = reinterpret_cast<const uint8_t *>(start);
      uint8_t *dst = ring + (q % NS) * kStage;
      for (int i = lane; i < whole; i += 32) cp_async16(dst + 16 * i, from + 16 * i);
      if (whole < n16 && lane == 0) copy16_async(dst + 16 * whole, reinterpret_cast<const uint4 *>(from + 16 * whole), mat_end);
    } else if (kBulk && q < chunks) {
      if (lane < 16) {
        const RowGranules g = row_granules(q, lane);
        // the matrix's cut last granule by a plain store, released by the arrival below
        if (g.whole < g.n16)
          *reinterpret_cast<uint4 *>(g.dst + 16 * g.whole) =
              load16_bounded(reinterpret_cast<const uint4 *>(g.from + 16 * g.whole), mat_end);
        bulk_copy_g2s(g.dst, g.from, 16u * static_cast<unsigned>(g.whole), bars + q % NS);  // whole >= 5: 84-byte blocks
      }
    } else if (q < chunks) {
      const RowGranules g = row_granules(q, lane >> 1);
      for (int i = lane & 1; i < g.whole; i += 2) cp_async16(g.dst + 16 * i, g.from + 16 * i);
      if (g.whole < g.n16 && (lane & 1) == (g.whole & 1))
        copy16_async(g.dst + 16 * g.whole, reinterpret_cast<const uint4 *>(g.from + 16 * g.whole), mat_end);
    }
    if constexpr (!kBulk) cp_async_commit();
  };
#pragma unroll
  for (int q = 0; q < NS - 1; ++q) issue(q);
  grid_dependency_wait();  // as the stream kernel: x read and y written only after it
  grid_dependents_launch();
  const float *x = a.x + static_cast<int64_t>(a.x_rows ? a.x_rows[m] : m) * a.k;
  float *y = a.y + static_cast<int64_t>(m) * a.n;
  for (int i = static_cast<int>(threadIdx.x); i < imma::kZeroTableBytes / 4; i += static_cast<int>(blockDim.x))
    reinterpret_cast<uint32_t *>(zero)[i] = 0u;
  // x: one thread per (block, slot, field) group; the slot's four groups are lanes 4i..4i+3
#if defined(EP_GEMV_SWEEP)
  const int x_groups = (g_gemv_probe & 16) != 0 ? 0 : nb * 16;
#else
  const int x_groups = nb * 16;
#endif
  for (int base = 0; base < x_groups; base += blockDim.x) {
    const int item = base + static_cast<int>(threadIdx.x), valid = item < nb * 16;
    const int it = valid ? item : nb * 16 - 1;
    const int b = it >> 4, c = (it >> 2) & 3, j = it & 3;
    float v[16];
    imma::load_group(x + static_cast<int64_t>(b) * 256, c, j, v);
    float mx = imma::group_absmax(v);
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    if (valid) imma::quantize_group(v, c, j, mx, xq[b]);
  }
  __syncthreads();

  const int g = lane >> 2, t = lane & 3;
  const bool b_on = imma::b_active(lane);
  const int b_off = imma::b_offset(lane);
  float acc_g = 0.0f, acc_g8 = 0.0f;
  for (int q = 0; q < chunks; ++q) {
    __syncwarp();  // every lane is done with the stage that chunk q + NS − 1 overwrites
    issue(q + NS - 1);
    if constexpr (kBulk) {
      mbar_wait(bars + q % NS, static_cast<unsigned>(q / NS) & 1u);
    } else {
      cp_async_wait<NS - 1>();
      __syncwarp();
    }
    const int tile = first + (q / slices) * stride, sl = q % slices, b0 = kb0 + sl * SB;
    const int nbs = min(SB, kb1 - b0);
    const uint8_t *stage = ring + (q % NS) * kStage;
    const uint8_t *base_g, *base_g8;
    int blk_step;
#if defined(EP_GEMV_SWEEP)
    // timing probes that separate the global read order from the shared-memory bank pattern:
    // 32: row-major copies, blocks addressed as the IL layout's; 64: IL copies, addressed as rows
    const bool il_addr = IL ? (g_gemv_probe & 64) == 0 : (g_gemv_probe & 32) != 0;
#else
    constexpr bool il_addr = IL;
#endif
    if (il_addr) {
      const uint8_t *base =
          stage + (reinterpret_cast<uintptr_t>(w + tile * 16 * row_bytes + b0 * 16 * imma::kBlockBytes) & 15);
      base_g = base + g * imma::kBlockBytes;
      base_g8 = base + (g + 8) * imma::kBlockBytes;
      blk_step = 16 * imma::kBlockBytes;
    } else {
      base_g = stage + g * kSeg + (reinterpret_cast<uintptr_t>(row_src(tile, g, b0)) & 15);
      base_g8 = stage + (g + 8) * kSeg + (reinterpret_cast<uintptr_t>(row_src(tile, g + 8, b0)) & 15);
      blk_step = imma::kBlockBytes;
    }
    for (int bb = 0; bb < nbs; ++bb) {
      const uint8_t *blk_g = base_g + bb * blk_step, *blk_g8 = base_g8 + bb * blk_step;
      const imma::XBlock &xb = xq[b0 + bb];
      const uint8_t *bsrc = b_on ? reinterpret_cast<const uint8_t *>(&xb) + b_off : zero;
      const uint32_t sg = imma::slot_scales(blk_g, lane), sg8 = imma::slot_scales(blk_g8, lane);
      const uint32_t scg = sg & 0x0F0F0F0Fu, scg8 = sg8 & 0x0F0F0F0Fu;
      int32_t blk_acc_g = 0, blk_acc_g8 = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        int32_t cc[4] = {0, 0, 0, 0};
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
          uint32_t av[4];
          imma::a_regs(blk_g, blk_g8, lane, j, mi, av);
          const uint2 bw = *reinterpret_cast<const uint2 *>(bsrc + imma::b_set_offset(j, mi));
          const uint32_t bv[2] = {bw.x, bw.y};
          mma_u8s8(cc, av, bv);
        }
        imma::add_set(cc, j, scg, scg8, blk_acc_g, blk_acc_g8);
      }
      const uint4 pw = *reinterpret_cast<const uint4 *>(xb.planes[t]);
      const uint32_t planes[3] = {pw.x, pw.y, pw.z};
      const float xs = xb.scale[t];
      const float2 dg = __half22float2(bits_h2(imma::load_u32(blk_g + 80)));
      const float2 dg8 = __half22float2(bits_h2(imma::load_u32(blk_g8 + 80)));
      acc_g += imma::block_term(blk_acc_g, imma::min_sum(sg, planes), dg.x, dg.y, xs);
      acc_g8 += imma::block_term(blk_acc_g8, imma::min_sum(sg8, planes), dg8.x, dg8.y, xs);
    }
    if (sl == slices - 1) {  // the tile's last slice: the quad's four slots, then the two rows
      acc_g += __shfl_xor_sync(0xffffffffu, acc_g, 1);
      acc_g += __shfl_xor_sync(0xffffffffu, acc_g, 2);
      acc_g8 += __shfl_xor_sync(0xffffffffu, acc_g8, 1);
      acc_g8 += __shfl_xor_sync(0xffffffffu, acc_g8, 2);
      const int r0 = tile * 16 + g;
      if constexpr (KS == 1) {
        if (t == 0 && r0 < n) y[r0] = acc_g;
        if (t == 0 && r0 + 8 < n) y[r0 + 8] = acc_g8;
      } else {
        // the group's tile number i = q / slices: partial buffer i % 2, reused two tiles later,
        // after the barrier of tile i + 1 (which warp kp = 0 reaches only after reading tile i's)
        float *part = partial + ((q / slices) & 1) * 16 * WARPS + 16 * warp;
        if (t == 0) {
          part[g] = acc_g;
          part[g + 8] = acc_g8;
        }
        named_barrier(1 + grp, KS * 32);
        if (kp == 0 && lane < 16 && tile * 16 + lane < n) {
          float sum = 0.0f;
#pragma unroll
          for (int p = 0; p < KS; ++p) sum += part[16 * p + lane];
          y[tile * 16 + lane] = sum;
        }
      }
      acc_g = acc_g8 = 0.0f;
    }
  }
  if constexpr (KS > 1) {  // a warp with no blocks (kb1 <= kb0) adds zeros and joins the barriers
    if (slices == 0)
      for (int i = 0; i < tile_count; ++i) {
        if (lane < 16) partial[(i & 1) * 16 * WARPS + 16 * warp + lane] = 0.0f;
        named_barrier(1 + grp, KS * 32);
      }
  }
  if constexpr (!kBulk) cp_async_wait<0>();
}

constexpr int kImmaWarps = 8, kImmaSb = 8, kImmaNs = 2, kImmaKs = 1;
constexpr int64_t kImmaMaxSmem = 227 * 1024;
// imma reads words of the rows' shared-memory copies: matrices must start 4-byte aligned (w_ptrs
// entries are pack slots + tensor offsets, aligned by construction; a single w is checked).
bool imma_covers(int type, const GemvArgs &args) {
  return type == kQ2_K && args.n_tok == 1 && args.k % 256 == 0 &&
         imma_smem_bytes(args.k, kImmaWarps, kImmaSb, kImmaNs) <= kImmaMaxSmem &&
         (args.w_ptrs != nullptr || (reinterpret_cast<uintptr_t>(args.w) & 3) == 0);
}

template <int WARPS, int SB, int NS, int KS, bool IL = false>
void launch_imma_cfg(const GemvArgs &args, cudaStream_t stream) {
  // at least one 16-row tile per warp group
  launch_one_wave<gemv_imma_kernel<WARPS, SB, NS, KS, IL>>("gemv_imma_kernel", WARPS * 32,
                                                          imma_smem_bytes(args.k, WARPS, SB, NS), args.n_mat,
                                                          ((args.n + 15) / 16 + WARPS / KS - 1) / (WARPS / KS), true,
                                                          stream, args);
}

void launch_imma(const GemvArgs &args, cudaStream_t stream) {
#if defined(EP_GEMV_SWEEP)
  sweep_probe();
  // EP_GEMV_IMMA_CFG = "SBxNSxWxKS" (blocks per stage x stages x warps x k-split) picks a
  // measured configuration
  if (const char *env = std::getenv("EP_GEMV_IMMA_CFG"); env != nullptr && std::strlen(env) >= 7) {
    int sb = 0, ns = 0, warps = 0, ks = 0;
    const bool il = std::strchr(env, 'i') != nullptr;  // "...i": the interleaved-layout timing probe
    if (std::sscanf(env, "%dx%dx%dx%d", &sb, &ns, &warps, &ks) == 4) {
#define EP_IMMA_CFG(S, N, W, K)                                                                                \
  if (sb == S && ns == N && warps == W && ks == K && imma_smem_bytes(args.k, W, S, N) <= kImmaMaxSmem) { \
    if (il) {                                                                                            \
      launch_imma_cfg<W, S, N, K, true>(args, stream);                                                   \
    } else {                                                                                             \
      launch_imma_cfg<W, S, N, K>(args, stream);                                                         \
    }                                                                                                    \
    return;                                                                                              \
  }
      EP_IMMA_CFG(4, 3, 8, 1) EP_IMMA_CFG(2, 3, 16, 2) EP_IMMA_CFG(4, 2, 16, 2) EP_IMMA_CFG(2, 3, 16, 4)
      EP_IMMA_CFG(2, 3, 8, 2) EP_IMMA_CFG(1, 4, 16, 4) EP_IMMA_CFG(4, 4, 8, 1) EP_IMMA_CFG(8, 2, 8, 1)
      EP_IMMA_CFG(16, 1, 8, 1) EP_IMMA_CFG(8, 2, 8, 2)
#undef EP_IMMA_CFG
    }
  }
#endif
  launch_imma_cfg<kImmaWarps, kImmaSb, kImmaNs, kImmaKs>(args, stream);
}

// Which kernel runs a type: the default per type is the fastest measured by `ep-bench kernels`
// on an H200 (docs/benchmarks.md): for one token stream (mxfp4, q2_K, q3_K and iq2_xxs with k a
// multiple of 256 and at least kDp4aMinRows rows per matrix; dp4a where stream's shared memory
// would not fit, except iq2_xxs, which has no dp4a kernel);
// for 2..8 tokens mma (same types and k); else
// generic for mxfp4, q4_K and q5_K, pipe for the rest. GemvArgs::kernel, else EP_GEMV_KERNEL
// (a gemv_kernel_name()), overrides; a kernel asked for a type or shape it does not cover falls
// back to what automatic picks there.
bool mma_covers(int type, int64_t k) {
  return (type == kMXFP4 || type == kQ2_K || type == kQ3_K) && k % kMmaChunk == 0;
}
// dp4a loads weight words: matrices must start 4-byte aligned (q3_K: 2-byte); only a single `w`
// can be checked here (w_ptrs entries are pack slots + tensor offsets, aligned by construction).
bool dp4a_covers(int type, const GemvArgs &args) {
  const uintptr_t align = type == kQ3_K ? 1 : 3;
  return mma_covers(type, args.k) && args.n_tok == 1 && dp4a_smem_bytes(args.k) <= kDp4aMaxSmem &&
         (args.w_ptrs != nullptr || (reinterpret_cast<uintptr_t>(args.w) & align) == 0);
}
// Below this many rows per matrix (one token) the per-lane f32 kernels are used: they are exact
// to f32 rounding, and such matrices (small test models) are too small for speed to matter. The
// choice depends on the matrix, not on how many share the launch, so a matrix's result does not
// change with the launch it is in (the MoE's expert-major pass computes subsets of the pairs).
constexpr int64_t kDp4aMinRows = 2048;
// stream: what dp4a covers, with x and one ring per warp in shared memory
bool stream_covers(int type, const GemvArgs &args) {
  if (type == kIQ2_XXS)  // its blocks are read as 16-bit halves and aligned words: 2-byte aligned rows
    return args.n_tok == 1 && args.k % 256 == 0 && stream_smem_bytes<kIQ2_XXS>(args.k) <= kStreamMaxSmem &&
           (args.w_ptrs != nullptr || (reinterpret_cast<uintptr_t>(args.w) & 1) == 0);
  if (!dp4a_covers(type, args)) return false;
  // q3_K (SQ3K): 4-byte aligned rows — k a multiple of 512 (rows of an even number of 110-byte
  // blocks) and 4-byte aligned matrices (w_ptrs: the caller's; documented on GemvArgs)
  if (type == kQ3_K && (args.k % 512 != 0 || (args.w_ptrs == nullptr && (reinterpret_cast<uintptr_t>(args.w) & 3) != 0)))
    return false;
  const int64_t smem = type == kQ2_K ? stream_smem_bytes<kQ2_K>(args.k)
                       : type == kQ3_K ? stream_smem_bytes<kQ3_K>(args.k)
                                       : stream_smem_bytes<kMXFP4>(args.k);
  return smem <= kStreamMaxSmem;
}
// The kernels that can apply GemvArgs::glu: they read x once per block, into their quantized copy.
bool applies_glu(GemvKernel kernel) { return kernel == GemvKernel::dp4a || kernel == GemvKernel::stream; }
GemvKernel pick_gemv_kernel(int type, const GemvArgs &args) {
  GemvKernel want = args.kernel;
  if (want == GemvKernel::automatic) {
    const char *v = gemv_env("EP_GEMV_KERNEL");
    if (v != nullptr && !parse_gemv_kernel(v, want)) want = GemvKernel::automatic;
  }
  const bool mma_ok = mma_covers(type, args.k), dp4a_ok = dp4a_covers(type, args);
  if (want == GemvKernel::stream && !stream_covers(type, args)) want = GemvKernel::automatic;
  if (want == GemvKernel::imma && !imma_covers(type, args)) want = GemvKernel::automatic;
  if (want == GemvKernel::automatic || (want == GemvKernel::mma && !mma_ok) || (want == GemvKernel::dp4a && !dp4a_ok)) {
    // stream measured faster than dp4a (docs/benchmarks.md); the same rows-per-matrix rule
    if (dp4a_ok && args.n >= kDp4aMinRows) return stream_covers(type, args) ? GemvKernel::stream : GemvKernel::dp4a;
    if (type == kIQ2_XXS && args.n >= kDp4aMinRows && stream_covers(type, args)) return GemvKernel::stream;
    if (mma_ok && args.n_tok > 1) return GemvKernel::mma;
    return type == kQ4_K || type == kQ5_K || type == kMXFP4 ? GemvKernel::generic : GemvKernel::pipe;
  }
  return want;
}

template <int T>
void launch_typed(GemvKernel kernel, const GemvArgs &args, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((args.n + kWarps * kRows - 1) / (kWarps * kRows)),
                  static_cast<unsigned>(args.n_mat));
  const bool one = args.n_tok == 1;
  if constexpr (T == kMXFP4 || T == kQ2_K || T == kQ3_K) {
    if (kernel == GemvKernel::dp4a) return launch_dp4a<T>(args, stream);
    if (kernel == GemvKernel::stream) return launch_stream<T>(args, stream);
    if constexpr (T == kQ2_K) {
      if (kernel == GemvKernel::imma) return launch_imma(args, stream);
    }
    if (kernel == GemvKernel::mma) return launch_mma_tokens<T, 4, 4, 1>(args, stream);
  }
  if constexpr (T == kIQ2_XXS) {
    if (kernel == GemvKernel::stream) return launch_stream<T>(args, stream);
  }
  if (kernel == GemvKernel::generic) {
    if (one) {
      gemv_generic_kernel<T, 1><<<grid, kWarps * 32, 0, stream>>>(args);
    } else {
      gemv_generic_kernel<T, kGemvMaxTokens><<<grid, kWarps * 32, 0, stream>>>(args);
    }
    EP_CUDA_CHECK_LAUNCH("gemv_generic_kernel");
    return;
  }
  // pipe (pick_gemv_kernel gives mma and dp4a only for the types above)
  if (one) {
    gemv_pipe_kernel<T, 1><<<grid, kWarps * 32, 0, stream>>>(args);
  } else {
    gemv_pipe_kernel<T, kGemvMaxTokens><<<grid, kWarps * 32, 0, stream>>>(args);
  }
  EP_CUDA_CHECK_LAUNCH("gemv_pipe_kernel");
}

}  // namespace

const char *gemv_kernel_name(GemvKernel kernel) {
  switch (kernel) {
    case GemvKernel::automatic: return "auto";
    case GemvKernel::generic: return "generic";
    case GemvKernel::pipe: return "pipe";
    case GemvKernel::mma: return "mma";
    case GemvKernel::dp4a: return "dp4a";
    case GemvKernel::stream: return "stream";
    case GemvKernel::imma: return "imma";
  }
  return "?";
}

bool parse_gemv_kernel(const char *name, GemvKernel &out) {
  for (GemvKernel k : {GemvKernel::automatic, GemvKernel::generic, GemvKernel::pipe, GemvKernel::mma, GemvKernel::dp4a,
                       GemvKernel::stream, GemvKernel::imma}) {
    if (std::strcmp(name, gemv_kernel_name(k)) == 0) {
      out = k;
      return true;
    }
  }
  return false;
}

GemvKernel gemv_kernel_for(uint32_t type, const GemvArgs &args) { return pick_gemv_kernel(static_cast<int>(type), args); }

void gemv_env_changed() { g_gemv_env_set.store(-1, std::memory_order_relaxed); }

bool gemv_takes_glu(uint32_t type, const GemvArgs &args) {
  return applies_glu(pick_gemv_kernel(static_cast<int>(type), args));
}

void launch_gemv(uint32_t type, const GemvArgs &args, cudaStream_t stream) {
  if (args.n_tok < 1 || args.n_tok > kGemvMaxTokens)
    throw Error(Status::invalid_argument, "launch_gemv: n_tok " + std::to_string(args.n_tok) + " outside 1..8");
  if (args.n_mat < 1 || args.n_mat > 65535)
    throw Error(Status::invalid_argument, "launch_gemv: n_mat " + std::to_string(args.n_mat) + " outside 1..65535");
  if (args.k % 32 != 0 || (reinterpret_cast<uintptr_t>(args.x) & 15) != 0)
    throw Error(Status::invalid_argument, "launch_gemv: k must be a multiple of 32 and x 16-byte aligned");
  if (args.n < 0 || args.n > INT32_MAX || args.k > INT32_MAX)
    throw Error(Status::invalid_argument, "launch_gemv: n = " + std::to_string(args.n) + ", k = " + std::to_string(args.k) +
                                              ": both must be below 2^31");
  const GemvKernel kernel = pick_gemv_kernel(static_cast<int>(type), args);
  if (args.glu.up != nullptr && ((reinterpret_cast<uintptr_t>(args.glu.up) & 15) != 0 || !applies_glu(kernel)))
    throw Error(Status::invalid_argument, "launch_gemv: an activation on the input (GemvArgs::glu) needs the dp4a or stream "
                                          "kernel (gemv_takes_glu) and a 16-byte aligned up row; " +
                                              std::string(gemv_kernel_name(kernel)) + " was picked for type " +
                                              std::to_string(type));
  if (args.n == 0) return;
  dispatch_type(type, "launch_gemv", [&](auto tag) {
    constexpr int T = decltype(tag)::value;
    if (args.k % Traits<T>::elems != 0)
      throw Error(Status::shape, "launch_gemv: k = " + std::to_string(args.k) + " is not a whole number of blocks");
    launch_typed<T>(kernel, args, stream);
  });
}

}  // namespace ep::backend::cuda
