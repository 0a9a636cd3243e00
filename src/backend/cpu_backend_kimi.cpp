// CPU reference of the Kimi-Linear / Kimi-K3 ops (short convolution, l2 norm, sigmoid, the KDA
// decay gate and recurrence, the gated output norm, causal attention over cached keys, the
// AttnRes mix). The formulas and operation order are those the model was validated with against
// transformers and tests/oracle/kimi_k3_ref.py (docs/models/kimi-linear.md).
#include "backend/cpu_backend.hpp"
#include "backend/kimi_checks.hpp"

#include "core/error.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace ep::backend {

namespace {
float sigmoid_ref(float x) { return 1.0f / (1.0f + std::exp(-x)); }
/// transformers' Kimi-Linear softplus: x for x > 20.
float softplus20(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }
}  // namespace

void CpuBackend::short_conv_silu(const Tensor &x, const Tensor &w, const Tensor &state, const Tensor &y) {
  const ShortConvDims d = check_short_conv_silu(x, w, state, y, Device::cpu);
  const int64_t C = d.channels, n = d.n_tokens, K = d.kernel, hist = K - 1;
  const float *xs = x.as<float>(), *ws = w.as<float>();
  float *st = state.as<float>(), *ys = y.as<float>();
  // x̂ row r: the state's rows first, then x's
  auto at = [&](int64_t r, int64_t c) { return r < hist ? st[r * C + c] : xs[(r - hist) * C + c]; };
  for (int64_t t = 0; t < n; ++t)
    for (int64_t c = 0; c < C; ++c) {
      const float *wc = ws + c * K;
      float acc = 0.0f;
      for (int64_t j = 0; j < K; ++j) acc += wc[j] * at(t + j, c);
      ys[t * C + c] = acc * sigmoid_ref(acc);
    }
  std::vector<float> next(static_cast<size_t>(hist * C));
  for (int64_t r = 0; r < hist; ++r)
    for (int64_t c = 0; c < C; ++c) next[static_cast<size_t>(r * C + c)] = at(n + r, c);
  std::copy(next.begin(), next.end(), st);
}

void CpuBackend::l2_normalize(const Tensor &x, float eps, float s, const Tensor &y) {
  check_kimi_elementwise(x, y, "l2_normalize", Device::cpu);
  const int64_t d = x.ne[0];
  for (int64_t r = 0; r < x.n_rows(); ++r) {
    const float *xr = x.as<float>() + r * d;
    float *yr = y.as<float>() + r * d;
    float ss = 0.0f;
    for (int64_t i = 0; i < d; ++i) ss += xr[i] * xr[i];
    const float inv = 1.0f / std::sqrt(ss + eps);
    for (int64_t i = 0; i < d; ++i) yr[i] = xr[i] * inv * s;
  }
}

void CpuBackend::sigmoid(const Tensor &x, const Tensor &y) {
  check_kimi_elementwise(x, y, "sigmoid", Device::cpu);
  for (int64_t i = 0; i < x.n_elems(); ++i) y.as<float>()[i] = sigmoid_ref(x.as<float>()[i]);
}

void CpuBackend::kda_gate(const Tensor &x, const Tensor &bias, const Tensor &a, float lower_bound, const Tensor &g) {
  const KdaDims d = check_kda_gate(x, bias, a, g, Device::cpu);
  const int64_t inner = d.dk * d.n_heads;
  for (int64_t t = 0; t < d.n_tokens; ++t)
    for (int64_t ch = 0; ch < inner; ++ch) {
      const float ah = a.as<float>()[ch / d.dk], f = x.as<float>()[t * inner + ch] + bias.as<float>()[ch];
      g.as<float>()[t * inner + ch] = lower_bound < 0.0f ? lower_bound * sigmoid_ref(-ah * f) : ah * softplus20(f);
    }
}

void CpuBackend::kda_recurrence(const Tensor &q, const Tensor &k, const Tensor &v, const Tensor &g, const Tensor &beta,
                                const Tensor &state, const Tensor &out) {
  const KdaDims d = check_kda_recurrence(q, k, v, g, beta, state, out, Device::cpu);
  const int64_t dk = d.dk, dv = d.dv, H = d.n_heads;
  std::vector<float> delta(static_cast<size_t>(dv));
  for (int64_t t = 0; t < d.n_tokens; ++t)
    for (int64_t h = 0; h < H; ++h) {
      float *S = state.as<float>() + h * dk * dv;
      const float *qt = q.as<float>() + (t * H + h) * dk, *kt = k.as<float>() + (t * H + h) * dk,
                  *gt = g.as<float>() + (t * H + h) * dk, *vt = v.as<float>() + (t * H + h) * dv;
      const float b = beta.as<float>()[t * H + h];
      float *o = out.as<float>() + (t * H + h) * dv;
      for (int64_t i = 0; i < dk; ++i) {
        const float decay = std::exp(gt[i]);
        for (int64_t j = 0; j < dv; ++j) S[i * dv + j] *= decay;
      }
      std::fill(delta.begin(), delta.end(), 0.0f);  // kv_mem = Sᵀ k
      for (int64_t i = 0; i < dk; ++i)
        for (int64_t j = 0; j < dv; ++j) delta[static_cast<size_t>(j)] += S[i * dv + j] * kt[i];
      for (int64_t j = 0; j < dv; ++j) delta[static_cast<size_t>(j)] = (vt[j] - delta[static_cast<size_t>(j)]) * b;
      for (int64_t i = 0; i < dk; ++i)
        for (int64_t j = 0; j < dv; ++j) S[i * dv + j] += kt[i] * delta[static_cast<size_t>(j)];
      for (int64_t j = 0; j < dv; ++j) o[j] = 0.0f;
      for (int64_t i = 0; i < dk; ++i)
        for (int64_t j = 0; j < dv; ++j) o[j] += S[i * dv + j] * qt[i];
    }
}

void CpuBackend::gated_rms_norm(const Tensor &x, const Tensor &w, const Tensor &gate, float eps, const Tensor &y) {
  check_gated_rms_norm(x, w, gate, y, Device::cpu);
  const int64_t d = x.ne[0];
  const float *ws = w.as<float>();
  for (int64_t r = 0; r < x.n_rows(); ++r) {
    const float *xr = x.as<float>() + r * d, *gr = gate.as<float>() + r * d;
    float *yr = y.as<float>() + r * d;
    float ss = 0.0f;
    for (int64_t i = 0; i < d; ++i) ss += xr[i] * xr[i];
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(d) + eps);
    for (int64_t i = 0; i < d; ++i) yr[i] = ws[i] * (xr[i] * inv) * sigmoid_ref(gr[i]);
  }
}

void CpuBackend::causal_attention(const Tensor &q, const Tensor &keys, const Tensor &values, int64_t n_past, float scale,
                                  const Tensor &out) {
  const CausalAttentionDims d = check_causal_attention(q, keys, values, n_past, out, Device::cpu);
  const int64_t H = d.n_heads, dqk = d.dqk, dv = d.dv;
  std::vector<float> p(static_cast<size_t>(n_past + d.n_tokens));
  for (int64_t t = 0; t < d.n_tokens; ++t) {
    const int64_t visible = n_past + t + 1;
    for (int64_t h = 0; h < H; ++h) {
      const float *qh = q.as<float>() + (t * H + h) * dqk;
      float mx = -INFINITY;
      for (int64_t j = 0; j < visible; ++j) {
        const float *kj = keys.as<float>() + (j * H + h) * dqk;
        float s = 0.0f;
        for (int64_t i = 0; i < dqk; ++i) s += qh[i] * kj[i];
        p[static_cast<size_t>(j)] = s * scale;
        mx = std::max(mx, p[static_cast<size_t>(j)]);
      }
      float sum = 0.0f;
      for (int64_t j = 0; j < visible; ++j) sum += (p[static_cast<size_t>(j)] = std::exp(p[static_cast<size_t>(j)] - mx));
      float *oh = out.as<float>() + (t * H + h) * dv;
      for (int64_t i = 0; i < dv; ++i) oh[i] = 0.0f;
      for (int64_t j = 0; j < visible; ++j) {
        const float pj = p[static_cast<size_t>(j)] / sum;
        const float *vj = values.as<float>() + (j * H + h) * dv;
        for (int64_t i = 0; i < dv; ++i) oh[i] += pj * vj[i];
      }
    }
  }
}

void CpuBackend::attn_res_mix(const Tensor *banked, const Tensor &cur, const Tensor &w, float eps, const Tensor &out) {
  const AttnResDims d = check_attn_res_mix(banked, cur, w, out, Device::cpu);
  const int64_t D = d.d, T = d.n_tokens, n_src = d.n_banked + 1;
  const float *ws = w.as<float>();
  std::vector<float> p(static_cast<size_t>(n_src));
  for (int64_t t = 0; t < T; ++t) {
    auto src = [&](int64_t i) {
      return i < d.n_banked ? banked->as<float>() + (i * T + t) * D : cur.as<float>() + t * D;
    };
    float mx = -INFINITY;
    for (int64_t i = 0; i < n_src; ++i) {
      const float *s = src(i);
      float ss = 0.0f, dot = 0.0f;
      for (int64_t j = 0; j < D; ++j) {
        ss += s[j] * s[j];
        dot += s[j] * ws[j];
      }
      p[static_cast<size_t>(i)] = dot / std::sqrt(ss / static_cast<float>(D) + eps);
      mx = std::max(mx, p[static_cast<size_t>(i)]);
    }
    float sum = 0.0f;
    for (float &v : p) sum += (v = std::exp(v - mx));
    float *o = out.as<float>() + t * D;
    for (int64_t j = 0; j < D; ++j) o[j] = 0.0f;
    for (int64_t i = 0; i < n_src; ++i) {
      const float pi = p[static_cast<size_t>(i)] / sum;
      const float *s = src(i);
      for (int64_t j = 0; j < D; ++j) o[j] += pi * s[j];
    }
  }
}

}  // namespace ep::backend
