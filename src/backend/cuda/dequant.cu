// Dequantization kernels: rows of any supported type to f32 (bit-exact with ggml) or bf16
// (the f32 value rounded to nearest even), or to the f16 halves of the split GEMM (split_f16.cuh,
// with the activations' split and the scales' undoing), embedding lookup, f32 → bf16; which types
// the GEMV kernels run (the others are dequantized for cuBLAS).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "gpu/check.hpp"
#include "backend/cuda/dequant_unit.cuh"
#include "backend/cuda/dispatch.cuh"
#include "backend/cuda/kernels.hpp"
#include "backend/cuda/reduce.cuh"
#include "backend/cuda/split_f16.cuh"

#include <algorithm>

namespace ep::backend::cuda {
namespace {

using namespace quant;

// One thread per 32-value unit. Rows r of k values; src row r at src + r·row_bytes.
template <int T, bool kBf16>
__global__ void dequant_kernel(const uint8_t *__restrict__ src, int64_t k, int64_t rows, const int32_t *__restrict__ ids,
                               int64_t vocab, float *__restrict__ dst_f32, __nv_bfloat16 *__restrict__ dst_bf16) {
  using Tr = Traits<T>;
  constexpr int kUnits = Tr::elems / 32;
  const int64_t units_per_row = k / 32;
  const int64_t unit = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (unit >= units_per_row * rows) return;
  const int64_t r = unit / units_per_row, ur = unit % units_per_row;
  const int64_t row_bytes = k / Tr::elems * Tr::bytes;
  float v[32];
  int64_t src_row = r;
  bool valid = true;
  if (ids) {
    src_row = ids[r];
    valid = src_row >= 0 && src_row < vocab;
  }
  if (valid) {
    unit_values<T>(src + src_row * row_bytes + (ur / kUnits) * Tr::bytes, static_cast<int>(ur % kUnits), v);
  } else {
#pragma unroll
    for (int l = 0; l < 32; ++l) v[l] = __int_as_float(0x7fc00000);
  }
  const int64_t out = r * k + ur * 32;
  if constexpr (kBf16) {
    uint32_t packed[16];
#pragma unroll
    for (int l = 0; l < 16; ++l) {
      const __nv_bfloat162 b2 = __floats2bfloat162_rn(v[2 * l], v[2 * l + 1]);
      packed[l] = *reinterpret_cast<const uint32_t *>(&b2);
    }
    uint4 *o = reinterpret_cast<uint4 *>(dst_bf16 + out);  // 64 bytes, 16-byte aligned
#pragma unroll
    for (int q = 0; q < 4; ++q) o[q] = make_uint4(packed[4 * q], packed[4 * q + 1], packed[4 * q + 2], packed[4 * q + 3]);
  } else {
    float4 *o = reinterpret_cast<float4 *>(dst_f32 + out);
#pragma unroll
    for (int q = 0; q < 8; ++q) o[q] = make_float4(v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]);
  }
}

__global__ void f32_to_bf16_kernel(const float *__restrict__ x, __nv_bfloat16 *__restrict__ y, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = __float2bfloat16_rn(x[i]);
}

void launch(uint32_t type, const void *src, int64_t k, int64_t rows, const int32_t *ids, int64_t vocab, float *dst_f32,
            uint16_t *dst_bf16, cudaStream_t stream) {
  if (k % 32 != 0) throw Error(Status::shape, "dequant: row of " + std::to_string(k) + " values is not a multiple of 32");
  if ((dst_f32 == nullptr) == (dst_bf16 == nullptr))
    throw Error(Status::invalid_argument, "dequant: exactly one of dst_f32 / dst_bf16 must be given");
  const int64_t units = k / 32 * rows;
  if (units == 0) return;
  dispatch_dequant_type(type, "dequant", [&](auto tag) {
    constexpr int T = decltype(tag)::value;
    if (k % Traits<T>::elems != 0)
      throw Error(Status::shape, "dequant: row of " + std::to_string(k) + " values is not a whole number of blocks");
    const unsigned blocks = static_cast<unsigned>((units + 255) / 256);
    const auto *s = static_cast<const uint8_t *>(src);
    if (dst_bf16) {
      dequant_kernel<T, true><<<blocks, 256, 0, stream>>>(s, k, rows, ids, vocab, nullptr,
                                                          reinterpret_cast<__nv_bfloat16 *>(dst_bf16));
    } else {
      dequant_kernel<T, false><<<blocks, 256, 0, stream>>>(s, k, rows, ids, vocab, dst_f32, nullptr);
    }
    EP_CUDA_CHECK_LAUNCH("dequant_kernel");
  });
}

}  // namespace

bool gemv_runs_type(uint32_t type) { return format::ggml_compute(type) == format::GgmlCompute::gemv; }

void launch_dequant_rows(uint32_t type, const void *src, int64_t k, int64_t rows, float *dst_f32, uint16_t *dst_bf16,
                         cudaStream_t stream) {
  launch(type, src, k, rows, nullptr, 0, dst_f32, dst_bf16, stream);
}

void launch_embed(uint32_t type, const void *table, int64_t d, int64_t vocab, const int32_t *ids, int64_t n_ids, float *y,
                  cudaStream_t stream) {
  launch(type, table, d, n_ids, ids, vocab, y, nullptr, stream);
}

namespace {

template <typename W>
__device__ float plain_value(const W *w, int64_t i);
template <>
__device__ float plain_value<float>(const float *w, int64_t i) { return w[i]; }
template <>
__device__ float plain_value<__half>(const __half *w, int64_t i) { return __half2float(w[i]); }
template <>
__device__ float plain_value<__nv_bfloat16>(const __nv_bfloat16 *w, int64_t i) { return __bfloat162float(w[i]); }

// One warp per output (row r = blockIdx.x · 4 + warp, token t = blockIdx.y).
template <typename W>
__global__ void matmul_plain_kernel(const W *__restrict__ w, const float *__restrict__ x, float *__restrict__ y, int64_t k,
                                    int64_t n) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * 4 + threadIdx.x / 32;
  const int64_t t = blockIdx.y;
  const int lane = threadIdx.x % 32;
  if (r >= n) return;
  float s = 0.0f;
  for (int64_t i = lane; i < k; i += 32) s += plain_value(w, r * k + i) * x[t * k + i];
  for (int off = 16; off > 0; off /= 2) s += __shfl_down_sync(0xffffffffu, s, off);
  if (lane == 0) y[t * n + r] = s;
}

}  // namespace

void launch_matmul_plain(uint32_t type, const void *w, const float *x, float *y, int64_t k, int64_t n, int64_t t,
                         cudaStream_t stream) {
  if (n == 0 || t == 0) return;
  if (t > 65535) throw Error(Status::invalid_argument, "matmul_plain: " + std::to_string(t) + " tokens (at most 65535)");
  const dim3 grid(static_cast<unsigned>((n + 3) / 4), static_cast<unsigned>(t));
  switch (type) {
    case 0: matmul_plain_kernel<<<grid, 128, 0, stream>>>(static_cast<const float *>(w), x, y, k, n); break;
    case 1: matmul_plain_kernel<<<grid, 128, 0, stream>>>(static_cast<const __half *>(w), x, y, k, n); break;
    case 30: matmul_plain_kernel<<<grid, 128, 0, stream>>>(static_cast<const __nv_bfloat16 *>(w), x, y, k, n); break;
    default: throw Error(Status::unsupported, "matmul_plain: ggml type " + std::to_string(type) + " is not f32/f16/bf16");
  }
  EP_CUDA_CHECK_LAUNCH("matmul_plain_kernel");
}

namespace {

constexpr int kSplitKeep = 2;  // units per thread kept in registers between the max and the split

// hi, hi and lo of 2·16 values at the row's scale, as 16 words each (value 2l in the low half).
__device__ __forceinline__ void split_words(const float (&v)[32], float scale, uint32_t (&hi)[16], uint32_t (&lo)[16]) {
#pragma unroll
  for (int l = 0; l < 16; ++l) {
    const split::Halves a = split::split(v[2 * l], scale), b = split::split(v[2 * l + 1], scale);
    hi[l] = a.hi | (static_cast<uint32_t>(b.hi) << 16);
    lo[l] = a.lo | (static_cast<uint32_t>(b.lo) << 16);
  }
}

// One block per weight row (blockIdx.x): its 32-value units decoded by the type's unit decoder
// (kSplitKeep per thread kept in registers, any further ones decoded again), the row's largest
// |value| reduced over the block, then every value split at the row's power of two. Row r of dst
// (3k halves): [hi | lo | hi], the A operand of the one-GEMM product; exps[r]: the exponent.
template <int T>
__global__ void dequant_split_kernel(const uint8_t *__restrict__ src, int64_t k, uint16_t *__restrict__ dst,
                                     int32_t *__restrict__ exps) {
  using Tr = Traits<T>;
  constexpr int kUnits = Tr::elems / 32;
  const int64_t r = blockIdx.x, units = k / 32;
  const uint8_t *row = src + r * (k / Tr::elems * Tr::bytes);
  const auto decode = [&](int64_t u, float (&v)[32]) {
    unit_values<T>(row + (u / kUnits) * Tr::bytes, static_cast<int>(u % kUnits), v);
  };
  float kept[kSplitKeep][32];
  float m = 0.0f;  // fmaxf drops NaN: a NaN value stays NaN in its halves whatever the scale
#pragma unroll
  for (int j = 0; j < kSplitKeep; ++j) {
    const int64_t u = threadIdx.x + static_cast<int64_t>(j) * blockDim.x;
    if (u < units) {
      decode(u, kept[j]);
#pragma unroll
      for (int l = 0; l < 32; ++l) m = fmaxf(m, fabsf(kept[j][l]));
    }
  }
  for (int64_t u = threadIdx.x + static_cast<int64_t>(kSplitKeep) * blockDim.x; u < units; u += blockDim.x) {
    float v[32];
    decode(u, v);
#pragma unroll
    for (int l = 0; l < 32; ++l) m = fmaxf(m, fabsf(v[l]));
  }
  m = block_reduce(m, MaxOp{}, 0.0f);
  const int e = split::scale_exponent(m);
  const float scale = split::pow2(e);
  if (threadIdx.x == 0) exps[r] = e;
  uint16_t *out = dst + r * 3 * k;
  const auto store = [&](int64_t u, const float (&v)[32]) {
    uint32_t hi[16], lo[16];
    split_words(v, scale, hi, lo);
    // 64 bytes per part; 16-byte aligned (k is a multiple of 32)
    uint4 *h0 = reinterpret_cast<uint4 *>(out + u * 32), *h1 = reinterpret_cast<uint4 *>(out + 2 * k + u * 32);
    uint4 *l0 = reinterpret_cast<uint4 *>(out + k + u * 32);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const uint4 hq = make_uint4(hi[4 * q], hi[4 * q + 1], hi[4 * q + 2], hi[4 * q + 3]);
      h0[q] = hq;
      h1[q] = hq;
      l0[q] = make_uint4(lo[4 * q], lo[4 * q + 1], lo[4 * q + 2], lo[4 * q + 3]);
    }
  };
#pragma unroll
  for (int j = 0; j < kSplitKeep; ++j) {
    const int64_t u = threadIdx.x + static_cast<int64_t>(j) * blockDim.x;
    if (u < units) store(u, kept[j]);
  }
  for (int64_t u = threadIdx.x + static_cast<int64_t>(kSplitKeep) * blockDim.x; u < units; u += blockDim.x) {
    float v[32];
    decode(u, v);
    store(u, v);
  }
}

// One block per token (blockIdx.x) of x [t][k]: its largest |value|, then its halves at its power
// of two. Token i of dst (3k halves): [lo ; hi ; hi], the B operand; exps[i]: the exponent. x is
// read as pairs of floats (4-byte alignment suffices: x may be a view).
__global__ void split_tokens_kernel(const float *__restrict__ x, int64_t k, uint16_t *__restrict__ dst,
                                    int32_t *__restrict__ exps) {
  const int64_t i = blockIdx.x, pairs = k / 2;
  const float *row = x + i * k;
  float m = 0.0f;
  for (int64_t p = threadIdx.x; p < pairs; p += blockDim.x) m = fmaxf(m, fmaxf(fabsf(row[2 * p]), fabsf(row[2 * p + 1])));
  m = block_reduce(m, MaxOp{}, 0.0f);
  const int e = split::scale_exponent(m);
  const float scale = split::pow2(e);
  if (threadIdx.x == 0) exps[i] = e;
  auto *out = reinterpret_cast<uint32_t *>(dst + i * 3 * k);  // k is even: every part 4-byte aligned
  for (int64_t p = threadIdx.x; p < pairs; p += blockDim.x) {
    const split::Halves a = split::split(row[2 * p], scale), b = split::split(row[2 * p + 1], scale);
    const uint32_t hi = a.hi | (static_cast<uint32_t>(b.hi) << 16), lo = a.lo | (static_cast<uint32_t>(b.lo) << 16);
    out[p] = lo;
    out[pairs + p] = hi;
    out[2 * pairs + p] = hi;
  }
}

// y [t][n]: y[i][r] · 2^−(row_exps[r] + tok_exps[i]), exactly (ldexpf rounds only a result
// below f32's normal range, as the unscaled sum would have been).
__global__ void unscale_split_kernel(float *__restrict__ y, int64_t n, int64_t total, const int32_t *__restrict__ row_exps,
                                     const int32_t *__restrict__ tok_exps) {
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < total;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = j / n;
    y[j] = ldexpf(y[j], -(row_exps[j - i * n] + tok_exps[i]));
  }
}

}  // namespace

void launch_dequant_rows_split(uint32_t type, const void *src, int64_t k, int64_t rows, uint16_t *dst, int32_t *exps,
                               cudaStream_t stream) {
  if (k % 32 != 0)
    throw Error(Status::shape, "dequant_split: row of " + std::to_string(k) + " values is not a multiple of 32");
  if (rows == 0) return;
  if (rows > 0x7FFFFFFF) throw Error(Status::invalid_argument, "dequant_split: " + std::to_string(rows) + " rows in one launch");
  dispatch_dequant_type(type, "dequant_split", [&](auto tag) {
    constexpr int T = decltype(tag)::value;
    if (k % Traits<T>::elems != 0)
      throw Error(Status::shape, "dequant_split: row of " + std::to_string(k) + " values is not a whole number of blocks");
    const int64_t units = k / 32;
    const int64_t per_thread = (units + kSplitKeep - 1) / kSplitKeep;
    const unsigned threads = static_cast<unsigned>(std::min<int64_t>(256, std::max<int64_t>(32, (per_thread + 31) / 32 * 32)));
    dequant_split_kernel<T><<<static_cast<unsigned>(rows), threads, 0, stream>>>(static_cast<const uint8_t *>(src), k, dst, exps);
    EP_CUDA_CHECK_LAUNCH("dequant_split_kernel");
  });
}

void launch_split_tokens(const float *x, int64_t k, int64_t t, uint16_t *dst, int32_t *exps, cudaStream_t stream) {
  if (k % 2 != 0) throw Error(Status::shape, "split_tokens: rows of " + std::to_string(k) + " values (expected an even count)");
  if (t == 0 || k == 0) return;
  if (t > 0x7FFFFFFF) throw Error(Status::invalid_argument, "split_tokens: " + std::to_string(t) + " tokens in one launch");
  split_tokens_kernel<<<static_cast<unsigned>(t), 256, 0, stream>>>(x, k, dst, exps);
  EP_CUDA_CHECK_LAUNCH("split_tokens_kernel");
}

void launch_unscale_split(float *y, int64_t n, int64_t t, const int32_t *row_exps, const int32_t *tok_exps,
                          cudaStream_t stream) {
  const int64_t total = n * t;
  if (total == 0) return;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((total + 255) / 256, 8192));
  unscale_split_kernel<<<blocks, 256, 0, stream>>>(y, n, total, row_exps, tok_exps);
  EP_CUDA_CHECK_LAUNCH("unscale_split_kernel");
}

void launch_f32_to_bf16(const float *x, uint16_t *y, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  f32_to_bf16_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(x, reinterpret_cast<__nv_bfloat16 *>(y), n);
  EP_CUDA_CHECK_LAUNCH("f32_to_bf16_kernel");
}

}  // namespace ep::backend::cuda
