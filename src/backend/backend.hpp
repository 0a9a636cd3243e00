// The op interface the models are written against, once, for every backend: the CPU backend
// (exact fp32 reference, cpu_backend.hpp) and the CUDA backend (cuda/cuda_backend.hpp).
//
// Conventions: activations are f32, row-major with ne[0] contiguous ([features, tokens]).
// Weights are ggml rows: W has ne[0] = input dim (contiguous), ne[1] = output dim, and any
// supported type (f32, f16, bf16, q8_0, q2_K, q3_K, q4_K, q5_K, q6_K, mxfp4, iq2_xxs).
// Every tensor passed to an op lives on the backend's device and is contiguous. Ops are
// ordered on the backend's stream; download() and sample() synchronise.
#pragma once

#include "backend/tensor.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace ep::backend {

/// RoPE on a sub-range of each head, interleaved pairs (x[2i], x[2i+1]), with optional YaRN.
struct RopeParams {
  int32_t n_dims = 0;        ///< rotated dims per head (even); 0 = the whole head
  int32_t dim_offset = 0;    ///< first rotated dim within the head (DeepSeek-V4: head_dim − 64)
  float theta = 10000.0f;    ///< frequency base
  bool inverse = false;      ///< rotate by −angle (DeepSeek-V4 attention output)
  // YaRN (HF _compute_yarn_parameters with truncate=true); off when yarn_factor <= 1.
  float yarn_factor = 1.0f;
  int64_t yarn_original_max_positions = 0;
  float yarn_beta_fast = 32.0f;
  float yarn_beta_slow = 1.0f;
  float attention_factor = 1.0f;  ///< multiplies cos and sin (DeepSeek-V4 forces 1.0)
};

/// The inverse frequencies of RopeParams (n_dims/2 entries), computed as HF does.
std::vector<float> rope_inv_freq(const RopeParams &params, int32_t head_dim);

/// Router scoring function.
enum class Scoring : uint8_t { softmax = 0, sigmoid = 1, sqrt_softplus = 2 };

/// MoE router. Scores s = f(logits). Without a hash table the experts are the top-k of
/// s + bias (bias optional); with one, the experts of token t are hash_table[t·k .. t·k+k).
/// Weights are s at the chosen experts, divided by their sum when renormalize, times scale.
struct RouterParams {
  Scoring scoring = Scoring::softmax;
  int32_t k = 1;
  bool renormalize = true;
  float scale = 1.0f;
  const Tensor *bias = nullptr;        ///< f32 [n_experts] or null
  const Tensor *hash_table = nullptr;  ///< i32 [k, vocab] (token → experts) or null
  const Tensor *token_ids = nullptr;   ///< i32 [n_tokens], needed with hash_table
};

/// Gated activation of (gate, up).
enum class ActivationKind : uint8_t {
  swiglu = 0,  ///< silu(min(g, limit)) · clamp(u, −limit, limit); limit <= 0 means no clamp
  situ = 1,    ///< beta_g·tanh(g/beta_g)·σ(g) · beta_u·tanh(u/beta_u)
};
struct Activation {
  ActivationKind kind = ActivationKind::swiglu;
  float limit = 0.0f;     ///< swiglu clamp (DeepSeek-V4: 10)
  float beta_g = 4.0f;    ///< situ gate beta (Kimi-K3: 4)
  float beta_u = 25.0f;   ///< situ linear beta (Kimi-K3: 25)
};

/// One weight inside an expert slot: bytes at slot + offset, ggml rows of ne0 values, ne1 rows.
struct SlotWeight {
  uint64_t offset = 0;
  GgmlType type = GgmlType::f32;
  int64_t ne0 = 0;
  int64_t ne1 = 0;
};
/// Where gate [D→F], up [D→F] and down [F→D] sit inside each expert slot.
struct ExpertLayout {
  SlotWeight gate, up, down;
};
/// The ExpertStore's table: slot[e] is the address (on the backend's device) of expert e's
/// contiguous object, or null when it is not resident.
struct ExpertSlots {
  const void *const *slot = nullptr;  ///< host array of n_experts addresses
  int32_t n_experts = 0;
};

/// Sampling: greedy when temperature <= 0 or top_k == 1. Otherwise logits/temperature,
/// keep the top_k largest (0 = all; ties at the k-th value are kept), then the smallest set of
/// most probable tokens whose probability reaches top_p (1 = all), and draw from the kept
/// tokens in vocabulary order with u = sample_uniform(seed, counter).
struct SamplingParams {
  float temperature = 0.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  uint64_t seed = 0;
};

/// The seeded uniform in [0, 1) used for draw @p counter (splitmix64; same on every backend).
double sample_uniform(uint64_t seed, uint64_t counter) noexcept;

/// The op interface. Not thread-safe: one backend per thread / stream.
class Backend {
 public:
  virtual ~Backend() = default;
  Backend() = default;
  Backend(const Backend &) = delete;
  Backend &operator=(const Backend &) = delete;

  virtual Device device() const noexcept = 0;

  // ---- memory on the backend's device ----
  virtual void *allocate(uint64_t bytes) = 0;
  virtual void deallocate(void *ptr) noexcept = 0;
  /// Host → device; @p src may be reused when it returns.
  virtual void upload(void *dst, const void *src, uint64_t bytes) = 0;
  /// Device → host; waits for the ops before it.
  virtual void download(void *dst, const void *src, uint64_t bytes) = 0;
  virtual void fill_zero(void *dst, uint64_t bytes) = 0;
  virtual void synchronize() = 0;

  // ---- ops ----
  /// y[N, T] = W[K, N] · x[K, T] for every supported weight type (decode: T = 1; prefill: T > 1).
  virtual void matmul(const Tensor &w, const Tensor &x, const Tensor &y) = 0;
  /// y = x / sqrt(mean(x²) + eps) (· weight when given, f32 [ne0]) per row.
  virtual void rms_norm(const Tensor &x, const Tensor *weight, float eps, const Tensor &y) = 0;
  /// x, y: f32 [head_dim, n_heads, T]; positions: i32 [T]. Dims outside the rotated range are
  /// copied. y may alias x.
  virtual void rope(const Tensor &x, const Tensor &positions, const RopeParams &params,
                    const Tensor &y) = 0;
  /// y[:, t] = dequantized row ids[t] of table [D, V] (any supported type).
  virtual void embed(const Tensor &table, const Tensor &ids, const Tensor &y) = 0;
  /// Row-wise softmax; y may alias x.
  virtual void softmax(const Tensor &x, const Tensor &y) = 0;
  /// Per row: the k largest values, descending (ties: lower index first); indices i32 [k, rows],
  /// values f32 [k, rows].
  virtual void top_k(const Tensor &x, int32_t k, const Tensor &indices, const Tensor &values) = 0;
  /// y = act(gate, up) elementwise (all f32, same shape).
  virtual void glu(const Tensor &gate, const Tensor &up, const Activation &act, const Tensor &y) = 0;
  /// y = a + b elementwise (same shape); y may alias a or b.
  virtual void add(const Tensor &a, const Tensor &b, const Tensor &y) = 0;
  /// Router: logits f32 [n_experts, T] → expert_ids i32 [k, T], weights f32 [k, T].
  virtual void route(const Tensor &logits, const RouterParams &params, const Tensor &expert_ids,
                     const Tensor &weights) = 0;
  /// Routed experts: y[:, t] = Σ_j weights[j, t] · down(act(gate(x_t), up(x_t))) of expert
  /// expert_ids[j, t], each expert read from its slot. x, y: f32 [D, T].
  virtual void moe(const Tensor &x, const Tensor &expert_ids, const Tensor &weights,
                   const ExpertSlots &slots, const ExpertLayout &layout, const Activation &act,
                   const Tensor &y) = 0;
  /// A dense gated FFN (shared experts, dense layers): y = down(act(gate x, up x)).
  void ffn(const Tensor &x, const Tensor &w_gate, const Tensor &w_up, const Tensor &w_down,
           const Activation &act, const Tensor &y);
  /// Draws one token from logits f32 [V] (one row); synchronises.
  virtual int32_t sample(const Tensor &logits, const SamplingParams &params, uint64_t counter) = 0;

 protected:
  /// Scratch memory on the device, one growing buffer per @p slot (0..7); valid until the next
  /// call with the same slot.
  virtual void *workspace(unsigned slot, uint64_t bytes) = 0;
};

// ---- shape checks shared by the backends (throw Error(Status::shape / unsupported)) ----
/// True for the weight types every backend can multiply and dequantize.
bool is_supported_weight_type(GgmlType type) noexcept;
void check_weight_type(GgmlType type, const char *op);
void check_f32(const Tensor &t, const char *op, const char *what, Device device);
void check_i32(const Tensor &t, const char *op, const char *what, Device device);
void check_same_shape(const Tensor &a, const Tensor &b, const char *op);
void check_matmul(const Tensor &w, const Tensor &x, const Tensor &y, Device device);
void check_moe(const Tensor &x, const Tensor &expert_ids, const Tensor &weights,
               const ExpertLayout &layout, const Tensor &y, Device device);
/// Validates host ids against the slot table; returns the slot addresses per (token, j).
std::vector<const uint8_t *> resolve_expert_slots(const int32_t *ids, int64_t n, const ExpertSlots &slots);

}  // namespace ep::backend
