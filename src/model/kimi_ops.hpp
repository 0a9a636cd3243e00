// Kimi-Linear operations the Backend interface does not have yet (short convolution, the Kimi
// Delta Attention recurrence, the gated output norm, causal multi-head attention over cached
// keys), as plain CPU reference code on host float arrays, in the style of dsv4_ops.hpp: each is
// one op with explicit shapes, so that it can become a Backend op (and a CUDA kernel) unchanged
// in meaning. Formulas and sources: docs/models/kimi-linear.md.
#pragma once

#include <cstdint>

namespace ep::model::kimi {

/// Depthwise causal convolution of width @p kernel followed by SiLU, over @p n rows of
/// @p channels values (x, y: [n][channels]; y may not alias x). The @p kernel − 1 rows before
/// the first are taken from @p state ([kernel − 1][channels], oldest first; zeros at the start of
/// a sequence), and @p state is left holding the last kernel − 1 input rows.
///   y[t][c] = silu(Σ_j w[c][j] · x[t − (kernel − 1) + j][c]),  w: [channels][kernel]
void short_conv_silu(const float *x, int64_t n, int64_t channels, const float *w, int64_t kernel, float *state, float *y);

/// x ← x / sqrt(Σ x² + eps) over @p d values (FLA's l2norm: + eps, not max(·, eps)).
void l2_normalize(float *x, int64_t d, float eps);

/// softplus as transformers' Kimi-Linear forget gate computes it: x for x > 20, log(1 + e^x) otherwise.
float softplus20(float x) noexcept;

/// One token of one head of the gated delta rule with per-channel decay (KDA):
///   S ← Diag(exp(g)) S;  S ← S + k (β (v − Sᵀk))ᵀ;  o = Sᵀ q
/// S: [dk][dv] row-major; q, k, g: [dk]; v, o: [dv]. q and k are used as given (normalised and
/// scaled by the caller).
void kda_step(float *S, const float *q, const float *k, const float *v, const float *g, float beta, int64_t dk, int64_t dv,
              float *o);

/// y = w ⊙ x / sqrt(mean(x²) + eps) ⊙ σ(gate) over @p d values (the KDA output norm).
void gated_rms_norm(const float *x, const float *w, const float *gate, int64_t d, float eps, float *y);

/// Causal multi-head attention, one key/value head per query head. Query t (of n) sits at
/// position n_past + t and sees keys 0 .. n_past + t. q: [n][H][dqk]; keys: [n_keys][H][dqk];
/// values: [n_keys][H][dv] with n_keys = n_past + n; out: [n][H][dv].
void causal_attention(const float *q, int64_t n, int64_t n_past, int64_t n_heads, int64_t dqk, int64_t dv, const float *keys,
                      const float *values, float scale, float *out);

/// Kimi-K3 AttnRes mix of one token: p = softmax_i(Σ_d rms_norm(src_i)[d] · w[d]) over the
/// @p n_src sources (banked block sums, then the current stream), out = Σ_i p_i · src_i (the raw,
/// un-normalised sources). srcs[i], w, out: [d]; out may not alias a source.
void attn_res_mix(const float *const *srcs, int64_t n_src, int64_t d, const float *w, float eps, float *out);

}  // namespace ep::model::kimi
