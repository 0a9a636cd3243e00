// The Kimi-Linear / Kimi-K3 ops of the CPU backend (src/backend/cpu_backend_kimi.cpp) against direct
// formulas, plus the properties the model relies on: a sequence split into several calls gives
// bitwise the same outputs and state as one call (short conv, KDA recurrence, causal attention
// with n_past), heads are independent, and bad shapes / aliasing are refused.
#include "support/catch.hpp"

#include "backend/cpu_backend.hpp"
#include "core/error.hpp"
#include "host_tensors.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <vector>

using ep::backend::CpuBackend;
using ep::test::host::close;
using ep::test::host::f32;

namespace {

std::vector<float> randn(size_t n, std::mt19937 &rng, float sd = 1.0f) {
  std::normal_distribution<float> nd(0.0f, sd);
  std::vector<float> v(n);
  for (float &x : v) x = nd(rng);
  return v;
}

ep::Status status_of_call(const std::function<void()> &f) {
  try {
    f();
  } catch (const ep::Error &e) {
    return e.status();
  }
  return ep::Status::ok;
}

}  // namespace

TEST_CASE("kimi ops: short conv + SiLU, split runs equal one run", "[backend][kimi]") {
  CpuBackend cpu;
  std::mt19937 rng(7);
  const int64_t C = 5, K = 4, n = 9;
  std::vector<float> x = randn(static_cast<size_t>(n * C), rng), w = randn(static_cast<size_t>(C * K), rng);
  std::vector<float> st1(static_cast<size_t>((K - 1) * C), 0.0f), st2 = st1, y1(x.size()), y2(x.size());
  cpu.short_conv_silu(f32(x, {C, n}), f32(w, {K, C}), f32(st1, {C, K - 1}), f32(y1, {C, n}));
  // two calls: 2 tokens, then the rest (a view into the same vectors)
  std::vector<float> xa(x.begin(), x.begin() + 2 * C), xb(x.begin() + 2 * C, x.end()), ya(xa.size()), yb(xb.size());
  cpu.short_conv_silu(f32(xa, {C, 2}), f32(w, {K, C}), f32(st2, {C, K - 1}), f32(ya, {C, 2}));
  cpu.short_conv_silu(f32(xb, {C, n - 2}), f32(w, {K, C}), f32(st2, {C, K - 1}), f32(yb, {C, n - 2}));
  std::copy(ya.begin(), ya.end(), y2.begin());
  std::copy(yb.begin(), yb.end(), y2.begin() + 2 * C);
  CHECK(y1 == y2);
  CHECK(st1 == st2);
  // the state holds the last K − 1 input rows
  for (int64_t r = 0; r < K - 1; ++r)
    for (int64_t c = 0; c < C; ++c) CHECK(st1[static_cast<size_t>(r * C + c)] == x[static_cast<size_t>((n - K + 1 + r) * C + c)]);
  // direct: t = 1, channel 2 from a zero state: w[2][2]·x[0][2] + w[2][3]·x[1][2]
  const float a = w[2 * K + 2] * x[2] + w[2 * K + 3] * x[C + 2];
  CHECK(std::fabs(y1[C + 2] - a / (1.0f + std::exp(-a))) <= 1e-6f);
  // one token with a state shorter than the kernel: rows come from the state
  std::vector<float> st3(static_cast<size_t>((K - 1) * C), 0.0f), y3(static_cast<size_t>(C));
  st3[static_cast<size_t>(2 * C + 1)] = 2.0f;  // newest state row, channel 1
  std::vector<float> x3(static_cast<size_t>(C), 0.0f);
  cpu.short_conv_silu(f32(x3, {C, 1}), f32(w, {K, C}), f32(st3, {C, K - 1}), f32(y3, {C, 1}));
  const float b = w[1 * K + 2] * 2.0f;
  CHECK(std::fabs(y3[1] - b / (1.0f + std::exp(-b))) <= 1e-6f);
  CHECK(st3[static_cast<size_t>(1 * C + 1)] == 2.0f);  // shifted one row older
  CHECK(st3[static_cast<size_t>(2 * C + 1)] == 0.0f);
  // refused: w of the wrong width, aliasing
  std::vector<float> wbad(static_cast<size_t>(C * (K + 1)));
  CHECK(status_of_call([&] { cpu.short_conv_silu(f32(x, {C, n}), f32(wbad, {K + 1, C}), f32(st1, {C, K - 1}), f32(y1, {C, n})); }) ==
        ep::Status::shape);
  CHECK(status_of_call([&] { cpu.short_conv_silu(f32(x, {C, n}), f32(w, {K, C}), f32(st1, {C, K - 1}), f32(x, {C, n})); }) ==
        ep::Status::invalid_argument);
}

TEST_CASE("kimi ops: KDA recurrence against the delta rule", "[backend][kimi]") {
  CpuBackend cpu;
  SECTION("one head: from a zero state, then decay and the delta rule") {
    const int64_t dk = 3, dv = 2;
    std::vector<float> S(static_cast<size_t>(dk * dv), 0.0f), o(2);
    std::vector<float> q = {0.5f, -1.0f, 2.0f}, k = {1.0f, 0.5f, -0.25f}, v = {2.0f, -3.0f}, g = {-0.1f, -0.2f, -0.3f},
                       beta = {0.5f};
    cpu.kda_recurrence(f32(q, {dk, 1, 1}), f32(k, {dk, 1, 1}), f32(v, {dv, 1, 1}), f32(g, {dk, 1, 1}), f32(beta, {1, 1}),
                       f32(S, {dv, dk, 1}), f32(o, {dv, 1, 1}));
    // S = β k vᵀ; o = Sᵀq = β (k·q) v
    const float kq = 0.5f * 1.0f + (-1.0f) * 0.5f + 2.0f * -0.25f;
    CHECK(std::fabs(o[0] - 0.5f * kq * 2.0f) <= 1e-6f);
    CHECK(std::fabs(o[1] - 0.5f * kq * -3.0f) <= 1e-6f);
    // second step with k = e0, β = 1: S ← e^g S, then row 0 replaced by v
    std::vector<float> e0 = {1.0f, 0.0f, 0.0f}, v2 = {7.0f, 8.0f}, one = {1.0f};
    std::vector<float> expect = S;
    for (int64_t i = 0; i < dk; ++i)
      for (int64_t j = 0; j < dv; ++j) expect[static_cast<size_t>(i * dv + j)] *= std::exp(g[static_cast<size_t>(i)]);
    expect[0] = 7.0f;
    expect[1] = 8.0f;
    cpu.kda_recurrence(f32(e0, {dk, 1, 1}), f32(e0, {dk, 1, 1}), f32(v2, {dv, 1, 1}), f32(g, {dk, 1, 1}), f32(one, {1, 1}),
                       f32(S, {dv, dk, 1}), f32(o, {dv, 1, 1}));
    for (size_t i = 0; i < S.size(); ++i) CHECK(std::fabs(S[i] - expect[i]) <= 1e-5f);
    CHECK(std::fabs(o[0] - 7.0f) <= 1e-5f);
    CHECK(std::fabs(o[1] - 8.0f) <= 1e-5f);
  }
  SECTION("tokens one call at a time equal one call; heads are independent") {
    std::mt19937 rng(11);
    const int64_t dk = 8, dv = 6, H = 3, T = 7;
    auto q = randn(static_cast<size_t>(dk * H * T), rng), k = randn(q.size(), rng), g = randn(q.size(), rng, 0.3f),
         v = randn(static_cast<size_t>(dv * H * T), rng), beta = randn(static_cast<size_t>(H * T), rng);
    for (float &x : g) x = -std::fabs(x);
    for (float &x : beta) x = 1.0f / (1.0f + std::exp(-x));
    std::vector<float> S1(static_cast<size_t>(dk * dv * H), 0.0f), S2 = S1, o1(v.size()), o2(v.size());
    cpu.kda_recurrence(f32(q, {dk, H, T}), f32(k, {dk, H, T}), f32(v, {dv, H, T}), f32(g, {dk, H, T}), f32(beta, {H, T}),
                       f32(S1, {dv, dk, H}), f32(o1, {dv, H, T}));
    for (int64_t t = 0; t < T; ++t) {
      auto slice = [&](const std::vector<float> &src, int64_t w) {
        return std::vector<float>(src.begin() + t * w, src.begin() + (t + 1) * w);
      };
      auto qt = slice(q, dk * H), kt = slice(k, dk * H), gt = slice(g, dk * H), vt = slice(v, dv * H), bt = slice(beta, H);
      std::vector<float> ot(static_cast<size_t>(dv * H));
      cpu.kda_recurrence(f32(qt, {dk, H, 1}), f32(kt, {dk, H, 1}), f32(vt, {dv, H, 1}), f32(gt, {dk, H, 1}), f32(bt, {H, 1}),
                         f32(S2, {dv, dk, H}), f32(ot, {dv, H, 1}));
      std::copy(ot.begin(), ot.end(), o2.begin() + t * dv * H);
    }
    CHECK(o1 == o2);
    CHECK(S1 == S2);
    // head 1 alone
    auto head = [&](const std::vector<float> &src, int64_t w) {
      std::vector<float> r;
      for (int64_t t = 0; t < T; ++t) r.insert(r.end(), src.begin() + (t * H + 1) * w, src.begin() + (t * H + 2) * w);
      return r;
    };
    auto qh = head(q, dk), kh = head(k, dk), gh = head(g, dk), vh = head(v, dv), bh = head(beta, 1), oh = head(o1, dv);
    std::vector<float> Sh(static_cast<size_t>(dk * dv), 0.0f), got(oh.size());
    cpu.kda_recurrence(f32(qh, {dk, 1, T}), f32(kh, {dk, 1, T}), f32(vh, {dv, 1, T}), f32(gh, {dk, 1, T}), f32(bh, {1, T}),
                       f32(Sh, {dv, dk, 1}), f32(got, {dv, 1, T}));
    CHECK(got == oh);
    // refused: state of the wrong size
    std::vector<float> Sbad(static_cast<size_t>(dk * dv * (H - 1)));
    CHECK(status_of_call([&] {
            cpu.kda_recurrence(f32(q, {dk, H, T}), f32(k, {dk, H, T}), f32(v, {dv, H, T}), f32(g, {dk, H, T}), f32(beta, {H, T}),
                               f32(Sbad, {dv, dk, H - 1}), f32(o1, {dv, H, T}));
          }) == ep::Status::shape);
  }
}

TEST_CASE("kimi ops: l2 norm, sigmoid, decay gate, gated norm", "[backend][kimi]") {
  CpuBackend cpu;
  std::vector<float> x = {3.0f, 4.0f, 0.0f, -2.0f}, y(4);
  cpu.l2_normalize(f32(x, {2, 2}), 0.0f, 2.0f, f32(y, {2, 2}));
  CHECK(close(y[0], 1.2, 1e-6));
  CHECK(close(y[1], 1.6, 1e-6));
  CHECK(y[2] == 0.0f);
  CHECK(close(y[3], -2.0, 1e-6));
  std::vector<float> s = {0.0f, 100.0f, -100.0f, 1.0f};
  cpu.sigmoid(f32(s, {4}), f32(s, {4}));  // in place
  CHECK(s[0] == 0.5f);
  CHECK(s[1] == 1.0f);
  CHECK(s[2] < 1e-40f);
  CHECK(close(s[3], 1.0 / (1.0 + std::exp(-1.0)), 1e-6));
  // decay gate: dk = 2, H = 2, T = 1; a per head, bias per channel
  std::vector<float> f = {0.5f, 25.0f, -1.0f, 0.0f}, bias = {0.5f, 0.0f, 0.0f, 1.0f}, a = {-2.0f, -0.5f}, g(4);
  cpu.kda_gate(f32(f, {2, 2, 1}), f32(bias, {4}), f32(a, {2}), 0.0f, f32(g, {2, 2, 1}));
  CHECK(close(g[0], -2.0 * std::log1p(std::exp(1.0)), 1e-6));
  CHECK(g[1] == -50.0f);  // softplus(25) = 25
  CHECK(close(g[2], -0.5 * std::log1p(std::exp(-1.0)), 1e-6));
  CHECK(close(g[3], -0.5 * std::log1p(std::exp(1.0)), 1e-6));
  cpu.kda_gate(f32(f, {2, 2, 1}), f32(bias, {4}), f32(a, {2}), -5.0f, f32(g, {2, 2, 1}));  // K3: lb·σ(−a·f)
  CHECK(close(g[0], -5.0 / (1.0 + std::exp(-2.0)), 1e-6));
  CHECK(close(g[2], -5.0 / (1.0 + std::exp(0.5)), 1e-6));  // a = −0.5, f = −1
  // gated RMS norm
  std::vector<float> xs = {1.0f, -1.0f}, w = {2.0f, 3.0f}, gate = {0.0f, 100.0f}, yo(2);
  cpu.gated_rms_norm(f32(xs, {2, 1}), f32(w, {2}), f32(gate, {2, 1}), 0.0f, f32(yo, {2, 1}));
  CHECK(std::fabs(yo[0] - 1.0f) <= 1e-6f);  // 2 · 1 · σ(0)
  CHECK(std::fabs(yo[1] + 3.0f) <= 1e-6f);  // 3 · −1 · σ(100)
  std::vector<float> wbad(3);
  CHECK(status_of_call([&] { cpu.gated_rms_norm(f32(xs, {2, 1}), f32(wbad, {3}), f32(gate, {2, 1}), 0.0f, f32(yo, {2, 1})); }) ==
        ep::Status::shape);
}

TEST_CASE("kimi ops: causal attention", "[backend][kimi]") {
  CpuBackend cpu;
  SECTION("the first query sees only the first key") {
    std::vector<float> q = {1.0f, 0.0f, 0.0f, 1.0f}, keys = {1.0f, 0.0f, 0.0f, 1.0f}, values = {5.0f, -2.0f}, out(2);
    cpu.causal_attention(f32(q, {2, 1, 2}), f32(keys, {2, 1, 2}), f32(values, {1, 1, 2}), 0, 1.0f, f32(out, {1, 1, 2}));
    CHECK(out[0] == 5.0f);
    const float p1 = 1.0f / (1.0f + std::exp(1.0f));  // softmax([0, 1])[0]
    CHECK(std::fabs(out[1] - (p1 * 5.0f + (1.0f - p1) * -2.0f)) <= 1e-6f);
  }
  SECTION("decode with n_past equals the prefill's rows; later keys are ignored") {
    std::mt19937 rng(5);
    const int64_t dqk = 6, dv = 4, H = 2, n = 5;
    auto q = randn(static_cast<size_t>(dqk * H * n), rng), keys = randn(q.size(), rng),
         values = randn(static_cast<size_t>(dv * H * n), rng);
    std::vector<float> full(values.size());
    cpu.causal_attention(f32(q, {dqk, H, n}), f32(keys, {dqk, H, n}), f32(values, {dv, H, n}), 0, 0.4f, f32(full, {dv, H, n}));
    for (int64_t t = 0; t < n; ++t) {
      std::vector<float> qt(q.begin() + t * dqk * H, q.begin() + (t + 1) * dqk * H), ot(static_cast<size_t>(dv * H));
      // all n keys are passed; the op must use only the first t + 1
      cpu.causal_attention(f32(qt, {dqk, H, 1}), f32(keys, {dqk, H, n}), f32(values, {dv, H, n}), t, 0.4f, f32(ot, {dv, H, 1}));
      for (int64_t i = 0; i < dv * H; ++i) CHECK(ot[static_cast<size_t>(i)] == full[static_cast<size_t>(t * dv * H + i)]);
    }
    std::vector<float> ot(static_cast<size_t>(dv * H * 2));
    CHECK(status_of_call([&] {
            cpu.causal_attention(f32(q, {dqk, H, 2}), f32(keys, {dqk, H, n}), f32(values, {dv, H, n}), n - 1, 0.4f,
                                 f32(ot, {dv, H, 2}));
          }) == ep::Status::shape);
  }
}

TEST_CASE("kimi ops: AttnRes mix", "[backend][kimi]") {
  CpuBackend cpu;
  std::mt19937 rng(3);
  const int64_t D = 8, T = 3, nb = 2;
  auto banked = randn(static_cast<size_t>(D * T * nb), rng), cur = randn(static_cast<size_t>(D * T), rng),
       w = randn(static_cast<size_t>(D), rng);
  std::vector<float> out(cur.size());
  const float eps = 1e-6f;
  const ep::backend::Tensor bt = f32(banked, {D, T, nb});
  cpu.attn_res_mix(&bt, f32(cur, {D, T}), f32(w, {D}), eps, f32(out, {D, T}));
  for (int64_t t = 0; t < T; ++t) {
    const float *src[3] = {banked.data() + (0 * T + t) * D, banked.data() + (1 * T + t) * D, cur.data() + t * D};
    double logit[3], mx = -1e300;
    for (int i = 0; i < 3; ++i) {
      double ss = 0, dot = 0;
      for (int64_t d = 0; d < D; ++d) {
        ss += static_cast<double>(src[i][d]) * src[i][d];
        dot += static_cast<double>(src[i][d]) * w[static_cast<size_t>(d)];
      }
      logit[i] = dot / std::sqrt(ss / D + eps);
      mx = std::max(mx, logit[i]);
    }
    double sum = 0;
    for (double &l : logit) sum += (l = std::exp(l - mx));
    for (int64_t d = 0; d < D; ++d) {
      double want = 0;
      for (int i = 0; i < 3; ++i) want += logit[i] / sum * src[i][d];
      CHECK(close(out[static_cast<size_t>(t * D + d)], want, 1e-5, 1e-6));
    }
  }
  // no banked sources: the mix is the current stream
  cpu.attn_res_mix(nullptr, f32(cur, {D, T}), f32(w, {D}), eps, f32(out, {D, T}));
  CHECK(out == cur);
  CHECK(status_of_call([&] { cpu.attn_res_mix(&bt, f32(cur, {D, T}), f32(w, {D}), eps, f32(cur, {D, T})); }) ==
        ep::Status::invalid_argument);
}
