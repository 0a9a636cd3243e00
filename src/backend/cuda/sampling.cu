// Sampling on the device, one block per row: greedy (first maximum), or temperature + top-k (k-th
// largest found by a bitwise search over order-preserving float keys, ties at the k-th value
// kept) + top-p (the largest probability cut whose kept mass reaches top_p, found the same way)
// + min-p (relative to the most likely token) + a draw in vocabulary order with the host's
// seeded uniform u. The repetition penalty and the logit bias run first, on a copy of the logits. Sums in
// double, like the CPU reference, so both backends pick the same token. The log-probabilities are of the raw
// logits (log Σ exp in double here, the top alternatives by the top-k kernel). sample_rows_kernel runs
// the same device functions over a batch of rows, one block each, in one launch.
#include "gpu/check.hpp"
#include "backend/cuda/kernels.hpp"
#include "backend/cuda/reduce.cuh"

namespace ep::backend::cuda {
namespace {

constexpr int kThreads = 1024;

__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t b = __float_as_uint(f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float key_float(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

/// z[ids[j]] of the copy: / penalty when positive, × penalty otherwise (ids distinct, in range).
__global__ void repetition_penalty_kernel(float *__restrict__ z, const int32_t *__restrict__ ids, int32_t n_ids,
                                          float penalty) {
  const int32_t j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= n_ids) return;
  const float v = z[ids[j]];
  z[ids[j]] = v > 0.0f ? v / penalty : v * penalty;
}

/// z[ids[j]] += bias[j] on the copy (ids distinct, in range).
__global__ void logit_bias_kernel(float *__restrict__ z, const int32_t *__restrict__ ids, const float *__restrict__ bias,
                                  int32_t n_ids) {
  const int32_t j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j < n_ids) z[ids[j]] += bias[j];
}

__global__ void token_mask_kernel(float *__restrict__ z, int64_t n, const uint32_t *__restrict__ mask, int64_t n_words) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= n) return;
  const int64_t w = t / 32;
  if (w >= n_words || !(mask[w] >> (t % 32) & 1u)) z[t] = -INFINITY;
}

/// log Σ exp(z) of the raw row and the token's log-probability (one block of kThreads). @p token
/// is not __restrict__: sample_rows_kernel wrote it earlier in the same launch, so its load must
/// not take the read-only (non-coherent) path.
__device__ void token_logprob_row(const float *__restrict__ logits, int64_t n, const int32_t *token, double *out_lse,
                                  float *out_logprob) {
  float zmax = -INFINITY;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) zmax = fmaxf(zmax, logits[i]);
  zmax = block_reduce(zmax, MaxOp{}, -INFINITY);
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) sum += exp(static_cast<double>(logits[i]) - zmax);
  sum = block_reduce(sum, SumOp{}, 0.0);
  if (threadIdx.x == 0) {
    const double lse = zmax + log(sum);
    *out_lse = lse;
    const int32_t t = *token;
    *out_logprob = t >= 0 && t < n ? static_cast<float>(static_cast<double>(logits[t]) - lse) : __int_as_float(0x7fc00000);
  }
}

__global__ void token_logprob_kernel(const float *__restrict__ logits, int64_t n, const int32_t *__restrict__ token,
                                     double *out_lse, float *out_logprob) {
  token_logprob_row(logits, n, token, out_lse, out_logprob);
}

/// The draw from one row (one block of kThreads): greedy, or the cuts and the seeded draw.
/// @p logits is not __restrict__: in sample_rows_kernel it is the adjusted copy the block wrote
/// earlier in the same launch, whose loads must not take the read-only (non-coherent) path.
__device__ void sample_row(const float *logits, int64_t n, float temperature, int32_t top_k, float top_p,
                           float min_p, double u, float *__restrict__ p, int32_t *out) {
  __shared__ double scan[kThreads];
  const int tid = threadIdx.x;
  if (temperature <= 0.0f || top_k == 1) {
    Best b{0.0f, INT32_MAX};
    for (int64_t i = tid; i < n; i += kThreads) {
      const Best c{logits[i], static_cast<int32_t>(i)};
      if (b.i == INT32_MAX || better(c, b)) b = c;
    }
    b = block_best(b);
    if (tid == 0) *out = b.i == INT32_MAX ? -1 : b.i;
    return;
  }
  float zmax = -INFINITY;
  for (int64_t i = tid; i < n; i += kThreads) zmax = fmaxf(zmax, logits[i] / temperature);
  zmax = block_reduce(zmax, MaxOp{}, -INFINITY);
  uint32_t keep_key = 0;
  if (top_k > 0 && top_k < n) {
    for (int bit = 31; bit >= 0; --bit) {
      const uint32_t cand = keep_key | (1u << bit);
      int32_t count = 0;
      for (int64_t i = tid; i < n; i += kThreads) count += order_key(logits[i] / temperature) >= cand;
      count = block_reduce(count, SumOp{}, 0);
      if (count >= top_k) keep_key = cand;
    }
  }
  const float zkeep = top_k > 0 && top_k < n ? key_float(keep_key) : -INFINITY;
  for (int64_t i = tid; i < n; i += kThreads) {
    const float z = logits[i] / temperature;
    p[i] = z >= zkeep ? expf(z - zmax) : 0.0f;
  }
  __syncthreads();
  if (top_p < 1.0f) {
    double total = 0.0;
    for (int64_t i = tid; i < n; i += kThreads) total += p[i];
    total = block_reduce(total, SumOp{}, 0.0);
    const double target = static_cast<double>(top_p) * total;
    uint32_t cut = 0;  // bits of a positive float: ordered like the values
    for (int bit = 30; bit >= 0; --bit) {
      const uint32_t cand = cut | (1u << bit);
      double mass = 0.0;
      for (int64_t i = tid; i < n; i += kThreads) {
        const float v = p[i];
        if (v > 0.0f && __float_as_uint(v) >= cand) mass += v;
      }
      mass = block_reduce(mass, SumOp{}, 0.0);
      if (mass >= target) cut = cand;
    }
    const float cutf = __uint_as_float(cut);
    for (int64_t i = tid; i < n; i += kThreads)
      if (p[i] < cutf) p[i] = 0.0f;
    __syncthreads();
  }
  if (min_p > 0.0f) {  // relative to the most likely token, whose p is expf(0) = 1
    for (int64_t i = tid; i < n; i += kThreads)
      if (p[i] < min_p) p[i] = 0.0f;
    __syncthreads();
  }
  // draw in vocabulary order: contiguous chunks per thread, exclusive scan of chunk sums
  const int64_t chunk = (n + kThreads - 1) / kThreads;
  const int64_t begin = tid * chunk, end = begin + chunk < n ? begin + chunk : n;
  double local = 0.0;
  int32_t last = -1;
  for (int64_t i = begin; i < end; ++i)
    if (p[i] > 0.0f) {
      local += p[i];
      last = static_cast<int32_t>(i);
    }
  scan[tid] = local;
  __syncthreads();
  for (int off = 1; off < kThreads; off <<= 1) {
    const double add = tid >= off ? scan[tid - off] : 0.0;
    __syncthreads();
    scan[tid] += add;
    __syncthreads();
  }
  const double total = scan[kThreads - 1];
  const double prefix = scan[tid] - local;
  const int32_t last_kept = block_reduce(last, [](int32_t a, int32_t b) { return a > b ? a : b; }, -1);
  if (tid == 0) *out = last_kept;
  __syncthreads();
  const double target = u * total;
  if (local > 0.0 && prefix <= target && target < prefix + local) {
    double cum = prefix;
    for (int64_t i = begin; i < end; ++i) {
      if (p[i] <= 0.0f) continue;
      cum += p[i];
      if (cum > target) {
        *out = static_cast<int32_t>(i);
        break;
      }
    }
  }
}

__global__ void sample_kernel(const float *__restrict__ logits, int64_t n, float temperature, int32_t top_k, float top_p,
                              float min_p, double u, float *__restrict__ p, int32_t *out) {
  sample_row(logits, n, temperature, top_k, top_p, min_p, u, p, out);
}

/// The top_n largest raw logits of a row, descending (ties: lower index first): top_k_kernel's
/// selection (moe.cu), which is exact whatever the block size.
__device__ void top_logits_row(const float *__restrict__ x, int64_t n, int32_t k, int32_t *indices, float *values) {
  float pv = INFINITY;
  int32_t pi = -1;
  for (int j = 0; j < k; ++j) {
    Best b{0.0f, INT32_MAX};
    for (int64_t e = threadIdx.x; e < n; e += blockDim.x) {
      const float v = x[e];
      const int32_t i = static_cast<int32_t>(e);
      if ((v < pv || (v == pv && i > pi)) && (b.i == INT32_MAX || better(Best{v, i}, b))) b = Best{v, i};
    }
    b = block_best(b);
    if (threadIdx.x == 0) {
      indices[j] = b.i == INT32_MAX ? -1 : b.i;
      values[j] = b.i == INT32_MAX ? __int_as_float(0x7fc00000) : b.v;
    }
    pv = b.v;
    pi = b.i;
  }
}

/// Every row of a batched step in one launch, one block per row: what sample() runs as separate
/// launches for one row (the adjusted copy of the logits: the repetition penalty, the logit bias,
/// the token mask, each stage after the last; the draw; the log-probabilities and the top
/// alternatives of the raw row), with the same per-element operations and the same reductions.
__global__ void __launch_bounds__(kThreads)
    sample_rows_kernel(const SampleRowArgs *__restrict__ rows, SampleRowResult *__restrict__ results) {
  const SampleRowArgs a = rows[blockIdx.x];
  SampleRowResult *res = results + blockIdx.x;
  const int tid = threadIdx.x;
  const float *z = a.logits;
  if (a.adjusted) {
    for (int64_t i = tid; i < a.n; i += kThreads) a.adjusted[i] = a.logits[i];
    __syncthreads();
    for (int32_t j = tid; j < a.n_penalty; j += kThreads) {
      const float v = a.adjusted[a.penalty_ids[j]];
      a.adjusted[a.penalty_ids[j]] = v > 0.0f ? v / a.penalty : v * a.penalty;
    }
    __syncthreads();
    for (int32_t j = tid; j < a.n_bias; j += kThreads) a.adjusted[a.bias_ids[j]] += a.bias[j];
    __syncthreads();
    if (a.mask)
      for (int64_t t = tid; t < a.n; t += kThreads) {
        const int64_t w = t / 32;
        if (w >= a.mask_words || !(a.mask[w] >> (t % 32) & 1u)) a.adjusted[t] = -INFINITY;
      }
    __syncthreads();
    z = a.adjusted;
  }
  sample_row(z, a.n, a.temperature, a.top_k, a.top_p, a.min_p, a.u, a.probs, &res->token);
  if (!a.logprobs) return;
  __syncthreads();  // the token written above, visible to the block
  token_logprob_row(a.logits, a.n, &res->token, &res->lse, &res->logprob);
  if (a.top_n > 0) top_logits_row(a.logits, a.n, a.top_n, res->top_ids, res->top_logits);
}

}  // namespace

void launch_repetition_penalty(float *z, const int32_t *ids, int32_t n_ids, float penalty, cudaStream_t stream) {
  if (n_ids <= 0) return;
  repetition_penalty_kernel<<<(n_ids + 255) / 256, 256, 0, stream>>>(z, ids, n_ids, penalty);
  EP_CUDA_CHECK_LAUNCH("repetition_penalty_kernel");
}

void launch_logit_bias(float *z, const int32_t *ids, const float *bias, int32_t n_ids, cudaStream_t stream) {
  if (n_ids <= 0) return;
  logit_bias_kernel<<<(n_ids + 255) / 256, 256, 0, stream>>>(z, ids, bias, n_ids);
  EP_CUDA_CHECK_LAUNCH("logit_bias_kernel");
}

void launch_token_mask(float *z, int64_t n, const uint32_t *mask, int64_t n_words, cudaStream_t stream) {
  if (n <= 0) return;
  token_mask_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(z, n, mask, n_words);
  EP_CUDA_CHECK_LAUNCH("token_mask_kernel");
}

void launch_token_logprob(const float *logits, int64_t n, const int32_t *token, double *out_lse, float *out_logprob,
                          cudaStream_t stream) {
  token_logprob_kernel<<<1, kThreads, 0, stream>>>(logits, n, token, out_lse, out_logprob);
  EP_CUDA_CHECK_LAUNCH("token_logprob_kernel");
}

void launch_sample(const float *logits, int64_t n, float temperature, int32_t top_k, float top_p, float min_p, double u,
                   float *scratch, int32_t *out, cudaStream_t stream) {
  sample_kernel<<<1, kThreads, 0, stream>>>(logits, n, temperature, top_k, top_p, min_p, u, scratch, out);
  EP_CUDA_CHECK_LAUNCH("sample_kernel");
}

void launch_sample_rows(const SampleRowArgs *rows, int64_t n_rows, SampleRowResult *results, cudaStream_t stream) {
  if (n_rows <= 0) return;
  sample_rows_kernel<<<static_cast<unsigned>(n_rows), kThreads, 0, stream>>>(rows, results);
  EP_CUDA_CHECK_LAUNCH("sample_rows_kernel");
}

}  // namespace ep::backend::cuda
