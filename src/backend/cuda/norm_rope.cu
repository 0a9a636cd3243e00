// Row-wise and elementwise ops: RMSNorm, RoPE (partial, interleaved pairs, YaRN frequencies
// computed on the host), softmax, gated activations (clamped SwiGLU, SiTU), add.
#include "backend/cuda/activation.cuh"
#include "gpu/check.hpp"
#include "backend/cuda/kernels.hpp"
#include "backend/cuda/reduce.cuh"

#include <cstdint>
#include <string>

namespace ep::backend::cuda {
namespace {

constexpr int kThreads = 256;

// One row per block. vec: rows of a multiple of 4 values, x, w and y 16-byte aligned: float4
// loads, several in flight per thread.
__global__ void rms_norm_kernel(const float *__restrict__ x, const float *__restrict__ w, float eps, int64_t n, bool vec,
                                float *__restrict__ y) {
  const float *xr = x + blockIdx.x * n;
  float *yr = y + blockIdx.x * n;
  float ss = 0.0f;
  if (vec) {
    const float4 *x4 = reinterpret_cast<const float4 *>(xr);
#pragma unroll 4
    for (int64_t i = threadIdx.x; i < n / 4; i += blockDim.x) {
      const float4 v = x4[i];
      ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
  } else {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
  }
  ss = block_reduce(ss, SumOp{}, 0.0f);
  const float scale = 1.0f / sqrtf(ss / static_cast<float>(n) + eps);
  if (vec) {
    const float4 *x4 = reinterpret_cast<const float4 *>(xr), *w4 = reinterpret_cast<const float4 *>(w);
    float4 *y4 = reinterpret_cast<float4 *>(yr);
#pragma unroll 4
    for (int64_t i = threadIdx.x; i < n / 4; i += blockDim.x) {
      float4 v = x4[i];
      v.x *= scale;
      v.y *= scale;
      v.z *= scale;
      v.w *= scale;
      if (w) {
        const float4 g = w4[i];
        v.x *= g.x;
        v.y *= g.y;
        v.z *= g.z;
        v.w *= g.w;
      }
      y4[i] = v;
    }
  } else {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) yr[i] = w ? xr[i] * scale * w[i] : xr[i] * scale;
  }
}

__global__ void rope_kernel(const float *__restrict__ x, const int32_t *__restrict__ pos, const RopeArgs a, float *y) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t total = a.head_dim * a.n_heads * a.n_tokens;
  if (idx >= total) return;
  const int64_t d = idx % a.head_dim;
  const int64_t t = idx / (a.head_dim * a.n_heads);
  const int64_t rel = d - a.dim_offset;
  if (rel < 0 || rel >= 2 * a.n_pairs) {
    if (y != x) y[idx] = x[idx];
    return;
  }
  if (rel & 1) return;  // the even element handles the pair
  const float angle = static_cast<float>(pos[t]) * a.inv_freq[rel / 2];
  const float c = cosf(angle) * a.attention_factor;
  float s = sinf(angle) * a.attention_factor;
  if (a.inverse) s = -s;
  const float x0 = x[idx], x1 = x[idx + 1];
  y[idx] = x0 * c - x1 * s;
  y[idx + 1] = x0 * s + x1 * c;
}

__global__ void softmax_kernel(const float *__restrict__ x, int64_t n, float *y) {
  const float *xr = x + blockIdx.x * n;
  float *yr = y + blockIdx.x * n;
  float m = -INFINITY;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, xr[i]);
  m = block_reduce(m, MaxOp{}, -INFINITY);
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) sum += expf(xr[i] - m);
  sum = block_reduce(sum, SumOp{}, 0.0f);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) yr[i] = expf(xr[i] - m) / sum;
}

__global__ void glu_kernel(const float *g, const float *u, int64_t n, int kind, float limit, float bg, float bu, float *y) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = glu_activation(g[i], u[i], kind, limit, bg, bu);
}

__global__ void add_kernel(const float *a, const float *b, int64_t n, float *y) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a[i] + b[i];
}

unsigned blocks_for(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

}  // namespace

void launch_rms_norm(const float *x, const float *weight, float eps, int64_t n, int64_t rows, float *y, cudaStream_t stream) {
  if (rows == 0) return;
  auto aligned = [](const void *p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; };
  const bool vec = n % 4 == 0 && aligned(x) && aligned(y) && (weight == nullptr || aligned(weight));
  // few rows (decode): a wide block per row, so one row's reads are spread over many threads
  const int threads = rows < 128 ? 1024 : kThreads;
  rms_norm_kernel<<<static_cast<unsigned>(rows), threads, 0, stream>>>(x, weight, eps, n, vec, y);
  EP_CUDA_CHECK_LAUNCH("rms_norm_kernel");
}

void launch_rope(const float *x, const int32_t *positions, const RopeArgs &args, float *y, cudaStream_t stream) {
  if (args.n_pairs < 0 || args.n_pairs > kRopeMaxPairs)
    throw Error(Status::unsupported, "launch_rope: " + std::to_string(args.n_pairs) + " rotated pairs (at most 256)");
  const int64_t total = args.head_dim * args.n_heads * args.n_tokens;
  if (total == 0) return;
  rope_kernel<<<blocks_for(total), kThreads, 0, stream>>>(x, positions, args, y);
  EP_CUDA_CHECK_LAUNCH("rope_kernel");
}

void launch_softmax(const float *x, int64_t n, int64_t rows, float *y, cudaStream_t stream) {
  if (rows == 0) return;
  softmax_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, n, y);
  EP_CUDA_CHECK_LAUNCH("softmax_kernel");
}

void launch_glu(const float *gate, const float *up, int64_t n, int32_t kind, float limit, float beta_g, float beta_u,
                float *y, cudaStream_t stream) {
  if (n == 0) return;
  glu_kernel<<<blocks_for(n), kThreads, 0, stream>>>(gate, up, n, kind, limit, beta_g, beta_u, y);
  EP_CUDA_CHECK_LAUNCH("glu_kernel");
}

void launch_add(const float *a, const float *b, int64_t n, float *y, cudaStream_t stream) {
  if (n == 0) return;
  add_kernel<<<blocks_for(n), kThreads, 0, stream>>>(a, b, n, y);
  EP_CUDA_CHECK_LAUNCH("add_kernel");
}

}  // namespace ep::backend::cuda
