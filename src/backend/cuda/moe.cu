// MoE routing and combination: router scoring (softmax, sigmoid, sqrt-softplus), bias-corrected
// top-k or hash routing, renormalisation and scaling; generic top-k; weighted combine; row
// gather / scatter for the grouped (prefill) expert path.
#include "gpu/check.hpp"
#include "backend/cuda/kernels.hpp"
#include "backend/cuda/reduce.cuh"

#include <string>

namespace ep::backend::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxK = 64;

__device__ __forceinline__ bool after(float v, int32_t i, float pv, int32_t pi) {
  return v < pv || (v == pv && i > pi);
}

__global__ void route_kernel(const float *__restrict__ logits, int64_t n_exp, const RouteArgs a, int32_t *ids, float *weights) {
  extern __shared__ float s[];  // scores [n_exp]
  __shared__ int32_t chosen[kMaxK];
  const int64_t t = blockIdx.x;
  const float *lr = logits + t * n_exp;
  if (a.scoring == 0) {
    float m = -INFINITY;
    for (int64_t e = threadIdx.x; e < n_exp; e += blockDim.x) m = fmaxf(m, lr[e]);
    m = block_reduce(m, MaxOp{}, -INFINITY);
    float sum = 0.0f;
    for (int64_t e = threadIdx.x; e < n_exp; e += blockDim.x) sum += (s[e] = expf(lr[e] - m));
    sum = block_reduce(sum, SumOp{}, 0.0f);
    for (int64_t e = threadIdx.x; e < n_exp; e += blockDim.x) s[e] /= sum;
  } else {
    for (int64_t e = threadIdx.x; e < n_exp; e += blockDim.x) {
      const float l = lr[e];
      s[e] = a.scoring == 1 ? 1.0f / (1.0f + expf(-l)) : sqrtf(l > 20.0f ? l : log1pf(expf(l)));
    }
  }
  __syncthreads();
  if (a.hash_table) {
    if (threadIdx.x < a.k) {
      const int32_t tok = a.token_ids[t];
      int32_t e = -1;
      if (tok >= 0 && tok < a.hash_vocab) e = a.hash_table[static_cast<int64_t>(tok) * a.k + threadIdx.x];
      chosen[threadIdx.x] = e >= 0 && e < n_exp ? e : -1;
    }
  } else {
    float pv = INFINITY;
    int32_t pi = -1;
    for (int j = 0; j < a.k; ++j) {
      Best b{0.0f, INT32_MAX};
      for (int64_t e = threadIdx.x; e < n_exp; e += blockDim.x) {
        const float v = a.bias ? s[e] + a.bias[e] : s[e];
        const int32_t i = static_cast<int32_t>(e);
        if (after(v, i, pv, pi) && (b.i == INT32_MAX || better(Best{v, i}, b))) b = Best{v, i};
      }
      b = block_best(b);
      if (threadIdx.x == 0) chosen[j] = b.i == INT32_MAX ? -1 : b.i;
      pv = b.v;
      pi = b.i;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float w[kMaxK];
    float sum = 0.0f;
    for (int j = 0; j < a.k; ++j) {
      w[j] = chosen[j] >= 0 ? s[chosen[j]] : __int_as_float(0x7fc00000);
      sum += w[j];
    }
    for (int j = 0; j < a.k; ++j) {
      ids[t * a.k + j] = chosen[j];
      weights[t * a.k + j] = (a.renormalize ? w[j] / sum : w[j]) * a.scale;
    }
  }
}

__global__ void top_k_kernel(const float *__restrict__ x, int64_t n, int32_t k, int32_t *indices, float *values) {
  const int64_t r = blockIdx.x;
  const float *xr = x + r * n;
  float pv = INFINITY;
  int32_t pi = -1;
  for (int j = 0; j < k; ++j) {
    Best b{0.0f, INT32_MAX};
    for (int64_t e = threadIdx.x; e < n; e += blockDim.x) {
      const float v = xr[e];
      const int32_t i = static_cast<int32_t>(e);
      if (after(v, i, pv, pi) && (b.i == INT32_MAX || better(Best{v, i}, b))) b = Best{v, i};
    }
    b = block_best(b);
    if (threadIdx.x == 0) {
      indices[r * k + j] = b.i == INT32_MAX ? -1 : b.i;
      values[r * k + j] = b.i == INT32_MAX ? __int_as_float(0x7fc00000) : b.v;
    }
    pv = b.v;
    pi = b.i;
  }
}

__global__ void combine_kernel(const float *__restrict__ o, const float *__restrict__ w, int64_t d, int64_t n_tok, int32_t k,
                               float *__restrict__ y) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= d * n_tok) return;
  const int64_t t = idx / d, i = idx % d;
  float acc = 0.0f;
  for (int j = 0; j < k; ++j) acc += w[t * k + j] * o[(t * k + j) * d + i];
  y[idx] = acc;
}

__global__ void gather_kernel(const float *__restrict__ x, const int32_t *__restrict__ rows, int64_t d, int64_t n,
                              float *__restrict__ out) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= d * n) return;
  const int32_t r = rows[idx / d];
  out[idx] = r >= 0 ? x[static_cast<int64_t>(r) * d + idx % d] : 0.0f;
}

__global__ void scatter_kernel(const float *__restrict__ src, const int32_t *__restrict__ rows, int64_t d, int64_t n,
                               float *__restrict__ out) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= d * n) return;
  const int32_t r = rows[idx / d];
  if (r >= 0) out[static_cast<int64_t>(r) * d + idx % d] = src[idx];
}

unsigned blocks_for(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

}  // namespace

void launch_route(const float *logits, int64_t n_experts, int64_t n_tok, const RouteArgs &args, int32_t *ids,
                  float *weights, cudaStream_t stream) {
  if (args.k < 1 || args.k > kMaxK || args.k > n_experts)
    throw Error(Status::unsupported, "launch_route: k = " + std::to_string(args.k) + " outside 1..min(64, n_experts)");
  if (n_experts > 12288)
    throw Error(Status::unsupported, "launch_route: " + std::to_string(n_experts) + " experts (at most 12288)");
  if (n_tok == 0) return;
  route_kernel<<<static_cast<unsigned>(n_tok), kThreads, static_cast<size_t>(n_experts) * sizeof(float), stream>>>(
      logits, n_experts, args, ids, weights);
  EP_CUDA_CHECK_LAUNCH("route_kernel");
}

void launch_top_k(const float *x, int64_t n, int64_t rows, int32_t k, int32_t *indices, float *values, cudaStream_t stream) {
  if (rows == 0) return;
  top_k_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, n, k, indices, values);
  EP_CUDA_CHECK_LAUNCH("top_k_kernel");
}

void launch_moe_combine(const float *o, const float *w, int64_t d, int64_t n_tok, int32_t k, float *y, cudaStream_t stream) {
  if (d * n_tok == 0) return;
  combine_kernel<<<blocks_for(d * n_tok), kThreads, 0, stream>>>(o, w, d, n_tok, k, y);
  EP_CUDA_CHECK_LAUNCH("combine_kernel");
}

void launch_gather_rows(const float *x, const int32_t *rows, int64_t d, int64_t n, float *out, cudaStream_t stream) {
  if (d * n == 0) return;
  gather_kernel<<<blocks_for(d * n), kThreads, 0, stream>>>(x, rows, d, n, out);
  EP_CUDA_CHECK_LAUNCH("gather_kernel");
}

void launch_scatter_rows(const float *src, const int32_t *rows, int64_t d, int64_t n, float *out, cudaStream_t stream) {
  if (d * n == 0) return;
  scatter_kernel<<<blocks_for(d * n), kThreads, 0, stream>>>(src, rows, d, n, out);
  EP_CUDA_CHECK_LAUNCH("scatter_kernel");
}

namespace {

__global__ void gather_role_table_kernel(const int32_t *__restrict__ ids, int64_t n, const void *const *__restrict__ slots,
                                         int64_t n_experts, uint64_t gate_offset, uint64_t up_offset, uint64_t down_offset,
                                         const void **out) {
  const int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (p >= n) return;
  const int32_t e = ids[p];
  const auto *base = e >= 0 && e < n_experts ? static_cast<const unsigned char *>(slots[e]) : nullptr;
  out[p] = base ? base + gate_offset : nullptr;
  out[n + p] = base ? base + up_offset : nullptr;
  out[2 * n + p] = base ? base + down_offset : nullptr;
}

__global__ void pair_tokens_kernel(int64_t n, int32_t k, int32_t *out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < 2 * n) out[i] = static_cast<int32_t>((i % n) / k);
}

}  // namespace

void launch_gather_role_table(const int32_t *ids, int64_t n, const void *const *slots, int64_t n_experts, uint64_t gate_offset,
                              uint64_t up_offset, uint64_t down_offset, const void **out, cudaStream_t stream) {
  if (n == 0) return;
  gather_role_table_kernel<<<blocks_for(n), kThreads, 0, stream>>>(ids, n, slots, n_experts, gate_offset, up_offset,
                                                                   down_offset, out);
  EP_CUDA_CHECK_LAUNCH("gather_role_table_kernel");
}

void launch_pair_tokens(int64_t n, int32_t k, int32_t *out, cudaStream_t stream) {
  if (n == 0) return;
  pair_tokens_kernel<<<blocks_for(2 * n), kThreads, 0, stream>>>(n, k, out);
  EP_CUDA_CHECK_LAUNCH("pair_tokens_kernel");
}

}  // namespace ep::backend::cuda
