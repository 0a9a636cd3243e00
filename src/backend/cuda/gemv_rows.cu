// The row-parallel decode-GEMV kernel for q8_0 and the plain float types (f32, f16, bf16): a
// group of lanes shares one row (4, 8, 32 or 128 lanes, picked from the row length so that short
// rows keep every lane busy and long rows of few-row matrices spread over a whole block), each
// lane reads whole pieces of the row with 16-byte read-only loads straight into registers (q8_0:
// eight blocks, 272 bytes; f16 / bf16: 32 values, 64 bytes; f32: 32 values, 128 bytes) and
// accumulates in f32; the lanes of a row add their sums by shuffles (and shared memory across
// warps). q8_0's signed bytes become floats exactly by integer byte permutes and one float
// subtraction (2^23 + 128 + q − (2^23 + 128)), with each block's scale applied once to its sum.
// One token of q8_0 runs a warp-coalesced variant instead (gemv_q8_0_warp_kernel, below).
// launch_gemv (gemv.cu) runs them for these types when gemv_rows_covers() says so.
#include "backend/cuda/dispatch.cuh"
#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/gemv_families.hpp"
#include "backend/cuda/kernels.hpp"
#include "backend/cuda/quant_unit.cuh"
#include "core/status.hpp"
#include "gpu/check.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <string>

namespace ep::backend::cuda {
namespace {

using namespace quant;

constexpr int kRowsThreads = 128;

// Signed byte i of w as a float, exactly: 0x4B000000 | (byte ^ 0x80) is 2^23 + byte + 128.
template <int I>
__device__ __forceinline__ float signed_byte(uint32_t w) {
  return __int_as_float(__byte_perm(w ^ 0x80808080u, 0x4B000000u, 0x7440u | I)) - 8388736.0f;
}

// 4 bytes of the piece starting at byte offset O (O even).
template <int O>
__device__ __forceinline__ uint32_t bytes4(const uint32_t (&w)[68]) {
  if constexpr (O % 4 == 0) return w[O / 4];
  else return __funnelshift_r(w[O / 4], w[O / 4 + 1], 16);
}

// Accumulates Σ w·x of one piece into acc[t] for every token; x points at the piece's first value
// of token 0, tokens k values apart.
struct DecQ8_0 {
  static constexpr int kValues = 256, kVecs = 17;  // eight 34-byte blocks
  template <int NTOK>
  __device__ static void dot(const uint4 (&v)[kVecs], const float *x, int64_t k, int n_tok, float (&acc)[NTOK]) {
    uint32_t w[68];
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      w[4 * i] = v[i].x;
      w[4 * i + 1] = v[i].y;
      w[4 * i + 2] = v[i].z;
      w[4 * i + 3] = v[i].w;
    }
    block<0>(w, x, k, n_tok, acc);
    block<1>(w, x, k, n_tok, acc);
    block<2>(w, x, k, n_tok, acc);
    block<3>(w, x, k, n_tok, acc);
    block<4>(w, x, k, n_tok, acc);
    block<5>(w, x, k, n_tok, acc);
    block<6>(w, x, k, n_tok, acc);
    block<7>(w, x, k, n_tok, acc);
  }
  template <int J, int NTOK>
  __device__ static void block(const uint32_t (&w)[68], const float *x, int64_t k, int n_tok, float (&acc)[NTOK]) {
    constexpr int kStart = 34 * J;
    const uint32_t scale_bits = (kStart % 4 == 0) ? (w[kStart / 4] & 0xFFFFu) : (w[kStart / 4] >> 16);
    const float d = __half2float(__ushort_as_half(static_cast<unsigned short>(scale_bits)));
    float q[32];
    quad<kStart + 2>(w, q);
    quad<kStart + 6>(w, q + 4);
    quad<kStart + 10>(w, q + 8);
    quad<kStart + 14>(w, q + 12);
    quad<kStart + 18>(w, q + 16);
    quad<kStart + 22>(w, q + 20);
    quad<kStart + 26>(w, q + 24);
    quad<kStart + 30>(w, q + 28);
#pragma unroll
    for (int t = 0; t < NTOK; ++t) {
      if (t < n_tok) acc[t] = fmaf(dot32(q, x + t * k + 32 * J, 0.0f), d, acc[t]);
    }
  }
  template <int O>
  __device__ static void quad(const uint32_t (&w)[68], float *q) {
    const uint32_t b = bytes4<O>(w);
    q[0] = signed_byte<0>(b);
    q[1] = signed_byte<1>(b);
    q[2] = signed_byte<2>(b);
    q[3] = signed_byte<3>(b);
  }
};

// Plain floats: 32 values per piece. Value(v, i) converts value i of the piece's registers.
template <int T>
struct DecFloat {
  static constexpr int kValues = 32, kVecs = T == kF32 ? 8 : 4;
  __device__ static float value(const uint4 (&v)[kVecs], int i) {
    const uint32_t *u = reinterpret_cast<const uint32_t *>(v);
    if constexpr (T == kF32) {
      return __uint_as_float(u[i]);
    } else if constexpr (T == kBF16) {
      return __uint_as_float((i & 1) ? (u[i >> 1] & 0xFFFF0000u) : (u[i >> 1] << 16));
    } else {
      return __half2float(__ushort_as_half(static_cast<unsigned short>((i & 1) ? (u[i >> 1] >> 16) : (u[i >> 1] & 0xFFFFu))));
    }
  }
  template <int NTOK>
  __device__ static void dot(const uint4 (&v)[kVecs], const float *x, int64_t k, int n_tok, float (&acc)[NTOK]) {
    float val[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) val[i] = value(v, i);
#pragma unroll
    for (int t = 0; t < NTOK; ++t) {
      if (t < n_tok) acc[t] = dot32(val, x + t * k, acc[t]);
    }
  }
};

template <int T> struct DecOf { using type = DecFloat<T>; };
template <> struct DecOf<kQ8_0> { using type = DecQ8_0; };

// LPR lanes per row, kRowsThreads / LPR rows per block; blockIdx.y is the matrix.
template <int T, int LPR, int NTOK>
__global__ void __launch_bounds__(kRowsThreads) gemv_rows_kernel(GemvArgs a) {
  using D = typename DecOf<T>::type;
  constexpr int kRowsPerBlock = kRowsThreads / LPR;
  const int lane = static_cast<int>(threadIdx.x) % LPR, slot = static_cast<int>(threadIdx.x) / LPR;
  const int m = blockIdx.y;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + slot;
  const bool active = row < a.n;
  const int n_tok = NTOK == 1 ? 1 : a.n_tok;
  const uint8_t *w = static_cast<const uint8_t *>(a.w_ptrs ? a.w_ptrs[m] : a.w);
  const int64_t pieces = a.k / D::kValues;
  const uint4 *wr = reinterpret_cast<const uint4 *>(w + (active ? row : 0) * pieces * D::kVecs * 16);
  const float *x = a.x + static_cast<int64_t>(a.x_rows ? a.x_rows[m] : m) * a.k;
  float acc[NTOK];
#pragma unroll
  for (int t = 0; t < NTOK; ++t) acc[t] = 0.0f;
  if (active) {
    for (int64_t p = lane; p < pieces; p += LPR) {
      uint4 v[D::kVecs];
#pragma unroll
      for (int i = 0; i < D::kVecs; ++i) v[i] = __ldg(wr + p * D::kVecs + i);
      D::template dot<NTOK>(v, x + p * D::kValues, a.k, n_tok, acc);
    }
  }
  constexpr int kWarpLanes = LPR < 32 ? LPR : 32;
#pragma unroll
  for (int t = 0; t < NTOK; ++t)
#pragma unroll
    for (int o = kWarpLanes / 2; o > 0; o >>= 1) acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], o);
  float *y = a.y + static_cast<int64_t>(m) * a.n * n_tok;
  if constexpr (LPR > 32) {
    constexpr int kWarpsPerRow = LPR / 32;
    __shared__ float part[kRowsThreads / 32][NTOK];
    const int warp = static_cast<int>(threadIdx.x) / 32;
    if ((threadIdx.x & 31) == 0)
#pragma unroll
      for (int t = 0; t < NTOK; ++t) part[warp][t] = acc[t];
    __syncthreads();
    if (lane < NTOK && lane < n_tok && active) {
      float s = 0.0f;
#pragma unroll
      for (int i = 0; i < kWarpsPerRow; ++i) s += part[slot * kWarpsPerRow + i][lane];
      y[static_cast<int64_t>(lane) * a.n + row] = s;
    }
  } else {
    if (lane == 0 && active)
#pragma unroll
      for (int t = 0; t < NTOK; ++t)
        if (t < n_tok) y[static_cast<int64_t>(t) * a.n + row] = acc[t];
  }
}

// One token of q8_0, coalesced: a warp reads each 256-value group of a row (eight 34-byte blocks,
// 272 contiguous bytes) together, lane t taking values 8t .. 8t + 7 of the group (block t / 4,
// quarter t % 4: its 8 quant bytes by aligned 32-bit loads and a funnel shift, the block's scale
// by a 16-bit load) and x's 8 matching values by two float4 loads, so that one load instruction
// of the warp touches three 128-byte lines and x is read once for kQ8Rows rows. WPR warps share
// the rows of a block, splitting the groups of a row among them (WPR 4 for matrices of few rows,
// so that the grid still fills the GPU); the lanes' and the warps' sums are added in a fixed order.
constexpr int kQ8Rows = 4;
constexpr int64_t kQ8SplitBelowRows = 8192;  // fewer rows per matrix: the 4 warps of a block split each row

template <int WPR>
__global__ void __launch_bounds__(kRowsThreads) gemv_q8_0_warp_kernel(GemvArgs a) {
  constexpr int kWarps = kRowsThreads / 32, kRowsPerBlock = kWarps / WPR * kQ8Rows;
  const int t = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const int m = blockIdx.y;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + (warp / WPR) * kQ8Rows;
  const uint8_t *w = static_cast<const uint8_t *>(a.w_ptrs ? a.w_ptrs[m] : a.w);
  const int64_t groups = a.k / 256, row_bytes = groups * 272;
  const float *x = a.x + static_cast<int64_t>(a.x_rows ? a.x_rows[m] : m) * a.k + 8 * t;
  const int b = t >> 2, o = 34 * b + 2 + 8 * (t & 3), o4 = o & ~3;
  const bool shifted = (o & 3) != 0;
  const uint8_t *rows[kQ8Rows];
#pragma unroll
  for (int r = 0; r < kQ8Rows; ++r) rows[r] = w + (row0 + r < a.n ? row0 + r : a.n - 1) * row_bytes;
  float acc[kQ8Rows];
#pragma unroll
  for (int r = 0; r < kQ8Rows; ++r) acc[r] = 0.0f;
#pragma unroll 2
  for (int64_t g = warp % WPR; g < groups; g += WPR) {
    const float4 x0 = __ldg(reinterpret_cast<const float4 *>(x + 256 * g));
    const float4 x1 = __ldg(reinterpret_cast<const float4 *>(x + 256 * g + 4));
#pragma unroll
    for (int r = 0; r < kQ8Rows; ++r) {
      const uint8_t *grp = rows[r] + 272 * g;
      const uint32_t w0 = __ldg(reinterpret_cast<const uint32_t *>(grp + o4));
      const uint32_t w1 = __ldg(reinterpret_cast<const uint32_t *>(grp + o4 + 4));
      const uint32_t w2 = shifted ? __ldg(reinterpret_cast<const uint32_t *>(grp + o4 + 8)) : 0u;
      const uint32_t lo = shifted ? __funnelshift_r(w0, w1, 16) : w0;
      const uint32_t hi = shifted ? __funnelshift_r(w1, w2, 16) : w1;
      const float d = __half2float(__ushort_as_half(__ldg(reinterpret_cast<const unsigned short *>(grp + 34 * b))));
      float s = signed_byte<0>(lo) * x0.x;
      s = fmaf(signed_byte<1>(lo), x0.y, s);
      s = fmaf(signed_byte<2>(lo), x0.z, s);
      s = fmaf(signed_byte<3>(lo), x0.w, s);
      s = fmaf(signed_byte<0>(hi), x1.x, s);
      s = fmaf(signed_byte<1>(hi), x1.y, s);
      s = fmaf(signed_byte<2>(hi), x1.z, s);
      s = fmaf(signed_byte<3>(hi), x1.w, s);
      acc[r] = fmaf(s, d, acc[r]);
    }
  }
#pragma unroll
  for (int r = 0; r < kQ8Rows; ++r)
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], off);
  float *y = a.y + static_cast<int64_t>(m) * a.n;
  if constexpr (WPR == 1) {
    if (t < kQ8Rows) {
      float v = acc[0];
#pragma unroll
      for (int r = 1; r < kQ8Rows; ++r)
        if (t == r) v = acc[r];
      if (row0 + t < a.n) y[row0 + t] = v;
    }
  } else {
    __shared__ float part[kWarps][kQ8Rows];
    if (t == 0)
#pragma unroll
      for (int r = 0; r < kQ8Rows; ++r) part[warp][r] = acc[r];
    __syncthreads();
    if (threadIdx.x < kRowsPerBlock) {
      const int set = static_cast<int>(threadIdx.x) / kQ8Rows, r = static_cast<int>(threadIdx.x) % kQ8Rows;
      float v = 0.0f;
#pragma unroll
      for (int i = 0; i < WPR; ++i) v += part[set * WPR + i][r];
      const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x;
      if (row < a.n) y[row] = v;
    }
  }
}

template <int WPR>
void launch_q8_0_warps(const GemvArgs &a, cudaStream_t stream) {
  constexpr int kRowsPerBlock = kRowsThreads / 32 / WPR * kQ8Rows;
  const dim3 grid(static_cast<unsigned>((a.n + kRowsPerBlock - 1) / kRowsPerBlock), static_cast<unsigned>(a.n_mat));
  gemv_q8_0_warp_kernel<WPR><<<grid, kRowsThreads, 0, stream>>>(a);
}

template <int T, int LPR>
void launch_lanes(const GemvArgs &a, cudaStream_t stream) {
  constexpr int kRowsPerBlock = kRowsThreads / LPR;
  const dim3 grid(static_cast<unsigned>((a.n + kRowsPerBlock - 1) / kRowsPerBlock), static_cast<unsigned>(a.n_mat));
  if (a.n_tok == 1) gemv_rows_kernel<T, LPR, 1><<<grid, kRowsThreads, 0, stream>>>(a);
  else gemv_rows_kernel<T, LPR, kGemvMaxTokens><<<grid, kRowsThreads, 0, stream>>>(a);
}

template <int T>
void launch_type(const GemvArgs &a, cudaStream_t stream) {
  using D = typename DecOf<T>::type;
  if constexpr (T == kQ8_0) {
    if (a.n_tok == 1) {
      if (a.n < kQ8SplitBelowRows) launch_q8_0_warps<4>(a, stream);
      else launch_q8_0_warps<1>(a, stream);
      return;
    }
  }
  const int64_t pieces = a.k / D::kValues;  // per row
  if (pieces >= 256) launch_lanes<T, 128>(a, stream);
  else if (pieces >= 64) launch_lanes<T, 32>(a, stream);
  else if (pieces >= 8) launch_lanes<T, 8>(a, stream);
  else launch_lanes<T, 4>(a, stream);
}

}  // namespace

bool gemv_rows_covers(uint32_t type, const GemvArgs &args) {
  const int t = static_cast<int>(type);
  const int64_t values = t == kQ8_0 ? 256 : 32;
  if (!format::ggml_gemv_family(type, format::kGemvRows)) return false;
  if (args.k % values != 0) return false;
  // every matrix 16-byte aligned: a single `w` checked here, a table of matrices by its caller
  if (args.w_ptrs) return args.w_ptrs_aligned16;
  return (reinterpret_cast<uintptr_t>(args.w) & 15) == 0;
}

void launch_gemv_rows(uint32_t type, const GemvArgs &args, cudaStream_t stream) {
  dispatch_gemv_family<format::kGemvRows>(type, "launch_gemv_rows",
                                          [&](auto tag) { launch_type<decltype(tag)::value>(args, stream); });
  EP_CUDA_CHECK_LAUNCH("gemv_rows_kernel");
}

}  // namespace ep::backend::cuda
