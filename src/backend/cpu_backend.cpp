#include "backend/cpu_backend.hpp"

#include "backend/dequant.hpp"
#include "core/error.hpp"
#include "core/log.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>

namespace ep::backend {

float activation_ref(float g, float u, const Activation &act) noexcept {
  if (act.kind == ActivationKind::situ) {
    const float sig = 1.0f / (1.0f + std::exp(-g));
    return act.beta_g * std::tanh(g / act.beta_g) * sig * (act.beta_u * std::tanh(u / act.beta_u));
  }
  if (act.limit > 0.0f) {
    g = std::min(g, act.limit);
    u = std::min(std::max(u, -act.limit), act.limit);
  }
  return g / (1.0f + std::exp(-g)) * u;
}

float router_score_ref(float logit, Scoring scoring) noexcept {
  switch (scoring) {
    case Scoring::sigmoid:
      return 1.0f / (1.0f + std::exp(-logit));
    case Scoring::sqrt_softplus:
      return std::sqrt(logit > 20.0f ? logit : std::log1p(std::exp(logit)));
    case Scoring::softmax:
      break;
  }
  return logit;  // softmax is applied over the row by the caller
}

namespace {

// Eight f32 lanes; GCC/Clang vector extensions do lane-wise IEEE mul and add (no reassociation,
// no FMA unless the target has it for scalars too), so lane j of acc computes exactly the scalar
// reference sum of token j.
typedef float V8 __attribute__((vector_size(32)));

constexpr int64_t kTokenBlock = 8;     // tokens per packed block (the V8 lanes)
constexpr int64_t kPackMinTokens = 4;  // from this many tokens, the packed path
constexpr int64_t kRowGroup = 4;       // rows per group in the few-token path

}  // namespace

void pack_tokens_by8(const float *x, int64_t k, int64_t n_tokens, float *xt) {
  const int64_t n_blocks = (n_tokens + kTokenBlock - 1) / kTokenBlock;
  for (int64_t b = 0; b < n_blocks; ++b) {
    float *dst = xt + b * k * kTokenBlock;
    const int64_t t0 = b * kTokenBlock, nt = std::min(kTokenBlock, n_tokens - t0);
    for (int64_t i = 0; i < k; ++i) {
      for (int64_t j = 0; j < nt; ++j) dst[i * kTokenBlock + j] = x[(t0 + j) * k + i];
      for (int64_t j = nt; j < kTokenBlock; ++j) dst[i * kTokenBlock + j] = 0.0f;
    }
  }
}

void matmul_rows(GgmlType type, const void *w, int64_t k, int64_t r0, int64_t r1, const float *x, int64_t n_tokens,
                 float *y, int64_t ldy, float *row_buf, const float *xt) {
  const uint64_t row_bytes = format::ggml_row_bytes(type, static_cast<uint64_t>(k), "matmul weight row");
  const auto *base = static_cast<const uint8_t *>(w);
  if (n_tokens >= kPackMinTokens) {
    // Two rows at a time against blocks of 8 packed tokens: 16 independent f32 sums.
    const int64_t n_blocks = (n_tokens + kTokenBlock - 1) / kTokenBlock;
    for (int64_t r = r0; r < r1; r += 2) {
      const bool two = r + 1 < r1;
      float *ra = row_buf, *rb = row_buf + k;
      dequantize_row(type, base + static_cast<uint64_t>(r) * row_bytes, ra, k);
      if (two) dequantize_row(type, base + static_cast<uint64_t>(r + 1) * row_bytes, rb, k);
      for (int64_t b = 0; b < n_blocks; ++b) {
        const float *xb = xt + b * k * kTokenBlock;
        V8 acc_a = {0, 0, 0, 0, 0, 0, 0, 0}, acc_b = acc_a;
        if (two) {
          for (int64_t i = 0; i < k; ++i) {
            V8 xv;
            std::memcpy(&xv, xb + i * kTokenBlock, sizeof xv);
            acc_a += ra[i] * xv;
            acc_b += rb[i] * xv;
          }
        } else {
          for (int64_t i = 0; i < k; ++i) {
            V8 xv;
            std::memcpy(&xv, xb + i * kTokenBlock, sizeof xv);
            acc_a += ra[i] * xv;
          }
        }
        const int64_t t0 = b * kTokenBlock, nt = std::min(kTokenBlock, n_tokens - t0);
        for (int64_t j = 0; j < nt; ++j) {
          y[(t0 + j) * ldy + r] = acc_a[j];
          if (two) y[(t0 + j) * ldy + r + 1] = acc_b[j];
        }
      }
    }
    return;
  }
  // Few tokens (decode): groups of rows, one independent sum per row.
  for (int64_t g0 = r0; g0 < r1; g0 += kRowGroup) {
    const int64_t ng = std::min(kRowGroup, r1 - g0);
    for (int64_t j = 0; j < ng; ++j)
      dequantize_row(type, base + static_cast<uint64_t>(g0 + j) * row_bytes, row_buf + j * k, k);
    for (int64_t t = 0; t < n_tokens; ++t) {
      const float *xv = x + t * k;
      if (ng == kRowGroup) {
        const float *w0 = row_buf, *w1 = row_buf + k, *w2 = row_buf + 2 * k, *w3 = row_buf + 3 * k;
        float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
        for (int64_t i = 0; i < k; ++i) {
          a0 += w0[i] * xv[i];
          a1 += w1[i] * xv[i];
          a2 += w2[i] * xv[i];
          a3 += w3[i] * xv[i];
        }
        y[t * ldy + g0] = a0;
        y[t * ldy + g0 + 1] = a1;
        y[t * ldy + g0 + 2] = a2;
        y[t * ldy + g0 + 3] = a3;
      } else {
        for (int64_t j = 0; j < ng; ++j) {
          const float *wr = row_buf + j * k;
          float acc = 0.0f;
          for (int64_t i = 0; i < k; ++i) acc += wr[i] * xv[i];
          y[t * ldy + g0 + j] = acc;
        }
      }
    }
  }
}

void matmul_ref(GgmlType type, const void *w, int64_t k, int64_t n, const float *x, int64_t n_tokens, float *y) {
  std::vector<float> row(static_cast<size_t>(std::max(kRowGroup, int64_t{2}) * k));
  std::vector<float> xt;
  if (n_tokens >= kPackMinTokens) {
    xt.resize(static_cast<size_t>((n_tokens + kTokenBlock - 1) / kTokenBlock * kTokenBlock * k));
    pack_tokens_by8(x, k, n_tokens, xt.data());
  }
  matmul_rows(type, w, k, 0, n, x, n_tokens, y, n, row.data(), xt.data());
}

CpuBackend::CpuBackend(unsigned threads)
    : pool_(threads == 0 ? ThreadPool::default_threads() : threads),
      scratch_(static_cast<size_t>(pool_.threads()) * 4) {}

float *CpuBackend::worker_scratch(unsigned worker, unsigned slot, int64_t n) {
  auto &buf = scratch_.at(static_cast<size_t>(worker) * 4 + slot);
  if (buf.size() < static_cast<size_t>(n)) buf.resize(static_cast<size_t>(n));
  return buf.data();
}

void *CpuBackend::allocate(uint64_t bytes) {
  void *p = std::aligned_alloc(64, std::max<uint64_t>(64, (bytes + 63) / 64 * 64));
  if (!p) fail(Status::out_of_memory, "cpu backend: cannot allocate {} bytes", bytes);
  return p;
}
void CpuBackend::deallocate(void *ptr) noexcept { std::free(ptr); }
void CpuBackend::upload(void *dst, const void *src, uint64_t bytes) { std::memcpy(dst, src, bytes); }
void CpuBackend::download(void *dst, const void *src, uint64_t bytes) { std::memcpy(dst, src, bytes); }
void *CpuBackend::host_buffer(unsigned slot, uint64_t bytes) {
  auto &buf = host_buffers_.at(slot);
  if (buf.size() < bytes) buf.resize(static_cast<size_t>(bytes));
  return buf.data();
}
void CpuBackend::fill_zero(void *dst, uint64_t bytes) { std::memset(dst, 0, bytes); }
void CpuBackend::wait_for(Backend &other) {
  if (other.device() != Device::cpu)
    fail(Status::invalid_argument, "cpu backend: ordered after a {} backend (the devices of a model are of one kind)",
         device_name(other.device()));
}
void CpuBackend::copy_from(Backend &from, void *dst, const void *src, uint64_t bytes) {
  wait_for(from);
  if (bytes) std::memcpy(dst, src, bytes);
}

void *CpuBackend::workspace(unsigned slot, uint64_t bytes) {
  auto &buf = workspace_.at(slot);
  if (buf.size() < bytes) buf.resize(bytes);
  return buf.data();
}

namespace {
/// Rows per chunk so that a chunk is worth handing to a thread (~256k multiply-adds), even.
int64_t matmul_grain(int64_t k, int64_t n_tokens) {
  const int64_t per_row = std::max<int64_t>(1, k * std::max<int64_t>(n_tokens, 4));
  return std::max<int64_t>(2, (int64_t{1} << 18) / per_row / 2 * 2);
}
}  // namespace

void CpuBackend::matmul(const Tensor &w, const Tensor &x, const Tensor &y) {
  check_matmul(w, x, y, Device::cpu);
  const int64_t k = w.ne[0], n = w.ne[1], n_tok = x.n_rows();
  const float *xt = nullptr;
  if (n_tok >= kPackMinTokens) {
    packed_x_.resize(static_cast<size_t>((n_tok + kTokenBlock - 1) / kTokenBlock * kTokenBlock * k));
    pack_tokens_by8(x.as<float>(), k, n_tok, packed_x_.data());
    xt = packed_x_.data();
  }
  pool_.parallel_for(n, matmul_grain(k, n_tok), [&](int64_t r0, int64_t r1, unsigned worker) {
    float *row = worker_scratch(worker, 0, kRowGroup * k);
    matmul_rows(w.type, w.data, k, r0, r1, x.as<float>(), n_tok, y.as<float>(), n, row, xt);
  });
}

namespace {
/// Rows of @p n values per chunk for the cheap row-wise ops (~32k values per chunk).
int64_t rows_grain(int64_t n) { return std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(1, n)); }
constexpr int64_t kElemGrain = int64_t{1} << 16;  // elementwise ops: values per chunk
}  // namespace

void CpuBackend::rms_norm(const Tensor &x, const Tensor *weight, float eps, const Tensor &y) {
  check_f32(x, "rms_norm", "x", Device::cpu);
  check_f32(y, "rms_norm", "y", Device::cpu);
  check_same_shape(x, y, "rms_norm");
  const int64_t n = x.ne[0];
  const float *wt = nullptr;
  if (weight) {
    check_f32(*weight, "rms_norm", "weight", Device::cpu);
    if (weight->n_elems() != n) fail(Status::shape, "rms_norm: weight has {} values, rows have {}", weight->n_elems(), n);
    wt = weight->as<float>();
  }
  pool_.parallel_for(x.n_rows(), rows_grain(n), [&](int64_t r0, int64_t r1, unsigned) {
    for (int64_t r = r0; r < r1; ++r) {
      const float *xr = x.as<float>() + r * n;
      float *yr = y.as<float>() + r * n;
      float ss = 0.0f;
      for (int64_t i = 0; i < n; ++i) ss += xr[i] * xr[i];
      const float scale = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
      for (int64_t i = 0; i < n; ++i) yr[i] = wt ? xr[i] * scale * wt[i] : xr[i] * scale;
    }
  });
}

void CpuBackend::rope(const Tensor &x, const Tensor &positions, const RopeParams &p, const Tensor &y) {
  check_f32(x, "rope", "x", Device::cpu);
  check_f32(y, "rope", "y", Device::cpu);
  check_i32(positions, "rope", "positions", Device::cpu);
  check_same_shape(x, y, "rope");
  const int64_t head_dim = x.ne[0], n_heads = x.ne[1], n_tokens = x.ne[2] * x.ne[3];
  if (positions.n_elems() != n_tokens)
    fail(Status::shape, "rope: {} positions for {} tokens", positions.n_elems(), n_tokens);
  const std::vector<float> inv = rope_inv_freq(p, static_cast<int32_t>(head_dim));
  const int64_t off = p.dim_offset;
  pool_.parallel_for(n_tokens, rows_grain(n_heads * head_dim), [&](int64_t t0, int64_t t1, unsigned) {
  for (int64_t t = t0; t < t1; ++t) {
    const float pos = static_cast<float>(positions.as<int32_t>()[t]);
    for (int64_t h = 0; h < n_heads; ++h) {
      const float *xr = x.as<float>() + (t * n_heads + h) * head_dim;
      float *yr = y.as<float>() + (t * n_heads + h) * head_dim;
      if (yr != xr) std::memcpy(yr, xr, static_cast<size_t>(head_dim) * 4);
      for (size_t i = 0; i < inv.size(); ++i) {
        const float angle = pos * inv[i];
        const float c = std::cos(angle) * p.attention_factor;
        float s = std::sin(angle) * p.attention_factor;
        if (p.inverse) s = -s;
        const int64_t a = off + 2 * static_cast<int64_t>(i);
        const float x0 = xr[a], x1 = xr[a + 1];
        yr[a] = x0 * c - x1 * s;
        yr[a + 1] = x0 * s + x1 * c;
      }
    }
  }
  });
}

void CpuBackend::embed(const Tensor &table, const Tensor &ids, const Tensor &y) {
  check_weight_type(table.type, "embed");
  check_i32(ids, "embed", "ids", Device::cpu);
  check_f32(y, "embed", "y", Device::cpu);
  const int64_t d = table.ne[0], vocab = table.ne[1];
  if (y.ne[0] != d || y.n_rows() != ids.n_elems())
    fail(Status::shape, "embed: table rows of {} and {} ids do not fit y [{}, {}]", d, ids.n_elems(), y.ne[0], y.n_rows());
  const uint64_t rb = table.row_bytes();
  for (int64_t t = 0; t < ids.n_elems(); ++t) {
    const int32_t id = ids.as<int32_t>()[t];
    if (id < 0 || id >= vocab) fail(Status::invalid_argument, "embed: token id {} at {} is outside 0..{}", id, t, vocab - 1);
    dequantize_row(table.type, table.as<uint8_t>() + static_cast<uint64_t>(id) * rb, y.as<float>() + t * d, d);
  }
}

void CpuBackend::softmax(const Tensor &x, const Tensor &y) {
  check_f32(x, "softmax", "x", Device::cpu);
  check_f32(y, "softmax", "y", Device::cpu);
  check_same_shape(x, y, "softmax");
  const int64_t n = x.ne[0];
  pool_.parallel_for(x.n_rows(), rows_grain(n), [&](int64_t r0, int64_t r1, unsigned) {
    for (int64_t r = r0; r < r1; ++r) {
      const float *xr = x.as<float>() + r * n;
      float *yr = y.as<float>() + r * n;
      float m = -INFINITY;
      for (int64_t i = 0; i < n; ++i) m = std::max(m, xr[i]);
      float sum = 0.0f;
      for (int64_t i = 0; i < n; ++i) {
        yr[i] = std::exp(xr[i] - m);
        sum += yr[i];
      }
      for (int64_t i = 0; i < n; ++i) yr[i] /= sum;
    }
  });
}

namespace {
// Indices of the k largest values of v[0..n), descending, ties by lower index.
void top_k_indices(const float *v, int64_t n, int32_t k, int32_t *out) {
  std::vector<int32_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [v](int32_t a, int32_t b) {
    return v[a] > v[b] || (v[a] == v[b] && a < b);
  });
  std::copy(idx.begin(), idx.begin() + k, out);
}

// Trace: token t's k picks and the first expert left out, each with its selection score (the
// biased score the top-k is taken over), and the k-th minus the (k+1)-th: how near a tie it was.
void trace_selection(int64_t t, int64_t n_tok, const std::vector<float> &sel, int32_t k) {
  const int64_t n = static_cast<int64_t>(sel.size());
  if (k >= n) return;
  std::vector<int32_t> top(static_cast<size_t>(k) + 1);
  top_k_indices(sel.data(), n, k + 1, top.data());
  std::string picks;
  for (int32_t j = 0; j <= k; ++j) fmt::format_to(std::back_inserter(picks), " {}:{:.7g}", top[j], sel[top[j]]);
  log::trace("route: token {} of {}: expert:selection score{} (the last one left out), gap {:.4g}", t, n_tok, picks,
             sel[top[k - 1]] - sel[top[k]]);
}
}  // namespace

void CpuBackend::top_k(const Tensor &x, int32_t k, const Tensor &indices, const Tensor &values) {
  check_f32(x, "top_k", "x", Device::cpu);
  check_i32(indices, "top_k", "indices", Device::cpu);
  check_f32(values, "top_k", "values", Device::cpu);
  const int64_t n = x.ne[0];
  if (k <= 0 || k > n || indices.ne[0] != k || values.ne[0] != k || indices.n_rows() != x.n_rows() ||
      values.n_rows() != x.n_rows())
    fail(Status::shape, "top_k: k = {} of rows of {} does not fit indices [{}, {}] / values [{}, {}]", k, n,
         indices.ne[0], indices.n_rows(), values.ne[0], values.n_rows());
  for (int64_t r = 0; r < x.n_rows(); ++r) {
    const float *xr = x.as<float>() + r * n;
    int32_t *ir = indices.as<int32_t>() + r * k;
    top_k_indices(xr, n, k, ir);
    for (int32_t j = 0; j < k; ++j) values.as<float>()[r * k + j] = xr[ir[j]];
  }
}

void CpuBackend::glu(const Tensor &gate, const Tensor &up, const Activation &act, const Tensor &y) {
  check_f32(gate, "glu", "gate", Device::cpu);
  check_f32(up, "glu", "up", Device::cpu);
  check_f32(y, "glu", "y", Device::cpu);
  check_same_shape(gate, up, "glu");
  check_same_shape(gate, y, "glu");
  pool_.parallel_for(y.n_elems(), kElemGrain / 4, [&](int64_t i0, int64_t i1, unsigned) {
    for (int64_t i = i0; i < i1; ++i) y.as<float>()[i] = activation_ref(gate.as<float>()[i], up.as<float>()[i], act);
  });
}

void CpuBackend::add(const Tensor &a, const Tensor &b, const Tensor &y) {
  check_f32(a, "add", "a", Device::cpu);
  check_f32(b, "add", "b", Device::cpu);
  check_f32(y, "add", "y", Device::cpu);
  check_same_shape(a, b, "add");
  check_same_shape(a, y, "add");
  pool_.parallel_for(y.n_elems(), kElemGrain, [&](int64_t i0, int64_t i1, unsigned) {
    for (int64_t i = i0; i < i1; ++i) y.as<float>()[i] = a.as<float>()[i] + b.as<float>()[i];
  });
}

void CpuBackend::route(const Tensor &logits, const RouterParams &p, const Tensor &expert_ids, const Tensor &weights) {
  check_f32(logits, "route", "logits", Device::cpu);
  check_i32(expert_ids, "route", "expert_ids", Device::cpu);
  check_f32(weights, "route", "weights", Device::cpu);
  const int64_t n_exp = logits.ne[0], n_tok = logits.n_rows();
  const int32_t k = p.k;
  if (k <= 0 || k > n_exp || expert_ids.ne[0] != k || weights.ne[0] != k || expert_ids.n_rows() != n_tok ||
      weights.n_rows() != n_tok)
    fail(Status::shape, "route: k = {} of {} experts for {} tokens does not fit ids [{}, {}] / weights [{}, {}]", k,
         n_exp, n_tok, expert_ids.ne[0], expert_ids.n_rows(), weights.ne[0], weights.n_rows());
  const float *bias = nullptr;
  if (p.bias) {
    check_f32(*p.bias, "route", "bias", Device::cpu);
    if (p.bias->n_elems() != n_exp) fail(Status::shape, "route: bias has {} values for {} experts", p.bias->n_elems(), n_exp);
    bias = p.bias->as<float>();
  }
  if (p.hash_table) {
    check_i32(*p.hash_table, "route", "hash_table", Device::cpu);
    if (!p.token_ids) fail(Status::invalid_argument, "route: hash routing needs token_ids");
    check_i32(*p.token_ids, "route", "token_ids", Device::cpu);
    if (p.hash_table->ne[0] != k || p.token_ids->n_elems() != n_tok)
      fail(Status::shape, "route: hash table rows of {} / {} token ids for k = {} and {} tokens", p.hash_table->ne[0],
           p.token_ids->n_elems(), k, n_tok);
  }
  std::vector<float> s(static_cast<size_t>(n_exp)), sel(static_cast<size_t>(n_exp));
  for (int64_t t = 0; t < n_tok; ++t) {
    const float *lr = logits.as<float>() + t * n_exp;
    if (p.scoring == Scoring::softmax) {
      float m = -INFINITY, sum = 0.0f;
      for (int64_t e = 0; e < n_exp; ++e) m = std::max(m, lr[e]);
      for (int64_t e = 0; e < n_exp; ++e) sum += (s[e] = std::exp(lr[e] - m));
      for (int64_t e = 0; e < n_exp; ++e) s[e] /= sum;
    } else {
      for (int64_t e = 0; e < n_exp; ++e) s[e] = router_score_ref(lr[e], p.scoring);
    }
    int32_t *ids = expert_ids.as<int32_t>() + t * k;
    float *w = weights.as<float>() + t * k;
    if (p.hash_table) {
      const int32_t tok = p.token_ids->as<int32_t>()[t];
      if (tok < 0 || tok >= p.hash_table->ne[1])
        fail(Status::invalid_argument, "route: token id {} outside the hash table's {} rows", tok, p.hash_table->ne[1]);
      for (int32_t j = 0; j < k; ++j) {
        ids[j] = p.hash_table->as<int32_t>()[static_cast<int64_t>(tok) * k + j];
        if (ids[j] < 0 || ids[j] >= n_exp)
          fail(Status::corrupt, "route: hash table entry {} of token {} is expert {}, outside 0..{}", j, tok, ids[j], n_exp - 1);
      }
    } else {
      for (int64_t e = 0; e < n_exp; ++e) sel[e] = bias ? s[e] + bias[e] : s[e];
      top_k_indices(sel.data(), n_exp, k, ids);
      if (log::enabled(EP_LOG_TRACE)) trace_selection(t, n_tok, sel, k);
    }
    float sum = 0.0f;
    for (int32_t j = 0; j < k; ++j) sum += (w[j] = s[ids[j]]);
    for (int32_t j = 0; j < k; ++j) w[j] = (p.renormalize ? w[j] / sum : w[j]) * p.scale;
  }
}

void CpuBackend::moe(const Tensor &x, const Tensor &expert_ids, const Tensor &weights, const ExpertBatch &batch,
                     const SlotLayout &l, const Activation &act, const Tensor &y) {
  check_moe(x, expert_ids, weights, l, y, Device::cpu);
  if (x.n_rows() == 0) return;
  check_host_batch(batch, expert_ids.n_elems(), true, "moe");
  // Every (token, j) pair gets its own output row, then each token sums its rows in j order.
  pair_out_.resize(static_cast<size_t>(expert_ids.ne[0] * x.n_rows() * x.ne[0]));
  compute_pairs(x, expert_ids, batch, l, act, pair_out_.data());
  combine_pairs(pair_out_.data(), weights, y);
}

void CpuBackend::gather_role_table(const Tensor &expert_ids, const void *const *slots, int64_t n_experts,
                                   const SlotLayout &l, const void **out) {
  check_i32(expert_ids, "gather_role_table", "expert_ids", Device::cpu);
  const int64_t n = expert_ids.n_elems();
  const int32_t *ids = expert_ids.as<int32_t>();
  const uint64_t offsets[3] = {l.gate.offset, l.up.offset, l.down.offset};
  for (int r = 0; r < 3; ++r)
    for (int64_t p = 0; p < n; ++p)
      out[r * n + p] = ids[p] >= 0 && ids[p] < n_experts ? static_cast<const uint8_t *>(slots[ids[p]]) + offsets[r] : nullptr;
}

void CpuBackend::moe_pairs(const Tensor &x, const Tensor &expert_ids, const ExpertBatch &batch, const SlotLayout &l,
                           const Activation &act, const Tensor &pairs) {
  check_moe_pairs(x, expert_ids, l, pairs, Device::cpu);
  if (x.n_rows() == 0) return;
  check_host_batch(batch, expert_ids.n_elems(), false, "moe_pairs");
  compute_pairs(x, expert_ids, batch, l, act, pairs.as<float>());
}

void CpuBackend::moe_combine(const Tensor &pairs, const Tensor &weights, const Tensor &y) {
  check_moe_combine(pairs, weights, y, Device::cpu);
  if (y.n_rows() == 0) return;
  combine_pairs(pairs.as<float>(), weights, y);
}

void CpuBackend::compute_pairs(const Tensor &x, const Tensor &expert_ids, const ExpertBatch &batch, const SlotLayout &l,
                               const Activation &act, float *pair_out) {
  const int64_t d = x.ne[0], f = l.gate.ne1, k = expert_ids.ne[0];
  // Each pair's row is computed by its expert's group (all of that expert's tokens in one batch).
  // Per value this is the reference's arithmetic, so neither the grouping, nor the thread count,
  // nor which experts a call covers (moe_pairs) changes a bit.
  const std::vector<ExpertGroup> expert_groups = group_pairs_by_expert(batch);
  std::vector<const std::vector<int32_t> *> groups;
  std::vector<const uint8_t *> bases;
  for (const ExpertGroup &g : expert_groups) {
    groups.push_back(&g.pairs);
    bases.push_back(static_cast<const uint8_t *>(g.slot));
  }
  auto base_at = [&](size_t gi) { return bases[gi]; };
  const float *xs = x.as<float>();
  const int64_t kmax = std::max(d, f);
  auto packed_len = [](int64_t ne, int64_t kk) { return (ne + kTokenBlock - 1) / kTokenBlock * kTokenBlock * kk; };

  // Gathers the group's tokens: X [ne, d] and, for the packed path, XT.
  auto gather = [&](const std::vector<int32_t> &g, float *X, float *XT) {
    const int64_t ne = static_cast<int64_t>(g.size());
    for (int64_t i = 0; i < ne; ++i) std::memcpy(X + i * d, xs + (g[static_cast<size_t>(i)] / k) * d, static_cast<size_t>(d) * 4);
    if (ne >= kPackMinTokens) pack_tokens_by8(X, d, ne, XT);
  };
  // Gate and up rows [r0, r1) for the group's ne tokens, then the activation into G.
  auto gate_up = [&](const uint8_t *base, int64_t ne, const float *X, const float *XT, float *G, float *U, int64_t r0,
                     int64_t r1, float *row) {
    matmul_rows(l.gate.type, base + l.gate.offset, d, r0, r1, X, ne, G, f, row, XT);
    matmul_rows(l.up.type, base + l.up.offset, d, r0, r1, X, ne, U, f, row, XT);
    for (int64_t t = 0; t < ne; ++t)
      for (int64_t i = r0; i < r1; ++i) G[t * f + i] = activation_ref(G[t * f + i], U[t * f + i], act);
  };
  auto scatter = [&](const std::vector<int32_t> &g, const float *O) {
    for (size_t i = 0; i < g.size(); ++i)
      std::memcpy(pair_out + static_cast<int64_t>(g[i]) * d, O + static_cast<int64_t>(i) * d, static_cast<size_t>(d) * 4);
  };

  if (groups.size() >= pool_.threads()) {
    // Many experts (prefill): one expert per task.
    pool_.parallel_for(static_cast<int64_t>(groups.size()), 1, [&](int64_t g0, int64_t g1, unsigned worker) {
      for (int64_t gi = g0; gi < g1; ++gi) {
        const std::vector<int32_t> &g = *groups[static_cast<size_t>(gi)];
        const int64_t ne = static_cast<int64_t>(g.size());
        const uint8_t *base = base_at(static_cast<size_t>(gi));
        float *row = worker_scratch(worker, 0, kRowGroup * kmax);
        float *X = worker_scratch(worker, 1, ne * d + packed_len(ne, d));
        float *XT = X + ne * d;
        float *G = worker_scratch(worker, 2, 2 * ne * f + packed_len(ne, f));
        float *U = G + ne * f, *GT = U + ne * f;
        float *O = worker_scratch(worker, 3, ne * d);
        gather(g, X, XT);
        gate_up(base, ne, X, XT, G, U, 0, f, row);
        if (ne >= kPackMinTokens) pack_tokens_by8(G, f, ne, GT);
        matmul_rows(l.down.type, base + l.down.offset, f, 0, d, G, ne, O, d, row, GT);
        scatter(g, O);
      }
    });
  } else {
    // Few experts (decode): each expert's rows are split over the threads.
    for (size_t gi = 0; gi < groups.size(); ++gi) {
      const std::vector<int32_t> &g = *groups[gi];
      const int64_t ne = static_cast<int64_t>(g.size());
      const uint8_t *base = base_at(gi);
      moe_x_.resize(static_cast<size_t>(ne * d + packed_len(ne, d)));
      moe_h_.resize(static_cast<size_t>(2 * ne * f + packed_len(ne, f)));
      moe_o_.resize(static_cast<size_t>(ne * d));
      float *X = moe_x_.data(), *XT = X + ne * d;
      float *G = moe_h_.data(), *U = G + ne * f, *GT = U + ne * f;
      float *O = moe_o_.data();
      gather(g, X, XT);
      pool_.parallel_for(f, matmul_grain(d, ne), [&](int64_t r0, int64_t r1, unsigned worker) {
        gate_up(base, ne, X, XT, G, U, r0, r1, worker_scratch(worker, 0, kRowGroup * kmax));
      });
      if (ne >= kPackMinTokens) pack_tokens_by8(G, f, ne, GT);
      pool_.parallel_for(d, matmul_grain(f, ne), [&](int64_t r0, int64_t r1, unsigned worker) {
        matmul_rows(l.down.type, base + l.down.offset, f, r0, r1, G, ne, O, d, worker_scratch(worker, 0, kRowGroup * kmax), GT);
      });
      scatter(g, O);
    }
  }
}

void CpuBackend::combine_pairs(const float *pair_out, const Tensor &weights, const Tensor &y) {
  const int64_t d = y.ne[0], k = weights.ne[0], n_tok = y.n_rows();
  const float *wts = weights.as<float>();
  pool_.parallel_for(n_tok, std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(1, k * d)),
                     [&](int64_t t0, int64_t t1, unsigned) {
                       for (int64_t t = t0; t < t1; ++t) {
                         float *yt = y.as<float>() + t * d;
                         std::fill(yt, yt + d, 0.0f);
                         for (int64_t j = 0; j < k; ++j) {
                           const float wj = wts[t * k + j];
                           const float *o = pair_out + (t * k + j) * d;
                           for (int64_t i = 0; i < d; ++i) yt[i] += wj * o[i];
                         }
                       }
                     });
}

namespace {

/// TokenLogprobs' out fields for @p token from the raw logits row @p z (n floats).
void fill_logprobs(const float *z, int64_t n, int32_t token, TokenLogprobs &out) {
  if (out.top_n < 0 || out.top_n > kMaxTopLogprobs)
    fail(Status::invalid_argument, "sample: top_n {} of the log-probabilities (expected 0..{})", out.top_n, kMaxTopLogprobs);
  const float zmax = *std::max_element(z, z + n);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(z[i]) - zmax);
  const double lse = zmax + std::log(sum);
  out.logprob = static_cast<float>(static_cast<double>(z[token]) - lse);
  const int64_t k = std::min<int64_t>(out.top_n, n);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [z](int32_t a, int32_t b) { return z[a] > z[b] || (z[a] == z[b] && a < b); });
  out.top_ids.assign(ids.begin(), ids.begin() + k);
  out.top_logprobs.resize(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i) out.top_logprobs[i] = static_cast<float>(static_cast<double>(z[ids[i]]) - lse);
}

}  // namespace

int32_t CpuBackend::sample(const Tensor &logits, const SamplingParams &p, uint64_t counter, TokenLogprobs *logprobs) {
  check_f32(logits, "sample", "logits", Device::cpu);
  const int64_t n = logits.ne[0];
  if (logits.n_rows() != 1 || n <= 0) fail(Status::shape, "sample: expected one row of logits, got [{}, {}]", n, logits.n_rows());
  const float *raw = logits.as<float>();
  const int32_t token = draw(raw, n, p, counter);
  if (logprobs) fill_logprobs(raw, n, token, *logprobs);
  return token;
}

void CpuBackend::sample_rows(std::span<const SampleRow> rows, std::span<int32_t> tokens) {
  check_sample_rows(rows, tokens.size(), Device::cpu);
  // One row per chunk: each row writes only its own token and log-probabilities, and draw() and
  // fill_logprobs() keep no state, so the results are those of sample() row by row.
  pool_.parallel_for(static_cast<int64_t>(rows.size()), 1, [&](int64_t r0, int64_t r1, unsigned) {
    for (int64_t i = r0; i < r1; ++i) {
      const SampleRow &r = rows[static_cast<size_t>(i)];
      const float *raw = r.logits.as<float>();
      const int64_t n = r.logits.ne[0];
      tokens[static_cast<size_t>(i)] = draw(raw, n, *r.params, r.counter);
      if (r.logprobs) fill_logprobs(raw, n, tokens[static_cast<size_t>(i)], *r.logprobs);
    }
  });
}

int32_t CpuBackend::draw(const float *z0, int64_t n, const SamplingParams &p, uint64_t counter) {
  std::vector<float> adjusted;
  if ((p.repetition_penalty != 1.0f && !p.penalty_tokens.empty()) || !p.logit_bias.empty() || !p.allowed.empty()) {
    adjusted.assign(z0, z0 + n);
    apply_repetition_penalty(adjusted.data(), n, p);
    apply_logit_bias(adjusted.data(), n, p);
    apply_token_mask(adjusted.data(), n, p);
    z0 = adjusted.data();
  }
  if (p.temperature <= 0.0f || p.top_k == 1) {
    return static_cast<int32_t>(std::max_element(z0, z0 + n) - z0);  // first maximum
  }
  std::vector<float> z(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) z[i] = z0[i] / p.temperature;
  const float zmax = *std::max_element(z.begin(), z.end());
  float zmin_keep = -INFINITY;
  if (p.top_k > 0 && p.top_k < n) {
    std::vector<float> tmp = z;
    std::nth_element(tmp.begin(), tmp.begin() + (p.top_k - 1), tmp.end(), std::greater<float>());
    zmin_keep = tmp[static_cast<size_t>(p.top_k - 1)];
  }
  std::vector<float> prob(static_cast<size_t>(n), 0.0f);
  for (int64_t i = 0; i < n; ++i) prob[i] = z[i] >= zmin_keep ? std::exp(z[i] - zmax) : 0.0f;
  if (p.top_p < 1.0f) {
    double total = 0.0;
    for (float v : prob) total += v;
    std::vector<float> sorted;
    for (float v : prob)
      if (v > 0.0f) sorted.push_back(v);
    std::sort(sorted.begin(), sorted.end(), std::greater<float>());
    const double target = static_cast<double>(p.top_p) * total;
    // the cut is the value at which the sum over all values >= it first reaches target
    double cum = 0.0;
    float cut = sorted.empty() ? 0.0f : sorted.back();
    for (size_t i = 0; i < sorted.size();) {
      size_t j = i;
      while (j < sorted.size() && sorted[j] == sorted[i]) cum += sorted[j++];
      if (cum >= target) {
        cut = sorted[i];
        break;
      }
      i = j;
    }
    for (float &v : prob)
      if (v < cut) v = 0.0f;
  }
  if (p.min_p > 0.0f) {  // relative to the most likely token, whose prob is exp(0) = 1
    for (float &v : prob)
      if (v < p.min_p) v = 0.0f;
  }
  double total = 0.0;
  for (float v : prob) total += v;
  const double target = sample_uniform(p.seed, counter) * total;
  double cum = 0.0;
  int32_t last = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (prob[i] <= 0.0f) continue;
    cum += prob[i];
    last = static_cast<int32_t>(i);
    if (cum > target) return last;
  }
  if (last < 0)
    fail(Status::internal, "sample: no token kept (temperature {}, top_k {}, top_p {}, min_p {})", p.temperature, p.top_k, p.top_p,
         p.min_p);
  return last;
}

}  // namespace ep::backend
