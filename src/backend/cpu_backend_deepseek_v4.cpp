// CPU reference of the elementwise/copy ops and the DeepSeek-V4 ops (hyper-connections,
// attention with sinks, compressor pooling, lightning indexer). The numerics are those the
// model was validated with against transformers (double accumulation where noted).
#include "backend/cpu_backend.hpp"

#include "core/error.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace ep::backend {

namespace {
float sigmoid_f(float x) { return 1.0f / (1.0f + std::exp(-x)); }

/// Sinkhorn-normalised comb of one token (row-major [hc][hc]) from its hc·hc logits.
void sinkhorn_comb(const float *logits, int64_t hc, float scale, const float *base, float eps, int32_t iters,
                   float *comb) {
  for (int64_t i = 0; i < hc; ++i) {
    float *row = comb + i * hc;
    float mx = -INFINITY;
    for (int64_t j = 0; j < hc; ++j) {
      row[j] = logits[i * hc + j] * scale + base[i * hc + j];
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
  for (int32_t it = 0; it + 1 < iters; ++it) {
    row_norm();
    col_norm();
  }
}

void check_elementwise(const Tensor &a, const Tensor &y, const char *op) {
  check_f32(a, op, "x", Device::cpu);
  check_f32(y, op, "y", Device::cpu);
  check_same_shape(a, y, op);
}
}  // namespace

void CpuBackend::mul(const Tensor &a, const Tensor &b, const Tensor &y) {
  check_elementwise(a, y, "mul");
  check_elementwise(b, y, "mul");
  for (int64_t i = 0; i < y.n_elems(); ++i) y.as<float>()[i] = a.as<float>()[i] * b.as<float>()[i];
}

void CpuBackend::scale(const Tensor &x, float s, const Tensor &y) {
  check_elementwise(x, y, "scale");
  for (int64_t i = 0; i < y.n_elems(); ++i) y.as<float>()[i] = s * x.as<float>()[i];
}

void CpuBackend::copy(const Tensor &src, const Tensor &dst) {
  check_copy(src, dst, Device::cpu);
  if (src.n_bytes() != 0 && src.data != dst.data) std::memmove(dst.data, src.data, src.n_bytes());
}

void CpuBackend::copy_2d(void *dst, uint64_t dst_pitch, const void *src, uint64_t src_pitch, uint64_t row_bytes,
                         uint64_t rows) {
  check_copy_2d(dst, dst_pitch, src, src_pitch, row_bytes, rows);
  if (rows == 0 || row_bytes == 0) return;
  for (uint64_t r = 0; r < rows; ++r)
    std::memcpy(static_cast<uint8_t *>(dst) + r * dst_pitch, static_cast<const uint8_t *>(src) + r * src_pitch, row_bytes);
}

void CpuBackend::hc_weights(const Tensor &mix, const Tensor &scale, const Tensor &base, float eps, int32_t iters,
                            const Tensor &pre, const Tensor *post, const Tensor *comb) {
  const int64_t hc = check_hc_weights(mix, scale, base, pre, post, comb, Device::cpu);
  const int64_t m = mix.ne[0];
  const float *sc = scale.as<float>(), *bs = base.as<float>();
  for (int64_t t = 0; t < pre.n_rows(); ++t) {
    const float *mt = mix.as<float>() + t * m;
    for (int64_t i = 0; i < hc; ++i) pre.as<float>()[t * hc + i] = sigmoid_f(mt[i] * sc[0] + bs[i]) + eps;
    if (!post) continue;
    for (int64_t i = 0; i < hc; ++i) post->as<float>()[t * hc + i] = 2.0f * sigmoid_f(mt[hc + i] * sc[1] + bs[hc + i]);
    sinkhorn_comb(mt + 2 * hc, hc, sc[2], bs + 2 * hc, eps, iters, comb->as<float>() + t * hc * hc);
  }
}

void CpuBackend::hc_collapse(const Tensor &x, const Tensor &pre, const Tensor &y) {
  const int64_t hc = check_hc_collapse(x, pre, y, Device::cpu);
  const int64_t d = y.ne[0];
  pool_.parallel_for(y.n_rows(), std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(1, hc * d)),
                     [&](int64_t t0, int64_t t1, unsigned) {
    for (int64_t t = t0; t < t1; ++t) {
      const float *xt = x.as<float>() + t * hc * d, *pt = pre.as<float>() + t * hc;
      float *yt = y.as<float>() + t * d;
      for (int64_t c = 0; c < d; ++c) {
        float s = 0.0f;
        for (int64_t j = 0; j < hc; ++j) s += pt[j] * xt[j * d + c];
        yt[c] = s;
      }
    }
  });
}

void CpuBackend::hc_expand(const Tensor &x, const Tensor &f, const Tensor &post, const Tensor &comb, const Tensor &y) {
  const int64_t hc = check_hc_expand(x, f, post, comb, y, Device::cpu);
  const int64_t d = x.ne[0];
  pool_.parallel_for(post.n_rows(), std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(1, hc * hc * d)),
                     [&](int64_t t0, int64_t t1, unsigned worker) {
    float *old = worker_scratch(worker, 1, hc * d);
    for (int64_t t = t0; t < t1; ++t) {
      const float *xt = x.as<float>() + t * hc * d, *ft = f.as<float>() + t * d;
      const float *pt = post.as<float>() + t * hc, *ct = comb.as<float>() + t * hc * hc;
      float *yt = y.as<float>() + t * hc * d;
      std::copy(xt, xt + hc * d, old);
      for (int64_t k = 0; k < hc; ++k)
        for (int64_t c = 0; c < d; ++c) {
          float s = pt[k] * ft[c];
          for (int64_t j = 0; j < hc; ++j) s += ct[j * hc + k] * old[j * d + c];
          yt[k * d + c] = s;
        }
    }
  });
}

void CpuBackend::attention_sinks(const Tensor &q, const Tensor &kv, const Tensor &visible, const Tensor &sinks,
                                 float scale, const Tensor &out) {
  check_attention_sinks(q, kv, visible, sinks, out, Device::cpu);
  const int64_t hd = q.ne[0], n_heads = q.ne[1], n_tok = q.ne[2] * q.ne[3], n_kv = kv.n_rows();
  const float *kvp = kv.as<float>(), *sk = sinks.as<float>();
  // One task per (token, head): it reads only its own q column and writes only its own out
  // column (out may alias q).
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, 2 * n_kv * hd));
  pool_.parallel_for(n_tok * n_heads, grain, [&](int64_t i0, int64_t i1, unsigned worker) {
    float *logit = worker_scratch(worker, 1, n_kv + hd);
    float *qh = logit + n_kv;
    auto *acc = reinterpret_cast<double *>(worker_scratch(worker, 2, 2 * hd));
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / n_heads, h = i % n_heads;
      const int8_t *vis = visible.as<int8_t>() + t * n_kv;
      const float *qsrc = q.as<float>() + (t * n_heads + h) * hd;
      std::copy(qsrc, qsrc + hd, qh);  // out may alias q
      float *oh = out.as<float>() + (t * n_heads + h) * hd;
      float mx = sk[h];
      for (int64_t j = 0; j < n_kv; ++j) {
        if (!vis[j]) continue;
        const float *k = kvp + j * hd;
        double s = 0.0;
        for (int64_t c = 0; c < hd; ++c) s += static_cast<double>(qh[c]) * k[c];
        logit[j] = static_cast<float>(s) * scale;
        mx = std::max(mx, logit[j]);
      }
      double denom = std::exp(static_cast<double>(sk[h]) - mx);
      std::fill(acc, acc + hd, 0.0);
      for (int64_t j = 0; j < n_kv; ++j) {
        if (!vis[j]) continue;
        const double p = std::exp(static_cast<double>(logit[j]) - mx);
        denom += p;
        const float *v = kvp + j * hd;
        for (int64_t c = 0; c < hd; ++c) acc[c] += p * v[c];
      }
      for (int64_t c = 0; c < hd; ++c) oh[c] = static_cast<float>(acc[c] / denom);
    }
  });
}

void CpuBackend::pool_windows(const Tensor &kv, const Tensor &gate, const Tensor &out) {
  check_pool_windows(kv, gate, out, Device::cpu);
  const int64_t d = kv.ne[0], n_slots = kv.ne[1], n_win = kv.ne[2];
  for (int64_t w = 0; w < n_win; ++w) {
    const float *kw = kv.as<float>() + w * n_slots * d, *gw = gate.as<float>() + w * n_slots * d;
    float *ow = out.as<float>() + w * d;
    for (int64_t c = 0; c < d; ++c) {
      float mx = -INFINITY;
      for (int64_t s = 0; s < n_slots; ++s) mx = std::max(mx, gw[s * d + c]);
      if (mx == -INFINITY) {
        ow[c] = 0.0f;
        continue;
      }
      double den = 0.0, num = 0.0;
      for (int64_t s = 0; s < n_slots; ++s) {
        const double p = std::exp(static_cast<double>(gw[s * d + c]) - mx);
        den += p;
        num += p * kw[s * d + c];
      }
      ow[c] = static_cast<float>(num / den);
    }
  }
}

void CpuBackend::indexer_scores(const Tensor &q, const Tensor &w, const Tensor &keys, const Tensor &visible, float scale,
                                const Tensor &scores) {
  check_indexer_scores(q, w, keys, visible, scores, Device::cpu);
  const int64_t dim = q.ne[0], n_heads = q.ne[1], n_tok = q.ne[2] * q.ne[3], n = keys.n_rows();
  // One task per (token, key).
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, n_heads * dim));
  pool_.parallel_for(n_tok * n, grain, [&](int64_t i0, int64_t i1, unsigned) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / n, s = i % n;
      const float *qt = q.as<float>() + t * n_heads * dim, *wt = w.as<float>() + t * n_heads;
      float *st = scores.as<float>() + t * n;
      if (!visible.as<int8_t>()[t * n + s]) {
        st[s] = -INFINITY;
        continue;
      }
      const float *k = keys.as<float>() + s * dim;
      double total = 0.0;
      for (int64_t h = 0; h < n_heads; ++h) {
        const float *qh = qt + h * dim;
        double dot = 0.0;
        for (int64_t c = 0; c < dim; ++c) dot += static_cast<double>(qh[c]) * k[c];
        const double r = dot > 0.0 ? dot * scale : 0.0;
        total += r * wt[h];
      }
      st[s] = static_cast<float>(total);
    }
  });
}

void CpuBackend::set_visible(const Tensor &indices, const Tensor &values, int64_t offset, const Tensor &mask) {
  check_set_visible(indices, values, offset, mask, Device::cpu);
  const int64_t k = indices.ne[0], n = mask.ne[0];
  for (int64_t t = 0; t < indices.n_rows(); ++t)
    for (int64_t j = 0; j < k; ++j) {
      if (!(values.as<float>()[t * k + j] > -INFINITY)) continue;
      const int32_t i = indices.as<int32_t>()[t * k + j];
      if (i < 0 || i >= n - offset)
        fail(Status::corrupt, "set_visible: index {} (pick {} of token {}) is outside 0..{} (mask rows of {}, offset {})",
             i, j, t, n - offset - 1, n, offset);
      mask.as<int8_t>()[t * n + offset + i] = 1;
    }
}

}  // namespace ep::backend
