#include "model/kimi_ops.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace ep::model::kimi {

namespace {
float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
float silu(float x) { return x * sigmoid(x); }
}  // namespace

void short_conv_silu(const float *x, int64_t n, int64_t channels, const float *w, int64_t kernel, float *state, float *y) {
  const int64_t hist = kernel - 1;
  // rows: [state (hist rows) | x (n rows)]
  auto row = [&](int64_t r) -> const float * { return r < hist ? state + r * channels : x + (r - hist) * channels; };
  for (int64_t t = 0; t < n; ++t) {
    float *yt = y + t * channels;
    for (int64_t c = 0; c < channels; ++c) {
      const float *wc = w + c * kernel;
      float acc = 0.0f;
      for (int64_t j = 0; j < kernel; ++j) acc += wc[j] * row(t + j)[c];
      yt[c] = silu(acc);
    }
  }
  if (hist > 0) {
    std::vector<float> next(static_cast<size_t>(hist * channels));
    for (int64_t r = 0; r < hist; ++r)
      std::memcpy(next.data() + r * channels, row(n + r), static_cast<size_t>(channels) * sizeof(float));
    std::memcpy(state, next.data(), next.size() * sizeof(float));
  }
}

void l2_normalize(float *x, int64_t d, float eps) {
  float ss = 0.0f;
  for (int64_t i = 0; i < d; ++i) ss += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(ss + eps);
  for (int64_t i = 0; i < d; ++i) x[i] *= inv;
}

float softplus20(float x) noexcept { return x > 20.0f ? x : std::log1p(std::exp(x)); }

void kda_step(float *S, const float *q, const float *k, const float *v, const float *g, float beta, int64_t dk, int64_t dv,
              float *o) {
  std::vector<float> delta(static_cast<size_t>(dv), 0.0f);
  for (int64_t i = 0; i < dk; ++i) {
    const float decay = std::exp(g[i]);
    float *row = S + i * dv;
    for (int64_t j = 0; j < dv; ++j) row[j] *= decay;
  }
  // kv_mem = Sᵀ k
  for (int64_t i = 0; i < dk; ++i) {
    const float *row = S + i * dv;
    for (int64_t j = 0; j < dv; ++j) delta[static_cast<size_t>(j)] += row[j] * k[i];
  }
  for (int64_t j = 0; j < dv; ++j) delta[static_cast<size_t>(j)] = (v[j] - delta[static_cast<size_t>(j)]) * beta;
  for (int64_t i = 0; i < dk; ++i) {
    float *row = S + i * dv;
    for (int64_t j = 0; j < dv; ++j) row[j] += k[i] * delta[static_cast<size_t>(j)];
  }
  for (int64_t j = 0; j < dv; ++j) o[j] = 0.0f;
  for (int64_t i = 0; i < dk; ++i) {
    const float *row = S + i * dv;
    for (int64_t j = 0; j < dv; ++j) o[j] += row[j] * q[i];
  }
}

void gated_rms_norm(const float *x, const float *w, const float *gate, int64_t d, float eps, float *y) {
  float ss = 0.0f;
  for (int64_t i = 0; i < d; ++i) ss += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(ss / static_cast<float>(d) + eps);
  for (int64_t i = 0; i < d; ++i) y[i] = w[i] * (x[i] * inv) * sigmoid(gate[i]);
}

void causal_attention(const float *q, int64_t n, int64_t n_past, int64_t n_heads, int64_t dqk, int64_t dv, const float *keys,
                      const float *values, float scale, float *out) {
  std::vector<float> p(static_cast<size_t>(n_past + n));
  for (int64_t t = 0; t < n; ++t) {
    const int64_t visible = n_past + t + 1;
    for (int64_t h = 0; h < n_heads; ++h) {
      const float *qh = q + (t * n_heads + h) * dqk;
      float mx = -INFINITY;
      for (int64_t j = 0; j < visible; ++j) {
        const float *kj = keys + (j * n_heads + h) * dqk;
        float s = 0.0f;
        for (int64_t i = 0; i < dqk; ++i) s += qh[i] * kj[i];
        p[static_cast<size_t>(j)] = s * scale;
        mx = std::max(mx, p[static_cast<size_t>(j)]);
      }
      float sum = 0.0f;
      for (int64_t j = 0; j < visible; ++j) sum += (p[static_cast<size_t>(j)] = std::exp(p[static_cast<size_t>(j)] - mx));
      float *oh = out + (t * n_heads + h) * dv;
      for (int64_t i = 0; i < dv; ++i) oh[i] = 0.0f;
      for (int64_t j = 0; j < visible; ++j) {
        const float pj = p[static_cast<size_t>(j)] / sum;
        const float *vj = values + (j * n_heads + h) * dv;
        for (int64_t i = 0; i < dv; ++i) oh[i] += pj * vj[i];
      }
    }
  }
}

void attn_res_mix(const float *const *srcs, int64_t n_src, int64_t d, const float *w, float eps, float *out) {
  std::vector<float> p(static_cast<size_t>(n_src));
  float mx = -INFINITY;
  for (int64_t i = 0; i < n_src; ++i) {
    const float *s = srcs[i];
    float ss = 0.0f, dot = 0.0f;
    for (int64_t j = 0; j < d; ++j) {
      ss += s[j] * s[j];
      dot += s[j] * w[j];
    }
    p[static_cast<size_t>(i)] = dot / std::sqrt(ss / static_cast<float>(d) + eps);
    mx = std::max(mx, p[static_cast<size_t>(i)]);
  }
  float sum = 0.0f;
  for (float &v : p) sum += (v = std::exp(v - mx));
  for (int64_t j = 0; j < d; ++j) out[j] = 0.0f;
  for (int64_t i = 0; i < n_src; ++i) {
    const float pi = p[static_cast<size_t>(i)] / sum;
    for (int64_t j = 0; j < d; ++j) out[j] += pi * srcs[i][j];
  }
}

}  // namespace ep::model::kimi
