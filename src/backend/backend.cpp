#include "backend/backend.hpp"

#include "core/error.hpp"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <iterator>

namespace ep::backend {

const char *device_name(Device device) noexcept { return device == Device::cuda ? "cuda" : "cpu"; }

Tensor Tensor::make(const void *data, GgmlType type, Device device, std::initializer_list<int64_t> shape) {
  if (shape.size() == 0 || shape.size() > 4)
    fail(Status::shape, "Tensor::make: {} dimensions given, expected 1 to 4", shape.size());
  Tensor t;
  t.data = const_cast<void *>(data);
  t.type = type;
  t.device = device;
  int i = 0;
  for (int64_t n : shape) {
    if (n < 0) fail(Status::shape, "Tensor::make: dimension {} is negative ({})", i, n);
    t.ne[i++] = n;
  }
  const auto info = format::require_ggml_type(static_cast<uint32_t>(type), "Tensor::make");
  t.nb[0] = info.block_bytes;
  t.nb[1] = format::ggml_row_bytes(type, static_cast<uint64_t>(t.ne[0]), "Tensor::make");
  t.nb[2] = t.nb[1] * static_cast<uint64_t>(t.ne[1]);
  t.nb[3] = t.nb[2] * static_cast<uint64_t>(t.ne[2]);
  return t;
}

uint64_t Tensor::row_bytes() const {
  return format::ggml_row_bytes(type, static_cast<uint64_t>(ne[0]), "Tensor::row_bytes");
}

bool Tensor::is_contiguous() const {
  const uint64_t rb = row_bytes();
  return nb[1] == rb && nb[2] == rb * static_cast<uint64_t>(ne[1]) &&
         nb[3] == nb[2] * static_cast<uint64_t>(ne[2]);
}

std::vector<float> rope_inv_freq(const RopeParams &p, int32_t head_dim) {
  const int32_t dim = p.n_dims > 0 ? p.n_dims : head_dim;
  if (dim % 2 != 0 || dim <= 0 || p.dim_offset < 0 || p.dim_offset + dim > head_dim)
    fail(Status::shape, "rope: rotated dims [{}, {}) do not fit an even range inside a head of {}",
         p.dim_offset, p.dim_offset + dim, head_dim);
  const int32_t half = dim / 2;
  std::vector<float> inv(static_cast<size_t>(half));
  for (int32_t i = 0; i < half; ++i) {
    const float pos_freq = std::pow(p.theta, static_cast<float>(2 * i) / static_cast<float>(dim));
    inv[static_cast<size_t>(i)] = 1.0f / pos_freq;
  }
  if (p.yarn_factor > 1.0f) {
    if (p.yarn_original_max_positions <= 0)
      fail(Status::invalid_argument, "rope: YaRN factor {} needs original_max_position_embeddings > 0",
           p.yarn_factor);
    const double base = p.theta;
    auto correction_dim = [&](double rotations) {
      return (dim * std::log(static_cast<double>(p.yarn_original_max_positions) / (rotations * 2 * M_PI))) /
             (2 * std::log(base));
    };
    double low = std::floor(correction_dim(p.yarn_beta_fast));
    double high = std::ceil(correction_dim(p.yarn_beta_slow));
    low = std::max(low, 0.0);
    high = std::min(high, static_cast<double>(dim - 1));
    if (low == high) high += 0.001;
    for (int32_t i = 0; i < half; ++i) {
      const float pos_freq = std::pow(p.theta, static_cast<float>(2 * i) / static_cast<float>(dim));
      const float extrapolation = 1.0f / pos_freq;
      const float interpolation = 1.0f / (p.yarn_factor * pos_freq);
      float ramp = static_cast<float>((static_cast<float>(i) - low) / (high - low));
      ramp = std::min(std::max(ramp, 0.0f), 1.0f);
      const float extrapolation_factor = 1.0f - ramp;
      inv[static_cast<size_t>(i)] =
          interpolation * (1.0f - extrapolation_factor) + extrapolation * extrapolation_factor;
    }
  }
  return inv;
}

double sample_uniform(uint64_t seed, uint64_t counter) noexcept {
  auto splitmix = [](uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  const uint64_t r = splitmix(seed ^ splitmix(counter));
  return static_cast<double>(r >> 11) * 0x1.0p-53;
}

std::vector<int32_t> penalty_ids(std::span<const int32_t> tokens, int64_t n_vocab) {
  std::vector<int32_t> ids;
  ids.reserve(tokens.size());
  for (int32_t t : tokens)
    if (t >= 0 && t < n_vocab) ids.push_back(t);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

void apply_repetition_penalty(float *z, int64_t n_vocab, const SamplingParams &p) {
  if (p.repetition_penalty == 1.0f || p.penalty_tokens.empty()) return;
  for (int32_t t : penalty_ids(p.penalty_tokens, n_vocab)) {
    float &v = z[t];
    v = v > 0.0f ? v / p.repetition_penalty : v * p.repetition_penalty;
  }
}

void check_logit_bias(const SamplingParams &p, int64_t n_vocab) {
  for (size_t i = 0; i < p.logit_bias.size(); ++i)
    if (p.logit_bias[i].token < 0 || p.logit_bias[i].token >= n_vocab)
      fail(Status::invalid_argument, "sample: logit_bias[{}] names token {}, outside 0..{}", i, p.logit_bias[i].token, n_vocab - 1);
}

void check_token_mask(const SamplingParams &p, int64_t n_vocab) {
  if (p.allowed.empty()) return;
  const int64_t words = std::min<int64_t>(static_cast<int64_t>(p.allowed.size()), (n_vocab + 31) / 32);
  for (int64_t w = 0; w < words; ++w) {
    uint32_t bits = p.allowed[static_cast<size_t>(w)];
    if (w == (n_vocab - 1) / 32 && n_vocab % 32) bits &= (uint32_t{1} << (n_vocab % 32)) - 1;
    if (bits) return;
  }
  fail(Status::invalid_argument, "sample: the token mask ({} words) allows no token of the {} in the row", p.allowed.size(), n_vocab);
}

void apply_token_mask(float *z, int64_t n_vocab, const SamplingParams &p) {
  if (p.allowed.empty()) return;
  check_token_mask(p, n_vocab);
  for (int64_t t = 0; t < n_vocab; ++t) {
    const size_t w = static_cast<size_t>(t / 32);
    if (w >= p.allowed.size() || !(p.allowed[w] >> (t % 32) & 1)) z[t] = -INFINITY;
  }
}

void check_sample_rows(std::span<const SampleRow> rows, size_t n_tokens, Device device) {
  if (n_tokens != rows.size()) fail(Status::invalid_argument, "sample_rows: {} token slots for {} rows", n_tokens, rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    const SampleRow &r = rows[i];
    try {
      if (!r.params) fail(Status::invalid_argument, "no sampling params");
      check_f32(r.logits, "sample", "logits", device);
      const int64_t n = r.logits.ne[0];
      if (r.logits.n_rows() != 1 || n <= 0) fail(Status::shape, "sample: expected one row of logits, got [{}, {}]", n, r.logits.n_rows());
      check_logit_bias(*r.params, n);
      check_token_mask(*r.params, n);
      if (r.logprobs && (r.logprobs->top_n < 0 || r.logprobs->top_n > kMaxTopLogprobs))
        fail(Status::invalid_argument, "sample: top_n {} of the log-probabilities (expected 0..{})", r.logprobs->top_n,
             kMaxTopLogprobs);
    } catch (const Error &e) {
      fail(e.status(), "sample_rows: rows[{}]: {}", i, e.what());
    }
  }
}

void apply_logit_bias(float *z, int64_t n_vocab, const SamplingParams &p) {
  check_logit_bias(p, n_vocab);
  for (const TokenBias &b : p.logit_bias) z[b.token] += b.bias;
}

void Backend::grouped_matmul(const Tensor &w, int64_t groups, const Tensor &x, const Tensor &y) {
  const int64_t k = w.ne[0], t = x.n_rows();
  if (groups <= 0 || w.ne[1] % groups != 0 || x.ne[0] != groups * k || y.ne[0] != w.ne[1] || y.n_rows() != t)
    fail(Status::shape, "grouped_matmul: W [{}, {}] in {} groups · x [{}, {}] → y [{}, {}] do not fit", w.ne[0], w.ne[1], groups,
         x.ne[0], t, y.ne[0], y.n_rows());
  const int64_t o = w.ne[1] / groups;
  const uint64_t w_group_bytes = w.row_bytes() * static_cast<uint64_t>(o);
  const Device dv = device();
  for (int64_t g = 0; g < groups; ++g) {
    const Tensor wg = Tensor::make(static_cast<const uint8_t *>(w.data) + static_cast<uint64_t>(g) * w_group_bytes, w.type, dv, {k, o});
    if (t == 1) {
      matmul(wg, Tensor::make(x.as<float>() + g * k, GgmlType::f32, dv, {k, 1}),
             Tensor::make(y.as<float>() + g * o, GgmlType::f32, dv, {o, 1}));
      continue;
    }
    auto *xg = static_cast<float *>(workspace(6, static_cast<uint64_t>(k * t) * 4));
    auto *yg = static_cast<float *>(workspace(7, static_cast<uint64_t>(o * t) * 4));
    copy_2d(xg, static_cast<uint64_t>(k) * 4, x.as<float>() + g * k, static_cast<uint64_t>(groups * k) * 4,
            static_cast<uint64_t>(k) * 4, static_cast<uint64_t>(t));
    matmul(wg, Tensor::make(xg, GgmlType::f32, dv, {k, t}), Tensor::make(yg, GgmlType::f32, dv, {o, t}));
    copy_2d(y.as<float>() + g * o, static_cast<uint64_t>(groups * o) * 4, yg, static_cast<uint64_t>(o) * 4,
            static_cast<uint64_t>(o) * 4, static_cast<uint64_t>(t));
  }
}

void Backend::ffn(const Tensor &x, const Tensor &w_gate, const Tensor &w_up, const Tensor &w_down,
                  const Activation &act, const Tensor &y) {
  const int64_t n_ff = w_gate.ne[1];
  if (w_up.ne[1] != n_ff || w_up.ne[0] != w_gate.ne[0] || w_down.ne[0] != n_ff)
    fail(Status::shape, "ffn: gate [{}, {}], up [{}, {}] and down [{}, {}] do not fit together",
         w_gate.ne[0], w_gate.ne[1], w_up.ne[0], w_up.ne[1], w_down.ne[0], w_down.ne[1]);
  const int64_t n_tokens = x.ne[1];
  const uint64_t bytes = static_cast<uint64_t>(n_ff * n_tokens) * 4;
  const Tensor g = Tensor::make(workspace(6, bytes), GgmlType::f32, device(), {n_ff, n_tokens});
  const Tensor u = Tensor::make(workspace(7, bytes), GgmlType::f32, device(), {n_ff, n_tokens});
  matmul(w_gate, x, g);
  matmul(w_up, x, u);
  glu(g, u, act, g);
  matmul(w_down, g, y);
}

// The weight types are the rows of format::kGgmlTypes that have compute kernels (CPU:
// dequantize_row; CUDA: the dequantization kernels, and GEMV kernels for some).
bool is_supported_weight_type(GgmlType type) noexcept {
  return format::ggml_compute(static_cast<uint32_t>(type)) != format::GgmlCompute::none;
}

std::string supported_weight_type_names() {
  std::string names;
  for (const format::GgmlTypeInfo &row : format::kGgmlTypes) {
    if (row.compute == format::GgmlCompute::none) continue;
    if (!names.empty()) names += ' ';
    names += row.name;
  }
  return names;
}

void check_weight_type(GgmlType type, const char *op) {
  if (is_supported_weight_type(type)) return;
  const auto info = format::ggml_type_info(static_cast<uint32_t>(type));
  fail(Status::unsupported, "{}: weight type {} is not supported (supported: {})", op,
       info ? info->name : std::string_view("unknown"), supported_weight_type_names());
}

namespace {
void check_common(const Tensor &t, const char *op, const char *what, Device device) {
  if (t.device != device)
    fail(Status::invalid_argument, "{}: {} is on {}, expected {}", op, what, device_name(t.device),
         device_name(device));
  if (!t.is_contiguous()) fail(Status::unsupported, "{}: {} is not contiguous", op, what);
  if (t.data == nullptr && t.n_elems() > 0) fail(Status::invalid_argument, "{}: {} has no data", op, what);
}
}  // namespace

void check_f32(const Tensor &t, const char *op, const char *what, Device device) {
  if (t.type != GgmlType::f32)
    fail(Status::unsupported, "{}: {} must be f32, found type id {}", op, what, static_cast<uint32_t>(t.type));
  check_common(t, op, what, device);
}

void check_i32(const Tensor &t, const char *op, const char *what, Device device) {
  if (t.type != GgmlType::i32)
    fail(Status::unsupported, "{}: {} must be i32, found type id {}", op, what, static_cast<uint32_t>(t.type));
  check_common(t, op, what, device);
}

void check_i8(const Tensor &t, const char *op, const char *what, Device device) {
  if (t.type != GgmlType::i8)
    fail(Status::unsupported, "{}: {} must be i8, found type id {}", op, what, static_cast<uint32_t>(t.type));
  check_common(t, op, what, device);
}

void check_copy_2d(const void *dst, uint64_t dst_pitch, const void *src, uint64_t src_pitch, uint64_t row_bytes,
                   uint64_t rows) {
  if (rows == 0 || row_bytes == 0) return;
  if (dst == nullptr || src == nullptr || dst_pitch < row_bytes || src_pitch < row_bytes)
    fail(Status::invalid_argument, "copy_2d: {} rows of {} bytes with pitches dst {} / src {} (null pointer or pitch "
         "below the row size)", rows, row_bytes, dst_pitch, src_pitch);
}

void check_copy(const Tensor &src, const Tensor &dst, Device device) {
  check_common(src, "copy", "src", device);
  check_common(dst, "copy", "dst", device);
  if (src.n_bytes() != dst.n_bytes())
    fail(Status::shape, "copy: src has {} bytes, dst {}", src.n_bytes(), dst.n_bytes());
}

void check_same_shape(const Tensor &a, const Tensor &b, const char *op) {
  for (int i = 0; i < 4; ++i) {
    if (a.ne[i] != b.ne[i])
      fail(Status::shape, "{}: shapes differ: [{}, {}, {}, {}] vs [{}, {}, {}, {}]", op, a.ne[0], a.ne[1],
           a.ne[2], a.ne[3], b.ne[0], b.ne[1], b.ne[2], b.ne[3]);
  }
}

void check_matmul(const Tensor &w, const Tensor &x, const Tensor &y, Device device) {
  check_weight_type(w.type, "matmul");
  check_common(w, "matmul", "weight", device);
  check_f32(x, "matmul", "x", device);
  check_f32(y, "matmul", "y", device);
  if (w.ne[2] != 1 || w.ne[3] != 1 || x.ne[0] != w.ne[0] || y.ne[0] != w.ne[1] || x.n_rows() != y.n_rows())
    fail(Status::shape, "matmul: W [{}, {}] · x [{}, {}] → y [{}, {}] do not fit", w.ne[0], w.ne[1], x.ne[0],
         x.n_rows(), y.ne[0], y.n_rows());
}

namespace {
/// x, expert_ids and the experts' layout of moe() / moe_pairs().
void check_moe_inputs(const Tensor &x, const Tensor &expert_ids, const SlotLayout &l, Device device, const char *op) {
  check_f32(x, op, "x", device);
  check_i32(expert_ids, op, "expert_ids", device);
  for (const SlotWeight *sw : {&l.gate, &l.up, &l.down}) check_weight_type(sw->type, op);
  const int64_t d = x.ne[0];
  if (l.gate.ne0 != d || l.up.ne0 != d || l.gate.ne1 != l.up.ne1 || l.down.ne0 != l.gate.ne1 || l.down.ne1 != d)
    fail(Status::shape, "{}: expert gate [{}, {}], up [{}, {}], down [{}, {}] do not fit hidden size {}", op,
         l.gate.ne0, l.gate.ne1, l.up.ne0, l.up.ne1, l.down.ne0, l.down.ne1, d);
  if (expert_ids.n_rows() != x.n_rows())
    fail(Status::shape, "{}: expert_ids have {} tokens, x has {}", op, expert_ids.n_rows(), x.n_rows());
  for (const SlotWeight *sw : {&l.gate, &l.up, &l.down})
    (void)format::ggml_row_bytes(sw->type, static_cast<uint64_t>(sw->ne0), "moe expert weight");
}
}  // namespace

void check_moe(const Tensor &x, const Tensor &expert_ids, const Tensor &weights, const SlotLayout &l,
               const Tensor &y, Device device) {
  check_moe_inputs(x, expert_ids, l, device, "moe");
  check_f32(y, "moe", "y", device);
  check_f32(weights, "moe", "weights", device);
  check_same_shape(x, y, "moe");
  check_same_shape(expert_ids, weights, "moe");
}

void check_moe_pairs(const Tensor &x, const Tensor &expert_ids, const SlotLayout &l, const Tensor &pairs, Device device) {
  check_moe_inputs(x, expert_ids, l, device, "moe_pairs");
  check_f32(pairs, "moe_pairs", "pairs", device);
  const int64_t k = expert_ids.ne[0], n = x.n_rows();
  if (pairs.ne[0] != x.ne[0] || pairs.n_rows() != k * n)
    fail(Status::shape, "moe_pairs: pairs [{}, {}], expected [{}, {}] ({} picks of {} tokens)", pairs.ne[0], pairs.n_rows(),
         x.ne[0], k * n, k, n);
}

void check_moe_combine(const Tensor &pairs, const Tensor &weights, const Tensor &y, Device device) {
  check_f32(pairs, "moe_combine", "pairs", device);
  check_f32(weights, "moe_combine", "weights", device);
  check_f32(y, "moe_combine", "y", device);
  const int64_t k = weights.ne[0], n = weights.n_rows();
  if (y.n_rows() != n || pairs.ne[0] != y.ne[0] || pairs.n_rows() != k * n)
    fail(Status::shape, "moe_combine: pairs [{}, {}], weights [{}, {}], y [{}, {}] do not fit (pairs must be [D, k·T])",
         pairs.ne[0], pairs.n_rows(), k, n, y.ne[0], y.n_rows());
}

namespace {
constexpr int64_t kHcMax = 16;
struct Named {
  const Tensor *t;
  const char *what;
};
void check_all_f32(std::initializer_list<Named> tensors, const char *op, Device device) {
  for (const Named &n : tensors) check_f32(*n.t, op, n.what, device);
}
int64_t tokens_of(const Tensor &t, int first_token_dim) {
  int64_t n = 1;
  for (int i = first_token_dim; i < 4; ++i) n *= t.ne[i];
  return n;
}
}  // namespace

int64_t check_hc_weights(const Tensor &mix, const Tensor &scale, const Tensor &base, const Tensor &pre,
                         const Tensor *post, const Tensor *comb, Device device) {
  const char *op = "hc_weights";
  check_all_f32({{&mix, "mix"}, {&scale, "scale"}, {&base, "base"}, {&pre, "pre"}}, op, device);
  if ((post == nullptr) != (comb == nullptr)) fail(Status::invalid_argument, "{}: give both post and comb or neither", op);
  const int64_t hc = pre.ne[0], n_tok = pre.n_rows();
  if (hc <= 0 || hc > kHcMax) fail(Status::unsupported, "{}: {} streams, supported 1..{}", op, hc, kHcMax);
  const int64_t m = post ? (2 + hc) * hc : hc;
  if (mix.ne[0] != m || mix.n_rows() != n_tok || base.n_elems() != m || scale.n_elems() != (post ? 3 : 1))
    fail(Status::shape, "{}: mix [{}, {}], base [{}] and scale [{}] do not fit {} streams x {} tokens "
         "(expected mix [{}, {}], base [{}], scale [{}])", op, mix.ne[0], mix.n_rows(), base.n_elems(),
         scale.n_elems(), hc, n_tok, m, n_tok, m, post ? 3 : 1);
  if (post) {
    check_f32(*post, op, "post", device);
    check_f32(*comb, op, "comb", device);
    if (post->ne[0] != hc || post->n_rows() != n_tok || comb->ne[0] != hc * hc || comb->n_rows() != n_tok)
      fail(Status::shape, "{}: post [{}, {}] / comb [{}, {}] do not fit {} streams x {} tokens", op, post->ne[0],
           post->n_rows(), comb->ne[0], comb->n_rows(), hc, n_tok);
  }
  return hc;
}

int64_t check_hc_collapse(const Tensor &x, const Tensor &pre, const Tensor &y, Device device) {
  const char *op = "hc_collapse";
  check_all_f32({{&x, "x"}, {&pre, "pre"}, {&y, "y"}}, op, device);
  const int64_t hc = pre.ne[0], n_tok = pre.n_rows();
  if (hc <= 0 || hc > kHcMax) fail(Status::unsupported, "{}: {} streams, supported 1..{}", op, hc, kHcMax);
  if (x.ne[0] != y.ne[0] || x.ne[1] != hc || tokens_of(x, 2) != n_tok || y.n_rows() != n_tok)
    fail(Status::shape, "{}: x [{}, {}, {}], pre [{}, {}] and y [{}, {}] do not fit (expected x [D, hc, T], "
         "pre [hc, T], y [D, T])", op, x.ne[0], x.ne[1], tokens_of(x, 2), hc, n_tok, y.ne[0], y.n_rows());
  return hc;
}

int64_t check_hc_expand(const Tensor &x, const Tensor &f, const Tensor &post, const Tensor &comb, const Tensor &y,
                        Device device) {
  const char *op = "hc_expand";
  check_all_f32({{&x, "x"}, {&f, "f"}, {&post, "post"}, {&comb, "comb"}, {&y, "y"}}, op, device);
  check_same_shape(x, y, op);
  const int64_t hc = post.ne[0], n_tok = post.n_rows();
  if (hc <= 0 || hc > kHcMax) fail(Status::unsupported, "{}: {} streams, supported 1..{}", op, hc, kHcMax);
  if (x.ne[0] != f.ne[0] || x.ne[1] != hc || tokens_of(x, 2) != n_tok || f.n_rows() != n_tok ||
      comb.ne[0] != hc * hc || comb.n_rows() != n_tok)
    fail(Status::shape, "{}: x [{}, {}, {}], f [{}, {}], post [{}, {}], comb [{}, {}] do not fit (expected x [D, hc, T], "
         "f [D, T], post [hc, T], comb [hc*hc, T])", op, x.ne[0], x.ne[1], tokens_of(x, 2), f.ne[0], f.n_rows(), hc,
         n_tok, comb.ne[0], comb.n_rows());
  return hc;
}

void check_attention_sinks(const Tensor &q, const Tensor &kv, const Tensor &visible, const Tensor &sinks,
                           const Tensor &out, Device device) {
  const char *op = "attention_sinks";
  check_all_f32({{&q, "q"}, {&kv, "kv"}, {&sinks, "sinks"}, {&out, "out"}}, op, device);
  check_i8(visible, op, "visible", device);
  check_same_shape(q, out, op);
  const int64_t hd = q.ne[0], n_heads = q.ne[1], n_tok = tokens_of(q, 2), n_kv = kv.n_rows();
  if (kv.ne[0] != hd || visible.ne[0] != n_kv || visible.n_rows() != n_tok || sinks.n_elems() != n_heads)
    fail(Status::shape, "{}: q [{}, {}, {}], kv [{}, {}], visible [{}, {}], sinks [{}] do not fit (expected "
         "q [hd, H, T], kv [hd, n_kv], visible [n_kv, T], sinks [H])", op, hd, n_heads, n_tok, kv.ne[0], n_kv,
         visible.ne[0], visible.n_rows(), sinks.n_elems());
}

void check_pool_windows(const Tensor &kv, const Tensor &gate, const Tensor &out, Device device) {
  const char *op = "pool_windows";
  check_all_f32({{&kv, "kv"}, {&gate, "gate"}, {&out, "out"}}, op, device);
  check_same_shape(kv, gate, op);
  if (kv.ne[3] != 1 || out.ne[0] != kv.ne[0] || out.n_rows() != kv.ne[2] || kv.ne[1] <= 0)
    fail(Status::shape, "{}: kv [{}, {}, {}, {}] and out [{}, {}] do not fit (expected kv [d, n_slots >= 1, n_win], "
         "out [d, n_win])", op, kv.ne[0], kv.ne[1], kv.ne[2], kv.ne[3], out.ne[0], out.n_rows());
}

void check_indexer_scores(const Tensor &q, const Tensor &w, const Tensor &keys, const Tensor &visible,
                          const Tensor &scores, Device device) {
  const char *op = "indexer_scores";
  check_all_f32({{&q, "q"}, {&w, "w"}, {&keys, "keys"}, {&scores, "scores"}}, op, device);
  check_i8(visible, op, "visible", device);
  const int64_t dim = q.ne[0], n_heads = q.ne[1], n_tok = tokens_of(q, 2), n = keys.n_rows();
  if (w.ne[0] != n_heads || w.n_rows() != n_tok || keys.ne[0] != dim || visible.ne[0] != n ||
      visible.n_rows() != n_tok || scores.ne[0] != n || scores.n_rows() != n_tok)
    fail(Status::shape, "{}: q [{}, {}, {}], w [{}, {}], keys [{}, {}], visible [{}, {}], scores [{}, {}] do not fit "
         "(expected q [dim, H, T], w [H, T], keys [dim, n], visible and scores [n, T])", op, dim, n_heads, n_tok,
         w.ne[0], w.n_rows(), keys.ne[0], n, visible.ne[0], visible.n_rows(), scores.ne[0], scores.n_rows());
}

void check_set_visible(const Tensor &indices, const Tensor &values, int64_t offset, const Tensor &mask, Device device) {
  const char *op = "set_visible";
  check_i32(indices, op, "indices", device);
  check_f32(values, op, "values", device);
  check_i8(mask, op, "mask", device);
  check_same_shape(indices, values, op);
  if (indices.n_rows() != mask.n_rows() || offset < 0 || offset > mask.ne[0])
    fail(Status::shape, "{}: indices [{}, {}] with offset {} do not fit mask [{}, {}]", op, indices.ne[0],
         indices.n_rows(), offset, mask.ne[0], mask.n_rows());
}

void check_host_batch(const ExpertBatch &batch, int64_t n_pairs, bool all, const char *op) {
  if (batch.n_pairs != n_pairs)
    fail(Status::internal, "{}: the expert batch has {} pairs, the op {}", op, batch.n_pairs, n_pairs);
  if (n_pairs && (!batch.pair_slots || !batch.pair_experts))
    fail(Status::internal, "{}: the expert batch has no host slots (the provider must resolve it on the host when "
                           "moe_reads_host_picks() says so)", op);
  if (all)
    for (int64_t p = 0; p < n_pairs; ++p)
      if (!batch.pair_slots[p])
        fail(Status::internal, "{}: pair {} (expert {}) has no slot in the expert batch", op, p, batch.pair_experts[p]);
}

std::vector<ExpertGroup> group_pairs_by_expert(const ExpertBatch &batch) {
  std::vector<int32_t> order;
  for (int64_t p = 0; p < batch.n_pairs; ++p)
    if (batch.pair_slots[p]) order.push_back(static_cast<int32_t>(p));
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return batch.pair_experts[a] < batch.pair_experts[b]; });
  std::vector<ExpertGroup> groups;
  for (int32_t p : order) {
    if (groups.empty() || groups.back().expert != batch.pair_experts[p])
      groups.push_back(ExpertGroup{batch.pair_experts[p], batch.pair_slots[p], {}});
    else if (groups.back().slot != batch.pair_slots[p])
      fail(Status::internal, "moe: expert {} has two slots in one batch", batch.pair_experts[p]);
    groups.back().pairs.push_back(p);
  }
  return groups;
}

}  // namespace ep::backend
