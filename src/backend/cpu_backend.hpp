// The CPU backend: the exact reference. Simple loops with fp32 accumulation; quantized weights
// are dequantized row by row with dequantize_row() (bit-exact with ggml). The hot ops (matmul,
// moe, attention_sinks, indexer_scores, ...) run on a small thread pool owned by the backend;
// work is split by output rows / experts / tokens only, never a reduction across threads, so
// the results are bitwise the same for every thread count.
#pragma once

#include "backend/backend.hpp"
#include "core/thread_pool.hpp"

#include <memory>
#include <vector>

namespace ep::backend {

class CpuBackend final : public Backend {
 public:
  /// @p threads: the pool's thread count; 0 = ThreadPool::default_threads() (EP_CPU_THREADS,
  /// else the hardware concurrency); 1 = no worker threads.
  explicit CpuBackend(unsigned threads = 0);
  /// The thread count the ops run with.
  unsigned threads() const noexcept { return pool_.threads(); }
  Device device() const noexcept override { return Device::cpu; }

  void *allocate(uint64_t bytes) override;
  void deallocate(void *ptr) noexcept override;
  void upload(void *dst, const void *src, uint64_t bytes) override;
  void download(void *dst, const void *src, uint64_t bytes) override;
  void *host_buffer(unsigned slot, uint64_t bytes) override;
  void download_async(void *dst, const void *src, uint64_t bytes) override { download(dst, src, bytes); }
  void wait_downloads() override {}
  void fill_zero(void *dst, uint64_t bytes) override;
  void synchronize() override {}
  /// Checks that @p other is a CPU backend; nothing to order (every op is done when it returns).
  void wait_for(Backend &other) override;
  void copy_from(Backend &from, void *dst, const void *src, uint64_t bytes) override;

  void matmul(const Tensor &w, const Tensor &x, const Tensor &y) override;
  void rms_norm(const Tensor &x, const Tensor *weight, float eps, const Tensor &y) override;
  void rope(const Tensor &x, const Tensor &positions, const RopeParams &params, const Tensor &y) override;
  void embed(const Tensor &table, const Tensor &ids, const Tensor &y) override;
  void softmax(const Tensor &x, const Tensor &y) override;
  void top_k(const Tensor &x, int32_t k, const Tensor &indices, const Tensor &values) override;
  void glu(const Tensor &gate, const Tensor &up, const Activation &act, const Tensor &y) override;
  void add(const Tensor &a, const Tensor &b, const Tensor &y) override;
  void route(const Tensor &logits, const RouterParams &params, const Tensor &expert_ids,
             const Tensor &weights) override;
  void moe(const Tensor &x, const Tensor &expert_ids, const Tensor &weights, const ExpertBatch &batch,
           const SlotLayout &layout, const Activation &act, const Tensor &y) override;
  /// Always: the CPU's "device" memory is host memory, so the host picks cost nothing.
  bool moe_reads_host_picks(int64_t, const SlotLayout &) const override { return true; }
  void gather_role_table(const Tensor &expert_ids, const void *const *slots, int64_t n_experts, const SlotLayout &layout,
                         const void **out) override;
  void moe_pairs(const Tensor &x, const Tensor &expert_ids, const ExpertBatch &batch, const SlotLayout &layout,
                 const Activation &act, const Tensor &pairs) override;
  void moe_combine(const Tensor &pairs, const Tensor &weights, const Tensor &y) override;
  using Backend::sample;
  int32_t sample(const Tensor &logits, const SamplingParams &params, uint64_t counter,
                 TokenLogprobs *logprobs) override;
  /// The rows one after another, each exactly as sample() draws it.
  void sample_rows(std::span<const SampleRow> rows, std::span<int32_t> tokens) override;

  void mul(const Tensor &a, const Tensor &b, const Tensor &y) override;
  void scale(const Tensor &x, float s, const Tensor &y) override;
  void copy(const Tensor &src, const Tensor &dst) override;
  void copy_2d(void *dst, uint64_t dst_pitch_bytes, const void *src, uint64_t src_pitch_bytes, uint64_t row_bytes,
               uint64_t rows) override;
  void hc_weights(const Tensor &mix, const Tensor &scale, const Tensor &base, float eps, int32_t sinkhorn_iters,
                  const Tensor &pre, const Tensor *post, const Tensor *comb) override;
  void hc_collapse(const Tensor &x, const Tensor &pre, const Tensor &y) override;
  void hc_expand(const Tensor &x, const Tensor &f, const Tensor &post, const Tensor &comb, const Tensor &y) override;
  void attention_sinks(const Tensor &q, const Tensor &kv, const Tensor &visible, const Tensor &sinks, float scale,
                       const Tensor &out) override;
  void pool_windows(const Tensor &kv, const Tensor &gate, const Tensor &out) override;
  void indexer_scores(const Tensor &q, const Tensor &w, const Tensor &keys, const Tensor &visible, float scale,
                      const Tensor &scores) override;
  void set_visible(const Tensor &indices, const Tensor &values, int64_t offset, const Tensor &mask) override;
  // Kimi ops (cpu_backend_kimi.cpp)
  void short_conv_silu(const Tensor &x, const Tensor &w, const Tensor &state, const Tensor &y) override;
  void l2_normalize(const Tensor &x, float eps, float s, const Tensor &y) override;
  void sigmoid(const Tensor &x, const Tensor &y) override;
  void kda_gate(const Tensor &x, const Tensor &bias, const Tensor &a, float lower_bound, const Tensor &g) override;
  void kda_recurrence(const Tensor &q, const Tensor &k, const Tensor &v, const Tensor &g, const Tensor &beta,
                      const Tensor &state, const Tensor &out) override;
  void gated_rms_norm(const Tensor &x, const Tensor &w, const Tensor &gate, float eps, const Tensor &y) override;
  void causal_attention(const Tensor &q, const Tensor &keys, const Tensor &values, int64_t n_past, float scale,
                        const Tensor &out) override;
  void attn_res_mix(const Tensor *banked, const Tensor &cur, const Tensor &w, float eps, const Tensor &out) override;

 protected:
  void *workspace(unsigned slot, uint64_t bytes) override;

 private:
  /// The token sample() draws from the raw logits row @p z (n floats): penalty, bias, cuts, draw.
  static int32_t draw(const float *z, int64_t n, const SamplingParams &p, uint64_t counter);
  /// Per-worker f32 scratch (@p slot 0..3) of at least @p n floats.
  float *worker_scratch(unsigned worker, unsigned slot, int64_t n);

  std::vector<std::vector<uint8_t>> workspace_ = std::vector<std::vector<uint8_t>>(8);
  std::vector<std::vector<uint8_t>> host_buffers_ = std::vector<std::vector<uint8_t>>(4);
  ThreadPool pool_;
  std::vector<std::vector<float>> scratch_;  // [worker * 4 + slot]
  std::vector<float> packed_x_;              // matmul's x in blocks of 8 tokens
  /// The rows of the pairs @p batch covers into pair_out [k·T rows of D]; moe() and moe_pairs().
  void compute_pairs(const Tensor &x, const Tensor &expert_ids, const ExpertBatch &batch, const SlotLayout &layout,
                     const Activation &act, float *pair_out);
  /// y[t] = Σ_j weights[j, t] · pair_out[t·k + j], j in order; moe() and moe_combine().
  void combine_pairs(const float *pair_out, const Tensor &weights, const Tensor &y);
  std::vector<float> pair_out_, moe_x_, moe_h_, moe_o_;  // moe: per-pair rows, one expert's batch
};

/// The activation of one (gate, up) pair, as every backend computes it.
float activation_ref(float g, float u, const Activation &act) noexcept;
/// The router score of one logit.
float router_score_ref(float logit, Scoring scoring) noexcept;
/// y[n·T...] = W · x on host memory (rows dequantized, fp32 accumulation).
void matmul_ref(GgmlType type, const void *w, int64_t k, int64_t n, const float *x, int64_t n_tokens, float *y);
/// Output rows [r0, r1) of matmul_ref (y[t·ldy + r] for r in [r0, r1)), bitwise the same values:
/// each y element is Σ_i w[r, i]·x[t, i] accumulated in f32 from 0 with i ascending, whatever the
/// row range. @p x is [T, k] token-major; @p row_buf holds at least 4·k floats (dequantized rows);
/// @p xt is pack_tokens_by8(x) when n_tokens >= 4 (may be null below that).
void matmul_rows(GgmlType type, const void *w, int64_t k, int64_t r0, int64_t r1, const float *x, int64_t n_tokens,
                 float *y, int64_t ldy, float *row_buf, const float *xt);
/// x [T, k] (token-major) → blocks of 8 tokens [ceil(T/8)][k][8], zero-padded (the layout
/// matmul_rows reads for n_tokens >= 4).
void pack_tokens_by8(const float *x, int64_t k, int64_t n_tokens, float *xt);

}  // namespace ep::backend
