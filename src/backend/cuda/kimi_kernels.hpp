// Host launchers of the Kimi-Linear / Kimi-K3 kernels (cuda/kimi_ops.cu). Each takes the stream
// last, checks the launch and throws ep::Error on failure. Plain pointers and sizes only; shapes
// are validated by the caller (cuda_backend_kimi.cpp, backend/kimi_checks.hpp).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ep::backend::cuda {

/// Largest key size kda_recurrence supports (the per-block state tile is dk × 32 floats).
inline constexpr int64_t kKdaMaxKeyDim = 256;
/// Largest query/key and value head size causal_attention supports.
inline constexpr int64_t kCausalMaxHeadDim = 512;
/// Most banked sources attn_res_mix supports.
inline constexpr int64_t kAttnResMaxBanked = 255;

/// y[t][c] = silu(Σ_j w[c][j] · x̂[t + j][c]) with x̂ = state rows [K−1][C] then x rows [T][C];
/// then state ← the last K − 1 rows of x̂. 2 <= kernel <= 16; y may not alias x.
void launch_short_conv_silu(const float *x, const float *w, int64_t channels, int64_t n_tok, int64_t kernel, float *state,
                            float *y, cudaStream_t stream);
/// Per row of d values: y = x / sqrt(Σ x² + eps) · s.
void launch_l2_normalize(const float *x, int64_t d, int64_t rows, float eps, float s, float *y, cudaStream_t stream);
/// y[i] = σ(x[i]).
void launch_sigmoid(const float *x, int64_t n, float *y, cudaStream_t stream);
/// g[t][h][i] from f = x[t][h][i] + bias[h·dk + i] (backend::Backend::kda_gate).
void launch_kda_gate(const float *x, const float *bias, const float *a, float lower_bound, int64_t dk, int64_t n_heads,
                     int64_t n_tok, float *g, cudaStream_t stream);
/// The KDA recurrence over n_tok tokens in order; state [H][dk][dv] updated in place.
void launch_kda_recurrence(const float *q, const float *k, const float *v, const float *g, const float *beta, int64_t dk,
                           int64_t dv, int64_t n_heads, int64_t n_tok, float *state, float *out, cudaStream_t stream);
/// y = w ⊙ x / sqrt(mean(x²) + eps) ⊙ σ(gate) per row of d values.
void launch_gated_rms_norm(const float *x, const float *w, const float *gate, int64_t d, int64_t rows, float eps, float *y,
                           cudaStream_t stream);
/// Causal attention, query t at position n_past + t; q [T][H][dqk], keys [n][H][dqk],
/// values [n][H][dv], out [T][H][dv].
void launch_causal_attention(const float *q, const float *keys, const float *values, int64_t dqk, int64_t dv,
                             int64_t n_heads, int64_t n_tok, int64_t n_past, float scale, float *out, cudaStream_t stream);
/// AttnRes mix per token over banked [nb][T][D] (may be null when nb = 0) and cur [T][D].
void launch_attn_res_mix(const float *banked, int64_t n_banked, const float *cur, const float *w, int64_t d, int64_t n_tok,
                         float eps, float *out, cudaStream_t stream);

}  // namespace ep::backend::cuda
