// MoE end to end on tiny sizes: experts in contiguous slots (gate, up, down at byte offsets),
// routing, the expert computation and the weighted combine against a formula computed here from
// dequantized dense matrices in double; dense FFN (shared experts); missing slots are errors.
#include "backend/expert_batch.hpp"
#include "backend/cpu_backend.hpp"
#include "backend/dequant.hpp"
#include "core/status.hpp"
#include "random_weights.hpp"
#include "support/catch.hpp"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

using namespace ep::backend;
using ep::format::GgmlType;

namespace {

struct ExpertSet {
  SlotLayout layout;
  std::vector<std::vector<uint8_t>> slots;  // one contiguous object per expert
  std::vector<const void *> table;
};

uint64_t align64(uint64_t v) { return (v + 63) / 64 * 64; }

ExpertSet make_experts(int n_exp, int64_t d, int64_t f, GgmlType gu, GgmlType down, std::mt19937 &rng) {
  ExpertSet s;
  const uint64_t gate_bytes = ep::format::ggml_row_bytes(gu, d, "t") * f;
  const uint64_t down_bytes = ep::format::ggml_row_bytes(down, f, "t") * d;
  s.layout.gate = {0, gu, d, f};
  s.layout.up = {align64(gate_bytes), gu, d, f};
  s.layout.down = {align64(2 * align64(gate_bytes)), down, f, d};
  for (int e = 0; e < n_exp; ++e) {
    std::vector<uint8_t> slot(s.layout.down.offset + down_bytes);
    auto g = ep::test::random_weights(gu, d, f, rng);
    auto u = ep::test::random_weights(gu, d, f, rng);
    auto o = ep::test::random_weights(down, f, d, rng);
    std::memcpy(slot.data(), g.data(), g.size());
    std::memcpy(slot.data() + s.layout.up.offset, u.data(), u.size());
    std::memcpy(slot.data() + s.layout.down.offset, o.data(), o.size());
    s.slots.push_back(std::move(slot));
  }
  for (auto &sl : s.slots) s.table.push_back(sl.data());
  return s;
}

std::vector<double> dense_mv(GgmlType type, const uint8_t *w, int64_t k, int64_t n, const std::vector<double> &x) {
  const uint64_t rb = ep::format::ggml_row_bytes(type, k, "t");
  std::vector<float> row(static_cast<size_t>(k));
  std::vector<double> y(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) {
    dequantize_row(type, w + r * rb, row.data(), k);
    double acc = 0;
    for (int64_t i = 0; i < k; ++i) acc += row[i] * x[i];
    y[r] = acc;
  }
  return y;
}

double act_ref(double g, double u, const Activation &a) {
  if (a.kind == ActivationKind::situ)
    return a.beta_g * std::tanh(g / a.beta_g) / (1 + std::exp(-g)) * a.beta_u * std::tanh(u / a.beta_u);
  if (a.limit > 0) {
    g = std::min<double>(g, a.limit);
    u = std::clamp<double>(u, -a.limit, a.limit);
  }
  return g / (1 + std::exp(-g)) * u;
}

std::vector<double> expert_ref(const ExpertSet &s, int e, const float *x, int64_t d, const Activation &act) {
  const uint8_t *base = s.slots[e].data();
  std::vector<double> xd(x, x + d);
  auto g = dense_mv(s.layout.gate.type, base + s.layout.gate.offset, d, s.layout.gate.ne1, xd);
  auto u = dense_mv(s.layout.up.type, base + s.layout.up.offset, d, s.layout.up.ne1, xd);
  for (size_t i = 0; i < g.size(); ++i) g[i] = act_ref(g[i], u[i], act);
  return dense_mv(s.layout.down.type, base + s.layout.down.offset, s.layout.down.ne0, d, g);
}

}  // namespace

TEST_CASE("route + moe + combine match the formula (DeepSeek-V4 and Kimi-K3 styles)", "[moe]") {
  CpuBackend be;
  std::mt19937 rng(99);
  const int64_t d = 256, f = 512, toks = 3;
  const int n_exp = 8;
  struct Case {
    GgmlType gu, down;
    Scoring scoring;
    int k;
    float scale;
    Activation act;
  };
  const Case cases[] = {
      {GgmlType::mxfp4, GgmlType::mxfp4, Scoring::sqrt_softplus, 2, 1.5f, {ActivationKind::swiglu, 10.0f}},
      {GgmlType::iq2_xxs, GgmlType::q2_k, Scoring::sqrt_softplus, 3, 1.5f, {ActivationKind::swiglu, 10.0f}},
      {GgmlType::q3_k, GgmlType::q4_k, Scoring::sigmoid, 3, 1.0f, {ActivationKind::situ, 0.0f, 4.0f, 25.0f}},
  };
  for (const Case &c : cases) {
    ExpertSet s = make_experts(n_exp, d, f, c.gu, c.down, rng);
    auto x = ep::test::random_floats(static_cast<size_t>(d * toks), rng, -2, 2);
    auto logits = ep::test::random_floats(static_cast<size_t>(n_exp * toks), rng, -2, 2);
    std::vector<int32_t> ids(static_cast<size_t>(c.k * toks), -1);
    std::vector<float> w(ids.size(), NAN), y(static_cast<size_t>(d * toks), NAN);
    RouterParams rp;
    rp.k = c.k;
    rp.scoring = c.scoring;
    rp.scale = c.scale;
    be.route(Tensor::make(logits.data(), GgmlType::f32, Device::cpu, {n_exp, toks}), rp,
             Tensor::make(ids.data(), GgmlType::i32, Device::cpu, {c.k, toks}),
             Tensor::make(w.data(), GgmlType::f32, Device::cpu, {c.k, toks}));
    const ep::test::HostBatch hb = ep::test::host_batch(ids, s.table, s.layout);
    be.moe(Tensor::make(x.data(), GgmlType::f32, Device::cpu, {d, toks}),
           Tensor::make(ids.data(), GgmlType::i32, Device::cpu, {c.k, toks}),
           Tensor::make(w.data(), GgmlType::f32, Device::cpu, {c.k, toks}), hb.batch, s.layout, c.act,
           Tensor::make(y.data(), GgmlType::f32, Device::cpu, {d, toks}));
    int bad = 0;
    double max_abs = 0;
    for (int64_t t = 0; t < toks; ++t) {
      std::vector<double> want(static_cast<size_t>(d), 0.0);
      double wsum = 0;
      for (int j = 0; j < c.k; ++j) wsum += w[t * c.k + j];
      CHECK(std::fabs(wsum - c.scale) < 1e-5);  // renormalised then scaled
      for (int j = 0; j < c.k; ++j) {
        const auto o = expert_ref(s, ids[t * c.k + j], &x[t * d], d, c.act);
        for (int64_t i = 0; i < d; ++i) want[i] += w[t * c.k + j] * o[i];
      }
      double row_max = 0;
      for (int64_t i = 0; i < d; ++i) row_max = std::max(row_max, std::fabs(want[i]));
      max_abs = std::max(max_abs, row_max);
      // fp32 accumulation: error relative to the row's magnitude (cancellation makes single
      // entries small)
      for (int64_t i = 0; i < d; ++i)
        bad += !(std::isfinite(y[t * d + i]) &&
                 std::fabs(y[t * d + i] - want[i]) <= 1e-4 * std::fabs(want[i]) + 2e-5 * row_max);
    }
    INFO("gate/up type " << static_cast<int>(c.gu) << ", max |y| " << max_abs);
    CHECK(max_abs > 1e-3);  // the experts produce non-trivial output
    CHECK(bad == 0);
  }
}

TEST_CASE("moe refuses a batch that does not cover every pair, or has no host slots", "[moe]") {
  CpuBackend be;
  std::mt19937 rng(1);
  const int64_t d = 256, f = 256;
  ExpertSet s = make_experts(2, d, f, GgmlType::q8_0, GgmlType::q8_0, rng);
  s.table[1] = nullptr;
  std::vector<float> x(d, 0.5f), y(d), w = {1.0f};
  std::vector<int32_t> ids = {1};
  ep::test::HostBatch hb = ep::test::host_batch(ids, s.table, s.layout);
  auto run = [&] {
    be.moe(Tensor::make(x.data(), GgmlType::f32, Device::cpu, {d, 1}),
           Tensor::make(ids.data(), GgmlType::i32, Device::cpu, {1, 1}),
           Tensor::make(w.data(), GgmlType::f32, Device::cpu, {1, 1}), hb.batch, s.layout, Activation{},
           Tensor::make(y.data(), GgmlType::f32, Device::cpu, {d, 1}));
  };
  auto status = [&] {
    try {
      run();
    } catch (const ep::Error &e) {
      return e.status();
    }
    return ep::Status::ok;
  };
  CHECK(status() == ep::Status::internal);  // pair 0's expert has no slot
  ids[0] = 0;
  hb = ep::test::host_batch(ids, s.table, s.layout);
  CHECK(status() == ep::Status::ok);
  hb.batch.pair_slots = nullptr;
  CHECK(status() == ep::Status::internal);  // a CPU batch needs the host slots
  hb = ep::test::host_batch(ids, s.table, s.layout);
  hb.batch.n_pairs = 2;
  CHECK(status() == ep::Status::internal);  // a batch of another step
}

TEST_CASE("ffn (shared experts) equals down(act(gate x, up x))", "[moe]") {
  CpuBackend be;
  std::mt19937 rng(4);
  const int64_t d = 256, f = 512, toks = 2;
  ExpertSet s = make_experts(1, d, f, GgmlType::q6_k, GgmlType::q5_k, rng);
  const uint8_t *base = s.slots[0].data();
  auto x = ep::test::random_floats(static_cast<size_t>(d * toks), rng);
  std::vector<float> y(static_cast<size_t>(d * toks), NAN);
  const Activation act{ActivationKind::situ, 0.0f, 4.0f, 25.0f};
  be.ffn(Tensor::make(x.data(), GgmlType::f32, Device::cpu, {d, toks}),
         Tensor::make(base + s.layout.gate.offset, GgmlType::q6_k, Device::cpu, {d, f}),
         Tensor::make(base + s.layout.up.offset, GgmlType::q6_k, Device::cpu, {d, f}),
         Tensor::make(base + s.layout.down.offset, GgmlType::q5_k, Device::cpu, {f, d}), act,
         Tensor::make(y.data(), GgmlType::f32, Device::cpu, {d, toks}));
  int bad = 0;
  for (int64_t t = 0; t < toks; ++t) {
    const auto want = expert_ref(s, 0, &x[t * d], d, act);
    double row_max = 0;
    for (int64_t i = 0; i < d; ++i) row_max = std::max(row_max, std::fabs(want[i]));
    for (int64_t i = 0; i < d; ++i)
      bad += !(std::isfinite(y[t * d + i]) &&
               std::fabs(y[t * d + i] - want[i]) <= 1e-4 * std::fabs(want[i]) + 2e-5 * row_max);
  }
  CHECK(bad == 0);
}

TEST_CASE("moe_pairs over disjoint expert sets, then moe_combine, give moe()'s bits", "[moe]") {
  // The expert-major prompt pass (experts/runner.cpp): each set of experts gets only its
  // own slots (the others are null, as when the cache holds a few experts at a time).
  CpuBackend be(3);
  std::mt19937 rng(7);
  const int64_t d = 256, f = 256, toks = 37, k = 3;
  const int n_exp = 8;
  ExpertSet s = make_experts(n_exp, d, f, GgmlType::q4_k, GgmlType::q8_0, rng);
  auto x = ep::test::random_floats(static_cast<size_t>(d * toks), rng, -2, 2);
  auto w = ep::test::random_floats(static_cast<size_t>(k * toks), rng, 0, 1);
  std::vector<int32_t> ids(static_cast<size_t>(k * toks));
  for (int64_t t = 0; t < toks; ++t)  // k distinct experts per token
    for (int64_t j = 0; j < k; ++j) ids[static_cast<size_t>(t * k + j)] = static_cast<int32_t>((t * 5 + j * 3) % n_exp);
  const Activation act{ActivationKind::swiglu, 10.0f};
  auto X = Tensor::make(x.data(), GgmlType::f32, Device::cpu, {d, toks});
  auto I = Tensor::make(ids.data(), GgmlType::i32, Device::cpu, {k, toks});
  auto W = Tensor::make(w.data(), GgmlType::f32, Device::cpu, {k, toks});
  std::vector<float> want(static_cast<size_t>(d * toks), NAN);
  be.moe(X, I, W, ep::test::host_batch(ids, s.table, s.layout).batch, s.layout, act,
         Tensor::make(want.data(), GgmlType::f32, Device::cpu, {d, toks}));

  std::vector<float> pairs(static_cast<size_t>(d * k * toks), NAN), got(want.size(), NAN);
  auto P = Tensor::make(pairs.data(), GgmlType::f32, Device::cpu, {d, k * toks});
  for (const std::vector<int32_t> &set : {std::vector<int32_t>{5, 0, 3}, {1, 7}, {2, 4, 6}}) {
    std::vector<const void *> table(static_cast<size_t>(n_exp), nullptr);
    for (int32_t e : set) table[static_cast<size_t>(e)] = s.table[static_cast<size_t>(e)];
    be.moe_pairs(X, I, ep::test::host_batch(ids, table, s.layout).batch, s.layout, act, P);
  }
  be.moe_combine(P, W, Tensor::make(got.data(), GgmlType::f32, Device::cpu, {d, toks}));
  CHECK(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)) == 0);
  CHECK(std::isfinite(got[0]));

  // a set leaves the other experts' rows alone: a poisoned row stays poisoned
  std::vector<float> poisoned(pairs.size(), NAN);
  auto Q = Tensor::make(poisoned.data(), GgmlType::f32, Device::cpu, {d, k * toks});
  std::vector<const void *> table(static_cast<size_t>(n_exp), nullptr);
  table[1] = s.table[1];
  be.moe_pairs(X, I, ep::test::host_batch(ids, table, s.layout).batch, s.layout, act, Q);
  int64_t of_expert_1 = 0, wrong = 0;
  for (int64_t p = 0; p < k * toks; ++p) {
    const bool mine = ids[static_cast<size_t>(p)] == 1;
    of_expert_1 += mine;
    for (int64_t i = 0; i < d; ++i) wrong += std::isfinite(poisoned[static_cast<size_t>(p * d + i)]) != mine;
  }
  CHECK(of_expert_1 > 0);
  CHECK(wrong == 0);

  // errors: pairs of the wrong shape, a batch of another step
  auto status = [](auto &&fn) {
    try {
      fn();
    } catch (const ep::Error &e) {
      return e.status();
    }
    return ep::Status::ok;
  };
  const ep::test::HostBatch one = ep::test::host_batch(ids, table, s.layout);
  ep::backend::ExpertBatch short_batch = one.batch;
  short_batch.n_pairs = k * toks - 1;
  CHECK(status([&] { be.moe_pairs(X, I, short_batch, s.layout, act, Q); }) == ep::Status::internal);
  CHECK(status([&] {
          be.moe_pairs(X, I, one.batch, s.layout, act, Tensor::make(poisoned.data(), GgmlType::f32, Device::cpu, {d, toks}));
        }) == ep::Status::shape);
  CHECK(status([&] { be.moe_combine(Tensor::make(pairs.data(), GgmlType::f32, Device::cpu, {d, toks}), W,
                                    Tensor::make(got.data(), GgmlType::f32, Device::cpu, {d, toks})); }) == ep::Status::shape);
}
