// The op interface the models are written against, once, for every backend: the CPU backend
// (exact fp32 reference, cpu_backend.hpp) and the CUDA backend (backend/cuda/cuda_backend.hpp).
//
// Conventions: activations are f32, row-major with ne[0] contiguous ([features, tokens]).
// Weights are ggml rows: W has ne[0] = input dim (contiguous), ne[1] = output dim, and any
// supported type (f32, f16, bf16, q8_0, q2_K, q3_K, q4_K, q5_K, q6_K, mxfp4, iq2_xxs).
// Every tensor passed to an op lives on the backend's device and is contiguous. Ops, uploads and
// device copies are ordered on the backend's stream and return without waiting for the device;
// download(), wait_downloads() and sample() synchronise.
#pragma once

#include "backend/tensor.hpp"

#include <cstdint>
#include <span>
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
struct SlotLayout {
  SlotWeight gate, up, down;
};
/// One MoE layer's picks resolved to expert slots: what the expert provider (the ExpertStore's
/// one published table, or the resident experts' table built on the device) hands the moe op.
/// Pair p = t·k + j is token t's j-th pick (expert_ids[j, t]).
struct ExpertBatch {
  int64_t n_pairs = 0;
  /// Backend memory, [3][n_pairs]: per pair, the address of its expert's gate (row 0), up
  /// (row 1) and down (row 2) weights, i.e. the slot plus the SlotLayout offset of the role.
  /// Null when the batch was resolved on the host only.
  const void *const *role_table = nullptr;
  /// Host memory, [n_pairs]: per pair, its expert's slot (the object's first byte, in backend
  /// memory), or null for a pair this batch does not cover (moe_pairs). Null when the batch was
  /// resolved on the device only (then it covers every pair).
  const void *const *pair_slots = nullptr;
  /// Host memory, [n_pairs]: per pair, its expert id (given with pair_slots).
  const int32_t *pair_experts = nullptr;
  /// Backend memory, for a batch that covers some pairs (a staged acquire's wave: the pairs
  /// whose experts became resident together), published by the store (store::Acquisition's
  /// wave_table): the n_wave covered pairs in ascending order, [3][n_wave] the addresses of their
  /// gate, up and down weights; null when the batch has none (the host copies are there either way).
  const void *const *wave_table = nullptr;
  /// Backend memory, with wave_table: int32 [3][n_wave] each entry's token (the same in every
  /// row), then int32 [n_wave] each entry's pair.
  const int32_t *wave_lists = nullptr;
  int64_t n_wave = 0;
};

/// One additive logit bias (OpenAI's logit_bias): @c bias is added to the logit of @c token.
struct TokenBias {
  int32_t token = 0;
  float bias = 0.0f;
};

/// Sampling. First the repetition penalty: the logit z of each distinct token in
/// penalty_tokens becomes z / repetition_penalty when z > 0, else z · repetition_penalty (HF /
/// llama.cpp; 1 = off; ids outside the row are ignored). Then each logit_bias entry is added to
/// its token's logit (distinct ids inside the row; the engine checks them). Then the allowed mask
/// (tokens outside it: −∞). Then greedy (first maximum) when
/// temperature <= 0 or top_k == 1. Otherwise logits/temperature, keep the top_k largest (0 =
/// all; ties at the k-th value are kept), then the smallest set of most probable tokens whose
/// probability reaches top_p (1 = all), then drop tokens whose probability is below min_p × the
/// largest (0 = off), and draw from the kept tokens in vocabulary order with
/// u = sample_uniform(seed, counter).
struct SamplingParams {
  float temperature = 0.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  uint64_t seed = 0;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  /// Tokens the penalty applies to (duplicates count once); host memory, valid during sample().
  std::span<const int32_t> penalty_tokens;
  /// Added to the logits after the penalty, before the temperature: distinct ids inside the row.
  std::vector<TokenBias> logit_bias;
  /// Empty: every token may be drawn. Else the tokens that may (constrained sampling): bit t % 32
  /// of word t / 32 for token t; tokens past the words may not. Applied after the logit bias: a
  /// token outside it gets the logit −∞, so greedy and seeded draws pick from exactly the masked
  /// distribution. Host memory, valid during sample(); at least one token of the row allowed.
  std::span<const uint32_t> allowed;
};

/// The most alternatives TokenLogprobs reports (OpenAI's top_logprobs limit).
inline constexpr int32_t kMaxTopLogprobs = 20;

/// What sample() reports of the distribution it drew from, when asked. The log-probabilities are
/// the model's own: log-softmax of the raw logits row, before the repetition penalty, the logit
/// bias, the temperature and the top-k / top-p / min-p cuts (vLLM's default), so they do not
/// depend on the sampling settings. Each is computed as (double) z − log Σ exp(z) with the sum
/// in double, then rounded to float.
struct TokenLogprobs {
  int32_t top_n = 0;               ///< in: alternatives wanted, 0 .. kMaxTopLogprobs
  float logprob = 0.0f;            ///< out: the sampled token's log-probability
  std::vector<int32_t> top_ids;    ///< out: the top_n most likely tokens, descending (ties: lower id first)
  std::vector<float> top_logprobs; ///< out: their log-probabilities
};
/// One row of Backend::sample_rows(): a row of logits with its own settings, draw and
/// log-probabilities, as one sample() call takes them.
struct SampleRow {
  Tensor logits;                         ///< f32 [V], one row on the backend's device
  const SamplingParams *params = nullptr;  ///< its settings (host memory, valid during the call)
  uint64_t counter = 0;                  ///< its draw: u = sample_uniform(params->seed, counter)
  TokenLogprobs *logprobs = nullptr;     ///< null, or filled as sample() fills it (top_n in, the rest out)
};

/// The distinct ids of @p tokens inside [0, n_vocab), ascending (what the penalty touches).
std::vector<int32_t> penalty_ids(std::span<const int32_t> tokens, int64_t n_vocab);
/// Applies the repetition penalty of @p p to @p z (n_vocab floats) in place.
void apply_repetition_penalty(float *z, int64_t n_vocab, const SamplingParams &p);
/// Adds the logit bias of @p p to @p z (n_vocab floats) in place; Status::invalid_argument for an
/// id outside the row.
void apply_logit_bias(float *z, int64_t n_vocab, const SamplingParams &p);
/// Status::invalid_argument unless every logit_bias id of @p p is inside [0, n_vocab).
void check_logit_bias(const SamplingParams &p, int64_t n_vocab);
/// Sets the logit of every token @p p's allowed mask leaves out to −∞ (nothing when the mask is
/// empty); Status::invalid_argument when it allows no token of the row.
void apply_token_mask(float *z, int64_t n_vocab, const SamplingParams &p);
/// Status::invalid_argument when @p p has a mask that allows no token inside [0, n_vocab).
void check_token_mask(const SamplingParams &p, int64_t n_vocab);
/// sample_rows()'s checks of @p rows on @p device (the row's shape and type, its params, its logit
/// bias, its mask and its top_n, as sample() checks them), each message prefixed with the row's
/// index; Status::invalid_argument when @p n_tokens differs from the row count.
void check_sample_rows(std::span<const SampleRow> rows, size_t n_tokens, Device device);

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
  /// Host → device, ordered on the stream like the ops; @p src may be reused when it returns (the
  /// bytes are staged: the call does not wait for the device).
  virtual void upload(void *dst, const void *src, uint64_t bytes) = 0;
  /// Device → host; waits for the ops before it.
  virtual void download(void *dst, const void *src, uint64_t bytes) = 0;
  /// Host memory of @p bytes that download_async() can copy into (pinned on CUDA), one growing
  /// buffer per @p slot (0..3), owned by the backend; valid until the next call with the slot.
  virtual void *host_buffer(unsigned slot, uint64_t bytes) = 0;
  /// Starts a device → host copy ordered after the ops before it and returns at once; @p dst
  /// must come from host_buffer(). wait_downloads() blocks until every copy started so far is
  /// done. Lets the host queue more work before it needs the bytes.
  virtual void download_async(void *dst, const void *src, uint64_t bytes) = 0;
  virtual void wait_downloads() = 0;
  virtual void fill_zero(void *dst, uint64_t bytes) = 0;
  virtual void synchronize() = 0;

  // ---- several backends of one kind (a model on several devices: docs/multi-device.md) ----
  /// Makes this backend's device the calling thread's current one (CUDA: cudaSetDevice; the CPU:
  /// nothing). Whoever switches between the backends of several devices calls it before using
  /// another one's ops, memory or expert store.
  virtual void make_current() {}
  /// Orders this backend's later work after the work queued so far on @p other (a backend of the
  /// same device kind; Status::invalid_argument otherwise); returns at once (CUDA: an event of
  /// @p other's stream that this stream waits on; the CPU: nothing, its ops are done when they return).
  virtual void wait_for(Backend &other) = 0;
  /// Copies @p bytes at @p src in the memory of @p from (a backend of the same device kind) to
  /// @p dst in this backend's memory, ordered on this backend's stream like the ops (so after
  /// wait_for(@p from) when the bytes are @p from's work); returns at once (CUDA: a peer copy).
  virtual void copy_from(Backend &from, void *dst, const void *src, uint64_t bytes) = 0;

  // ---- ops ----
  /// y[N, T] = W[K, N] · x[K, T] for every supported weight type (decode: T = 1; prefill: T > 1).
  virtual void matmul(const Tensor &w, const Tensor &x, const Tensor &y) = 0;
  /// Grouped matmul: W [K, G·O] holds G row blocks of O rows, x [G·K, T] and y [G·O, T] are split
  /// the same way, and block g multiplies only its own slice of every token:
  /// y[g·O + r, t] = Σ_i W[g·O + r, i] · x[g·K + i, t] (DeepSeek-V4's grouped output projection).
  /// The default runs one matmul per group (through strided copies when T > 1).
  virtual void grouped_matmul(const Tensor &w, int64_t groups, const Tensor &x, const Tensor &y);
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
  /// values f32 [k, rows]. 1 <= k <= ne0. −inf is an ordinary value (it sorts last, so with k
  /// above the count of finite values the pick ends in −inf entries, lowest index first); NaN
  /// inputs are not supported.
  virtual void top_k(const Tensor &x, int32_t k, const Tensor &indices, const Tensor &values) = 0;
  /// y = act(gate, up) elementwise (all f32, same shape).
  virtual void glu(const Tensor &gate, const Tensor &up, const Activation &act, const Tensor &y) = 0;
  /// y = a + b elementwise (same shape); y may alias a or b.
  virtual void add(const Tensor &a, const Tensor &b, const Tensor &y) = 0;
  /// Router: logits f32 [n_experts, T] → expert_ids i32 [k, T], weights f32 [k, T].
  virtual void route(const Tensor &logits, const RouterParams &params, const Tensor &expert_ids,
                     const Tensor &weights) = 0;
  /// Routed experts: y[:, t] = Σ_j weights[j, t] · down(act(gate(x_t), up(x_t))) of expert
  /// expert_ids[j, t], each expert read from the slot @p batch gives its pair (every pair must be
  /// covered). x, y: f32 [D, T]. Queued on the stream like every op: the caller releases the
  /// slots after it returns (the store orders their reuse with events), nothing synchronises.
  virtual void moe(const Tensor &x, const Tensor &expert_ids, const Tensor &weights, const ExpertBatch &batch,
                   const SlotLayout &layout, const Activation &act, const Tensor &y) = 0;
  /// True when moe() / moe_pairs() on @p n_tokens tokens of @p layout read the batch's host
  /// copies (pair_slots, pair_experts); false when the device role table is enough. A provider
  /// asks before it resolves a batch, so that the router's ids go to the host only when needed.
  virtual bool moe_reads_host_picks(int64_t n_tokens, const SlotLayout &layout) const = 0;
  /// Builds @p batch-style role rows on the device: out[r·n + p] = slots[expert_ids[p]] +
  /// offset of role r (gate, up, down) for the n = k·T pairs of expert_ids (i32 [k, T]);
  /// @p slots: [n_experts] object addresses in backend memory; @p out: [3·n] in backend memory.
  /// An id outside 0 .. n_experts − 1 gives a null address (which moe() must never read: the
  /// routers only produce ids inside the range).
  virtual void gather_role_table(const Tensor &expert_ids, const void *const *slots, int64_t n_experts,
                                 const SlotLayout &layout, const void **out) = 0;
  /// Expert-major MoE (a prompt pass whose experts do not all fit the cache): moe() in two parts.
  /// moe_pairs() writes, for every pair (token t, pick j) that @p batch covers (pair_slots
  /// non-null), the row down(act(gate(x_t), up(x_t))) of that expert to pairs[:, t·k + j]; other
  /// rows are left as they are. moe_combine() then sums each token's rows in j order:
  /// y[:, t] = Σ_j weights[j, t] · pairs[:, t·k + j]. Calling moe_pairs() for disjoint batches
  /// that cover every pair, then moe_combine(), gives moe()'s bits. pairs: f32 [D, k·T].
  /// moe_pairs() reads the batch's host copies.
  virtual void moe_pairs(const Tensor &x, const Tensor &expert_ids, const ExpertBatch &batch, const SlotLayout &layout,
                         const Activation &act, const Tensor &pairs) = 0;
  virtual void moe_combine(const Tensor &pairs, const Tensor &weights, const Tensor &y) = 0;
  /// A dense gated FFN (shared experts, dense layers): y = down(act(gate x, up x)).
  void ffn(const Tensor &x, const Tensor &w_gate, const Tensor &w_up, const Tensor &w_down,
           const Activation &act, const Tensor &y);
  /// Draws one token from logits f32 [V] (one row); synchronises. With @p logprobs (non-null),
  /// also fills its out fields (the logits are not changed).
  virtual int32_t sample(const Tensor &logits, const SamplingParams &params, uint64_t counter, TokenLogprobs *logprobs) = 0;
  /// sample() without log-probabilities.
  int32_t sample(const Tensor &logits, const SamplingParams &params, uint64_t counter) {
    return sample(logits, params, counter, nullptr);
  }
  /// sample() of every row at once (a batched decode step's sessions): @p tokens[i] (and
  /// rows[i].logprobs) is what sample(rows[i].logits, *rows[i].params, rows[i].counter,
  /// rows[i].logprobs) gives, bit for bit on the CPU, the same arithmetic on CUDA. Every row is
  /// checked before anything runs (Status::invalid_argument or Status::shape naming rows[i]; a
  /// refused call changes nothing). CUDA: one kernel launch over all rows, one download of all
  /// results, one synchronisation. @p tokens has one entry per row.
  virtual void sample_rows(std::span<const SampleRow> rows, std::span<int32_t> tokens) = 0;

  // ---- elementwise ops and device copies ----
  // (DeepSeek-V4 ops. Signatures are stable; changes are noted here.)
  /// y = a · b elementwise (all f32, same shape); y may alias a or b.
  virtual void mul(const Tensor &a, const Tensor &b, const Tensor &y) = 0;
  /// y = s · x elementwise (f32, same shape); y may alias x.
  virtual void scale(const Tensor &x, float s, const Tensor &y) = 0;
  /// dst = src, bytes as they are: both contiguous on the backend's device, any types, the same
  /// n_bytes(). Ordered on the stream like the ops.
  virtual void copy(const Tensor &src, const Tensor &dst) = 0;
  /// Strided copy on the backend's device (a gather of rows / a slice of columns):
  /// for r < rows: dst + r·dst_pitch_bytes ← row_bytes bytes at src + r·src_pitch_bytes.
  /// Pitches are >= row_bytes; source and destination must not overlap.
  virtual void copy_2d(void *dst, uint64_t dst_pitch_bytes, const void *src, uint64_t src_pitch_bytes,
                       uint64_t row_bytes, uint64_t rows) = 0;

  // ---- DeepSeek-V4 ops (docs/models/deepseek-v4.md) ----
  // Masks are i8 (nonzero = visible), [n_keys, T]: row t says which keys token t may see.
  /// Manifold-constrained hyper-connection weights, per token t (hc = pre.ne[0]), from the mix
  /// logits m = mix[:, t]:
  ///   pre_i  = σ(m_i·scale[0] + base_i) + eps
  ///   post_i = 2σ(m_{hc+i}·scale[1] + base_{hc+i})
  ///   comb   = Sinkhorn(softmax_row(m_{2hc..}·scale[2] + base_{2hc..}) + eps): one column
  ///            normalisation, then (sinkhorn_iters − 1) × (row, column), each dividing by
  ///            (sum + eps); sinkhorn_iters < 1 counts as 1. comb[:, t] is row-major [hc][hc]
  ///            (comb[i·hc + j]).
  /// mix f32 [(2+hc)·hc, T], scale f32 [3], base f32 [(2+hc)·hc], pre/post f32 [hc, T],
  /// comb f32 [hc·hc, T]. With post and comb both null only pre is computed, and mix is
  /// [hc, T], scale [1] and base [hc] (the output head's collapse). hc <= 16.
  virtual void hc_weights(const Tensor &mix, const Tensor &scale, const Tensor &base, float eps,
                          int32_t sinkhorn_iters, const Tensor &pre, const Tensor *post, const Tensor *comb) = 0;
  /// Collapse of the hc streams: y[:, t] = Σ_j pre[j, t] · x[:, j, t] (j ascending).
  /// x f32 [D, hc, T], pre f32 [hc, T], y f32 [D, T].
  virtual void hc_collapse(const Tensor &x, const Tensor &pre, const Tensor &y) = 0;
  /// Expansion into the hc streams: y[:, k, t] = post[k, t]·f[:, t] + Σ_j comb[j·hc + k, t]·x[:, j, t]
  /// (comb applied transposed). x, y f32 [D, hc, T] (y may alias x: in place), f f32 [D, T],
  /// post f32 [hc, T], comb f32 [hc·hc, T]. hc <= 16.
  virtual void hc_expand(const Tensor &x, const Tensor &f, const Tensor &post, const Tensor &comb,
                         const Tensor &y) = 0;
  /// Multi-head attention against one shared K=V head with a per-head sink logit:
  /// out[:, h, t] = Σ_j p_j·kv[:, j] with p = softmax([scale·q[:, h, t]·kv[:, j] for visible j]
  /// ++ [sinks[h]]) without the sink's share. q, out f32 [hd, H, T] (out may alias q);
  /// kv f32 [hd, n_kv]; visible i8 [n_kv, T]; sinks f32 [H] (finite). A token that sees no key
  /// gets 0. CUDA: hd <= 512.
  virtual void attention_sinks(const Tensor &q, const Tensor &kv, const Tensor &visible, const Tensor &sinks,
                               float scale, const Tensor &out) = 0;
  /// Softmax-gated pooling over slots, per channel and window:
  /// out[c, w] = Σ_s softmax_s(gate[c, s, w]) · kv[c, s, w]. kv, gate f32 [d, n_slots, n_win];
  /// out f32 [d, n_win]. Slots whose gate is −inf get weight 0; a (c, w) whose gates are all
  /// −inf gives 0.
  virtual void pool_windows(const Tensor &kv, const Tensor &gate, const Tensor &out) = 0;
  /// Lightning-indexer scores: scores[s, t] = Σ_h w[h, t] · max(q[:, h, t]·keys[:, s], 0) · scale
  /// where visible[s, t], −inf elsewhere. q f32 [dim, H, T]; w f32 [H, T]; keys f32 [dim, n];
  /// visible i8 [n, T]; scores f32 [n, T]. top_k on the scores orders −inf last (ties by
  /// index), so with k > the visible count the tail of the pick has value −inf: pass the
  /// values to set_visible, which skips those.
  virtual void indexer_scores(const Tensor &q, const Tensor &w, const Tensor &keys, const Tensor &visible,
                              float scale, const Tensor &scores) = 0;
  /// Marks picked keys visible: mask[offset + indices[j, t], t] = 1 for every j with
  /// values[j, t] > −inf; other mask entries are left as they are. indices i32 [k, T], values
  /// f32 [k, T] (top_k's outputs), mask i8 [n, T]. An index outside [0, n − offset) with a
  /// finite value is an error on the CPU (Status::corrupt) and ignored on CUDA.
  virtual void set_visible(const Tensor &indices, const Tensor &values, int64_t offset, const Tensor &mask) = 0;

  // ---- Kimi-Linear / Kimi-K3 ops (docs/models/kimi-linear.md, kimi-k3.md) ----
  // Shape checks: backend/kimi_checks.hpp. All tensors f32.
  /// Depthwise causal convolution of width K, then SiLU, continuing a sequence: with x̂ = the
  /// K − 1 state rows followed by x's T rows,
  ///   y[c, t] = silu(Σ_j w[j, c] · x̂[c, t + j])   (j = 0..K−1 ascending)
  /// and state then holds the last K − 1 rows of x̂. x, y [C, T] (y may not alias x); w [K, C];
  /// state [C, K − 1] (oldest row first; zeros at a sequence start). 2 <= K <= 16.
  virtual void short_conv_silu(const Tensor &x, const Tensor &w, const Tensor &state, const Tensor &y) = 0;
  /// Per row: y = x / sqrt(Σ x² + eps) · s (FLA's l2norm: + eps). y may alias x.
  virtual void l2_normalize(const Tensor &x, float eps, float s, const Tensor &y) = 0;
  /// y = 1 / (1 + exp(−x)) elementwise; y may alias x.
  virtual void sigmoid(const Tensor &x, const Tensor &y) = 0;
  /// The KDA per-channel log-decay. With f = x[c, h, t] + bias[c + h·dk]:
  ///   lower_bound < 0: g = lower_bound · σ(−a[h] · f)          (Kimi-K3)
  ///   otherwise:       g = a[h] · softplus(f), softplus(f) = f for f > 20   (Kimi-Linear)
  /// x, g [dk, H, T] (g may alias x); bias [dk·H]; a [H] (= −exp(A_log)).
  virtual void kda_gate(const Tensor &x, const Tensor &bias, const Tensor &a, float lower_bound, const Tensor &g) = 0;
  /// The KDA recurrence (gated delta rule with per-channel decay), tokens in order, per head h:
  ///   S ← Diag(exp(g_t)) S;  S ← S + k_t (β_t (v_t − Sᵀ k_t))ᵀ;  o_t = Sᵀ q_t
  /// q, k, g [dk, H, T] (q, k used as given: normalise / scale before); v, out [dv, H, T];
  /// beta [H, T]; state [dv, dk, H] (head h's S is [dk][dv] row-major), updated in place.
  /// out may not alias an input. CUDA: dk <= 256.
  virtual void kda_recurrence(const Tensor &q, const Tensor &k, const Tensor &v, const Tensor &g, const Tensor &beta,
                              const Tensor &state, const Tensor &out) = 0;
  /// Per row: y = w ⊙ x / sqrt(mean(x²) + eps) ⊙ σ(gate). x, gate, y [d, rows] (y may alias x);
  /// w [d].
  virtual void gated_rms_norm(const Tensor &x, const Tensor &w, const Tensor &gate, float eps, const Tensor &y) = 0;
  /// Causal multi-head attention, one key and one value head per query head (MLA after
  /// expansion, no positional encoding here). Query t sits at position n_past + t and sees keys
  /// 0 .. n_past + t:  out[:, h, t] = Σ_j softmax_j(scale · q[:, h, t] · keys[:, h, j]) values[:, h, j].
  /// q [dqk, H, T]; keys [dqk, H, n_keys]; values [dv, H, n_keys] with n_keys >= n_past + T
  /// (later keys are ignored); out [dv, H, T], may not alias q. CUDA: dqk, dv <= 512.
  /// (attention_sinks cannot serve here: it has one K=V head shared by all heads, a sink per
  /// head and a host-built mask.)
  virtual void causal_attention(const Tensor &q, const Tensor &keys, const Tensor &values, int64_t n_past, float scale,
                                const Tensor &out) = 0;
  /// Kimi-K3 AttnRes mix, per token t over the sources src_0 .. src_nb = banked[:, t, 0 .. nb),
  /// then cur[:, t]:  p = softmax_i(Σ_d w[d] · src_i[d] / sqrt(mean(src_i²) + eps)),
  /// out[:, t] = Σ_i p_i · src_i (the raw sources). banked [D, T, nb] or null (nb = 0);
  /// cur, out [D, T] (out may not alias a source); w [D]. CUDA: nb < 256.
  virtual void attn_res_mix(const Tensor *banked, const Tensor &cur, const Tensor &w, float eps, const Tensor &out) = 0;

 protected:
  /// Scratch memory on the device, one growing buffer per @p slot (0..7); valid until the next
  /// call with the same slot.
  virtual void *workspace(unsigned slot, uint64_t bytes) = 0;
};

// ---- shape checks shared by the backends (throw Error(Status::shape / unsupported)) ----
/// True for the weight types every backend can multiply and dequantize.
bool is_supported_weight_type(GgmlType type) noexcept;
/// Their ggml names, space-separated, for messages.
std::string supported_weight_type_names();
void check_weight_type(GgmlType type, const char *op);
void check_f32(const Tensor &t, const char *op, const char *what, Device device);
void check_i32(const Tensor &t, const char *op, const char *what, Device device);
void check_same_shape(const Tensor &a, const Tensor &b, const char *op);
void check_i8(const Tensor &t, const char *op, const char *what, Device device);
/// Shape checks of the DeepSeek-V4 ops (the same on every backend); they return hc where the
/// op has hyper-connection streams.
int64_t check_hc_weights(const Tensor &mix, const Tensor &scale, const Tensor &base, const Tensor &pre,
                         const Tensor *post, const Tensor *comb, Device device);
int64_t check_hc_collapse(const Tensor &x, const Tensor &pre, const Tensor &y, Device device);
int64_t check_hc_expand(const Tensor &x, const Tensor &f, const Tensor &post, const Tensor &comb, const Tensor &y,
                        Device device);
void check_attention_sinks(const Tensor &q, const Tensor &kv, const Tensor &visible, const Tensor &sinks,
                           const Tensor &out, Device device);
void check_pool_windows(const Tensor &kv, const Tensor &gate, const Tensor &out, Device device);
void check_indexer_scores(const Tensor &q, const Tensor &w, const Tensor &keys, const Tensor &visible,
                          const Tensor &scores, Device device);
void check_set_visible(const Tensor &indices, const Tensor &values, int64_t offset, const Tensor &mask, Device device);
void check_copy(const Tensor &src, const Tensor &dst, Device device);
/// copy_2d's arguments: non-null pointers and pitches >= row_bytes (nothing to check when empty).
void check_copy_2d(const void *dst, uint64_t dst_pitch_bytes, const void *src, uint64_t src_pitch_bytes,
                   uint64_t row_bytes, uint64_t rows);
void check_matmul(const Tensor &w, const Tensor &x, const Tensor &y, Device device);
void check_moe(const Tensor &x, const Tensor &expert_ids, const Tensor &weights,
               const SlotLayout &layout, const Tensor &y, Device device);
/// moe_pairs(): as check_moe() for x, expert_ids and the layout; pairs f32 [D, k·T].
void check_moe_pairs(const Tensor &x, const Tensor &expert_ids, const SlotLayout &layout, const Tensor &pairs, Device device);
/// moe_combine(): pairs f32 [D, k·T], weights f32 [k, T], y f32 [D, T].
void check_moe_combine(const Tensor &pairs, const Tensor &weights, const Tensor &y, Device device);
/// Checks the host side of @p batch for the moe op of @p n_pairs pairs: pair_slots and
/// pair_experts present, and (when @p all) every pair covered (Status::internal otherwise: the
/// provider broke the contract).
void check_host_batch(const ExpertBatch &batch, int64_t n_pairs, bool all, const char *op);
/// The covered pairs of @p batch grouped by expert, in expert order: each group's pairs ascend.
/// Pairs whose slot is null are left out.
struct ExpertGroup {
  int32_t expert = 0;
  const void *slot = nullptr;
  std::vector<int32_t> pairs;
};
std::vector<ExpertGroup> group_pairs_by_expert(const ExpertBatch &batch);

}  // namespace ep::backend
