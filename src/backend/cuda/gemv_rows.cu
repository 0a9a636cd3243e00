// The row-parallel decode-GEMV kernels for q8_0 and the plain float types (f32, f16, bf16),
// launched by launch_gemv (gemv.cu) for these types when gemv_rows_covers() says so:
//  - one token of q8_0: gemv_q8_0_warp_kernel, warp-coalesced (a warp reads each 256-value group
//    of its rows together); q8_0's signed bytes become floats exactly by integer byte permutes and
//    one float subtraction (2^23 + 128 + q − (2^23 + 128)), each block's scale applied once to its
//    sum;
//  - 2..8 tokens of q8_0, and of the float types with k a multiple of 256: the same coalesced
//    scheme, one kernel per token count, each x value read once per token for several rows
//    (gemv_warp_tokens_kernel; a q8_0 token's outputs equal the one-token kernel's bit for bit);
//  - the float types otherwise (one token; several tokens with other k): gemv_rows_kernel, a
//    group of lanes shares one row (4, 8, 32 or 128 lanes, picked from the row length so that
//    short rows keep every lane busy and long rows of few-row matrices spread over a whole block),
//    each lane reads whole pieces of 32 values of the row with 16-byte read-only loads straight
//    into registers (f16 / bf16: 64 bytes, f32: 128 bytes) and accumulates in f32; the lanes of a
//    row add their sums by shuffles (and shared memory across warps).
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

// LPR lanes per row, kRowsThreads / LPR rows per block; blockIdx.y is the matrix.
template <int T, int LPR, int NTOK>
__global__ void __launch_bounds__(kRowsThreads) gemv_rows_kernel(GemvArgs a) {
  using D = DecFloat<T>;
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

// Several tokens, coalesced (q8_0 and the plain float types with k a multiple of 256): the
// one-token q8_0 kernel's scheme for NTOK tokens, a template parameter (launch_warp_tokens
// instantiates every count 2..kGemvMaxTokens: no lane computes a token that is not there). A warp
// owns R rows; lane t takes values 8t .. 8t + 7 of every 256-value group of them (q8_0: as in
// gemv_q8_0_warp_kernel; f16 / bf16: one 16-byte load per row and group, f32: two), converts them
// to floats once per row and multiplies them with every token's 8 matching x values, read by two
// float4 loads per token and group and used for all R rows. WPR warps split the groups of a row
// as in the one-token kernel. Each (row, token) sum is accumulated in a fixed order that does not
// depend on R or NTOK: for q8_0 it is the one-token kernel's (8 products, then the block's scale,
// per group; the lanes' sums by the same shuffles, the warps' in the same order), so token t of a
// q8_0 launch equals a one-token launch on x row t bit for bit; for the float types the 8 products
// of a group are added to the lane's running sum (not the order of gemv_rows_kernel's one token).
template <int T>
struct WarpGroup;  // lane t's 8 values of group g of a row, as floats, and the group's scale
template <>
struct WarpGroup<kQ8_0> {
  static constexpr int64_t kGroupBytes = 272;
  static constexpr bool kScaled = true;
  __device__ static float load(const uint8_t *grp, int t, float (&v)[8]) {
    const int b = t >> 2, o = 34 * b + 2 + 8 * (t & 3), o4 = o & ~3;
    const bool shifted = (o & 3) != 0;
    const uint32_t w0 = __ldg(reinterpret_cast<const uint32_t *>(grp + o4));
    const uint32_t w1 = __ldg(reinterpret_cast<const uint32_t *>(grp + o4 + 4));
    const uint32_t w2 = shifted ? __ldg(reinterpret_cast<const uint32_t *>(grp + o4 + 8)) : 0u;
    const uint32_t lo = shifted ? __funnelshift_r(w0, w1, 16) : w0;
    const uint32_t hi = shifted ? __funnelshift_r(w1, w2, 16) : w1;
    v[0] = signed_byte<0>(lo);
    v[1] = signed_byte<1>(lo);
    v[2] = signed_byte<2>(lo);
    v[3] = signed_byte<3>(lo);
    v[4] = signed_byte<0>(hi);
    v[5] = signed_byte<1>(hi);
    v[6] = signed_byte<2>(hi);
    v[7] = signed_byte<3>(hi);
    return __half2float(__ushort_as_half(__ldg(reinterpret_cast<const unsigned short *>(grp + 34 * b))));
  }
};
template <int T>
struct WarpGroupFloat {
  static constexpr int64_t kGroupBytes = T == kF32 ? 1024 : 512;
  static constexpr bool kScaled = false;
  __device__ static float load(const uint8_t *grp, int t, float (&v)[8]) {
    if constexpr (T == kF32) {
      const uint4 a = __ldg(reinterpret_cast<const uint4 *>(grp) + 2 * t);
      const uint4 b = __ldg(reinterpret_cast<const uint4 *>(grp) + 2 * t + 1);
      const uint32_t u[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = __uint_as_float(u[i]);
    } else {
      const uint4 a = __ldg(reinterpret_cast<const uint4 *>(grp) + t);
      const uint32_t u[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if constexpr (T == kBF16) {
          v[2 * i] = __uint_as_float(u[i] << 16);
          v[2 * i + 1] = __uint_as_float(u[i] & 0xFFFF0000u);
        } else {
          v[2 * i] = __half2float(__ushort_as_half(static_cast<unsigned short>(u[i] & 0xFFFFu)));
          v[2 * i + 1] = __half2float(__ushort_as_half(static_cast<unsigned short>(u[i] >> 16)));
        }
      }
    }
    return 1.0f;
  }
};
template <> struct WarpGroup<kF32> : WarpGroupFloat<kF32> {};
template <> struct WarpGroup<kF16> : WarpGroupFloat<kF16> {};
template <> struct WarpGroup<kBF16> : WarpGroupFloat<kBF16> {};

// Bounded for 3 blocks per SM (at most 168 registers) at 8 rows per warp, 4 (128) at 4: unbounded,
// 8 tokens of q8_0 at 8 rows per warp took 255 registers, which leaves 2 blocks (8 warps) per SM
// to keep the weights streaming.
template <int T, int NTOK, int R, int WPR>
__global__ void __launch_bounds__(kRowsThreads, R >= 8 ? 3 : 4) gemv_warp_tokens_kernel(GemvArgs a) {
  using G = WarpGroup<T>;
  constexpr int kWarps = kRowsThreads / 32, kRowsPerBlock = kWarps / WPR * R;
  const int t = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const int m = blockIdx.y;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + (warp / WPR) * R;
  const uint8_t *w = static_cast<const uint8_t *>(a.w_ptrs ? a.w_ptrs[m] : a.w);
  const int64_t groups = a.k / 256, row_bytes = groups * G::kGroupBytes;
  const float *x = a.x + static_cast<int64_t>(a.x_rows ? a.x_rows[m] : m) * a.k + 8 * t;
  const uint8_t *rows[R];
#pragma unroll
  for (int r = 0; r < R; ++r) rows[r] = w + (row0 + r < a.n ? row0 + r : a.n - 1) * row_bytes;
  float acc[R][NTOK];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int tok = 0; tok < NTOK; ++tok) acc[r][tok] = 0.0f;
  for (int64_t g = warp % WPR; g < groups; g += WPR) {
    float v[R][8], d[R];
#pragma unroll
    for (int r = 0; r < R; ++r) d[r] = G::load(rows[r] + G::kGroupBytes * g, t, v[r]);
#pragma unroll
    for (int tok = 0; tok < NTOK; ++tok) {
      const float4 x0 = __ldg(reinterpret_cast<const float4 *>(x + tok * a.k + 256 * g));
      const float4 x1 = __ldg(reinterpret_cast<const float4 *>(x + tok * a.k + 256 * g + 4));
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if constexpr (G::kScaled) {  // gemv_q8_0_warp_kernel's order
          float s = v[r][0] * x0.x;
          s = fmaf(v[r][1], x0.y, s);
          s = fmaf(v[r][2], x0.z, s);
          s = fmaf(v[r][3], x0.w, s);
          s = fmaf(v[r][4], x1.x, s);
          s = fmaf(v[r][5], x1.y, s);
          s = fmaf(v[r][6], x1.z, s);
          s = fmaf(v[r][7], x1.w, s);
          acc[r][tok] = fmaf(s, d[r], acc[r][tok]);
        } else {
          float s = acc[r][tok];
          s = fmaf(v[r][0], x0.x, s);
          s = fmaf(v[r][1], x0.y, s);
          s = fmaf(v[r][2], x0.z, s);
          s = fmaf(v[r][3], x0.w, s);
          s = fmaf(v[r][4], x1.x, s);
          s = fmaf(v[r][5], x1.y, s);
          s = fmaf(v[r][6], x1.z, s);
          acc[r][tok] = fmaf(v[r][7], x1.w, s);
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int tok = 0; tok < NTOK; ++tok)
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) acc[r][tok] += __shfl_xor_sync(0xffffffffu, acc[r][tok], off);
  // every lane holds every sum: output j = r·NTOK + tok is written by lane j mod 32
  float *y = a.y + static_cast<int64_t>(m) * a.n * NTOK;
  if constexpr (WPR == 1) {
#pragma unroll
    for (int j = 0; j < R * NTOK; ++j) {
      const int r = j / NTOK, tok = j % NTOK;
      if (j % 32 == t && row0 + r < a.n) y[static_cast<int64_t>(tok) * a.n + row0 + r] = acc[r][tok];
    }
  } else {
    __shared__ float part[kWarps][R][NTOK];
    if (t == 0)
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int tok = 0; tok < NTOK; ++tok) part[warp][r][tok] = acc[r][tok];
    __syncthreads();
    for (int j = static_cast<int>(threadIdx.x); j < kRowsPerBlock * NTOK; j += kRowsThreads) {
      const int row = j / NTOK, tok = j % NTOK;  // row of the block
      const int set = row / R, r = row % R;
      float v = 0.0f;
#pragma unroll
      for (int i = 0; i < WPR; ++i) v += part[set * WPR + i][r][tok];
      const int64_t out = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + row;
      if (out < a.n) y[static_cast<int64_t>(tok) * a.n + out] = v;
    }
  }
}

// Rows per warp of the several-token kernel: q8_0 with whole rows per warp (WPR 1) 8, so that
// each token's x is read once per 8 rows; else 4 (the one-token kernel's tiles: split rows keep
// the grid of few-row matrices as large).
template <int T, int WPR>
constexpr int warp_tokens_rows() {
  return T == kQ8_0 && WPR == 1 ? 8 : 4;
}

template <int T, int NTOK, int WPR>
void launch_warp_tokens_wpr(const GemvArgs &a, cudaStream_t stream) {
  constexpr int kR = warp_tokens_rows<T, WPR>();
  constexpr int kRowsPerBlock = kRowsThreads / 32 / WPR * kR;
  const dim3 grid(static_cast<unsigned>((a.n + kRowsPerBlock - 1) / kRowsPerBlock), static_cast<unsigned>(a.n_mat));
  gemv_warp_tokens_kernel<T, NTOK, kR, WPR><<<grid, kRowsThreads, 0, stream>>>(a);
}

template <int T, int NTOK>
void launch_warp_tokens_n(const GemvArgs &a, cudaStream_t stream) {
  // the one-token q8_0 kernel's split (a q8_0 token's sums then equal that kernel's)
  if (a.n < kQ8SplitBelowRows) launch_warp_tokens_wpr<T, NTOK, 4>(a, stream);
  else launch_warp_tokens_wpr<T, NTOK, 1>(a, stream);
}

// 2..kGemvMaxTokens tokens, each count its own kernel.
template <int T>
void launch_warp_tokens(const GemvArgs &a, cudaStream_t stream) {
  static_assert(kGemvMaxTokens == 8, "instantiate every token count");
  switch (a.n_tok) {
    case 2: return launch_warp_tokens_n<T, 2>(a, stream);
    case 3: return launch_warp_tokens_n<T, 3>(a, stream);
    case 4: return launch_warp_tokens_n<T, 4>(a, stream);
    case 5: return launch_warp_tokens_n<T, 5>(a, stream);
    case 6: return launch_warp_tokens_n<T, 6>(a, stream);
    case 7: return launch_warp_tokens_n<T, 7>(a, stream);
    case 8: return launch_warp_tokens_n<T, 8>(a, stream);
    default:
      throw Error(Status::invalid_argument, "launch_gemv_rows: n_tok " + std::to_string(a.n_tok) + " outside 2..8");
  }
}

template <int WPR>
void launch_q8_0_warps(const GemvArgs &a, cudaStream_t stream) {
  constexpr int kRowsPerBlock = kRowsThreads / 32 / WPR * kQ8Rows;
  const dim3 grid(static_cast<unsigned>((a.n + kRowsPerBlock - 1) / kRowsPerBlock), static_cast<unsigned>(a.n_mat));
  gemv_q8_0_warp_kernel<WPR><<<grid, kRowsThreads, 0, stream>>>(a);
}

// The per-lane row kernel for 1, 2, 4 or 8 tokens (n_tok rounded up; the lanes skip the tokens
// past n_tok): floats with k not a multiple of 256 only (small test models), so they do not take
// eight instantiations per lane count.
template <int T, int LPR>
void launch_lanes(const GemvArgs &a, cudaStream_t stream) {
  constexpr int kRowsPerBlock = kRowsThreads / LPR;
  const dim3 grid(static_cast<unsigned>((a.n + kRowsPerBlock - 1) / kRowsPerBlock), static_cast<unsigned>(a.n_mat));
  if (a.n_tok == 1) gemv_rows_kernel<T, LPR, 1><<<grid, kRowsThreads, 0, stream>>>(a);
  else if (a.n_tok == 2) gemv_rows_kernel<T, LPR, 2><<<grid, kRowsThreads, 0, stream>>>(a);
  else if (a.n_tok <= 4) gemv_rows_kernel<T, LPR, 4><<<grid, kRowsThreads, 0, stream>>>(a);
  else gemv_rows_kernel<T, LPR, kGemvMaxTokens><<<grid, kRowsThreads, 0, stream>>>(a);
}

template <int T>
void launch_type(const GemvArgs &a, cudaStream_t stream) {
  if constexpr (T == kQ8_0) {  // k is a multiple of 256 (gemv_rows_covers)
    if (a.n_tok > 1) launch_warp_tokens<T>(a, stream);
    else if (a.n < kQ8SplitBelowRows) launch_q8_0_warps<4>(a, stream);
    else launch_q8_0_warps<1>(a, stream);
  } else {
    if (a.n_tok > 1 && a.k % 256 == 0) return launch_warp_tokens<T>(a, stream);
    const int64_t pieces = a.k / DecFloat<T>::kValues;  // per row
    if (pieces >= 256) launch_lanes<T, 128>(a, stream);
    else if (pieces >= 64) launch_lanes<T, 32>(a, stream);
    else if (pieces >= 8) launch_lanes<T, 8>(a, stream);
    else launch_lanes<T, 4>(a, stream);
  }
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
