// Kimi-Linear / Kimi-K3 kernels: depthwise causal short convolution + SiLU (outputs, then the
// state shift), row-wise l2 norm, sigmoid, the KDA decay gate, the KDA recurrence (one warp per
// (head, 32 value columns): each lane owns one column of the state, which needs no cross-lane
// reduction; the tile lives in shared memory and the tokens run in order inside the kernel), the
// gated RMS norm, causal multi-head attention (one block per (head, token), warps stream the
// visible keys with an online softmax, then merge) and the AttnRes mix (one block per token).
// Operation order follows the CPU reference (src/backend/cpu_backend_kimi.cpp).
#include "gpu/check.hpp"
#include "backend/cuda/kimi_kernels.hpp"
#include "backend/cuda/reduce.cuh"

#include <string>

namespace ep::backend::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kRowThreads = 128;
constexpr int kCausalWarps = 8;

unsigned blocks_for(int64_t n, int threads = kThreads) { return static_cast<unsigned>((n + threads - 1) / threads); }

__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }

__global__ void short_conv_kernel(const float *__restrict__ x, const float *__restrict__ w, int64_t C, int64_t n_tok, int K,
                                  const float *__restrict__ state, float *__restrict__ y) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= C * n_tok) return;
  const int64_t c = idx % C, t = idx / C;
  const int hist = K - 1;
  const float *wc = w + c * K;
  float acc = 0.0f;
  for (int j = 0; j < K; ++j) {
    const int64_t r = t + j;
    const float xv = r < hist ? state[r * C + c] : x[(r - hist) * C + c];
    acc += wc[j] * xv;
  }
  y[idx] = acc * sigmoid_f(acc);
}

// After short_conv_kernel (stream order): state ← the last K − 1 rows of [state; x].
__global__ void short_conv_state_kernel(const float *__restrict__ x, int64_t C, int64_t n_tok, int K, float *state) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int hist = K - 1;
  float next[15];
#pragma unroll
  for (int r = 0; r < 15; ++r) {
    if (r < hist) {
      const int64_t src = n_tok + r;  // row of [state; x]
      next[r] = src < hist ? state[src * C + c] : x[(src - hist) * C + c];
    }
  }
#pragma unroll
  for (int r = 0; r < 15; ++r)
    if (r < hist) state[r * C + c] = next[r];
}

__global__ void l2_normalize_kernel(const float *x, int64_t d, float eps, float s, float *y) {
  const int64_t row = blockIdx.x;
  const float *xr = x + row * d;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) ss += xr[i] * xr[i];
  ss = block_reduce(ss, SumOp{}, 0.0f);  // every read of x is done before y (may alias) is written
  const float inv = 1.0f / sqrtf(ss + eps);
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) y[row * d + i] = xr[i] * inv * s;
}

__global__ void sigmoid_kernel(const float *x, int64_t n, float *y) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = sigmoid_f(x[i]);
}

__global__ void kda_gate_kernel(const float *x, const float *__restrict__ bias, const float *__restrict__ a, float lower_bound,
                                int64_t dk, int64_t inner, int64_t n, float *g) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t ch = i % inner;
  const float ah = a[ch / dk], f = x[i] + bias[ch];
  float r;
  if (lower_bound < 0.0f) {
    r = lower_bound * sigmoid_f(-ah * f);
  } else {
    r = ah * (f > 20.0f ? f : log1pf(expf(f)));
  }
  g[i] = r;
}

// One warp per (head, 32 value columns); lane j owns column j of S (dk values in the shared tile
// S[i·32 + lane], conflict-free). Per token the warp stages q, k and exp(g) in shared memory.
__global__ void __launch_bounds__(32)
    kda_recurrence_kernel(const float *__restrict__ q, const float *__restrict__ k, const float *__restrict__ v,
                          const float *__restrict__ g, const float *__restrict__ beta, int dk, int64_t dv, int n_heads,
                          int64_t n_tok, float *__restrict__ state, float *__restrict__ out) {
  extern __shared__ float sm[];
  float *S = sm, *qs = S + dk * 32, *ks = qs + dk, *eg = ks + dk;
  const int h = blockIdx.x, lane = threadIdx.x;
  const int64_t j = static_cast<int64_t>(blockIdx.y) * 32 + lane;
  const bool active = j < dv;
  float *Sg = state + static_cast<int64_t>(h) * dk * dv;
  for (int i = 0; i < dk; ++i) S[i * 32 + lane] = active ? Sg[i * dv + j] : 0.0f;
  for (int64_t t = 0; t < n_tok; ++t) {
    const int64_t row = t * n_heads + h;
    for (int i = lane; i < dk; i += 32) {
      qs[i] = q[row * dk + i];
      ks[i] = k[row * dk + i];
      eg[i] = expf(g[row * dk + i]);
    }
    __syncwarp();
    if (active) {
      const float b = beta[row];
      float kv = 0.0f;
      for (int i = 0; i < dk; ++i) {
        const float s = S[i * 32 + lane] * eg[i];
        S[i * 32 + lane] = s;
        kv += s * ks[i];
      }
      const float delta = (v[row * dv + j] - kv) * b;
      float o = 0.0f;
      for (int i = 0; i < dk; ++i) {
        const float s = S[i * 32 + lane] + ks[i] * delta;
        S[i * 32 + lane] = s;
        o += s * qs[i];
      }
      out[row * dv + j] = o;
    }
    __syncwarp();  // the next token's staging overwrites qs / ks / eg
  }
  if (active)
    for (int i = 0; i < dk; ++i) Sg[i * dv + j] = S[i * 32 + lane];
}

__global__ void gated_rms_norm_kernel(const float *x, const float *__restrict__ w, const float *gate, int64_t d, float eps,
                                      float *y) {
  const int64_t row = blockIdx.x;
  const float *xr = x + row * d, *gr = gate + row * d;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) ss += xr[i] * xr[i];
  ss = block_reduce(ss, SumOp{}, 0.0f);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(d) + eps);
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) y[row * d + i] = w[i] * (xr[i] * inv) * sigmoid_f(gr[i]);
}

// One block of kCausalWarps warps per (head, token). Lane l holds dims l + 32·i (i < NPL) of q,
// of the current value row and of its accumulator; warp w takes keys w, w + kCausalWarps, ...
// with an online softmax; the warps' (max, sum, acc) are merged in shared memory.
template <int NPL>
__global__ void __launch_bounds__(kCausalWarps * 32)
    causal_attention_kernel(const float *__restrict__ q, const float *__restrict__ keys, const float *__restrict__ values,
                            int dqk, int dv, int n_heads, int64_t n_past, float scale, float *__restrict__ out) {
  __shared__ float sm_m[kCausalWarps], sm_l[kCausalWarps];
  __shared__ float sm_acc[kCausalWarps][32 * NPL];
  const int h = blockIdx.x;
  const int64_t t = blockIdx.y;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float qr[NPL], acc[NPL];
#pragma unroll
  for (int i = 0; i < NPL; ++i) {
    const int c = lane + 32 * i;
    qr[i] = c < dqk ? q[(t * n_heads + h) * dqk + c] : 0.0f;
    acc[i] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  const int64_t n_visible = n_past + t + 1;
  for (int64_t j = warp; j < n_visible; j += kCausalWarps) {
    const float *kj = keys + (j * n_heads + h) * dqk, *vj = values + (j * n_heads + h) * dv;
    float dot = 0.0f, vr[NPL];
#pragma unroll
    for (int i = 0; i < NPL; ++i) {
      const int c = lane + 32 * i;
      dot += qr[i] * (c < dqk ? kj[c] : 0.0f);
      vr[i] = c < dv ? vj[c] : 0.0f;
    }
    const float s = warp_reduce(dot, SumOp{}) * scale;
    if (s > m) {
      const float corr = expf(m - s);  // 0 for the first key (m = −inf)
      l = l * corr + 1.0f;
#pragma unroll
      for (int i = 0; i < NPL; ++i) acc[i] = acc[i] * corr + vr[i];
      m = s;
    } else {
      const float p = expf(s - m);
      l += p;
#pragma unroll
      for (int i = 0; i < NPL; ++i) acc[i] += p * vr[i];
    }
  }
  if (lane == 0) {
    sm_m[warp] = m;
    sm_l[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < NPL; ++i) sm_acc[warp][lane + 32 * i] = acc[i];
  __syncthreads();
  float mx = -INFINITY;
  for (int w = 0; w < kCausalWarps; ++w) mx = fmaxf(mx, sm_m[w]);
  float factor[kCausalWarps], denom = 0.0f;
  for (int w = 0; w < kCausalWarps; ++w) {
    factor[w] = sm_m[w] == -INFINITY ? 0.0f : expf(sm_m[w] - mx);
    denom += sm_l[w] * factor[w];
  }
  for (int c = threadIdx.x; c < dv; c += blockDim.x) {
    float o = 0.0f;
    for (int w = 0; w < kCausalWarps; ++w) o += sm_acc[w][c] * factor[w];
    out[(t * n_heads + h) * dv + c] = o / denom;
  }
}

template <int NPL>
void causal_launch(const float *q, const float *keys, const float *values, int64_t dqk, int64_t dv, int64_t n_heads,
                   int64_t n_tok, int64_t n_past, float scale, float *out, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(n_heads), static_cast<unsigned>(n_tok));
  causal_attention_kernel<NPL><<<grid, kCausalWarps * 32, 0, stream>>>(q, keys, values, static_cast<int>(dqk),
                                                                       static_cast<int>(dv), static_cast<int>(n_heads),
                                                                       n_past, scale, out);
  EP_CUDA_CHECK_LAUNCH("causal_attention_kernel");
}

// One block per token: the sources' logits (two block reductions each), their softmax (thread 0,
// into shared memory), then the weighted sum in source order.
__global__ void attn_res_mix_kernel(const float *__restrict__ banked, int n_banked, const float *__restrict__ cur,
                                    const float *__restrict__ w, int64_t d, int64_t n_tok, float eps, float *__restrict__ out) {
  __shared__ float p[kAttnResMaxBanked + 1];
  const int64_t t = blockIdx.x;
  const int n_src = n_banked + 1;
  auto src = [&](int i) { return i < n_banked ? banked + (static_cast<int64_t>(i) * n_tok + t) * d : cur + t * d; };
  for (int i = 0; i < n_src; ++i) {
    const float *s = src(i);
    float ss = 0.0f, dot = 0.0f;
    for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
      ss += s[c] * s[c];
      dot += s[c] * w[c];
    }
    ss = block_reduce(ss, SumOp{}, 0.0f);
    dot = block_reduce(dot, SumOp{}, 0.0f);
    if (threadIdx.x == 0) p[i] = dot / sqrtf(ss / static_cast<float>(d) + eps);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float mx = -INFINITY, sum = 0.0f;
    for (int i = 0; i < n_src; ++i) mx = fmaxf(mx, p[i]);
    for (int i = 0; i < n_src; ++i) sum += (p[i] = expf(p[i] - mx));
    for (int i = 0; i < n_src; ++i) p[i] /= sum;
  }
  __syncthreads();
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    float o = 0.0f;
    for (int i = 0; i < n_src; ++i) o += p[i] * src(i)[c];
    out[t * d + c] = o;
  }
}

}  // namespace

void launch_short_conv_silu(const float *x, const float *w, int64_t channels, int64_t n_tok, int64_t kernel, float *state,
                            float *y, cudaStream_t stream) {
  if (kernel < 2 || kernel > 16)
    throw Error(Status::unsupported, "short_conv_silu: kernel width " + std::to_string(kernel) + " (2..16 on CUDA)");
  if (channels == 0) return;
  if (n_tok > 0) {
    short_conv_kernel<<<blocks_for(channels * n_tok), kThreads, 0, stream>>>(x, w, channels, n_tok, static_cast<int>(kernel),
                                                                             state, y);
    EP_CUDA_CHECK_LAUNCH("short_conv_kernel");
  }
  short_conv_state_kernel<<<blocks_for(channels), kThreads, 0, stream>>>(x, channels, n_tok, static_cast<int>(kernel), state);
  EP_CUDA_CHECK_LAUNCH("short_conv_state_kernel");
}

void launch_l2_normalize(const float *x, int64_t d, int64_t rows, float eps, float s, float *y, cudaStream_t stream) {
  if (rows == 0 || d == 0) return;
  if (rows > 0x7fffffff) throw Error(Status::unsupported, "l2_normalize: too many rows for one launch");
  l2_normalize_kernel<<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(x, d, eps, s, y);
  EP_CUDA_CHECK_LAUNCH("l2_normalize_kernel");
}

void launch_sigmoid(const float *x, int64_t n, float *y, cudaStream_t stream) {
  if (n == 0) return;
  sigmoid_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, n, y);
  EP_CUDA_CHECK_LAUNCH("sigmoid_kernel");
}

void launch_kda_gate(const float *x, const float *bias, const float *a, float lower_bound, int64_t dk, int64_t n_heads,
                     int64_t n_tok, float *g, cudaStream_t stream) {
  const int64_t n = dk * n_heads * n_tok;
  if (n == 0) return;
  kda_gate_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, bias, a, lower_bound, dk, dk * n_heads, n, g);
  EP_CUDA_CHECK_LAUNCH("kda_gate_kernel");
}

void launch_kda_recurrence(const float *q, const float *k, const float *v, const float *g, const float *beta, int64_t dk,
                           int64_t dv, int64_t n_heads, int64_t n_tok, float *state, float *out, cudaStream_t stream) {
  if (dk <= 0 || dk > kKdaMaxKeyDim)
    throw Error(Status::unsupported, "kda_recurrence: key size " + std::to_string(dk) + " (1..256 on CUDA)");
  if (n_heads > 0x7fffffff || (dv + 31) / 32 > 65535)
    throw Error(Status::unsupported, "kda_recurrence: " + std::to_string(n_heads) + " heads x value size " +
                                         std::to_string(dv) + " do not fit one launch");
  if (n_heads == 0 || dv == 0) return;
  const size_t shared_bytes = static_cast<size_t>(dk * 32 + 3 * dk) * sizeof(float);
  const dim3 grid(static_cast<unsigned>(n_heads), static_cast<unsigned>((dv + 31) / 32));
  kda_recurrence_kernel<<<grid, 32, shared_bytes, stream>>>(q, k, v, g, beta, static_cast<int>(dk), dv,
                                                            static_cast<int>(n_heads), n_tok, state, out);
  EP_CUDA_CHECK_LAUNCH("kda_recurrence_kernel");
}

void launch_gated_rms_norm(const float *x, const float *w, const float *gate, int64_t d, int64_t rows, float eps, float *y,
                           cudaStream_t stream) {
  if (rows == 0 || d == 0) return;
  if (rows > 0x7fffffff) throw Error(Status::unsupported, "gated_rms_norm: too many rows for one launch");
  gated_rms_norm_kernel<<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(x, w, gate, d, eps, y);
  EP_CUDA_CHECK_LAUNCH("gated_rms_norm_kernel");
}

void launch_causal_attention(const float *q, const float *keys, const float *values, int64_t dqk, int64_t dv,
                             int64_t n_heads, int64_t n_tok, int64_t n_past, float scale, float *out, cudaStream_t stream) {
  if (dqk <= 0 || dqk > kCausalMaxHeadDim || dv <= 0 || dv > kCausalMaxHeadDim)
    throw Error(Status::unsupported, "causal_attention: head sizes " + std::to_string(dqk) + " / " + std::to_string(dv) +
                                         " (1..512 on CUDA)");
  if (n_tok > 65535 || n_heads > 65535)
    throw Error(Status::unsupported, "causal_attention: " + std::to_string(n_heads) + " heads x " + std::to_string(n_tok) +
                                         " tokens (at most 65535 each on CUDA)");
  if (n_heads * n_tok == 0) return;
  const int64_t widest = dqk > dv ? dqk : dv;
  if (widest <= 32) return causal_launch<1>(q, keys, values, dqk, dv, n_heads, n_tok, n_past, scale, out, stream);
  if (widest <= 64) return causal_launch<2>(q, keys, values, dqk, dv, n_heads, n_tok, n_past, scale, out, stream);
  if (widest <= 128) return causal_launch<4>(q, keys, values, dqk, dv, n_heads, n_tok, n_past, scale, out, stream);
  if (widest <= 256) return causal_launch<8>(q, keys, values, dqk, dv, n_heads, n_tok, n_past, scale, out, stream);
  causal_launch<16>(q, keys, values, dqk, dv, n_heads, n_tok, n_past, scale, out, stream);
}

void launch_attn_res_mix(const float *banked, int64_t n_banked, const float *cur, const float *w, int64_t d, int64_t n_tok,
                         float eps, float *out, cudaStream_t stream) {
  if (n_banked < 0 || n_banked > kAttnResMaxBanked)
    throw Error(Status::unsupported, "attn_res_mix: " + std::to_string(n_banked) + " banked sources (0..255 on CUDA)");
  if (n_tok > 0x7fffffff) throw Error(Status::unsupported, "attn_res_mix: too many tokens for one launch");
  if (n_tok == 0 || d == 0) return;
  attn_res_mix_kernel<<<static_cast<unsigned>(n_tok), kThreads, 0, stream>>>(banked, static_cast<int>(n_banked), cur, w, d,
                                                                             n_tok, eps, out);
  EP_CUDA_CHECK_LAUNCH("attn_res_mix_kernel");
}

}  // namespace ep::backend::cuda
