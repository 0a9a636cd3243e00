// The CUDA backend: the ops of backend::Backend on one device and one stream. Quantized
// matrix-vector products (up to 8 tokens) run the bandwidth-oriented GEMV kernels; larger
// batches dequantize weight rows in chunks and call cuBLAS (GemmMode): by default on tensor cores
// with each factor carried as two f16 halves (split_f16: ~22 bits of the weights and of x, f32
// sums; f32-like), or to f32 and SGEMM with pedantic math (exact_f32: no TF32, the reference
// path), or, as an opt-in, to bf16 with x rounded to bf16 (fast_bf16: ~1e-1 relative on small
// random models). Routed experts run batched over the selected slots.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "backend/backend.hpp"

namespace ep::backend::cuda {

/// How matmul multiplies more than kGemvMaxTokens tokens (prefill). Every mode dequantizes the
/// weight rows in chunks of at most 64 MiB of its operand format and calls cuBLAS once per chunk.
enum class GemmMode : uint8_t {
  /// Weights dequantized to f32 (f32 weights used as they are), x as is, cublasSgemm under
  /// CUBLAS_PEDANTIC_MATH (no TF32): the reference path. Any type with a dequantization kernel.
  exact_f32 = 0,
  /// Weights dequantized to bf16, x rounded to bf16, cublasGemmEx (tensor cores, f32 accumulate);
  /// f32 weights are not rounded: they take exact_f32's SGEMM. Any type with a dequantization kernel.
  fast_bf16 = 1,
  /// The default: each weight row and each token of x scaled by a power of two (its largest |value|
  /// into [2^14, 2^15)) and split into f16 halves hi + lo (backend/cuda/split_f16.cuh: 22
  /// significant bits); one cublasGemmEx of f16 over 3k, [W_hi | W_lo | W_hi] · [x_lo ; x_hi ;
  /// x_hi] (the small products first), accumulated in f32 (CUBLAS_COMPUTE_32F), then both scales
  /// undone exactly. Within 1e-4
  /// of max |y| of the CPU (tests/backend/cuda/backend_gpu_test.cpp, measured far below). A NaN in
  /// a token of x (a row of W) makes that token's (row's) outputs NaN, as the sum does; an inf
  /// makes them NaN too (its lo half is inf − inf), never a finite number. Any type with a
  /// dequantization kernel, f32 included; rows of a multiple of 32 values (Status::shape otherwise).
  split_f16 = 2,
};

/// The mode's name as EP_CUDA_GEMM and `ep-bench kernels --gemm-mode` spell it: "exact", "bf16",
/// "split".
const char *gemm_mode_name(GemmMode mode) noexcept;
/// Parses a gemm_mode_name(); false for any other string (nothing written).
bool parse_gemm_mode(const char *name, GemmMode &out) noexcept;

class CudaBackend final : public backend::Backend {
 public:
  /// Uses device @p device_index and creates its own stream. The GEMM mode starts as
  /// GemmMode::split_f16, or as the environment's EP_CUDA_GEMM names it (exact, bf16 or split);
  /// any other value of EP_CUDA_GEMM throws Error(Status::invalid_argument).
  explicit CudaBackend(int device_index = 0);
  ~CudaBackend() override;

  cudaStream_t stream() const noexcept;
  backend::Device device() const noexcept override { return backend::Device::cuda; }

  void *allocate(uint64_t bytes) override;
  void deallocate(void *ptr) noexcept override;
  void upload(void *dst, const void *src, uint64_t bytes) override;
  void download(void *dst, const void *src, uint64_t bytes) override;
  void *host_buffer(unsigned slot, uint64_t bytes) override;
  void download_async(void *dst, const void *src, uint64_t bytes) override;
  void wait_downloads() override;
  void fill_zero(void *dst, uint64_t bytes) override;
  void synchronize() override;
  void make_current() override;
  void wait_for(backend::Backend &other) override;
  /// cudaMemcpyPeerAsync from @p from's device on this stream (the same GPU twice: a device copy).
  void copy_from(backend::Backend &from, void *dst, const void *src, uint64_t bytes) override;
  /// The CUDA device's ordinal.
  int device_index() const noexcept;

  void matmul(const backend::Tensor &w, const backend::Tensor &x, const backend::Tensor &y) override;
  /// Up to kGemvMaxTokens tokens: one GEMV launch over the groups (several tokens: between a
  /// gather and a scatter of x's and y's rows); more tokens: the default.
  void grouped_matmul(const backend::Tensor &w, int64_t groups, const backend::Tensor &x, const backend::Tensor &y) override;
  void rms_norm(const backend::Tensor &x, const backend::Tensor *weight, float eps, const backend::Tensor &y) override;
  void rope(const backend::Tensor &x, const backend::Tensor &positions, const backend::RopeParams &params,
            const backend::Tensor &y) override;
  void embed(const backend::Tensor &table, const backend::Tensor &ids, const backend::Tensor &y) override;
  void softmax(const backend::Tensor &x, const backend::Tensor &y) override;
  void top_k(const backend::Tensor &x, int32_t k, const backend::Tensor &indices, const backend::Tensor &values) override;
  void glu(const backend::Tensor &gate, const backend::Tensor &up, const backend::Activation &act,
           const backend::Tensor &y) override;
  void add(const backend::Tensor &a, const backend::Tensor &b, const backend::Tensor &y) override;
  void route(const backend::Tensor &logits, const backend::RouterParams &params, const backend::Tensor &expert_ids,
             const backend::Tensor &weights) override;
  void moe(const backend::Tensor &x, const backend::Tensor &expert_ids, const backend::Tensor &weights,
           const backend::ExpertBatch &batch, const backend::SlotLayout &layout, const backend::Activation &act,
           const backend::Tensor &y) override;
  /// False for decode batches (up to kGemvMaxTokens tokens) whose three roles have GEMV kernels:
  /// those read the device role table; the rest group pairs by expert on the host.
  bool moe_reads_host_picks(int64_t n_tokens, const backend::SlotLayout &layout) const override;
  void gather_role_table(const backend::Tensor &expert_ids, const void *const *slots, int64_t n_experts,
                         const backend::SlotLayout &layout, const void **out) override;
  void moe_pairs(const backend::Tensor &x, const backend::Tensor &expert_ids, const backend::ExpertBatch &batch,
                 const backend::SlotLayout &layout, const backend::Activation &act, const backend::Tensor &pairs) override;
  void moe_combine(const backend::Tensor &pairs, const backend::Tensor &weights, const backend::Tensor &y) override;
  using Backend::sample;
  int32_t sample(const backend::Tensor &logits, const backend::SamplingParams &params, uint64_t counter,
                 backend::TokenLogprobs *logprobs) override;
  /// Every row in one launch (sample_rows_kernel: sample()'s device code, one block per row), one
  /// download of every row's results, one synchronisation.
  void sample_rows(std::span<const backend::SampleRow> rows, std::span<int32_t> tokens) override;

  void mul(const backend::Tensor &a, const backend::Tensor &b, const backend::Tensor &y) override;
  void scale(const backend::Tensor &x, float s, const backend::Tensor &y) override;
  void copy(const backend::Tensor &src, const backend::Tensor &dst) override;
  void copy_2d(void *dst, uint64_t dst_pitch_bytes, const void *src, uint64_t src_pitch_bytes, uint64_t row_bytes,
               uint64_t rows) override;
  void hc_weights(const backend::Tensor &mix, const backend::Tensor &scale, const backend::Tensor &base, float eps,
                  int32_t sinkhorn_iters, const backend::Tensor &pre, const backend::Tensor *post,
                  const backend::Tensor *comb) override;
  void hc_collapse(const backend::Tensor &x, const backend::Tensor &pre, const backend::Tensor &y) override;
  void hc_expand(const backend::Tensor &x, const backend::Tensor &f, const backend::Tensor &post,
                 const backend::Tensor &comb, const backend::Tensor &y) override;
  void attention_sinks(const backend::Tensor &q, const backend::Tensor &kv, const backend::Tensor &visible,
                       const backend::Tensor &sinks, float scale, const backend::Tensor &out) override;
  void pool_windows(const backend::Tensor &kv, const backend::Tensor &gate, const backend::Tensor &out) override;
  void indexer_scores(const backend::Tensor &q, const backend::Tensor &w, const backend::Tensor &keys,
                      const backend::Tensor &visible, float scale, const backend::Tensor &scores) override;
  void set_visible(const backend::Tensor &indices, const backend::Tensor &values, int64_t offset,
                   const backend::Tensor &mask) override;
  // Kimi ops (cuda_backend_kimi.cpp, kernels in kimi_ops.cu)
  void short_conv_silu(const backend::Tensor &x, const backend::Tensor &w, const backend::Tensor &state,
                       const backend::Tensor &y) override;
  void l2_normalize(const backend::Tensor &x, float eps, float s, const backend::Tensor &y) override;
  void sigmoid(const backend::Tensor &x, const backend::Tensor &y) override;
  void kda_gate(const backend::Tensor &x, const backend::Tensor &bias, const backend::Tensor &a, float lower_bound,
                const backend::Tensor &g) override;
  void kda_recurrence(const backend::Tensor &q, const backend::Tensor &k, const backend::Tensor &v,
                      const backend::Tensor &g, const backend::Tensor &beta, const backend::Tensor &state,
                      const backend::Tensor &out) override;
  void gated_rms_norm(const backend::Tensor &x, const backend::Tensor &w, const backend::Tensor &gate, float eps,
                      const backend::Tensor &y) override;
  void causal_attention(const backend::Tensor &q, const backend::Tensor &keys, const backend::Tensor &values,
                        int64_t n_past, float scale, const backend::Tensor &out) override;
  void attn_res_mix(const backend::Tensor *banked, const backend::Tensor &cur, const backend::Tensor &w, float eps,
                    const backend::Tensor &out) override;

  /// y[N, T] = W · x through the dequantize + cuBLAS path regardless of T (benchmarks, tests), in
  /// the current GEMM mode / in @p mode. Throws Error(Status::unsupported) for a type without a
  /// CUDA dequantization kernel and Error(Status::shape) for rows the mode cannot take.
  void matmul_gemm(const backend::Tensor &w, const backend::Tensor &x, const backend::Tensor &y);
  void matmul_gemm(const backend::Tensor &w, const backend::Tensor &x, const backend::Tensor &y, GemmMode mode);
  /// The path of prefill matmuls (and the routed experts' products above kGemvMaxTokens tokens).
  void set_gemm_mode(GemmMode mode) noexcept;
  GemmMode gemm_mode() const noexcept;

 protected:
  void *workspace(unsigned slot, uint64_t bytes) override;

 private:
  /// The rows of moe() for a decode batch: the GEMV kernels read the role table's addresses.
  void compute_pairs_from_table(const backend::Tensor &x, const backend::ExpertBatch &batch, int64_t k,
                                const backend::SlotLayout &layout, const backend::Activation &act, float *pair_out);
  /// The expert GEMVs of @p n_mat matrices of @p n_tok tokens each: their addresses in
  /// @p role_table ([3][n_mat], device), the first x row of each gate and up matrix in @p x_rows
  /// ([2][n_mat], device), of each down matrix in the gate output in @p down_rows (null: row m);
  /// rows to @p out ([n_mat · n_tok][D]).
  void run_pair_gemvs(const backend::Tensor &x, const void *const *role_table, const int32_t *x_rows, int64_t n_mat,
                      int32_t n_tok, const int32_t *down_rows, const backend::SlotLayout &layout,
                      const backend::Activation &act, float *out);
  /// The rows of the pairs @p batch covers: few tokens through the decode GEMVs on a compacted
  /// table, else grouped by expert on the host (prefill, moe_pairs()).
  void compute_pairs_grouped(const backend::Tensor &x, const backend::ExpertBatch &batch, const backend::SlotLayout &layout,
                             const backend::Activation &act, float *pair_out);

  /// The grouped path's rows on GEMV kernels: each expert's tokens in chunks of kGemvMaxTokens,
  /// or, where all three roles run on the tensor-core kernel (gemv_runs_wide), in chunks of
  /// kGemvMaxWideTokens (32) with the rest in one chunk of 8, 16 or 32 (9..16 tokens: one of 16),
  /// so that each expert's weights are read and decoded once per 32 tokens; one launch per role
  /// and chunk size for all chunks. The chunk sizes are a function of the expert's token count
  /// and the layout only: moe_pairs over disjoint expert sets gives moe()'s bits.
  void run_chunked_expert_gemvs(const backend::Tensor &x, const std::vector<backend::ExpertGroup> &groups, int64_t k,
                                const backend::SlotLayout &layout, const backend::Activation &act, float *pair_out);

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ep::backend::cuda
