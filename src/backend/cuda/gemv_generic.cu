// The generic decode-GEMV kernel (every type, 1..kGemvMaxTokens tokens: instantiated for 1, 2, 4
// and 8, gemv_tokens_rounded): each lane decodes whole
// 32-value units of the weights (quant_unit.cuh, exact to f32 rounding) and multiplies them with
// x read through the read-only cache; a warp owns kRows rows, staged kChunkBytes at a time
// through shared memory. launch_gemv (gemv.cu) runs it for q4_K, q5_K and mxfp4 where no
// dp4a-family or tensor-core kernel applies.
#include "backend/cuda/dispatch.cuh"
#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/gemv_families.hpp"
#include "backend/cuda/kernels.hpp"
#include "gpu/check.hpp"

#include <cstdint>

namespace ep::backend::cuda {
namespace {

using namespace quant;

constexpr int kChunkBytes = 2048;   // bytes of one row staged at a time (whole blocks)
constexpr int kStageBytes = kChunkBytes + 256;  // + alignment slack and one partial block
constexpr int kLoadsPerLane = (kStageBytes / 16 + 31) / 32;

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
            if (t < n_tok) acc[r][t] += dot32(v, x + t * a.k + col, 0.0f);
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

}  // namespace

void launch_gemv_generic(uint32_t type, const GemvArgs &args, cudaStream_t stream) {
  dispatch_type(type, "launch_gemv_generic", [&](auto tag) {
    constexpr int T = decltype(tag)::value;
    launch_per_lane<gemv_generic_kernel<T, 1>, gemv_generic_kernel<T, 2>, gemv_generic_kernel<T, 4>, gemv_generic_kernel<T, 8>>(
        "gemv_generic_kernel", args, stream);
  });
}

}  // namespace ep::backend::cuda
