// The CPU backend's thread pool: every index is run exactly once, errors come back, nested
// calls run inline. The threaded ops give the same BYTES for any thread count (1 = the plain
// loops) and the same bytes as a naive scalar reference (f32 sums, i ascending): matmul for every
// weight type and token count, moe (many experts per call = one expert per task; few experts =
// rows split), attention_sinks, indexer_scores and the row-wise ops; and a whole tiny DeepSeek-V4
// forward (prefill and decode) gives identical logits with 1, 3 and 7 threads.
#include "backend/expert_batch.hpp"
#include "backend/cpu_backend.hpp"
#include "backend/dequant.hpp"
#include "core/error.hpp"
#include "core/thread_pool.hpp"
#include "model/deepseek_v4.hpp"
#include "random_weights.hpp"
#include "support/catch.hpp"
#include "testkit/deepseek_v4_gguf.hpp"

#include <expertpack/expertpack.h>

#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <stdexcept>
#include <vector>

using namespace ep::backend;
using ep::format::GgmlType;

namespace {

Tensor f32(std::vector<float> &v, std::initializer_list<int64_t> shape) {
  return Tensor::make(v.data(), GgmlType::f32, Device::cpu, shape);
}

bool same_bytes(const std::vector<float> &a, const std::vector<float> &b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The single-threaded scalar matmul the CPU backend had before threading (the reference).
std::vector<float> naive_matmul(GgmlType type, const uint8_t *w, int64_t k, int64_t n, const float *x, int64_t toks) {
  const uint64_t rb = ep::format::ggml_row_bytes(type, static_cast<uint64_t>(k), "t");
  std::vector<float> row(static_cast<size_t>(k)), y(static_cast<size_t>(n * toks));
  for (int64_t r = 0; r < n; ++r) {
    dequantize_row(type, w + r * rb, row.data(), k);
    for (int64_t t = 0; t < toks; ++t) {
      float acc = 0.0f;
      for (int64_t i = 0; i < k; ++i) acc += row[static_cast<size_t>(i)] * x[t * k + i];
      y[static_cast<size_t>(t * n + r)] = acc;
    }
  }
  return y;
}

const unsigned kThreadCounts[] = {1, 2, 3, 7};

}  // namespace

TEST_CASE("thread pool: every index once, any grain and thread count", "[threading]") {
  for (unsigned threads : {1u, 2u, 5u}) {
    ep::ThreadPool pool(threads);
    CHECK(pool.threads() == threads);
    for (int64_t n : {0, 1, 7, 100, 1001}) {
      for (int64_t grain : {1, 3, 64, 5000}) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        std::vector<std::atomic<int>> busy(threads);
        std::atomic<int> overlap{0}, bad_worker{0};
        pool.parallel_for(n, grain, [&](int64_t b, int64_t e, unsigned worker) {
          // (Catch assertions are not thread-safe: count here, check after)
          if (worker >= threads) {
            ++bad_worker;
            return;
          }
          if (busy[worker].fetch_add(1) != 0) ++overlap;  // a worker id is never used twice at once
          for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
          busy[worker].fetch_sub(1);
        });
        int wrong = 0;
        for (auto &h : hits) wrong += h.load() != 1;
        INFO("threads " << threads << ", n " << n << ", grain " << grain);
        CHECK(wrong == 0);
        CHECK(overlap.load() == 0);
        CHECK(bad_worker.load() == 0);
      }
    }
  }
}

TEST_CASE("thread pool: exceptions come back, nested calls run inline, the pool is reusable", "[threading]") {
  ep::ThreadPool pool(4);
  std::atomic<int> ran{0};
  CHECK_THROWS_AS(pool.parallel_for(1000, 1,
                                    [&](int64_t b, int64_t, unsigned) {
                                      ++ran;
                                      if (b >= 500) throw std::runtime_error("chunk failed");
                                    }),
                  std::runtime_error);
  CHECK(ran.load() >= 1);
  // still usable after a failure; nested calls see the whole range inline
  std::atomic<int64_t> total{0};
  std::atomic<int> not_inline{0};
  pool.parallel_for(64, 1, [&](int64_t b, int64_t e, unsigned worker) {
    for (int64_t i = b; i < e; ++i)
      pool.parallel_for(10, 1, [&](int64_t b2, int64_t e2, unsigned w2) {
        if (b2 != 0 || e2 != 10 || w2 != worker) ++not_inline;
        total += e2 - b2;
      });
  });
  CHECK(total.load() == 640);
  CHECK(not_inline.load() == 0);
  // EP_CPU_THREADS parsing
  ::setenv("EP_CPU_THREADS", "3", 1);
  CHECK(ep::ThreadPool::default_threads() == 3);
  CHECK(CpuBackend().threads() == 3);
  ::setenv("EP_CPU_THREADS", "bogus", 1);
  CHECK(ep::ThreadPool::default_threads() >= 1);
  ::unsetenv("EP_CPU_THREADS");
  CHECK(CpuBackend(5).threads() == 5);
}

TEST_CASE("threaded matmul: the same bytes for every thread count and the naive loop", "[threading]") {
  std::mt19937 rng(7);
  const GgmlType types[] = {GgmlType::f32,  GgmlType::f16,  GgmlType::bf16,  GgmlType::q8_0,
                            GgmlType::q2_k, GgmlType::q3_k, GgmlType::q4_k,  GgmlType::q5_k,
                            GgmlType::q6_k, GgmlType::mxfp4, GgmlType::iq2_xxs};
  const int64_t k = 512, n = 301;
  std::vector<std::unique_ptr<CpuBackend>> bes;
  for (unsigned th : kThreadCounts) bes.push_back(std::make_unique<CpuBackend>(th));
  for (GgmlType type : types) {
    auto w = ep::test::random_weights(type, k, n, rng);
    const Tensor wt = Tensor::make(w.data(), type, Device::cpu, {k, n});
    for (int64_t toks : {1, 2, 3, 4, 5, 8, 9, 17, 40}) {
      auto x = ep::test::random_floats(static_cast<size_t>(k * toks), rng, -2, 2);
      const std::vector<float> want = naive_matmul(type, w.data(), k, n, x.data(), toks);
      INFO("type " << static_cast<int>(type) << ", tokens " << toks);
      for (auto &be : bes) {
        std::vector<float> y(static_cast<size_t>(n * toks), NAN);
        be->matmul(wt, f32(x, {k, toks}), f32(y, {n, toks}));
        INFO("threads " << be->threads());
        CHECK(same_bytes(y, want));
      }
      std::vector<float> yr(static_cast<size_t>(n * toks), NAN);
      matmul_ref(type, w.data(), k, n, x.data(), toks, yr.data());
      CHECK(same_bytes(yr, want));
    }
  }
}

TEST_CASE("threaded moe: the same bytes for every thread count and the per-token loop", "[threading]") {
  std::mt19937 rng(11);
  const int64_t d = 256, f = 512;
  const int n_exp = 16;
  const GgmlType gu = GgmlType::iq2_xxs, down = GgmlType::q2_k;
  const uint64_t gate_bytes = ep::format::ggml_row_bytes(gu, d, "t") * f;
  const uint64_t down_bytes = ep::format::ggml_row_bytes(down, f, "t") * d;
  SlotLayout l;
  l.gate = {0, gu, d, f};
  l.up = {gate_bytes, gu, d, f};
  l.down = {2 * gate_bytes, down, f, d};
  std::vector<std::vector<uint8_t>> slots;
  std::vector<const void *> table;
  for (int e = 0; e < n_exp; ++e) {
    std::vector<uint8_t> s(2 * gate_bytes + down_bytes);
    auto g = ep::test::random_weights(gu, d, f, rng), u = ep::test::random_weights(gu, d, f, rng);
    auto o = ep::test::random_weights(down, f, d, rng);
    std::memcpy(s.data(), g.data(), g.size());
    std::memcpy(s.data() + l.up.offset, u.data(), u.size());
    std::memcpy(s.data() + l.down.offset, o.data(), o.size());
    slots.push_back(std::move(s));
  }
  for (auto &s : slots) table.push_back(s.data());
  Activation act;
  act.limit = 10.0f;
  std::vector<std::unique_ptr<CpuBackend>> bes;
  for (unsigned th : kThreadCounts) bes.push_back(std::make_unique<CpuBackend>(th));
  for (const int64_t toks : {1, 2, 5, 40}) {
    const int64_t k = 4;
    auto x = ep::test::random_floats(static_cast<size_t>(d * toks), rng, -2, 2);
    std::vector<int32_t> ids(static_cast<size_t>(k * toks));
    for (auto &id : ids) id = static_cast<int32_t>(rng() % (toks == 1 ? 4 : n_exp));  // repeats too
    auto wts = ep::test::random_floats(ids.size(), rng, 0.1f, 1.0f);
    // the reference: the per-token loop of the single-threaded backend
    std::vector<float> want(static_cast<size_t>(d * toks), 0.0f);
    for (int64_t t = 0; t < toks; ++t)
      for (int64_t j = 0; j < k; ++j) {
        const auto *base = static_cast<const uint8_t *>(table[static_cast<size_t>(ids[t * k + j])]);
        auto g = naive_matmul(gu, base + l.gate.offset, d, f, &x[t * d], 1);
        auto u = naive_matmul(gu, base + l.up.offset, d, f, &x[t * d], 1);
        for (int64_t i = 0; i < f; ++i) g[i] = activation_ref(g[i], u[i], act);
        auto o = naive_matmul(down, base + l.down.offset, f, d, g.data(), 1);
        for (int64_t i = 0; i < d; ++i) want[t * d + i] += wts[t * k + j] * o[i];
      }
    for (auto &be : bes) {
      std::vector<float> y(static_cast<size_t>(d * toks), NAN);
      be->moe(f32(x, {d, toks}), Tensor::make(ids.data(), GgmlType::i32, Device::cpu, {k, toks}), f32(wts, {k, toks}),
              ep::test::host_batch(ids, table, l).batch, l, act, f32(y, {d, toks}));
      INFO("tokens " << toks << ", threads " << be->threads());
      CHECK(same_bytes(y, want));
    }
  }
}

TEST_CASE("threaded attention, indexer and row ops: the same bytes for every thread count", "[threading]") {
  std::mt19937 rng(5);
  const int64_t hd = 96, heads = 6, toks = 37, n_kv = 53, hc = 4, dd = 64;
  auto q = ep::test::random_floats(static_cast<size_t>(hd * heads * toks), rng);
  auto kv = ep::test::random_floats(static_cast<size_t>(hd * n_kv), rng);
  auto sinks = ep::test::random_floats(static_cast<size_t>(heads), rng);
  std::vector<int8_t> vis(static_cast<size_t>(n_kv * toks));
  for (auto &v : vis) v = static_cast<int8_t>(rng() % 3 != 0);
  auto iw = ep::test::random_floats(static_cast<size_t>(heads * toks), rng);
  auto hx = ep::test::random_floats(static_cast<size_t>(dd * hc * toks), rng);
  auto hf = ep::test::random_floats(static_cast<size_t>(dd * toks), rng);
  auto hpost = ep::test::random_floats(static_cast<size_t>(hc * toks), rng);
  auto hcomb = ep::test::random_floats(static_cast<size_t>(hc * hc * toks), rng);
  auto nw = ep::test::random_floats(static_cast<size_t>(hd), rng);
  std::vector<std::vector<float>> outs;
  for (unsigned th : kThreadCounts) {
    CpuBackend be(th);
    std::vector<float> att(q.size(), NAN), sc(static_cast<size_t>(n_kv * toks), NAN), col(hf.size(), NAN);
    std::vector<float> exp = hx, norm(q.size(), NAN), sm(q.size(), NAN), sum(q.size(), NAN), gl(q.size(), NAN);
    const Tensor vt = Tensor::make(vis.data(), GgmlType::i8, Device::cpu, {n_kv, toks});
    be.attention_sinks(f32(q, {hd, heads, toks}), f32(kv, {hd, n_kv}), vt, f32(sinks, {heads}), 0.1f, f32(att, {hd, heads, toks}));
    be.indexer_scores(f32(q, {hd, heads, toks}), f32(iw, {heads, toks}), f32(kv, {hd, n_kv}), vt, 0.2f, f32(sc, {n_kv, toks}));
    be.hc_collapse(f32(hx, {dd, hc, toks}), f32(hpost, {hc, toks}), f32(col, {dd, toks}));
    be.hc_expand(f32(exp, {dd, hc, toks}), f32(hf, {dd, toks}), f32(hpost, {hc, toks}), f32(hcomb, {hc * hc, toks}),
                 f32(exp, {dd, hc, toks}));
    const Tensor nwt = f32(nw, {hd});
    be.rms_norm(f32(q, {hd, heads * toks}), &nwt, 1e-6f, f32(norm, {hd, heads * toks}));
    be.softmax(f32(q, {hd, heads * toks}), f32(sm, {hd, heads * toks}));
    be.add(f32(q, {hd, heads * toks}), f32(att, {hd, heads * toks}), f32(sum, {hd, heads * toks}));
    Activation act;
    act.limit = 7.0f;
    be.glu(f32(q, {hd, heads * toks}), f32(att, {hd, heads * toks}), act, f32(gl, {hd, heads * toks}));
    // in place: attention output over its own q
    std::vector<float> inplace = q;
    be.attention_sinks(f32(inplace, {hd, heads, toks}), f32(kv, {hd, n_kv}), vt, f32(sinks, {heads}), 0.1f,
                       f32(inplace, {hd, heads, toks}));
    CHECK(same_bytes(inplace, att));
    int finite = 0;
    for (float v : att) finite += std::isfinite(v);
    CHECK(finite == static_cast<int>(att.size()));
    std::vector<float> all;
    for (auto *v : {&att, &sc, &col, &exp, &norm, &sm, &sum, &gl}) all.insert(all.end(), v->begin(), v->end());
    outs.push_back(std::move(all));
  }
  for (size_t i = 1; i < outs.size(); ++i) {
    INFO("threads " << kThreadCounts[i] << " vs 1");
    CHECK(same_bytes(outs[i], outs[0]));
  }
}

TEST_CASE("threaded DeepSeek-V4 forward: identical logits with 1, 3 and 7 threads", "[threading][model]") {
  ep::testkit::DeepseekV4SyntheticSpec spec;  // tiny: hash, sliding, CSA and HCA layers
  spec.n_experts = 16;
  spec.n_experts_used = 4;
  spec.expert_gate_up = GgmlType::iq2_xxs;
  spec.expert_down = GgmlType::q2_k;
  spec.hidden = 256;
  spec.moe_ff = 256;
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("ep_threading_deepseek_v4_" + std::to_string(getpid()) + ".gguf");
  ep::testkit::write_deepseek_v4_synthetic_gguf(spec, path.string());
  const int64_t n_tok = 41;
  std::vector<std::vector<float>> full, inc;
  for (unsigned th : {1u, 3u, 7u}) {
    CpuBackend cpu(th);
    auto model = ep::model::DeepseekV4Model::open(path.string(), cpu);
    const int64_t V = model->config().vocab;
    std::vector<int32_t> tokens;
    for (int64_t t = 0; t < n_tok; ++t) tokens.push_back(static_cast<int32_t>((t * 37 + 11) % V));
    std::vector<float> a(static_cast<size_t>(n_tok * V)), b(a.size());
    auto st = model->new_state();
    model->forward(tokens.data(), n_tok, st, a.data());
    auto st2 = model->new_state();
    model->forward(tokens.data(), 20, st2, b.data());
    for (int64_t t = 20; t < n_tok; ++t) model->forward(tokens.data() + t, 1, st2, b.data() + t * V);
    int finite = 0;
    for (float v : a) finite += std::isfinite(v);
    CHECK(finite == static_cast<int>(a.size()));
    full.push_back(std::move(a));
    inc.push_back(std::move(b));
  }
  for (size_t i = 1; i < full.size(); ++i) {
    INFO("run " << i);
    CHECK(same_bytes(full[i], full[0]));
    CHECK(same_bytes(inc[i], inc[0]));
  }
  // The C API's ep_model_options::cpu_threads: the same bytes as the backend run above.
  auto score = [&](int32_t threads) {
    ep_model_options o;
    ep_model_options_init(&o);
    o.device = EP_DEVICE_CPU;
    o.resident_experts = 1;
    o.cpu_threads = threads;
    ep_model *m = nullptr;
    std::vector<float> out;
    const ep_status st = ep_model_open(&m, path.string().c_str(), &o);
    INFO("cpu_threads " << threads << ": " << (st == EP_OK ? "" : ep_last_error()));
    REQUIRE(st == EP_OK);
    ep_session *s = nullptr;
    REQUIRE(ep_session_open(&s, m) == EP_OK);
    std::vector<int32_t> tokens;
    for (int64_t t = 0; t < n_tok; ++t) tokens.push_back(static_cast<int32_t>((t * 37 + 11) % spec.vocab));
    out.resize(full[0].size());
    CHECK(ep_score(s, tokens.data(), tokens.size(), 0, nullptr, out.data()) == EP_OK);
    ep_session_close(s);
    ep_model_close(m);
    return out;
  };
  CHECK(same_bytes(score(1), full[0]));
  CHECK(same_bytes(score(4), full[0]));
  ep_model_options bad;
  ep_model_options_init(&bad);
  bad.device = EP_DEVICE_CPU;
  bad.cpu_threads = -1;
  ep_model *none = nullptr;
  CHECK(ep_model_open(&none, path.string().c_str(), &bad) == EP_ERR_INVALID_ARGUMENT);
  CHECK(none == nullptr);
  std::filesystem::remove(path);
}
