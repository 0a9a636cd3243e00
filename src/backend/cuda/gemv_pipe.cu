// The pipelined decode-GEMV kernel (every type, 1..kGemvMaxTokens tokens: instantiated for 1, 2, 4
// and 8, gemv_tokens_rounded): the generic kernel's
// work split (gemv_generic.cu), with the row chunks copied by cp.async into a per-warp double
// buffer (the next chunk is in flight while the current one is decoded), and table-driven
// decoders for mxfp4, q2_K and q3_K (a 256-entry table turns one quant byte into 2 or 4 floats)
// with the block scales factored out of the inner sums. launch_gemv (gemv.cu) runs it for the
// types without a generic, dp4a-family or tensor-core pick.
#include "backend/cuda/dispatch.cuh"
#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/gemv_families.hpp"
#include "backend/cuda/kernels.hpp"
#include "gpu/check.hpp"

#include <cstdint>

namespace ep::backend::cuda {
namespace {

using namespace quant;

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

}  // namespace

void launch_gemv_pipe(uint32_t type, const GemvArgs &args, cudaStream_t stream) {
  dispatch_type(type, "launch_gemv_pipe", [&](auto tag) {
    constexpr int T = decltype(tag)::value;
    launch_per_lane<gemv_pipe_kernel<T, 1>, gemv_pipe_kernel<T, 2>, gemv_pipe_kernel<T, 4>, gemv_pipe_kernel<T, 8>>(
        "gemv_pipe_kernel", args, stream);
  });
}

}  // namespace ep::backend::cuda
