// Elementwise multiply/scale and the DeepSeek-V4 kernels: hyper-connection weights (Sinkhorn),
// collapse and expansion; attention against one shared K=V head with per-head sinks (one block
// per (head, token), warps stream the keys with an online softmax, then merge); softmax-gated
// window pooling; lightning-indexer scores; marking top-k picks in a visibility mask.
#include "gpu/check.hpp"
#include "backend/cuda/deepseek_v4_kernels.hpp"
#include "backend/cuda/reduce.cuh"

#include <algorithm>
#include <string>

namespace ep::backend::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kAttnWarps = 16;
// Key splits: enough (head, token, split) blocks to fill the GPU (decode has only n_heads
// blocks otherwise), each split at least kAttnMinKeysPerSplit keys.
constexpr int64_t kAttnTargetBlocks = 264;
constexpr int64_t kAttnMinKeysPerSplit = 128;
constexpr int64_t kAttnMaxSplits = 16;

unsigned blocks_for(int64_t n, int threads = kThreads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

__global__ void mul_kernel(const float *a, const float *b, int64_t n, float *y) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a[i] * b[i];
}

__global__ void scale_kernel(const float *x, float s, int64_t n, float *y) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = s * x[i];
}

// One thread per token, any stream count up to kHcMaxStreams (the matrix in local memory); the
// same operation order as the CPU reference.
__global__ void hc_weights_kernel(const float *__restrict__ mix, const float *__restrict__ scale,
                                  const float *__restrict__ base, float eps, int32_t iters, int hc, int64_t n_tok,
                                  float *__restrict__ pre, float *__restrict__ post, float *__restrict__ comb) {
  constexpr int kCells = kHcMaxStreams * kHcMaxStreams;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= n_tok) return;
  const int m = post ? (2 + hc) * hc : hc;
  const float *mt = mix + t * m;
  for (int i = 0; i < hc; ++i) pre[t * hc + i] = sigmoid(mt[i] * scale[0] + base[i]) + eps;
  if (!post) return;
  for (int i = 0; i < hc; ++i) post[t * hc + i] = 2.0f * sigmoid(mt[hc + i] * scale[1] + base[hc + i]);
  float c[kCells];
  const float *lg = mt + 2 * hc;
  const float *bs = base + 2 * hc;
  for (int i = 0; i < hc; ++i) {
    float mx = -INFINITY;
    for (int j = 0; j < hc; ++j) {
      c[i * hc + j] = lg[i * hc + j] * scale[2] + bs[i * hc + j];
      mx = fmaxf(mx, c[i * hc + j]);
    }
    float sum = 0.0f;
    for (int j = 0; j < hc; ++j) sum += (c[i * hc + j] = expf(c[i * hc + j] - mx));
    for (int j = 0; j < hc; ++j) c[i * hc + j] = c[i * hc + j] / sum + eps;
  }
  const int rounds = iters < 1 ? 1 : iters;  // as the CPU: one column pass at least
  for (int it = 0; it < rounds; ++it) {
    if (it > 0) {  // rows (the first round normalises columns only)
      for (int i = 0; i < hc; ++i) {
        float s = 0.0f;
        for (int j = 0; j < hc; ++j) s += c[i * hc + j];
        for (int j = 0; j < hc; ++j) c[i * hc + j] /= (s + eps);
      }
    }
    for (int j = 0; j < hc; ++j) {
      float s = 0.0f;
      for (int i = 0; i < hc; ++i) s += c[i * hc + j];
      for (int i = 0; i < hc; ++i) c[i * hc + j] /= (s + eps);
    }
  }
  for (int i = 0; i < hc * hc; ++i) comb[t * hc * hc + i] = c[i];
}

// DeepSeek-V4's 4 streams: 16 lanes per token, lane i·4 + j holding cell (i, j) of the Sinkhorn
// matrix, so that a round is two shuffled sums and two divisions per lane instead of 32 divisions
// in one thread. Every sum takes its four values in the index order of hc_weights_kernel and the
// CPU reference (each lane reads them by shuffles), so the results are the same bits.
__global__ void hc_weights4_kernel(const float *__restrict__ mix, const float *__restrict__ scale,
                                   const float *__restrict__ base, float eps, int32_t iters, int64_t n_tok,
                                   float *__restrict__ pre, float *__restrict__ post, float *__restrict__ comb) {
  constexpr int hc = 4;
  constexpr unsigned kAll = 0xffffffffu;
  const int64_t token = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 16;
  const bool live = token < n_tok;
  const int64_t t = live ? token : n_tok - 1;  // lanes past the last token shuffle along, write nothing
  const int cell = static_cast<int>(threadIdx.x) & 15, i = cell >> 2, j = cell & 3;
  const int group = static_cast<int>(threadIdx.x) & 16;  // the token's first lane in the warp
  const int m = post ? (2 + hc) * hc : hc;
  const float *mt = mix + t * m;
  if (live && cell < hc) pre[t * hc + cell] = sigmoid(mt[cell] * scale[0] + base[cell]) + eps;
  if (!post) return;
  if (live && cell < hc) post[t * hc + cell] = 2.0f * sigmoid(mt[hc + cell] * scale[1] + base[hc + cell]);
  float c = mt[2 * hc + cell] * scale[2] + base[2 * hc + cell];
  auto in_row = [&](int jj) { return __shfl_sync(kAll, c, group + i * hc + jj); };
  auto in_col = [&](int ii) { return __shfl_sync(kAll, c, group + ii * hc + j); };
  float mx = -INFINITY;
#pragma unroll
  for (int jj = 0; jj < hc; ++jj) mx = fmaxf(mx, in_row(jj));
  c = expf(c - mx);
  float sum = 0.0f;
#pragma unroll
  for (int jj = 0; jj < hc; ++jj) sum += in_row(jj);
  c = c / sum + eps;
  const int rounds = iters < 1 ? 1 : iters;  // as the CPU: one column pass at least
  for (int it = 0; it < rounds; ++it) {
    if (it > 0) {  // rows (the first round normalises columns only)
      float s = 0.0f;
#pragma unroll
      for (int jj = 0; jj < hc; ++jj) s += in_row(jj);
      c /= (s + eps);
    }
    float s = 0.0f;
#pragma unroll
    for (int ii = 0; ii < hc; ++ii) s += in_col(ii);
    c /= (s + eps);
  }
  if (live) comb[t * hc * hc + cell] = c;
}

__global__ void hc_collapse_kernel(const float *__restrict__ x, const float *__restrict__ pre, int hc, int64_t d,
                                   int64_t n_tok, float *__restrict__ y) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= d * n_tok) return;
  const int64_t t = idx / d, c = idx % d;
  const float *xt = x + t * hc * d;
  float s = 0.0f;
  for (int j = 0; j < hc; ++j) s += pre[t * hc + j] * xt[j * d + c];
  y[idx] = s;
}

// Each thread owns channel c of token t in every stream, so y may alias x.
__global__ void hc_expand_kernel(const float *x, const float *__restrict__ f, const float *__restrict__ post,
                                 const float *__restrict__ comb, int hc, int64_t d, int64_t n_tok, float *y) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= d * n_tok) return;
  const int64_t t = idx / d, c = idx % d;
  float old[kHcMaxStreams];
  for (int j = 0; j < hc; ++j) old[j] = x[(t * hc + j) * d + c];
  const float *ct = comb + t * hc * hc;
  const float fv = f[idx];
  for (int k = 0; k < hc; ++k) {
    float s = post[t * hc + k] * fv;
    for (int j = 0; j < hc; ++j) s += ct[j * hc + k] * old[j];
    y[(t * hc + k) * d + c] = s;
  }
}

// Online-softmax update of one warp's (max, sum, acc) with key row kr at logit s.
template <int NPL>
__device__ __forceinline__ void online_update(float s, const float (&kr)[NPL], float &m, float &l, float (&acc)[NPL]) {
  if (s > m) {
    const float corr = expf(m - s);  // 0 for the first key (m = −inf)
    l = l * corr + 1.0f;
#pragma unroll
    for (int i = 0; i < NPL; ++i) acc[i] = acc[i] * corr + kr[i];
    m = s;
  } else {
    const float p = expf(s - m);
    l += p;
#pragma unroll
    for (int i = 0; i < NPL; ++i) acc[i] += p * kr[i];
  }
}

// One block of kAttnWarps warps per (head, token, key split). Lane l holds head dims l + 32·i
// (i < NPL) of q, of the current key rows and of its accumulator. Warp w takes the split's keys
// w, w + kAttnWarps, ..., two at a time (two row loads in flight), with an online softmax; the
// warps' (max, sum, acc) are merged in shared memory. With one split the block adds the sink and
// writes out; with several it writes its partial (max, sum, acc[hd]) for attention_merge_kernel.
template <int NPL>
__global__ void __launch_bounds__(kAttnWarps * 32)
    attention_sinks_kernel(const float *q, const float *__restrict__ kv, const int8_t *__restrict__ visible,
                           const float *__restrict__ sinks, float scale, int hd, int n_heads, int64_t n_kv,
                           int64_t keys_per_split, float *out, float *__restrict__ partial) {
  __shared__ float sm_m[kAttnWarps], sm_l[kAttnWarps];
  __shared__ float sm_acc[kAttnWarps][32 * NPL];
  const int h = blockIdx.x;
  const int64_t t = blockIdx.y;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t row = (t * n_heads + h) * hd;
  const int64_t j_begin = static_cast<int64_t>(blockIdx.z) * keys_per_split;
  const int64_t j_end = j_begin + keys_per_split < n_kv ? j_begin + keys_per_split : n_kv;
  float qr[NPL], acc[NPL];
#pragma unroll
  for (int i = 0; i < NPL; ++i) {
    const int c = lane + 32 * i;
    qr[i] = c < hd ? q[row + c] : 0.0f;
    acc[i] = 0.0f;
  }
  const int8_t *vis = visible + t * n_kv;
  float m = -INFINITY, l = 0.0f;
  for (int64_t j0 = j_begin + warp; j0 < j_end; j0 += 2 * kAttnWarps) {
    const int64_t j1 = j0 + kAttnWarps;
    const bool v0 = vis[j0] != 0, v1 = j1 < j_end && vis[j1] != 0;
    if (!v0 && !v1) continue;
    const float *k0 = kv + j0 * hd, *k1 = kv + (v1 ? j1 : j0) * hd;
    float kr0[NPL], kr1[NPL];
    float dot0 = 0.0f, dot1 = 0.0f;
#pragma unroll
    for (int i = 0; i < NPL; ++i) {
      const int c = lane + 32 * i;
      kr0[i] = c < hd ? k0[c] : 0.0f;
      kr1[i] = c < hd ? k1[c] : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < NPL; ++i) {
      dot0 += qr[i] * kr0[i];
      dot1 += qr[i] * kr1[i];
    }
    dot0 = warp_reduce(dot0, SumOp{}) * scale;
    dot1 = warp_reduce(dot1, SumOp{}) * scale;
    if (v0) online_update(dot0, kr0, m, l, acc);
    if (v1) online_update(dot1, kr1, m, l, acc);
  }
  if (lane == 0) {
    sm_m[warp] = m;
    sm_l[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < NPL; ++i) sm_acc[warp][lane + 32 * i] = acc[i];
  __syncthreads();  // every q read of this block is done before out (which may alias q) is written
  const bool final_pass = gridDim.z == 1;
  float mx = final_pass ? sinks[h] : -INFINITY;
  for (int w = 0; w < kAttnWarps; ++w) mx = fmaxf(mx, sm_m[w]);
  float factor[kAttnWarps];
  float denom = final_pass ? expf(sinks[h] - mx) : 0.0f;
  for (int w = 0; w < kAttnWarps; ++w) {
    factor[w] = sm_m[w] == -INFINITY ? 0.0f : expf(sm_m[w] - mx);
    denom += sm_l[w] * factor[w];
  }
  if (final_pass) {
    for (int c = threadIdx.x; c < hd; c += blockDim.x) {
      float o = 0.0f;
      for (int w = 0; w < kAttnWarps; ++w) o += sm_acc[w][c] * factor[w];
      out[row + c] = o / denom;
    }
    return;
  }
  float *part = partial + ((t * n_heads + h) * gridDim.z + blockIdx.z) * (hd + 2);
  if (threadIdx.x == 0) {
    part[0] = mx;  // −inf when the split saw no key
    part[1] = denom;
  }
  for (int c = threadIdx.x; c < hd; c += blockDim.x) {
    float o = 0.0f;
    for (int w = 0; w < kAttnWarps; ++w) o += sm_acc[w][c] * factor[w];
    part[2 + c] = o;
  }
}

// Merges the key splits of one (head, token) with the sink: one block per (head, token).
__global__ void attention_merge_kernel(const float *__restrict__ partial, const float *__restrict__ sinks, int hd,
                                       int n_heads, int n_split, float *out) {
  const int h = blockIdx.x;
  const int64_t t = blockIdx.y;
  const float *part = partial + (t * n_heads + h) * n_split * (hd + 2);
  const float sink = sinks[h];
  float mx = sink;
  for (int s = 0; s < n_split; ++s) mx = fmaxf(mx, part[s * (hd + 2)]);
  float denom = expf(sink - mx);
  for (int s = 0; s < n_split; ++s) {
    const float ms = part[s * (hd + 2)];
    if (ms != -INFINITY) denom += part[s * (hd + 2) + 1] * expf(ms - mx);
  }
  for (int c = threadIdx.x; c < hd; c += blockDim.x) {
    float o = 0.0f;
    for (int s = 0; s < n_split; ++s) {
      const float ms = part[s * (hd + 2)];
      if (ms != -INFINITY) o += part[s * (hd + 2) + 2 + c] * expf(ms - mx);
    }
    out[(t * n_heads + h) * hd + c] = o / denom;
  }
}

__global__ void pool_windows_kernel(const float *__restrict__ kv, const float *__restrict__ gate, int64_t d,
                                    int64_t n_slots, int64_t n_win, float *__restrict__ out) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= d * n_win) return;
  const int64_t w = idx / d, c = idx % d;
  const float *kw = kv + w * n_slots * d + c, *gw = gate + w * n_slots * d + c;
  float mx = -INFINITY;
  for (int64_t s = 0; s < n_slots; ++s) mx = fmaxf(mx, gw[s * d]);
  if (mx == -INFINITY) {
    out[idx] = 0.0f;
    return;
  }
  float den = 0.0f, num = 0.0f;
  for (int64_t s = 0; s < n_slots; ++s) {
    const float p = expf(gw[s * d] - mx);
    den += p;
    num += p * kw[s * d];
  }
  out[idx] = num / den;
}

// One warp per (key, token).
__global__ void indexer_scores_kernel(const float *__restrict__ q, const float *__restrict__ w,
                                      const float *__restrict__ keys, const int8_t *__restrict__ visible, float scale,
                                      int64_t dim, int64_t n_heads, int64_t n_tok, int64_t n, float *__restrict__ scores) {
  const int64_t gw = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (gw >= n * n_tok) return;
  const int64_t t = gw / n, s = gw % n;
  if (!visible[gw]) {
    if (lane == 0) scores[gw] = -INFINITY;
    return;
  }
  const float *k = keys + s * dim, *qt = q + t * n_heads * dim, *wt = w + t * n_heads;
  float total = 0.0f;
  for (int64_t h = 0; h < n_heads; ++h) {
    const float *qh = qt + h * dim;
    float dot = 0.0f;
    for (int64_t c = lane; c < dim; c += 32) dot += qh[c] * k[c];
    dot = warp_reduce(dot, SumOp{});
    total += (dot > 0.0f ? dot * scale : 0.0f) * wt[h];
  }
  if (lane == 0) scores[gw] = total;
}

__global__ void set_visible_kernel(const int32_t *__restrict__ indices, const float *__restrict__ values, int64_t k,
                                   int64_t n_tok, int64_t offset, int64_t n, int8_t *__restrict__ mask) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= k * n_tok) return;
  if (!(values[idx] > -INFINITY)) return;
  const int64_t i = indices[idx], t = idx / k;
  if (i < 0 || i >= n - offset) return;
  mask[t * n + offset + i] = 1;
}

template <int NPL>
void attention_launch(const float *q, const float *kv, const int8_t *visible, const float *sinks, float scale,
                      int64_t hd, int64_t n_heads, int64_t n_tok, int64_t n_kv, float *out, float *partial,
                      cudaStream_t stream) {
  const int32_t n_split = attention_sinks_splits(n_heads, n_tok, n_kv);
  const int64_t keys_per_split = (n_kv + n_split - 1) / n_split;
  const dim3 grid(static_cast<unsigned>(n_heads), static_cast<unsigned>(n_tok), static_cast<unsigned>(n_split));
  attention_sinks_kernel<NPL><<<grid, kAttnWarps * 32, 0, stream>>>(q, kv, visible, sinks, scale, static_cast<int>(hd),
                                                                    static_cast<int>(n_heads), n_kv, keys_per_split, out,
                                                                    partial);
  EP_CUDA_CHECK_LAUNCH("attention_sinks_kernel");
  if (n_split == 1) return;
  attention_merge_kernel<<<dim3(static_cast<unsigned>(n_heads), static_cast<unsigned>(n_tok)), 128, 0, stream>>>(
      partial, sinks, static_cast<int>(hd), static_cast<int>(n_heads), n_split, out);
  EP_CUDA_CHECK_LAUNCH("attention_merge_kernel");
}

}  // namespace

void launch_mul(const float *a, const float *b, int64_t n, float *y, cudaStream_t stream) {
  if (n == 0) return;
  mul_kernel<<<blocks_for(n), kThreads, 0, stream>>>(a, b, n, y);
  EP_CUDA_CHECK_LAUNCH("mul_kernel");
}

void launch_scale(const float *x, float s, int64_t n, float *y, cudaStream_t stream) {
  if (n == 0) return;
  scale_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, s, n, y);
  EP_CUDA_CHECK_LAUNCH("scale_kernel");
}

void launch_hc_weights(const float *mix, const float *scale, const float *base, float eps, int32_t iters, int64_t hc,
                       int64_t n_tok, float *pre, float *post, float *comb, cudaStream_t stream) {
  if (hc <= 0 || hc > kHcMaxStreams)
    throw Error(Status::unsupported, "launch_hc_weights: " + std::to_string(hc) + " streams (1..16)");
  if (n_tok == 0) return;
  if (hc == 4) {
    hc_weights4_kernel<<<blocks_for(16 * n_tok, 64), 64, 0, stream>>>(mix, scale, base, eps, iters, n_tok, pre, post, comb);
    EP_CUDA_CHECK_LAUNCH("hc_weights4_kernel");
    return;
  }
  hc_weights_kernel<<<blocks_for(n_tok, 64), 64, 0, stream>>>(mix, scale, base, eps, iters, static_cast<int>(hc), n_tok, pre,
                                                              post, comb);
  EP_CUDA_CHECK_LAUNCH("hc_weights_kernel");
}

void launch_hc_collapse(const float *x, const float *pre, int64_t hc, int64_t d, int64_t n_tok, float *y,
                        cudaStream_t stream) {
  if (d * n_tok == 0) return;
  hc_collapse_kernel<<<blocks_for(d * n_tok), kThreads, 0, stream>>>(x, pre, static_cast<int>(hc), d, n_tok, y);
  EP_CUDA_CHECK_LAUNCH("hc_collapse_kernel");
}

void launch_hc_expand(const float *x, const float *f, const float *post, const float *comb, int64_t hc, int64_t d,
                      int64_t n_tok, float *y, cudaStream_t stream) {
  if (hc <= 0 || hc > kHcMaxStreams)
    throw Error(Status::unsupported, "launch_hc_expand: " + std::to_string(hc) + " streams (1..16)");
  if (d * n_tok == 0) return;
  hc_expand_kernel<<<blocks_for(d * n_tok), kThreads, 0, stream>>>(x, f, post, comb, static_cast<int>(hc), d, n_tok, y);
  EP_CUDA_CHECK_LAUNCH("hc_expand_kernel");
}

int32_t attention_sinks_splits(int64_t n_heads, int64_t n_tok, int64_t n_kv) {
  const int64_t blocks = n_heads * n_tok;
  if (blocks <= 0) return 1;
  int64_t splits = (kAttnTargetBlocks + blocks - 1) / blocks;                  // fill the GPU
  splits = std::min(splits, (n_kv + kAttnMinKeysPerSplit - 1) / kAttnMinKeysPerSplit);  // enough keys each
  return static_cast<int32_t>(std::max<int64_t>(1, std::min<int64_t>(splits, kAttnMaxSplits)));
}

uint64_t attention_sinks_workspace_bytes(int64_t hd, int64_t n_heads, int64_t n_tok, int64_t n_kv) {
  const int32_t n_split = attention_sinks_splits(n_heads, n_tok, n_kv);
  return n_split == 1 ? 0 : static_cast<uint64_t>(n_heads * n_tok * n_split * (hd + 2)) * 4;
}

void launch_attention_sinks(const float *q, const float *kv, const int8_t *visible, const float *sinks, float scale,
                            int64_t hd, int64_t n_heads, int64_t n_tok, int64_t n_kv, float *out, float *partial,
                            cudaStream_t stream) {
  if (hd <= 0 || hd > kAttentionMaxHeadDim)
    throw Error(Status::unsupported, "attention_sinks: head size " + std::to_string(hd) + " (1..512 on CUDA)");
  if (n_tok > 65535 || n_heads > 65535)
    throw Error(Status::unsupported, "attention_sinks: " + std::to_string(n_heads) + " heads x " + std::to_string(n_tok) +
                                         " tokens (at most 65535 each on CUDA)");
  if (n_heads * n_tok == 0) return;
  if (hd <= 32) return attention_launch<1>(q, kv, visible, sinks, scale, hd, n_heads, n_tok, n_kv, out, partial, stream);
  if (hd <= 64) return attention_launch<2>(q, kv, visible, sinks, scale, hd, n_heads, n_tok, n_kv, out, partial, stream);
  if (hd <= 128) return attention_launch<4>(q, kv, visible, sinks, scale, hd, n_heads, n_tok, n_kv, out, partial, stream);
  if (hd <= 256) return attention_launch<8>(q, kv, visible, sinks, scale, hd, n_heads, n_tok, n_kv, out, partial, stream);
  attention_launch<16>(q, kv, visible, sinks, scale, hd, n_heads, n_tok, n_kv, out, partial, stream);
}

void launch_pool_windows(const float *kv, const float *gate, int64_t d, int64_t n_slots, int64_t n_win, float *out,
                         cudaStream_t stream) {
  if (d * n_win == 0) return;
  pool_windows_kernel<<<blocks_for(d * n_win), kThreads, 0, stream>>>(kv, gate, d, n_slots, n_win, out);
  EP_CUDA_CHECK_LAUNCH("pool_windows_kernel");
}

void launch_indexer_scores(const float *q, const float *w, const float *keys, const int8_t *visible, float scale,
                           int64_t dim, int64_t n_heads, int64_t n_tok, int64_t n, float *scores, cudaStream_t stream) {
  if (n * n_tok == 0) return;
  indexer_scores_kernel<<<blocks_for(n * n_tok * 32), kThreads, 0, stream>>>(q, w, keys, visible, scale, dim, n_heads,
                                                                             n_tok, n, scores);
  EP_CUDA_CHECK_LAUNCH("indexer_scores_kernel");
}

void launch_set_visible(const int32_t *indices, const float *values, int64_t k, int64_t n_tok, int64_t offset, int64_t n,
                        int8_t *mask, cudaStream_t stream) {
  if (k * n_tok == 0) return;
  set_visible_kernel<<<blocks_for(k * n_tok), kThreads, 0, stream>>>(indices, values, k, n_tok, offset, n, mask);
  EP_CUDA_CHECK_LAUNCH("set_visible_kernel");
}

}  // namespace ep::backend::cuda
