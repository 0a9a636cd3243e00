#include "backend/backend.hpp"

#include "core/error.hpp"

#include <cmath>

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

bool is_supported_weight_type(GgmlType type) noexcept {
  switch (type) {
    case GgmlType::f32: case GgmlType::f16: case GgmlType::bf16: case GgmlType::q8_0:
    case GgmlType::q2_k: case GgmlType::q3_k: case GgmlType::q4_k: case GgmlType::q5_k:
    case GgmlType::q6_k: case GgmlType::mxfp4: case GgmlType::iq2_xxs:
      return true;
    default:
      return false;
  }
}

void check_weight_type(GgmlType type, const char *op) {
  if (is_supported_weight_type(type)) return;
  const auto info = format::ggml_type_info(static_cast<uint32_t>(type));
  fail(Status::unsupported, "{}: weight type {} is not supported (supported: f32 f16 bf16 q8_0 q2_K q3_K "
       "q4_K q5_K q6_K mxfp4 iq2_xxs)", op, info ? info->name : std::string_view("unknown"));
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

void check_moe(const Tensor &x, const Tensor &expert_ids, const Tensor &weights, const ExpertLayout &l,
               const Tensor &y, Device device) {
  check_f32(x, "moe", "x", device);
  check_f32(y, "moe", "y", device);
  check_i32(expert_ids, "moe", "expert_ids", device);
  check_f32(weights, "moe", "weights", device);
  check_same_shape(x, y, "moe");
  check_same_shape(expert_ids, weights, "moe");
  for (const SlotWeight *sw : {&l.gate, &l.up, &l.down}) check_weight_type(sw->type, "moe");
  const int64_t d = x.ne[0];
  if (l.gate.ne0 != d || l.up.ne0 != d || l.gate.ne1 != l.up.ne1 || l.down.ne0 != l.gate.ne1 || l.down.ne1 != d)
    fail(Status::shape, "moe: expert gate [{}, {}], up [{}, {}], down [{}, {}] do not fit hidden size {}",
         l.gate.ne0, l.gate.ne1, l.up.ne0, l.up.ne1, l.down.ne0, l.down.ne1, d);
  if (expert_ids.n_rows() != x.n_rows())
    fail(Status::shape, "moe: expert_ids have {} tokens, x has {}", expert_ids.n_rows(), x.n_rows());
  for (const SlotWeight *sw : {&l.gate, &l.up, &l.down})
    (void)format::ggml_row_bytes(sw->type, static_cast<uint64_t>(sw->ne0), "moe expert weight");
}

std::vector<const uint8_t *> resolve_expert_slots(const int32_t *ids, int64_t n, const ExpertSlots &slots) {
  std::vector<const uint8_t *> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int32_t e = ids[i];
    if (e < 0 || e >= slots.n_experts)
      fail(Status::corrupt, "moe: expert id {} at position {} is outside 0..{}", e, i, slots.n_experts - 1);
    if (slots.slot[e] == nullptr)
      fail(Status::not_found, "moe: expert {} (position {}) has no resident slot", e, i);
    out[static_cast<size_t>(i)] = static_cast<const uint8_t *>(slots.slot[e]);
  }
  return out;
}

}  // namespace ep::backend
