// DeepSeek-V4 operations the Backend interface does not have yet, as plain CPU reference code on
// host float arrays. Each is written as one op with explicit shapes so that it can become a
// Backend op (and a CUDA kernel) unchanged in meaning: see docs/models/deepseek-v4.md.
#pragma once

#include <cstdint>

namespace ep::model::dsv4 {

/// Manifold-constrained hyper-connection weights of one token from its mix logits
/// (mix = fn · rms_norm(flatten(streams)), (2 + hc)·hc values):
///   pre_i  = σ(mix_i·scale0 + base_i) + eps
///   post_i = 2σ(mix_{hc+i}·scale1 + base_{hc+i})
///   comb   = Sinkhorn(softmax_row(mix_{2hc..}·scale2 + base_{2hc..}) + eps): one column
///            normalisation, then (iters − 1) × (row, column), each with + eps in the denominator.
/// comb is row-major [hc][hc]; it is applied transposed (see hc_expand).
void hc_weights(const float *mix, int64_t hc, const float *scale3, const float *base, float eps, int64_t sinkhorn_iters,
                float *pre, float *post, float *comb);
/// y[d] = Σ_j pre[j]·x[j][d]; x is [hc][d].
void hc_collapse(const float *x, const float *pre, int64_t hc, int64_t d, float *y);
/// x[k][d] ← post[k]·f[d] + Σ_j comb[j][k]·x[j][d] (in place).
void hc_expand(float *x, const float *f, const float *post, const float *comb, int64_t hc, int64_t d);

/// Multi-head attention against one shared K=V head, with a per-head sink logit in the softmax:
/// out[:, h, t] = Σ_j p_j·kv[:, j], p = softmax([scale·q·kv_j for visible j] ++ [sink_h]) without
/// the sink's share. q, out: [hd, H, T]; kv: [hd, n_kv]; visible: [T][n_kv] (0/1).
void attention_sinks(const float *q, int64_t hd, int64_t n_heads, int64_t n_tokens, const float *kv, int64_t n_kv,
                     const uint8_t *visible, const float *sinks, float scale, float *out);

/// Softmax-gated pooling of a compressor window: out[c] = Σ_s softmax_s(gate_s[c])·kv_s[c] over
/// n_slots slots of d channels each (slot s at kv[s], gate[s]).
void pool_window(const float *const *kv, const float *const *gate, int64_t n_slots, int64_t d, float *out);

/// Lightning-indexer scores of one query against n keys: Σ_h w_h·ReLU(q_h·k_s)·scale.
/// q: [dim, n_heads]; w: [n_heads]; keys: [dim, n]; scores: [n].
void indexer_scores(const float *q, const float *w, int64_t dim, int64_t n_heads, const float *keys, int64_t n, float scale,
                    float *scores);

/// Indices of the k largest of x[0..n) (descending; ties: lower index first); k <= n.
void top_k(const float *x, int64_t n, int64_t k, int32_t *out);

}  // namespace ep::model::dsv4
