// Dequantization kernels: rows of any supported type to f32 (bit-exact with ggml) or bf16
// (the f32 value rounded to nearest even), embedding lookup, f32 → bf16; which types the GEMV
// kernels run (the others are dequantized for cuBLAS).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "gpu/check.hpp"
#include "backend/cuda/dequant_unit.cuh"
#include "backend/cuda/dispatch.cuh"
#include "backend/cuda/kernels.hpp"

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

void launch_f32_to_bf16(const float *x, uint16_t *y, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  f32_to_bf16_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(x, reinterpret_cast<__nv_bfloat16 *>(y), n);
  EP_CUDA_CHECK_LAUNCH("f32_to_bf16_kernel");
}

}  // namespace ep::backend::cuda
