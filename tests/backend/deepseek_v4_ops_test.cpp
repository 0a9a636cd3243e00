// CPU backend: the elementwise/copy ops and the DeepSeek-V4 ops against hand-computed values
// and straightforward double-precision loops written here, plus the edge cases the model relies
// on (all-masked rows, −inf, one slot, one token, aliasing, top_k over −inf).
#include "backend/cpu_backend.hpp"
#include "core/status.hpp"
#include "host_tensors.hpp"
#include "random_weights.hpp"
#include "support/catch.hpp"
#include "support/expect_error.hpp"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

using namespace ep::backend;
using ep::format::GgmlType;
using namespace ep::test::host;

namespace {

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
std::vector<int8_t> random_mask(size_t n, std::mt19937 &rng, double p_visible) {
  std::bernoulli_distribution d(p_visible);
  std::vector<int8_t> m(n);
  for (auto &v : m) v = d(rng) ? 1 : 0;
  return m;
}

// Reference attention with sinks in double.
std::vector<float> attention_ref(const std::vector<float> &q, const std::vector<float> &kv, const std::vector<int8_t> &vis,
                                 const std::vector<float> &sinks, float scale, int64_t hd, int64_t H, int64_t T,
                                 int64_t n_kv) {
  std::vector<float> out(static_cast<size_t>(hd * H * T));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      std::vector<double> logit;
      std::vector<int64_t> keys;
      for (int64_t j = 0; j < n_kv; ++j) {
        if (!vis[t * n_kv + j]) continue;
        double s = 0;
        for (int64_t c = 0; c < hd; ++c) s += static_cast<double>(q[(t * H + h) * hd + c]) * kv[j * hd + c];
        logit.push_back(s * scale);
        keys.push_back(j);
      }
      double mx = sinks[h];
      for (double l : logit) mx = std::max(mx, l);
      double den = std::exp(sinks[h] - mx);
      for (double l : logit) den += std::exp(l - mx);
      for (int64_t c = 0; c < hd; ++c) {
        double o = 0;
        for (size_t i = 0; i < keys.size(); ++i) o += std::exp(logit[i] - mx) * kv[keys[i] * hd + c];
        out[(t * H + h) * hd + c] = static_cast<float>(o / den);
      }
    }
  return out;
}

}  // namespace

TEST_CASE("mul, scale, copy and copy_2d", "[ops][deepseek_v4]") {
  CpuBackend be;
  std::vector<float> a{1, -2, 3, 0.5f, 4, -1}, b{2, 2, -1, 4, 0.25f, 0}, y(6, NAN);
  be.mul(f32(a, {3, 2}), f32(b, {3, 2}), f32(y, {3, 2}));
  CHECK(y == std::vector<float>{2, -4, -3, 2, 1, -0.0f});
  be.scale(f32(a, {6}), -0.5f, f32(y, {6}));
  CHECK(y == std::vector<float>{-0.5f, 1, -1.5f, -0.25f, -2, 0.5f});
  be.scale(f32(a, {6}), 2.0f, f32(a, {6}));  // in place
  CHECK(a == std::vector<float>{2, -4, 6, 1, 8, -2});
  std::vector<float> c(6, NAN);
  be.copy(f32(a, {6}), f32(c, {3, 2}));
  CHECK(c == a);
  // gather column block [1, 3) of a 4 x 3 matrix (rows of 4 floats) into rows of 2
  std::vector<float> m{0, 1, 2, 3, 10, 11, 12, 13, 20, 21, 22, 23}, g(6, NAN);
  be.copy_2d(g.data(), 8, m.data() + 1, 16, 8, 3);
  CHECK(g == std::vector<float>{1, 2, 11, 12, 21, 22});
  be.copy_2d(g.data(), 8, m.data(), 16, 8, 0);  // nothing
  CHECK(g[0] == 1.0f);
  ep::test::expect_error([&] { be.copy_2d(g.data(), 4, m.data(), 16, 8, 3); }, ep::Status::invalid_argument, "pitch");
  ep::test::expect_error([&] { be.copy(f32(a, {6}), f32(c, {5})); }, ep::Status::shape, "copy: src has 24 bytes");
  ep::test::expect_error([&] { be.mul(f32(a, {6}), f32(b, {3}), f32(y, {6})); }, ep::Status::shape, "mul");
}

TEST_CASE("hc_weights: one stream by hand, several streams against a loop", "[ops][deepseek_v4]") {
  CpuBackend be;
  const float eps = 1e-6f;
  SECTION("hc = 1: pre, post and the Sinkhorn of a 1x1 matrix") {
    std::vector<float> mix{0.5f, -1.0f, 3.0f}, scale{2.0f, 0.5f, 7.0f}, base{0.25f, 0.1f, -2.0f};
    std::vector<float> pre(1, NAN), post(1, NAN), comb(1, NAN);
    Tensor tp = f32(post, {1, 1}), tc = f32(comb, {1, 1});
    be.hc_weights(f32(mix, {3, 1}), f32(scale, {3}), f32(base, {3}), eps, 3, f32(pre, {1, 1}), &tp, &tc);
    CHECK(close(pre[0], sigmoid(0.5 * 2 + 0.25) + eps, 1e-6));
    CHECK(close(post[0], 2 * sigmoid(-1.0 * 0.5 + 0.1), 1e-6));
    // softmax of one value = 1, + eps; then col, (row, col) x 2, each x / (x + eps)
    double v = 1.0 + eps;
    for (int i = 0; i < 5; ++i) v = v / (v + eps);
    CHECK(close(comb[0], v, 1e-6));
  }
  SECTION("hc = 4, 3 tokens, 20 iterations: against the formula; comb is doubly stochastic") {
    std::mt19937 rng(11);
    const int64_t hc = 4, T = 3, M = (2 + hc) * hc;
    const int iters = 20;
    auto mix = ep::test::random_floats(static_cast<size_t>(M * T), rng, -2, 2);
    auto base = ep::test::random_floats(static_cast<size_t>(M), rng);
    std::vector<float> scale{1.5f, 0.7f, 2.0f};
    std::vector<float> pre(hc * T, NAN), post(hc * T, NAN), comb(hc * hc * T, NAN);
    Tensor tp = f32(post, {hc, T}), tc = f32(comb, {hc * hc, T});
    be.hc_weights(f32(mix, {M, T}), f32(scale, {3}), f32(base, {M}), eps, iters, f32(pre, {hc, T}), &tp, &tc);
    for (int64_t t = 0; t < T; ++t) {
      const float *m = mix.data() + t * M;
      std::vector<double> c(hc * hc);
      for (int64_t i = 0; i < hc; ++i) {
        CHECK(close(pre[t * hc + i], sigmoid(m[i] * 1.5 + base[i]) + eps, 1e-5));
        CHECK(close(post[t * hc + i], 2 * sigmoid(m[hc + i] * 0.7 + base[hc + i]), 1e-5));
        double mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < hc; ++j) mx = std::max(mx, m[2 * hc + i * hc + j] * 2.0 + base[2 * hc + i * hc + j]);
        for (int64_t j = 0; j < hc; ++j) sum += c[i * hc + j] = std::exp(m[2 * hc + i * hc + j] * 2.0 + base[2 * hc + i * hc + j] - mx);
        for (int64_t j = 0; j < hc; ++j) c[i * hc + j] = c[i * hc + j] / sum + eps;
      }
      for (int it = 0; it < iters; ++it) {
        if (it > 0)
          for (int64_t i = 0; i < hc; ++i) {
            double s = 0;
            for (int64_t j = 0; j < hc; ++j) s += c[i * hc + j];
            for (int64_t j = 0; j < hc; ++j) c[i * hc + j] /= s + eps;
          }
        for (int64_t j = 0; j < hc; ++j) {
          double s = 0;
          for (int64_t i = 0; i < hc; ++i) s += c[i * hc + j];
          for (int64_t i = 0; i < hc; ++i) c[i * hc + j] /= s + eps;
        }
      }
      for (int64_t i = 0; i < hc * hc; ++i) CHECK(close(comb[t * hc * hc + i], c[i], 1e-5));
      for (int64_t i = 0; i < hc; ++i) {
        double rs = 0, cs = 0;
        for (int64_t j = 0; j < hc; ++j) {
          rs += comb[t * hc * hc + i * hc + j];
          cs += comb[t * hc * hc + j * hc + i];
        }
        CHECK(close(cs, 1.0, 1e-4));
        CHECK(close(rs, 1.0, 1e-3));
      }
    }
  }
  SECTION("pre only (the output head): mix [hc, T], scale [1], base [hc]") {
    std::vector<float> mix{0.0f, 1.0f, -1.0f, 2.0f}, scale{3.0f}, base{0.5f, -0.5f}, pre(4, NAN);
    be.hc_weights(f32(mix, {2, 2}), f32(scale, {1}), f32(base, {2}), eps, 1, f32(pre, {2, 2}), nullptr, nullptr);
    const double want[4] = {sigmoid(0.5), sigmoid(2.5), sigmoid(-2.5), sigmoid(5.5)};
    for (int i = 0; i < 4; ++i) CHECK(close(pre[i], want[i] + eps, 1e-6));
  }
  SECTION("shape errors") {
    std::vector<float> mix(24), scale(3), base(24), pre(4), post(4), comb(16);
    Tensor tp = f32(post, {4, 1}), tc = f32(comb, {16, 1});
    ep::test::expect_error([&] { be.hc_weights(f32(mix, {24, 1}), f32(scale, {3}), f32(base, {24}), eps, 1, f32(pre, {4, 1}), &tp, nullptr); },
                           ep::Status::invalid_argument, "post and comb");
    ep::test::expect_error([&] { be.hc_weights(f32(mix, {23, 1}), f32(scale, {3}), f32(base, {23}), eps, 1, f32(pre, {4, 1}), &tp, &tc); },
                           ep::Status::shape, "expected mix [24, 1]");
    std::vector<float> big(17 * 19 * 2);
    std::vector<float> bp(17);
    ep::test::expect_error([&] { be.hc_weights(f32(big, {17, 1}), f32(scale, {1}), f32(big, {17}), eps, 1, f32(bp, {17, 1}), nullptr, nullptr); },
                           ep::Status::unsupported, "17 streams");
  }
}

TEST_CASE("hc_collapse and hc_expand against loops; expand in place equals out of place", "[ops][deepseek_v4]") {
  CpuBackend be;
  std::mt19937 rng(5);
  for (int64_t hc : {int64_t{1}, int64_t{4}}) {
    for (int64_t T : {int64_t{1}, int64_t{3}}) {
      const int64_t D = 37;
      auto x = ep::test::random_floats(static_cast<size_t>(D * hc * T), rng);
      auto pre = ep::test::random_floats(static_cast<size_t>(hc * T), rng);
      auto post = ep::test::random_floats(static_cast<size_t>(hc * T), rng);
      auto comb = ep::test::random_floats(static_cast<size_t>(hc * hc * T), rng);
      auto f = ep::test::random_floats(static_cast<size_t>(D * T), rng);
      std::vector<float> y(static_cast<size_t>(D * T), NAN), e(x.size(), NAN);
      be.hc_collapse(f32(x, {D, hc, T}), f32(pre, {hc, T}), f32(y, {D, T}));
      be.hc_expand(f32(x, {D, hc, T}), f32(f, {D, T}), f32(post, {hc, T}), f32(comb, {hc * hc, T}), f32(e, {D, hc, T}));
      int bad = 0;
      for (int64_t t = 0; t < T; ++t)
        for (int64_t c = 0; c < D; ++c) {
          double s = 0;
          for (int64_t j = 0; j < hc; ++j) s += static_cast<double>(pre[t * hc + j]) * x[(t * hc + j) * D + c];
          bad += !close(y[t * D + c], s, 1e-5);
          for (int64_t k = 0; k < hc; ++k) {
            double v = static_cast<double>(post[t * hc + k]) * f[t * D + c];
            for (int64_t j = 0; j < hc; ++j) v += static_cast<double>(comb[t * hc * hc + j * hc + k]) * x[(t * hc + j) * D + c];
            bad += !close(e[(t * hc + k) * D + c], v, 1e-5);
          }
        }
      INFO("hc " << hc << " T " << T);
      CHECK(bad == 0);
      be.hc_expand(f32(x, {D, hc, T}), f32(f, {D, T}), f32(post, {hc, T}), f32(comb, {hc * hc, T}), f32(x, {D, hc, T}));
      CHECK(x == e);
    }
  }
  std::vector<float> x(8 * 4 * 2), pre(4 * 2), y(8 * 3);
  ep::test::expect_error([&] { be.hc_collapse(f32(x, {8, 4, 2}), f32(pre, {4, 2}), f32(y, {8, 3})); }, ep::Status::shape,
                         "hc_collapse");
}

TEST_CASE("attention_sinks: by hand, against a loop, masked rows and aliasing", "[ops][deepseek_v4]") {
  CpuBackend be;
  SECTION("one visible key: out = kv·e^s / (e^s + e^sink)") {
    std::vector<float> q{1, 2}, kv{0.5f, -1, 3, 1}, sinks{0.25f}, out(2, NAN);
    std::vector<int8_t> vis{0, 1};
    be.attention_sinks(f32(q, {2, 1, 1}), f32(kv, {2, 2}), i8(vis, {2, 1}), f32(sinks, {1}), 0.5f, f32(out, {2, 1, 1}));
    const double s = 0.5 * (1 * 3 + 2 * 1), p = std::exp(s) / (std::exp(s) + std::exp(0.25));
    CHECK(close(out[0], 3 * p, 1e-6));
    CHECK(close(out[1], 1 * p, 1e-6));
  }
  SECTION("random shapes against the reference, with an all-masked token") {
    std::mt19937 rng(3);
    const int64_t hd = 40, H = 3, T = 5, n_kv = 29;
    auto q = ep::test::random_floats(static_cast<size_t>(hd * H * T), rng, -2, 2);
    auto kv = ep::test::random_floats(static_cast<size_t>(hd * n_kv), rng, -2, 2);
    auto sinks = ep::test::random_floats(static_cast<size_t>(H), rng);
    auto vis = random_mask(static_cast<size_t>(n_kv * T), rng, 0.6);
    std::fill(vis.begin() + 2 * n_kv, vis.begin() + 3 * n_kv, 0);  // token 2 sees nothing
    std::vector<float> out(q.size(), NAN);
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    be.attention_sinks(f32(q, {hd, H, T}), f32(kv, {hd, n_kv}), i8(vis, {n_kv, T}), f32(sinks, {H}), scale, f32(out, {hd, H, T}));
    const auto want = attention_ref(q, kv, vis, sinks, scale, hd, H, T, n_kv);
    int bad = 0;
    for (size_t i = 0; i < out.size(); ++i) bad += !close(out[i], want[i], 1e-5);
    CHECK(bad == 0);
    for (int64_t i = 2 * hd * H; i < 3 * hd * H; ++i) CHECK(out[i] == 0.0f);
    // out may alias q
    be.attention_sinks(f32(q, {hd, H, T}), f32(kv, {hd, n_kv}), i8(vis, {n_kv, T}), f32(sinks, {H}), scale, f32(q, {hd, H, T}));
    CHECK(q == out);
  }
  SECTION("shape errors") {
    std::vector<float> q(8), kv(12), sinks(2), out(8);
    std::vector<int8_t> vis(3);
    std::vector<int32_t> vis32(3);
    ep::test::expect_error([&] { be.attention_sinks(f32(q, {4, 2, 1}), f32(kv, {4, 3}), i8(vis, {3, 1}), f32(sinks, {1}), 1, f32(out, {4, 2, 1})); },
                           ep::Status::shape, "sinks [1]");
    ep::test::expect_error([&] { be.attention_sinks(f32(q, {4, 2, 1}), f32(kv, {4, 3}), i32(vis32, {3, 1}), f32(sinks, {2}), 1, f32(out, {4, 2, 1})); },
                           ep::Status::unsupported, "visible must be i8");
  }
}

TEST_CASE("pool_windows: one slot, −inf gates, against a loop", "[ops][deepseek_v4]") {
  CpuBackend be;
  SECTION("one slot copies kv") {
    std::vector<float> kv{1, -2, 3, 4, 5, 6}, gate{9, -9, 0, 1, 2, 3}, out(6, NAN);
    be.pool_windows(f32(kv, {3, 1, 2}), f32(gate, {3, 1, 2}), f32(out, {3, 2}));
    CHECK(out == kv);
  }
  SECTION("two slots by hand; a −inf slot is excluded; all −inf gives 0") {
    // d = 3 channels, 2 slots, 1 window: channel 0 mixes, channel 1 has slot 0 at −inf,
    // channel 2 has both at −inf.
    std::vector<float> kv{1, 2, 3, 10, 20, 30}, gate{0, -INFINITY, -INFINITY, std::log(3.0f), 0, -INFINITY};
    std::vector<float> out(3, NAN);
    be.pool_windows(f32(kv, {3, 2, 1}), f32(gate, {3, 2, 1}), f32(out, {3, 1}));
    CHECK(close(out[0], 0.25 * 1 + 0.75 * 10, 1e-6));
    CHECK(out[1] == 20.0f);
    CHECK(out[2] == 0.0f);
  }
  SECTION("random against the reference") {
    std::mt19937 rng(9);
    const int64_t d = 24, S = 8, W = 3;
    auto kv = ep::test::random_floats(static_cast<size_t>(d * S * W), rng, -3, 3);
    auto gate = ep::test::random_floats(static_cast<size_t>(d * S * W), rng, -5, 5);
    std::vector<float> out(static_cast<size_t>(d * W), NAN);
    be.pool_windows(f32(kv, {d, S, W}), f32(gate, {d, S, W}), f32(out, {d, W}));
    int bad = 0;
    for (int64_t w = 0; w < W; ++w)
      for (int64_t c = 0; c < d; ++c) {
        double den = 0, num = 0;
        for (int64_t s = 0; s < S; ++s) {
          const double p = std::exp(static_cast<double>(gate[(w * S + s) * d + c]));
          den += p;
          num += p * kv[(w * S + s) * d + c];
        }
        bad += !close(out[w * d + c], num / den, 1e-5);
      }
    CHECK(bad == 0);
    std::vector<float> o2(static_cast<size_t>(d * 2));
    ep::test::expect_error([&] { be.pool_windows(f32(kv, {d, S, W}), f32(gate, {d, S, W}), f32(o2, {d, 2})); }, ep::Status::shape,
                           "pool_windows");
  }
}

TEST_CASE("indexer_scores, top_k over −inf and set_visible", "[ops][deepseek_v4]") {
  CpuBackend be;
  SECTION("by hand: ReLU per head, weights, scale, masked entries are −inf") {
    // dim 2, 2 heads, 1 token, 3 keys
    std::vector<float> q{1, 0, 0, 1}, w{2, -1}, keys{1, 1, -1, 2, 3, -4}, scores(3, NAN);
    std::vector<int8_t> vis{1, 1, 0};
    be.indexer_scores(f32(q, {2, 2, 1}), f32(w, {2, 1}), f32(keys, {2, 3}), i8(vis, {3, 1}), 0.5f, f32(scores, {3, 1}));
    // key 0: head dots (1, 1) → 2·0.5 − 1·0.5 = 0.5; key 1: dots (−1, 2) → 0 − 1·1 = −1
    CHECK(close(scores[0], 0.5, 1e-6));
    CHECK(close(scores[1], -1.0, 1e-6));
    CHECK(scores[2] == -INFINITY);
  }
  SECTION("random against a loop") {
    std::mt19937 rng(13);
    const int64_t dim = 24, H = 8, T = 3, n = 17;
    auto q = ep::test::random_floats(static_cast<size_t>(dim * H * T), rng);
    auto w = ep::test::random_floats(static_cast<size_t>(H * T), rng);
    auto keys = ep::test::random_floats(static_cast<size_t>(dim * n), rng);
    auto vis = random_mask(static_cast<size_t>(n * T), rng, 0.7);
    std::vector<float> scores(static_cast<size_t>(n * T), NAN);
    be.indexer_scores(f32(q, {dim, H, T}), f32(w, {H, T}), f32(keys, {dim, n}), i8(vis, {n, T}), 0.2f, f32(scores, {n, T}));
    int bad = 0;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t s = 0; s < n; ++s) {
        if (!vis[t * n + s]) {
          bad += scores[t * n + s] != -INFINITY;
          continue;
        }
        double total = 0;
        for (int64_t h = 0; h < H; ++h) {
          double dot = 0;
          for (int64_t c = 0; c < dim; ++c) dot += static_cast<double>(q[(t * H + h) * dim + c]) * keys[s * dim + c];
          total += std::max(dot, 0.0) * 0.2 * w[t * H + h];
        }
        bad += !close(scores[t * n + s], total, 1e-5);
      }
    CHECK(bad == 0);
  }
  SECTION("top_k with k above the visible count ends in −inf picks that set_visible skips") {
    std::vector<float> scores{-INFINITY, 0.5f, -INFINITY, 2.0f, -INFINITY, /* token 1 */ 1, 1, -INFINITY, 0, 3};
    std::vector<int32_t> idx(8, -7);
    std::vector<float> val(8, NAN);
    be.top_k(f32(scores, {5, 2}), 4, i32(idx, {4, 2}), f32(val, {4, 2}));
    CHECK(idx == std::vector<int32_t>{3, 1, 0, 2, 4, 0, 1, 3});
    CHECK(val[2] == -INFINITY);
    CHECK(val[3] == -INFINITY);
    CHECK(val[7] == 0.0f);
    // mask rows of 7: 2 raw keys, then the 5 entries (offset 2)
    std::vector<int8_t> mask{1, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0};
    be.set_visible(i32(idx, {4, 2}), f32(val, {4, 2}), 2, i8(mask, {7, 2}));
    CHECK(mask == std::vector<int8_t>{1, 0, 0, 1, 0, 1, 0, 1, 1, 1, 1, 0, 1, 1});
    // a finite pick outside the mask row is corrupt input
    std::vector<int32_t> bad_idx{5};
    std::vector<float> bad_val{1.0f};
    ep::test::expect_error([&] { be.set_visible(i32(bad_idx, {1, 1}), f32(bad_val, {1, 1}), 2, i8(mask, {7, 1})); },
                           ep::Status::corrupt, "index 5");
    ep::test::expect_error([&] { be.set_visible(i32(bad_idx, {1, 1}), f32(bad_val, {1, 1}), 8, i8(mask, {7, 1})); },
                           ep::Status::shape, "offset 8");
  }
}
