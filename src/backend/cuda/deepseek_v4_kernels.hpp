// Host launchers of the elementwise and DeepSeek-V4 kernels (cuda/deepseek_v4_ops.cu). Each takes
// the stream last, checks the launch and throws ep::Error on failure. Plain pointers and
// sizes only; shapes are validated by the caller (cuda_backend_deepseek_v4.cpp, backend::check_*).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ep::backend::cuda {

/// Largest head size attention_sinks supports (16 values per lane of a warp).
inline constexpr int64_t kAttentionMaxHeadDim = 512;
/// Largest number of hyper-connection streams.
inline constexpr int64_t kHcMaxStreams = 16;

/// y[i] = a[i] · b[i].
void launch_mul(const float *a, const float *b, int64_t n, float *y, cudaStream_t stream);
/// y[i] = s · x[i].
void launch_scale(const float *x, float s, int64_t n, float *y, cudaStream_t stream);

/// Hyper-connection weights per token (backend::Backend::hc_weights); post and comb null:
/// pre only (mix rows of hc values).
void launch_hc_weights(const float *mix, const float *scale, const float *base, float eps, int32_t iters, int64_t hc,
                       int64_t n_tok, float *pre, float *post, float *comb, cudaStream_t stream);
/// y[t][c] = Σ_j pre[t][j] · x[t][j][c].
void launch_hc_collapse(const float *x, const float *pre, int64_t hc, int64_t d, int64_t n_tok, float *y,
                        cudaStream_t stream);
/// y[t][k][c] = post[t][k]·f[t][c] + Σ_j comb[t][j·hc + k]·x[t][j][c]; y may alias x.
void launch_hc_expand(const float *x, const float *f, const float *post, const float *comb, int64_t hc, int64_t d,
                      int64_t n_tok, float *y, cudaStream_t stream);

/// Attention with sinks, one block per (head, token, key split); hd <= kAttentionMaxHeadDim; out
/// may alias q. With several key splits (few heads x tokens, many keys) the blocks write partial
/// results to `partial` (attention_sinks_workspace_bytes() of device memory) and a second kernel
/// merges them with the sink.
void launch_attention_sinks(const float *q, const float *kv, const int8_t *visible, const float *sinks, float scale,
                            int64_t hd, int64_t n_heads, int64_t n_tok, int64_t n_kv, float *out, float *partial,
                            cudaStream_t stream);
/// The number of key splits launch_attention_sinks uses for this shape (1: no partials).
int32_t attention_sinks_splits(int64_t n_heads, int64_t n_tok, int64_t n_kv);
/// Bytes of `partial` launch_attention_sinks needs (0 with one split).
uint64_t attention_sinks_workspace_bytes(int64_t hd, int64_t n_heads, int64_t n_tok, int64_t n_kv);
/// out[w][c] = Σ_s softmax_s(gate[w][s][c]) · kv[w][s][c].
void launch_pool_windows(const float *kv, const float *gate, int64_t d, int64_t n_slots, int64_t n_win, float *out,
                         cudaStream_t stream);
/// scores[t][s] = Σ_h w[t][h]·max(q[t][h]·keys[s], 0)·scale where visible[t][s], −inf elsewhere.
void launch_indexer_scores(const float *q, const float *w, const float *keys, const int8_t *visible, float scale,
                           int64_t dim, int64_t n_heads, int64_t n_tok, int64_t n, float *scores, cudaStream_t stream);
/// mask[t][offset + indices[t][j]] = 1 where values[t][j] > −inf and the index is in range.
void launch_set_visible(const int32_t *indices, const float *values, int64_t k, int64_t n_tok, int64_t offset,
                        int64_t n, int8_t *mask, cudaStream_t stream);

}  // namespace ep::backend::cuda
