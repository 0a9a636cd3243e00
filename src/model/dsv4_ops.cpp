#include "model/dsv4_ops.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace ep::model::dsv4 {

namespace {
float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
}  // namespace

void hc_weights(const float *mix, int64_t hc, const float *scale3, const float *base, float eps, int64_t iters, float *pre,
                float *post, float *comb) {
  for (int64_t i = 0; i < hc; ++i) {
    pre[i] = sigmoid(mix[i] * scale3[0] + base[i]) + eps;
    post[i] = 2.0f * sigmoid(mix[hc + i] * scale3[1] + base[hc + i]);
  }
  for (int64_t i = 0; i < hc; ++i) {
    float *row = comb + i * hc;
    float mx = -INFINITY;
    for (int64_t j = 0; j < hc; ++j) {
      row[j] = mix[2 * hc + i * hc + j] * scale3[2] + base[2 * hc + i * hc + j];
      mx = std::max(mx, row[j]);
    }
    float sum = 0.0f;
    for (int64_t j = 0; j < hc; ++j) sum += (row[j] = std::exp(row[j] - mx));
    for (int64_t j = 0; j < hc; ++j) row[j] = row[j] / sum + eps;
  }
  auto col_norm = [&] {
    for (int64_t j = 0; j < hc; ++j) {
      float s = 0.0f;
      for (int64_t i = 0; i < hc; ++i) s += comb[i * hc + j];
      for (int64_t i = 0; i < hc; ++i) comb[i * hc + j] /= (s + eps);
    }
  };
  auto row_norm = [&] {
    for (int64_t i = 0; i < hc; ++i) {
      float s = 0.0f;
      for (int64_t j = 0; j < hc; ++j) s += comb[i * hc + j];
      for (int64_t j = 0; j < hc; ++j) comb[i * hc + j] /= (s + eps);
    }
  };
  col_norm();
  for (int64_t it = 0; it + 1 < iters; ++it) {
    row_norm();
    col_norm();
  }
}

void hc_collapse(const float *x, const float *pre, int64_t hc, int64_t d, float *y) {
  for (int64_t c = 0; c < d; ++c) {
    float s = 0.0f;
    for (int64_t j = 0; j < hc; ++j) s += pre[j] * x[j * d + c];
    y[c] = s;
  }
}

void hc_expand(float *x, const float *f, const float *post, const float *comb, int64_t hc, int64_t d) {
  std::vector<float> old(x, x + hc * d);
  for (int64_t k = 0; k < hc; ++k)
    for (int64_t c = 0; c < d; ++c) {
      float s = post[k] * f[c];
      for (int64_t j = 0; j < hc; ++j) s += comb[j * hc + k] * old[static_cast<size_t>(j * d + c)];
      x[k * d + c] = s;
    }
}

void attention_sinks(const float *q, int64_t hd, int64_t n_heads, int64_t n_tokens, const float *kv, int64_t n_kv,
                     const uint8_t *visible, const float *sinks, float scale, float *out) {
  std::vector<float> logit(static_cast<size_t>(n_kv));
  for (int64_t t = 0; t < n_tokens; ++t) {
    const uint8_t *vis = visible + t * n_kv;
    for (int64_t h = 0; h < n_heads; ++h) {
      const float *qh = q + (t * n_heads + h) * hd;
      float *oh = out + (t * n_heads + h) * hd;
      float mx = sinks[h];
      for (int64_t j = 0; j < n_kv; ++j) {
        if (!vis[j]) continue;
        const float *k = kv + j * hd;
        double s = 0.0;
        for (int64_t c = 0; c < hd; ++c) s += static_cast<double>(qh[c]) * k[c];
        logit[static_cast<size_t>(j)] = static_cast<float>(s) * scale;
        mx = std::max(mx, logit[static_cast<size_t>(j)]);
      }
      double denom = std::exp(static_cast<double>(sinks[h]) - mx);
      std::vector<double> acc(static_cast<size_t>(hd), 0.0);
      for (int64_t j = 0; j < n_kv; ++j) {
        if (!vis[j]) continue;
        const double p = std::exp(static_cast<double>(logit[static_cast<size_t>(j)]) - mx);
        denom += p;
        const float *v = kv + j * hd;
        for (int64_t c = 0; c < hd; ++c) acc[static_cast<size_t>(c)] += p * v[c];
      }
      for (int64_t c = 0; c < hd; ++c) oh[c] = static_cast<float>(acc[static_cast<size_t>(c)] / denom);
    }
  }
}

void pool_window(const float *const *kv, const float *const *gate, int64_t n_slots, int64_t d, float *out) {
  for (int64_t c = 0; c < d; ++c) {
    float mx = -INFINITY;
    for (int64_t s = 0; s < n_slots; ++s) mx = std::max(mx, gate[s][c]);
    double den = 0.0, num = 0.0;
    for (int64_t s = 0; s < n_slots; ++s) {
      const double p = std::exp(static_cast<double>(gate[s][c]) - mx);
      den += p;
      num += p * kv[s][c];
    }
    out[c] = static_cast<float>(num / den);
  }
}

void indexer_scores(const float *q, const float *w, int64_t dim, int64_t n_heads, const float *keys, int64_t n, float scale,
                    float *scores) {
  for (int64_t s = 0; s < n; ++s) {
    const float *k = keys + s * dim;
    double total = 0.0;
    for (int64_t h = 0; h < n_heads; ++h) {
      const float *qh = q + h * dim;
      double dot = 0.0;
      for (int64_t c = 0; c < dim; ++c) dot += static_cast<double>(qh[c]) * k[c];
      const double r = dot > 0.0 ? dot * scale : 0.0;
      total += r * w[h];
    }
    scores[s] = static_cast<float>(total);
  }
}

void top_k(const float *x, int64_t n, int64_t k, int32_t *out) {
  std::vector<int32_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
    return x[a] > x[b] || (x[a] == x[b] && a < b);
  });
  std::copy(idx.begin(), idx.begin() + k, out);
}

}  // namespace ep::model::dsv4
