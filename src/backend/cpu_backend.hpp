// The CPU backend: the exact reference. Simple single-threaded loops with fp32 accumulation;
// quantized weights are dequantized row by row with dequantize_row() (bit-exact with ggml).
#pragma once

#include "backend/backend.hpp"

#include <memory>
#include <vector>

namespace ep::backend {

class CpuBackend final : public Backend {
 public:
  CpuBackend() = default;
  Device device() const noexcept override { return Device::cpu; }

  void *allocate(uint64_t bytes) override;
  void deallocate(void *ptr) noexcept override;
  void upload(void *dst, const void *src, uint64_t bytes) override;
  void download(void *dst, const void *src, uint64_t bytes) override;
  void fill_zero(void *dst, uint64_t bytes) override;
  void synchronize() override {}

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
  void moe(const Tensor &x, const Tensor &expert_ids, const Tensor &weights, const ExpertSlots &slots,
           const ExpertLayout &layout, const Activation &act, const Tensor &y) override;
  int32_t sample(const Tensor &logits, const SamplingParams &params, uint64_t counter) override;

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

 protected:
  void *workspace(unsigned slot, uint64_t bytes) override;

 private:
  std::vector<std::vector<uint8_t>> workspace_ = std::vector<std::vector<uint8_t>>(8);
};

/// The activation of one (gate, up) pair, as every backend computes it.
float activation_ref(float g, float u, const Activation &act) noexcept;
/// The router score of one logit.
float router_score_ref(float logit, Scoring scoring) noexcept;
/// y[n·T...] = W · x on host memory (rows dequantized, fp32 accumulation).
void matmul_ref(GgmlType type, const void *w, int64_t k, int64_t n, const float *x, int64_t n_tokens, float *y);

}  // namespace ep::backend
