// Host launchers of the compute kernels (backend/cuda/*.cu). Each takes the stream last, checks the
// launch and throws ep::Error on failure. Plain pointers and sizes only; shapes are validated
// by the caller (cuda_backend.cpp). Type ids are ggml type ids (format/ggml_type.hpp).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ep::backend::cuda {

/// GEMV kernel families (gemv.cu picks one; gemv_<family>.cu). automatic: the fastest for the
/// type and shape (q8_0 at 2..8 tokens: gemv.cu's kQ8_0SeveralTokensOnMma decides between mma and
/// rows); the others are asked for by tests and `ep-bench kernels`. dp4a and stream (one token)
/// and mma (1..8 tokens) run mxfp4, q2_K and q3_K with k a multiple of 256, stream also iq2_xxs
/// (one token, k a multiple of 256, 2-byte-aligned matrices), mma also iq2_xxs and q8_0 (k a
/// multiple of 256); asked for other types or shapes they fall back to what automatic picks there. stream is dp4a's arithmetic with the
/// weights streamed through shared memory (a ring per warp, filled by bulk copies on sm_90+).
/// generic and pipe run every type exactly (f32 x).
enum class GemvKernel : int32_t { automatic = 0, generic, pipe, mma, dp4a, stream, rows };

/// Batched quantized GEMV / small-batch GEMM: for matrix m < n_mat, y_m[t·n + r] =
/// Σ_i W_m[r, i] · x_m[t·k + i] for t < n_tok, where W_m = w_ptrs[m] (n rows of k values of
/// type `type`), x_m = x + (x_rows ? x_rows[m] : m)·k and y_m = y + m·n·n_tok.
/// w_ptrs and x_rows are device arrays. x must be 16-byte aligned; n_tok <= kGemvMaxTokens
/// (kGemvMaxWideTokens where gemv_runs_wide). The
/// dp4a kernel needs every matrix 4-byte aligned (q3_K: 2-byte); a misaligned single `w` falls
/// back to the per-lane kernels. The stream kernel (the one-token default for mxfp4, q2_K, q3_K)
/// needs the same, and for q3_K 4-byte aligned rows: every matrix 4-byte aligned and k a multiple
/// of 512 (other q3_K matrices run on dp4a).
/// Accumulation is f32; the mma kernel carries x as two f16 halves (~22 bits, scaled per token
/// by a power of two, any f32 range; within 5e-5 of the largest output of an f64 reference in
/// tests/backend/cuda/gemv_gpu_test.cpp), the dp4a and stream kernels as two int8 parts per 32 values
/// (per 128 for q2_K and q3_K; ~15 bits, any f32 range; within 2e-4 there).
/// A gated activation applied to a GEMV's input as the kernel reads it (GemvArgs::glu): the
/// input row is act(x_row, up_row) elementwise, with up_row at the same row of `up` as x_row of x
/// and act launch_glu's (kind 0: SwiGLU clamped by limit when limit > 0; kind 1: SiTU(beta_g,
/// beta_u)). The same f32 values as launch_glu followed by the GEMV, without the extra launch.
struct GemvGlu {
  const float *up = nullptr;  ///< null: no activation, the input is x
  int32_t kind = 0;
  float limit = 0.0f, beta_g = 1.0f, beta_u = 1.0f;
};
struct GemvArgs {
  const void *const *w_ptrs = nullptr;  ///< device array [n_mat], or null: every matrix is `w`
  /// The caller checked that every w_ptrs[m] is 16-byte aligned (the row kernel needs it; a
  /// single `w` is checked by launch_gemv itself).
  bool w_ptrs_aligned16 = false;
  const void *w = nullptr;
  const float *x = nullptr;
  const int32_t *x_rows = nullptr;
  float *y = nullptr;
  int64_t k = 0;
  int64_t n = 0;
  int32_t n_tok = 1;
  int32_t n_mat = 1;
  GemvKernel kernel = GemvKernel::automatic;
  /// Only with the dp4a and stream kernels (gemv_takes_glu); launch_gemv throws for the others.
  GemvGlu glu;
};
inline constexpr int32_t kGemvMaxTokens = 8;
/// CudaBackend::matmul runs up to this many tokens as GEMV launches of kGemvMaxTokens tokens
/// each, where the type's several-token kernel reads the weights once per launch (rows, mma);
/// more tokens take the GEMM.
inline constexpr int32_t kChunkedGemvMaxTokens = 32;
/// The most tokens of one launch_gemv where the tensor-core kernel runs the type and shape
/// (gemv_runs_wide): 9..kGemvMaxWideTokens tokens run on it alone (GemvArgs::kernel asking for
/// another family falls back to it; GemvArgs::glu is refused), as 16 or 32 token columns per
/// decoded weight fragment. Other types and shapes take at most kGemvMaxTokens.
inline constexpr int32_t kGemvMaxWideTokens = 32;
/// Whether launch_gemv takes more than kGemvMaxTokens (up to kGemvMaxWideTokens) tokens of
/// matrices of ggml type @p type with rows of @p k values: the tensor-core kernel's types (mxfp4,
/// q2_K, q3_K, iq2_xxs, q8_0) with k a multiple of 256.
bool gemv_runs_wide(uint32_t type, int64_t k);
void launch_gemv(uint32_t type, const GemvArgs &args, cudaStream_t stream);
/// The kernel launch_gemv runs for this type and these arguments (above kGemvMaxTokens tokens:
/// mma where gemv_runs_wide, else GemvKernel::automatic, none: launch_gemv refuses them).
GemvKernel gemv_kernel_for(uint32_t type, const GemvArgs &args);
/// Whether launch_gemv can apply args.glu for this type and these arguments (the kernel it runs
/// is dp4a or stream: they read x once per block, into their quantized copy).
bool gemv_takes_glu(uint32_t type, const GemvArgs &args);
const char *gemv_kernel_name(GemvKernel kernel);
/// Parses a gemv_kernel_name(); false for an unknown name.
bool parse_gemv_kernel(const char *name, GemvKernel &out);

/// True when launch_gemv has kernels for ggml type @p type; the other supported weight types
/// (backend::is_supported_weight_type) are multiplied through launch_dequant_rows and cuBLAS.
bool gemv_runs_type(uint32_t type);

/// Dequantizes `rows` rows of k values (row stride = row bytes) to f32 (dst_f32) or bf16
/// (dst_bf16; exactly one of them non-null), bit-exact with ggml for f32 output.
void launch_dequant_rows(uint32_t type, const void *src, int64_t k, int64_t rows, float *dst_f32,
                         uint16_t *dst_bf16, cudaStream_t stream);
/// y[t·d ..] = dequantized row ids[t] of table (rows of d values); ids checked against vocab
/// (out-of-range ids write NaN rows).
void launch_embed(uint32_t type, const void *table, int64_t d, int64_t vocab, const int32_t *ids,
                  int64_t n_ids, float *y, cudaStream_t stream);
void launch_f32_to_bf16(const float *x, uint16_t *y, int64_t n, cudaStream_t stream);

/// The split GEMM's operands (GemmMode::split_f16; the format in split_f16.cuh). Weights: `rows`
/// rows of k values of `type` (row stride = row bytes; k a multiple of 32 and of the type's
/// block) dequantized with the type's unit decoder and split at each row's power of two into
/// dst [rows][3k] f16 = [hi | lo | hi] per row, exps[rows] = each row's exponent. One block per
/// row (its largest |value| is reduced before the split).
void launch_dequant_rows_split(uint32_t type, const void *src, int64_t k, int64_t rows, uint16_t *dst, int32_t *exps,
                               cudaStream_t stream);
/// Activations: x [t][k] f32 (k even, x 4-byte aligned) split per token into dst [t][3k] f16 =
/// [lo ; hi ; hi] per token, exps[t] = each token's exponent; so that the GEMM of 3k over the two
/// is W_hi·x_lo + W_lo·x_hi + W_hi·x_hi, the small products first (a tensor core's f32 accumulator
/// rounds each step relative to the sum so far: the corrections are summed while it is small).
void launch_split_tokens(const float *x, int64_t k, int64_t t, uint16_t *dst, int32_t *exps, cudaStream_t stream);
/// Undoes the two scales of the split GEMM's output y [t][n] f32: y[i][r] ·= 2^−(row_exps[r] +
/// tok_exps[i]), exactly (ldexpf).
void launch_unscale_split(float *y, int64_t n, int64_t t, const int32_t *row_exps, const int32_t *tok_exps,
                          cudaStream_t stream);

/// y[t][r] = Σ_i w[r][i] · x[t][i] for plain float weights (@p type f32, f16 or bf16) of any row
/// length @p k (the GEMV and dequant kernels need k to be a multiple of 32): one warp per output,
/// f32 accumulation. For the small dims of tiny test models; x, y: f32 [t][k] / [t][n].
void launch_matmul_plain(uint32_t type, const void *w, const float *x, float *y, int64_t k, int64_t n, int64_t t,
                         cudaStream_t stream);

void launch_rms_norm(const float *x, const float *weight, float eps, int64_t n, int64_t rows, float *y,
                     cudaStream_t stream);
inline constexpr int32_t kRopeMaxPairs = 256;
struct RopeArgs {
  float inv_freq[kRopeMaxPairs];
  int32_t n_pairs = 0;
  int32_t dim_offset = 0;
  float attention_factor = 1.0f;
  int32_t inverse = 0;
  int64_t head_dim = 0;
  int64_t n_heads = 0;
  int64_t n_tokens = 0;
};
void launch_rope(const float *x, const int32_t *positions, const RopeArgs &args, float *y, cudaStream_t stream);
void launch_softmax(const float *x, int64_t n, int64_t rows, float *y, cudaStream_t stream);
void launch_top_k(const float *x, int64_t n, int64_t rows, int32_t k, int32_t *indices, float *values,
                  cudaStream_t stream);
/// kind 0: swiglu with limit (<= 0: none); kind 1: situ(beta_g, beta_u).
void launch_glu(const float *gate, const float *up, int64_t n, int32_t kind, float limit, float beta_g,
                float beta_u, float *y, cudaStream_t stream);
void launch_add(const float *a, const float *b, int64_t n, float *y, cudaStream_t stream);

struct RouteArgs {
  int32_t scoring = 0;  ///< backend::Scoring
  int32_t k = 1;
  int32_t renormalize = 1;
  float scale = 1.0f;
  const float *bias = nullptr;        ///< [n_experts] or null
  const int32_t *hash_table = nullptr;  ///< [vocab][k] or null
  const int32_t *token_ids = nullptr;
  int64_t hash_vocab = 0;
};
/// Router, one block per token: ids/weights [n_tok][k]. Invalid hash entries give id −1.
void launch_route(const float *logits, int64_t n_experts, int64_t n_tok, const RouteArgs &args,
                  int32_t *ids, float *weights, cudaStream_t stream);
/// y[t·d + i] = Σ_j w[t·k + j] · o[(t·k + j)·d + i].
void launch_moe_combine(const float *o, const float *w, int64_t d, int64_t n_tok, int32_t k, float *y,
                        cudaStream_t stream);
/// out[i·d ..] = x[rows[i]·d ..] (zeros where rows[i] < 0).
void launch_gather_rows(const float *x, const int32_t *rows, int64_t d, int64_t n, float *out, cudaStream_t stream);
/// out[rows[i]·d ..] = src[i·d ..] (rows[i] < 0: skipped).
void launch_scatter_rows(const float *src, const int32_t *rows, int64_t d, int64_t n, float *out, cudaStream_t stream);
/// The role table of an expert batch: out[r·n + p] = slots[ids[p]] + offsets[r] for r < 3 (gate,
/// up, down), null for an id outside 0 .. n_experts − 1. ids [n], slots [n_experts], out [3·n]
/// are device arrays.
void launch_gather_role_table(const int32_t *ids, int64_t n, const void *const *slots, int64_t n_experts, uint64_t gate_offset,
                              uint64_t up_offset, uint64_t down_offset, const void **out, cudaStream_t stream);
/// The x row of each GEMV matrix of a MoE batch: out[i] = (i mod n) / k for i < 2·n (the gate
/// rows, then the up rows, of n = k·T pairs).
void launch_pair_tokens(int64_t n, int32_t k, int32_t *out, cudaStream_t stream);

/// Sampling on the device (semantics of backend::SamplingParams, after the repetition
/// penalty); `scratch` holds n floats. Writes the token to *out (device).
void launch_sample(const float *logits, int64_t n, float temperature, int32_t top_k, float top_p, float min_p, double u,
                   float *scratch, int32_t *out, cudaStream_t stream);
/// The most alternatives a row of launch_sample_rows() reports (backend::kMaxTopLogprobs).
constexpr int32_t kSampleTopMax = 20;
/// One row of launch_sample_rows(): device addresses (the row, its scratch, its uploaded lists)
/// and its settings.
struct SampleRowArgs {
  const float *logits = nullptr;       ///< the raw row, n floats
  float *probs = nullptr;              ///< n floats of scratch
  float *adjusted = nullptr;           ///< null, or n floats: the row after the penalty, the bias and the mask
  const int32_t *penalty_ids = nullptr;  ///< n_penalty distinct ids inside the row
  const int32_t *bias_ids = nullptr;   ///< n_bias distinct ids inside the row
  const float *bias = nullptr;         ///< their biases
  const uint32_t *mask = nullptr;      ///< null, or mask_words words of allowed tokens
  double u = 0.0;                      ///< the draw's uniform (sample_uniform)
  int64_t n = 0;
  int64_t mask_words = 0;
  float temperature = 0.0f, top_p = 1.0f, min_p = 0.0f, penalty = 1.0f;
  int32_t top_k = 0, n_penalty = 0, n_bias = 0;
  int32_t logprobs = 0;                ///< 1: lse, logprob and the top_n alternatives
  int32_t top_n = 0;                   ///< 0 .. kSampleTopMax (at most n)
};
/// What one row of launch_sample_rows() gives (device memory; downloaded in one copy).
struct SampleRowResult {
  double lse;                          ///< log Σ exp of the raw row (with logprobs)
  int32_t token;                       ///< −1: no token kept
  float logprob;                       ///< the token's log-probability (with logprobs)
  int32_t top_ids[kSampleTopMax];       ///< the top_n most likely tokens (with logprobs)
  float top_logits[kSampleTopMax];      ///< their raw logits
};
/// launch_sample(), and with logprobs launch_token_logprob() and launch_top_k(), for every row of
/// @p rows (device, n_rows entries) in one launch, one block per row; @p results: n_rows entries.
void launch_sample_rows(const SampleRowArgs *rows, int64_t n_rows, SampleRowResult *results, cudaStream_t stream);
/// The repetition penalty on a device copy of the logits: z[ids[j]] / penalty when positive,
/// × penalty otherwise; ids (device) are distinct and inside the row.
void launch_repetition_penalty(float *z, const int32_t *ids, int32_t n_ids, float penalty, cudaStream_t stream);
/// The logit bias on a device copy of the logits: z[ids[j]] += bias[j]; ids (device) are
/// distinct and inside the row.
void launch_logit_bias(float *z, const int32_t *ids, const float *bias, int32_t n_ids, cudaStream_t stream);
/// Constrained sampling on a device copy of the logits (n of them): z[t] = −∞ unless bit t % 32
/// of mask[t / 32] is set; tokens at or past n_words · 32 are masked out. mask is device memory.
void launch_token_mask(float *z, int64_t n, const uint32_t *mask, int64_t n_words, cudaStream_t stream);
/// The sampled token's log-probability under the raw logits (one row of n): *out_lse = log Σ
/// exp(z) (summed in double from the maximum), *out_logprob = (double) z[*token] − *out_lse
/// rounded to float; all device memory.
void launch_token_logprob(const float *logits, int64_t n, const int32_t *token, double *out_lse, float *out_logprob,
                          cudaStream_t stream);

}  // namespace ep::backend::cuda
