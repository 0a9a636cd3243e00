// CPU backend ops against straightforward formulas written here (double precision where the
// op accumulates). Every weight type: quantized matmul vs dequantize-then-f32 matmul.
#include "backend/cpu_backend.hpp"
#include "backend/dequant.hpp"
#include "core/log.hpp"
#include "core/status.hpp"
#include "host_tensors.hpp"
#include "random_weights.hpp"
#include "support/catch.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

using namespace ep::backend;
using ep::format::GgmlType;

using namespace ep::test::host;

TEST_CASE("the test type lists are the supported weight types", "[ops]") {
  int supported = 0;
  for (uint32_t id = 0; id < 64; ++id)
    if (ep::format::ggml_type_info(id) && ep::backend::is_supported_weight_type(static_cast<GgmlType>(id))) ++supported;
  CHECK(static_cast<size_t>(supported) == ep::test::every_weight_type().size());
  for (GgmlType type : ep::test::every_weight_type()) CHECK(ep::backend::is_supported_weight_type(type));
  // the GPU tests' split: the GEMV types and those CUDA multiplies through dequantization only
  using ep::format::GgmlCompute;
  for (GgmlType type : ep::test::all_weight_types())
    CHECK(ep::format::ggml_compute(static_cast<uint32_t>(type)) == GgmlCompute::gemv);
  for (GgmlType type : ep::test::dequant_only_weight_types())
    CHECK(ep::format::ggml_compute(static_cast<uint32_t>(type)) == GgmlCompute::dequant);
}

TEST_CASE("matmul of every weight type equals dequantize-then-f32 matmul", "[ops]") {
  CpuBackend be;
  std::mt19937 rng(7);
  const int64_t k = 512, n = 24;
  for (GgmlType type : ep::test::every_weight_type()) {
    for (int64_t t : {int64_t{1}, int64_t{3}}) {
      auto w = ep::test::random_weights(type, k, n, rng);
      auto x = ep::test::random_floats(static_cast<size_t>(k * t), rng);
      std::vector<float> y(static_cast<size_t>(n * t), NAN);
      be.matmul(Tensor::make(w.data(), type, Device::cpu, {k, n}), f32(x, {k, t}), f32(y, {n, t}));
      const uint64_t rb = ep::format::ggml_row_bytes(type, k, "test");
      std::vector<float> row(static_cast<size_t>(k));
      int bad = 0;
      for (int64_t r = 0; r < n; ++r) {
        dequantize_row(type, w.data() + r * rb, row.data(), k);
        for (int64_t j = 0; j < t; ++j) {
          double want = 0.0, mag = 0.0;
          for (int64_t i = 0; i < k; ++i) {
            want += static_cast<double>(row[i]) * x[j * k + i];
            mag += std::fabs(static_cast<double>(row[i]) * x[j * k + i]);
          }
          bad += !close(y[j * n + r], want, 0.0, 1e-5 * mag + 1e-7);
        }
      }
      INFO("type " << static_cast<int>(type) << " tokens " << t);
      CHECK(bad == 0);
    }
  }
}

TEST_CASE("matmul rejects mismatched shapes and unsupported types", "[ops]") {
  CpuBackend be;
  std::vector<float> w(64 * 4), x(64), y(3);
  try {
    be.matmul(f32(w, {64, 4}), f32(x, {64, 1}), f32(y, {3, 1}));
    FAIL("accepted");
  } catch (const ep::Error &e) {
    CHECK(e.status() == ep::Status::shape);
  }
  std::vector<uint8_t> q(54 * 4);  // tq1_0: 54 bytes per 256 values, read by no backend
  std::vector<float> y4(4), x256(256);
  try {
    be.matmul(Tensor::make(q.data(), GgmlType::tq1_0, Device::cpu, {256, 4}), f32(x256, {256, 1}), f32(y4, {4, 1}));
    FAIL("accepted");
  } catch (const ep::Error &e) {
    CHECK(e.status() == ep::Status::unsupported);
  }
}

TEST_CASE("rms_norm weighted and unweighted", "[ops]") {
  CpuBackend be;
  std::mt19937 rng(3);
  const int64_t n = 96, rows = 3;
  auto x = ep::test::random_floats(n * rows, rng, -3, 3);
  auto w = ep::test::random_floats(n, rng);
  std::vector<float> y(n * rows, NAN), yw(n * rows, NAN);
  Tensor wt = f32(w, {n});
  be.rms_norm(f32(x, {n, rows}), nullptr, 1e-6f, f32(y, {n, rows}));
  be.rms_norm(f32(x, {n, rows}), &wt, 1e-6f, f32(yw, {n, rows}));
  int bad = 0;
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[r * n + i]) * x[r * n + i];
    const double s = 1.0 / std::sqrt(ss / n + 1e-6);
    for (int64_t i = 0; i < n; ++i) {
      bad += !close(y[r * n + i], x[r * n + i] * s, 1e-5);
      bad += !close(yw[r * n + i], x[r * n + i] * s * w[i], 1e-5);
    }
  }
  CHECK(bad == 0);
}

TEST_CASE("rope rotates interleaved pairs of a sub-range; inverse undoes it", "[ops]") {
  CpuBackend be;
  std::mt19937 rng(5);
  const int64_t hd = 16, heads = 2, toks = 3;
  auto x = ep::test::random_floats(hd * heads * toks, rng);
  std::vector<int32_t> pos = {0, 7, 1000};
  std::vector<float> y(x.size(), NAN), back(x.size(), NAN);
  RopeParams p;
  p.n_dims = 8;
  p.dim_offset = 8;  // the last 8 dims, as DeepSeek-V4 ropes the last 64 of 512
  p.theta = 10000.0f;
  be.rope(f32(x, {hd, heads, toks}), i32(pos, {toks}), p, f32(y, {hd, heads, toks}));
  int bad = 0;
  for (int64_t t = 0; t < toks; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      const float *xr = &x[(t * heads + h) * hd];
      const float *yr = &y[(t * heads + h) * hd];
      for (int i = 0; i < 8; ++i) bad += !(yr[i] == xr[i]);  // untouched dims are copied exactly
      for (int i = 0; i < 4; ++i) {
        const double inv = std::pow(10000.0, -2.0 * i / 8.0);
        const double a = pos[t] * inv;
        const double x0 = xr[8 + 2 * i], x1 = xr[8 + 2 * i + 1];
        bad += !close(yr[8 + 2 * i], x0 * std::cos(a) - x1 * std::sin(a), 1e-4, 1e-4);
        bad += !close(yr[8 + 2 * i + 1], x0 * std::sin(a) + x1 * std::cos(a), 1e-4, 1e-4);
      }
    }
  CHECK(bad == 0);
  p.inverse = true;
  be.rope(f32(y, {hd, heads, toks}), i32(pos, {toks}), p, f32(back, {hd, heads, toks}));
  for (size_t i = 0; i < x.size(); ++i) bad += !close(back[i], x[i], 1e-4, 1e-5);
  CHECK(bad == 0);
}

TEST_CASE("YaRN inverse frequencies follow the HF formula", "[ops]") {
  RopeParams p;
  p.n_dims = 64;
  p.theta = 160000.0f;
  p.yarn_factor = 16.0f;
  p.yarn_original_max_positions = 65536;
  p.yarn_beta_fast = 32.0f;
  p.yarn_beta_slow = 1.0f;
  const auto inv = rope_inv_freq(p, 512);
  REQUIRE(inv.size() == 32);
  // independent: correction range from find_correction_dim, linear ramp, blend
  const double dim = 64, base = 160000;
  auto cdim = [&](double rot) { return dim * std::log(65536 / (rot * 2 * M_PI)) / (2 * std::log(base)); };
  const double low = std::max(std::floor(cdim(32)), 0.0), high = std::min(std::ceil(cdim(1)), dim - 1);
  int bad = 0;
  for (int i = 0; i < 32; ++i) {
    const double pf = std::pow(base, 2.0 * i / dim);
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    const double extra = 1.0 - ramp;  // 1 = keep the original frequency
    const double want = (1 / (16 * pf)) * (1 - extra) + (1 / pf) * extra;
    bad += !close(inv[i], want, 1e-5, 0);
  }
  CHECK(bad == 0);
  CHECK(inv[0] == 1.0f);                                   // highest frequency kept
  CHECK(close(inv[31], 1 / (16 * std::pow(base, 62 / 64.0)), 1e-5, 0));  // lowest interpolated
  // without YaRN: plain theta^(-2i/d)
  RopeParams q;
  q.n_dims = 64;
  q.theta = 10000.0f;
  const auto plain = rope_inv_freq(q, 64);
  CHECK(close(plain[5], std::pow(10000.0, -10.0 / 64), 1e-6, 0));
}

TEST_CASE("embed dequantizes the rows of the given ids", "[ops]") {
  CpuBackend be;
  std::mt19937 rng(11);
  const int64_t d = 64, vocab = 10;
  auto table = ep::test::random_weights(GgmlType::q8_0, d, vocab, rng);
  std::vector<int32_t> ids = {3, 0, 9, 3};
  std::vector<float> y(d * 4, NAN), want(d);
  be.embed(Tensor::make(table.data(), GgmlType::q8_0, Device::cpu, {d, vocab}), i32(ids, {4}), f32(y, {d, 4}));
  const uint64_t rb = ep::format::ggml_row_bytes(GgmlType::q8_0, d, "t");
  int bad = 0;
  for (int t = 0; t < 4; ++t) {
    dequantize_row(GgmlType::q8_0, table.data() + ids[t] * rb, want.data(), d);
    for (int64_t i = 0; i < d; ++i) bad += !(y[t * d + i] == want[i]);
  }
  CHECK(bad == 0);
  std::vector<int32_t> badid = {10};
  CHECK_THROWS_AS(be.embed(Tensor::make(table.data(), GgmlType::q8_0, Device::cpu, {d, vocab}), i32(badid, {1}),
                           f32(y, {d, 1})),
                  ep::Error);
}

TEST_CASE("softmax, top_k, glu, add", "[ops]") {
  CpuBackend be;
  std::vector<float> x = {1, 3, 3, -2, 0.5f, 3};
  std::vector<float> y(6, NAN);
  be.softmax(f32(x, {6}), f32(y, {6}));
  double z = 0;
  for (float v : x) z += std::exp(v - 3.0);
  for (int i = 0; i < 6; ++i) CHECK(close(y[i], std::exp(x[i] - 3.0) / z, 1e-6));
  std::vector<int32_t> idx(3, -7);
  std::vector<float> val(3, NAN);
  be.top_k(f32(x, {6}), 3, i32(idx, {3}), f32(val, {3}));
  CHECK(idx == std::vector<int32_t>{1, 2, 5});  // ties: lower index first
  CHECK(val == std::vector<float>{3, 3, 3});
  CHECK_THROWS_AS(be.top_k(f32(x, {3, 2}), 2, i32(idx, {2}), f32(val, {2})), ep::Error);  // rows do not fit
  std::vector<float> g = {20, -1, 0.3f}, u = {-30, 2, 5}, o(3, NAN);
  Activation sw{ActivationKind::swiglu, 10.0f};
  be.glu(f32(g, {3}), f32(u, {3}), sw, f32(o, {3}));
  auto silu = [](double v) { return v / (1 + std::exp(-v)); };
  CHECK(close(o[0], silu(10) * -10, 1e-6));
  CHECK(close(o[1], silu(-1) * 2, 1e-6));
  CHECK(close(o[2], silu(0.3) * 5, 1e-6));
  Activation situ{ActivationKind::situ, 0.0f, 4.0f, 25.0f};
  be.glu(f32(g, {3}), f32(u, {3}), situ, f32(o, {3}));
  for (int i = 0; i < 3; ++i) {
    const double want = 4 * std::tanh(g[i] / 4.0) / (1 + std::exp(-g[i])) * 25 * std::tanh(u[i] / 25.0);
    CHECK(close(o[i], want, 1e-5));
  }
  Activation plain{ActivationKind::swiglu, 0.0f};
  be.glu(f32(g, {3}), f32(u, {3}), plain, f32(o, {3}));
  CHECK(close(o[0], silu(20) * -30, 1e-6));
  std::vector<float> s(3, NAN);
  be.add(f32(g, {3}), f32(u, {3}), f32(s, {3}));
  CHECK(s == std::vector<float>{-10, 1, 5.3f});
}

namespace {
// Top-2 of sigmoid scores plus a bias that lifts expert 2 (bias 5) above the others.
RouterParams sigmoid_top2_with_bias(const Tensor &bias) {
  RouterParams q;
  q.k = 2;
  q.scoring = Scoring::sigmoid;
  q.bias = &bias;
  return q;
}
}  // namespace

TEST_CASE("route: softmax, sigmoid with bias, sqrt-softplus, hash", "[ops]") {
  CpuBackend be;
  std::vector<float> logits = {0.1f, 2.0f, -1.0f, 1.5f, 0.0f, 1.9f};  // 6 experts, 1 token
  std::vector<int32_t> ids(2, -1);
  std::vector<float> w(2, NAN);
  RouterParams p;
  p.k = 2;
  p.scoring = Scoring::softmax;
  p.renormalize = false;
  p.scale = 2.0f;
  be.route(f32(logits, {6, 1}), p, i32(ids, {2, 1}), f32(w, {2, 1}));
  double z = 0;
  for (float v : logits) z += std::exp(v);
  CHECK(ids == std::vector<int32_t>{1, 5});
  CHECK(close(w[0], 2 * std::exp(2.0) / z, 1e-6));
  CHECK(close(w[1], 2 * std::exp(1.9) / z, 1e-6));

  // sigmoid, selection by score + bias, weights the raw scores renormalised
  std::vector<float> bias = {0, 0, 5, 0, 0, 0};
  Tensor bt = f32(bias, {6});
  const RouterParams q = sigmoid_top2_with_bias(bt);
  be.route(f32(logits, {6, 1}), q, i32(ids, {2, 1}), f32(w, {2, 1}));
  auto sig = [](double v) { return 1 / (1 + std::exp(-v)); };
  CHECK(ids == std::vector<int32_t>{2, 1});
  const double s2 = sig(-1), s1 = sig(2);
  CHECK(close(w[0], s2 / (s1 + s2), 1e-6));
  CHECK(close(w[1], s1 / (s1 + s2), 1e-6));

  // DeepSeek-V4: sqrt(softplus), renormalise, × 1.5
  RouterParams r;
  r.k = 3;
  r.scoring = Scoring::sqrt_softplus;
  r.scale = 1.5f;
  std::vector<int32_t> ids3(3);
  std::vector<float> w3(3);
  be.route(f32(logits, {6, 1}), r, i32(ids3, {3, 1}), f32(w3, {3, 1}));
  auto ssp = [](double v) { return std::sqrt(std::log1p(std::exp(v))); };
  CHECK(ids3 == std::vector<int32_t>{1, 5, 3});
  const double tot = ssp(2) + ssp(1.9) + ssp(1.5);
  CHECK(close(w3[0], 1.5 * ssp(2) / tot, 1e-6));
  CHECK(close(w3[2], 1.5 * ssp(1.5) / tot, 1e-6));

  // hash routing: experts from the token's row of the table, weights from the scores
  std::vector<int32_t> table = {0, 1, 2, 4, 5, 3};  // [k=2, vocab=3]
  std::vector<int32_t> toks = {2, 0};
  Tensor tt = i32(table, {2, 3}), tk = i32(toks, {2});
  std::vector<float> logits2(logits);
  logits2.insert(logits2.end(), logits.begin(), logits.end());
  RouterParams h;
  h.k = 2;
  h.scoring = Scoring::sqrt_softplus;
  h.scale = 1.5f;
  h.hash_table = &tt;
  h.token_ids = &tk;
  std::vector<int32_t> hid(4);
  std::vector<float> hw(4);
  be.route(f32(logits2, {6, 2}), h, i32(hid, {2, 2}), f32(hw, {2, 2}));
  CHECK(hid == std::vector<int32_t>{5, 3, 0, 1});
  CHECK(close(hw[0], 1.5 * ssp(1.9) / (ssp(1.9) + ssp(1.5)), 1e-6));
  CHECK(close(hw[3], 1.5 * ssp(2.0) / (ssp(0.1) + ssp(2.0)), 1e-6));
}

namespace {
void keep_trace(ep_log_level level, const char *message, void *payload) {
  if (level == EP_LOG_TRACE) static_cast<std::vector<std::string> *>(payload)->push_back(message);
}
}  // namespace

TEST_CASE("route at trace level logs each token's picks, the first expert left out and the gap", "[ops]") {
  CpuBackend be;
  // selection = sigmoid(logit) + bias: experts 2 (bias 5) and 1 picked, then 5 (sigmoid 1.9) left out
  std::vector<float> logits = {0.1f, 2.0f, -1.0f, 1.5f, 0.0f, 1.9f};
  std::vector<float> bias = {0, 0, 5, 0, 0, 0};
  Tensor bt = f32(bias, {6});
  const RouterParams q = sigmoid_top2_with_bias(bt);
  std::vector<int32_t> ids(2, -1);
  std::vector<float> w(2, NAN);
  std::vector<std::string> lines;
  ep::log::configure(EP_LOG_TRACE, keep_trace, &lines);
  be.route(f32(logits, {6, 1}), q, i32(ids, {2, 1}), f32(w, {2, 1}));
  ep::log::configure(EP_LOG_WARN, nullptr, nullptr);
  REQUIRE(lines.size() == 1);
  const auto sig = [](float v) { return 1.0f / (1.0f + std::exp(-v)); };
  const std::string want = fmt::format("route: token 0 of 1: expert:selection score 2:{:.7g} 1:{:.7g} 5:{:.7g} (the last "
                                       "one left out), gap {:.4g}",
                                       sig(-1.0f) + 5.0f, sig(2.0f), sig(1.9f), sig(2.0f) - sig(1.9f));
  CHECK(lines[0] == want);
  // below trace level nothing is formatted
  lines.clear();
  ep::log::configure(EP_LOG_DEBUG, keep_trace, &lines);
  be.route(f32(logits, {6, 1}), q, i32(ids, {2, 1}), f32(w, {2, 1}));
  ep::log::configure(EP_LOG_WARN, nullptr, nullptr);
  CHECK(lines.empty());
}

TEST_CASE("sampling: greedy, seeded draws, top-k and top-p restrict the choice", "[ops]") {
  CpuBackend be;
  std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f, -5.0f, 2.5f};
  Tensor lt = f32(logits, {6});
  SamplingParams greedy;
  CHECK(be.sample(lt, greedy, 0) == 1);  // first maximum
  SamplingParams k1{1.0f, 1, 1.0f, 9};
  CHECK(be.sample(lt, k1, 0) == 1);
  // deterministic for a seed and counter
  SamplingParams t{0.8f, 0, 1.0f, 42};
  CHECK(be.sample(lt, t, 5) == be.sample(lt, t, 5));
  // empirical frequencies follow softmax(logits / T)
  std::map<int, int> counts;
  const int draws = 20000;
  for (int c = 0; c < draws; ++c) counts[be.sample(lt, t, static_cast<uint64_t>(c))]++;
  double z = 0;
  for (float v : logits) z += std::exp(v / 0.8);
  for (int i = 0; i < 6; ++i) {
    const double p = std::exp(logits[i] / 0.8) / z;
    CHECK(std::fabs(counts[i] / static_cast<double>(draws) - p) < 0.015);
  }
  // top_k = 3 keeps the values >= the third largest (3, 3, 2.5)
  SamplingParams tk{1.0f, 3, 1.0f, 1};
  std::map<int, int> ck;
  for (int c = 0; c < 3000; ++c) ck[be.sample(lt, tk, static_cast<uint64_t>(c))]++;
  CHECK(ck.size() == 3);
  CHECK(ck.count(1) == 1);
  CHECK(ck.count(3) == 1);
  CHECK(ck.count(5) == 1);
  // top_p: the two 3.0 tokens hold ~0.63 at T = 1; top_p 0.5 keeps exactly those two
  SamplingParams tp{1.0f, 0, 0.5f, 3};
  std::map<int, int> cp;
  for (int c = 0; c < 3000; ++c) cp[be.sample(lt, tp, static_cast<uint64_t>(c))]++;
  CHECK(cp.size() == 2);
  CHECK(cp.count(1) == 1);
  CHECK(cp.count(3) == 1);
  CHECK(std::fabs(sample_uniform(1, 2) - sample_uniform(1, 2)) == 0.0);
  CHECK(sample_uniform(1, 2) != sample_uniform(1, 3));
}

TEST_CASE("sampling: a token mask draws from exactly the masked distribution", "[ops]") {
  CpuBackend be;
  std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f, -5.0f, 2.5f, 0.5f, 4.0f};
  const std::vector<uint32_t> mask = {0b01100101};  // tokens 0, 2, 5, 6
  // The same row with the masked-out logits at −∞: every draw must be the same token.
  std::vector<float> cut = logits;
  for (size_t t = 0; t < cut.size(); ++t)
    if (!(mask[0] >> t & 1)) cut[t] = -INFINITY;
  for (const SamplingParams &base : {SamplingParams{0.0f, 0, 1.0f, 0}, SamplingParams{0.9f, 0, 1.0f, 7}, SamplingParams{1.3f, 2, 1.0f, 3},
                                     SamplingParams{1.0f, 0, 0.6f, 5}}) {
    SamplingParams p = base;
    p.allowed = mask;
    std::map<int, int> seen;
    for (uint64_t c = 0; c < 400; ++c) {
      const int32_t a = be.sample(f32(logits, {8}), p, c);
      CHECK(a == be.sample(f32(cut, {8}), base, c));
      seen[a]++;
    }
    for (const auto &[t, n] : seen) CHECK((mask[0] >> t & 1));
  }
  SamplingParams greedy;
  greedy.allowed = mask;
  CHECK(be.sample(f32(logits, {8}), greedy, 0) == 5);  // the largest allowed logit (2.5), not token 7 (4.0)
  // A mask shorter than the row masks the rest; one allowing nothing is refused.
  const std::vector<uint32_t> none = {0};
  greedy.allowed = none;
  CHECK_THROWS_AS(be.sample(f32(logits, {8}), greedy, 0), ep::Error);
}
