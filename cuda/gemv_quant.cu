// Decode GEMV (and small-batch GEMM, up to kGemvMaxTokens tokens) on quantized weights, batched
// over many matrices per launch (the experts of a MoE layer). Bandwidth-oriented: each warp owns
// kRows rows; it stages a chunk of each row into shared memory with 16-byte loads issued together
// (all loads of a chunk in flight before the first use), then every lane decodes 32-value units
// and multiplies them with x (f32, read through the read-only cache). Warp-shuffle reduction.
#include "cuda/check.hpp"
#include "cuda/dispatch.cuh"
#include "cuda/kernels.hpp"

namespace ep::cuda {
namespace {

using namespace quant;

constexpr int kWarps = 4;           // warps per block
constexpr int kRows = 2;            // rows per warp
constexpr int kChunkBytes = 2048;   // bytes of one row staged at a time (whole blocks)
constexpr int kStageBytes = kChunkBytes + 256;  // + alignment slack and one partial block
constexpr int kLoadsPerLane = (kStageBytes / 16 + 31) / 32;

__device__ __forceinline__ uint4 load_stream(const uint4 *p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

template <int T, int NTOK>
__global__ void __launch_bounds__(kWarps * 32) gemv_kernel(GemvArgs a) {
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
    int offs[kRows], n16[kRows];
    const uint4 *src16[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const uint8_t *src = w + (row0 + r) * row_bytes + b0 * Tr::bytes;
      const uintptr_t start = reinterpret_cast<uintptr_t>(src) & ~uintptr_t(15);
      const uintptr_t end = reinterpret_cast<uintptr_t>(src) + static_cast<uintptr_t>(nb) * Tr::bytes;
      offs[r] = static_cast<int>(reinterpret_cast<uintptr_t>(src) - start);
      n16[r] = row0 + r < a.n ? static_cast<int>((end - start + 15) / 16) : 0;
      src16[r] = reinterpret_cast<const uint4 *>(start);
    }
    uint4 buf[kRows][kLoadsPerLane];
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int i = 0; i < kLoadsPerLane; ++i) {
        const int idx = lane + 32 * i;
        if (idx < n16[r]) buf[r][i] = load_stream(src16[r] + idx);
      }
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int i = 0; i < kLoadsPerLane; ++i) {
        const int idx = lane + 32 * i;
        if (idx < n16[r]) reinterpret_cast<uint4 *>(stage[warp][r])[idx] = buf[r][i];
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

}  // namespace

void launch_gemv(uint32_t type, const GemvArgs &args, cudaStream_t stream) {
  if (args.n_tok < 1 || args.n_tok > kGemvMaxTokens)
    throw Error(Status::invalid_argument, "launch_gemv: n_tok " + std::to_string(args.n_tok) + " outside 1..8");
  if (args.n_mat < 1 || args.n_mat > 65535)
    throw Error(Status::invalid_argument, "launch_gemv: n_mat " + std::to_string(args.n_mat) + " outside 1..65535");
  if (args.k % 32 != 0 || (reinterpret_cast<uintptr_t>(args.x) & 15) != 0)
    throw Error(Status::invalid_argument, "launch_gemv: k must be a multiple of 32 and x 16-byte aligned");
  if (args.n == 0) return;
  dispatch_type(type, "launch_gemv", [&](auto tag) {
    constexpr int T = decltype(tag)::value;
    if (args.k % Traits<T>::elems != 0)
      throw Error(Status::shape, "launch_gemv: k = " + std::to_string(args.k) + " is not a whole number of blocks");
    const dim3 grid(static_cast<unsigned>((args.n + kWarps * kRows - 1) / (kWarps * kRows)),
                    static_cast<unsigned>(args.n_mat));
    if (args.n_tok == 1) {
      gemv_kernel<T, 1><<<grid, kWarps * 32, 0, stream>>>(args);
    } else {
      gemv_kernel<T, kGemvMaxTokens><<<grid, kWarps * 32, 0, stream>>>(args);
    }
    EP_CUDA_CHECK_LAUNCH("gemv_kernel");
  });
}

}  // namespace ep::cuda
