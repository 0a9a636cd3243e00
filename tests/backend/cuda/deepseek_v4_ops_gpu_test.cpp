// The elementwise/copy ops and the DeepSeek-V4 ops on CUDA against the CPU reference backend on
// fresh seeded random inputs, at the DeepSeek-V4-Flash shapes (64 heads x 512, 640 keys, indexer
// 64 x 128, hidden 4096 x 4 streams) and at odd small shapes. Device outputs are poisoned with
// 0xFF bytes (NaN for f32) before each call, and a non-finite output where the CPU has a finite
// one never passes. Thresholds (max |gpu − cpu| / max |cpu| over the output):
//   mul, scale, copy, copy_2d, set_visible, top_k over the indexer scores: equal;
//   hc_weights: 1e-5 (float exp; 20 Sinkhorn rounds); hc_collapse / hc_expand: 1e-5 (FMA);
//   pool_windows: 1e-5 (the CPU accumulates in double);
//   attention_sinks: 1e-4 (float dots and online softmax vs the CPU's double; with and without
//   key splits);
//   indexer_scores: 1e-4 (float vs double over 64 heads x 128), −inf exactly where masked.
#include "backend/cpu_backend.hpp"
#include "gpu/check.hpp"
#include "backend/cuda/cuda_backend.hpp"
#include "backend/cuda/deepseek_v4_kernels.hpp"
#include "gpu_arena.hpp"
#include "backend/random_weights.hpp"
#include "support/catch.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

using namespace ep::backend;
using ep::backend::cuda::CudaBackend;
using ep::format::GgmlType;

namespace {

using ep::test::gpu::Arena;
using ep::test::gpu::host;
using ep::test::gpu::rel_diff;

std::vector<int8_t> random_mask(size_t n, std::mt19937 &rng, double p_visible) {
  std::bernoulli_distribution d(p_visible);
  std::vector<int8_t> m(n);
  for (auto &v : m) v = d(rng) ? 1 : 0;
  return m;
}

constexpr GgmlType F32 = GgmlType::f32, I8 = GgmlType::i8, I32 = GgmlType::i32;

/// Both backends and a seeded generator, fresh for each test case.
struct Backends {
  CudaBackend gpu;
  CpuBackend cpu;
  std::mt19937 rng{31};
};

}  // namespace

TEST_CASE_METHOD(Backends, "mul, scale, copy and copy_2d on CUDA equal the CPU", "[gpu][deepseek_v4]") {
  Arena dev(gpu);
  const int64_t n = 4099;
  auto a = ep::test::random_floats(n, rng, -3, 3), b = ep::test::random_floats(n, rng, -3, 3);
  std::vector<float> want(n);
  const Tensor da = dev.put(a, F32, {n}), db = dev.put(b, F32, {n});
  const Tensor dy = dev.poisoned(F32, {n});
  cpu.mul(host(a, F32, {n}), host(b, F32, {n}), host(want, F32, {n}));
  gpu.mul(da, db, dy);
  CHECK(dev.get<float>(dy) == want);
  cpu.scale(host(a, F32, {n}), -0.37f, host(want, F32, {n}));
  gpu.scale(da, -0.37f, dy);
  CHECK(dev.get<float>(dy) == want);
  gpu.scale(da, -0.37f, da);  // in place
  CHECK(dev.get<float>(da) == want);
  const Tensor dc = dev.poisoned(F32, {n});
  gpu.copy(db, dc);
  CHECK(dev.get<float>(dc) == b);
  // columns [3, 3 + 17) of 61 rows of 40 floats into rows of 17
  const int64_t rows = 61, cols = 40, take = 17;
  auto m = ep::test::random_floats(rows * cols, rng);
  const Tensor dm = dev.put(m, F32, {cols, rows}), dg = dev.poisoned(F32, {take, rows});
  gpu.copy_2d(dg.data, take * 4, dm.as<float>() + 3, cols * 4, take * 4, rows);
  std::vector<float> g(take * rows);
  cpu.copy_2d(g.data(), take * 4, m.data() + 3, cols * 4, take * 4, rows);
  CHECK(dev.get<float>(dg) == g);
}

TEST_CASE_METHOD(Backends, "hyper-connection ops on CUDA match the CPU", "[gpu][deepseek_v4]") {
  struct Shape {
    int64_t d, hc, t;
    int32_t iters;
  };
  for (Shape s : {Shape{4096, 4, 1, 20}, Shape{4096, 4, 37, 20}, Shape{37, 3, 5, 1}, Shape{96, 16, 2, 7}, Shape{8, 1, 3, 2}}) {
    Arena dev(gpu);
    const int64_t D = s.d, hc = s.hc, T = s.t, M = (2 + hc) * hc;
    auto mix = ep::test::random_floats(M * T, rng, -3, 3), base = ep::test::random_floats(M, rng);
    std::vector<float> scale{0.8f, 1.3f, 2.5f};
    std::vector<float> pre(hc * T), post(hc * T), comb(hc * hc * T);
    Tensor hp = host(post, F32, {hc, T}), hcmb = host(comb, F32, {hc * hc, T});
    cpu.hc_weights(host(mix, F32, {M, T}), host(scale, F32, {3}), host(base, F32, {M}), 1e-6f, s.iters, host(pre, F32, {hc, T}),
                   &hp, &hcmb);
    const Tensor dmix = dev.put(mix, F32, {M, T}), dscale = dev.put(scale, F32, {3}), dbase = dev.put(base, F32, {M});
    const Tensor dpre = dev.poisoned(F32, {hc, T}), dpost = dev.poisoned(F32, {hc, T}), dcomb = dev.poisoned(F32, {hc * hc, T});
    gpu.hc_weights(dmix, dscale, dbase, 1e-6f, s.iters, dpre, &dpost, &dcomb);
    INFO("D " << D << " hc " << hc << " T " << T << " iters " << s.iters);
    CHECK(rel_diff(dev.get<float>(dpre), pre) <= 1e-5);
    CHECK(rel_diff(dev.get<float>(dpost), post) <= 1e-5);
    CHECK(rel_diff(dev.get<float>(dcomb), comb) <= 1e-5);
    // pre only (output head)
    std::vector<float> pre_only(hc * T);
    auto mix1 = ep::test::random_floats(hc * T, rng, -3, 3), base1 = ep::test::random_floats(hc, rng);
    std::vector<float> scale1{1.7f};
    cpu.hc_weights(host(mix1, F32, {hc, T}), host(scale1, F32, {1}), host(base1, F32, {hc}), 1e-6f, 1, host(pre_only, F32, {hc, T}),
                   nullptr, nullptr);
    const Tensor dpre1 = dev.poisoned(F32, {hc, T});
    gpu.hc_weights(dev.put(mix1, F32, {hc, T}), dev.put(scale1, F32, {1}), dev.put(base1, F32, {hc}), 1e-6f, 1, dpre1, nullptr,
                   nullptr);
    CHECK(rel_diff(dev.get<float>(dpre1), pre_only) <= 1e-5);
    // collapse and expand (out of place, then in place)
    auto x = ep::test::random_floats(D * hc * T, rng, -2, 2), f = ep::test::random_floats(D * T, rng, -2, 2);
    std::vector<float> y(D * T), e(D * hc * T);
    cpu.hc_collapse(host(x, F32, {D, hc, T}), host(pre, F32, {hc, T}), host(y, F32, {D, T}));
    cpu.hc_expand(host(x, F32, {D, hc, T}), host(f, F32, {D, T}), host(post, F32, {hc, T}), host(comb, F32, {hc * hc, T}),
                  host(e, F32, {D, hc, T}));
    const Tensor dx = dev.put(x, F32, {D, hc, T}), df = dev.put(f, F32, {D, T}), dy = dev.poisoned(F32, {D, T});
    const Tensor de = dev.poisoned(F32, {D, hc, T});
    const Tensor cpre = dev.put(pre, F32, {hc, T}), cpost = dev.put(post, F32, {hc, T}), ccomb = dev.put(comb, F32, {hc * hc, T});
    gpu.hc_collapse(dx, cpre, dy);
    gpu.hc_expand(dx, df, cpost, ccomb, de);
    CHECK(rel_diff(dev.get<float>(dy), y) <= 1e-5);
    CHECK(rel_diff(dev.get<float>(de), e) <= 1e-5);
    gpu.hc_expand(dx, df, cpost, ccomb, dx);
    CHECK(dev.get<float>(dx) == dev.get<float>(de));
  }
}

TEST_CASE_METHOD(Backends, "attention_sinks on CUDA matches the CPU (Flash shapes, odd shapes, masked tokens)", "[gpu][deepseek_v4]") {
  struct Shape {
    int64_t hd, h, t, n_kv;
    double p_visible;
  };
  for (Shape s : {Shape{512, 64, 1, 640, 1.0}, Shape{512, 64, 37, 640, 0.5}, Shape{512, 64, 1, 1128, 0.9},
                  Shape{40, 3, 5, 29, 0.6}, Shape{100, 2, 3, 1, 1.0}, Shape{33, 5, 4, 300, 0.02}, Shape{256, 4, 2, 70, 0.7},
                  Shape{1, 1, 1, 5, 1.0}}) {
    Arena dev(gpu);
    const int64_t hd = s.hd, H = s.h, T = s.t, n_kv = s.n_kv;
    auto q = ep::test::random_floats(hd * H * T, rng, -2, 2), kv = ep::test::random_floats(hd * n_kv, rng, -2, 2);
    auto sinks = ep::test::random_floats(H, rng, -1, 3);
    auto vis = random_mask(static_cast<size_t>(n_kv * T), rng, s.p_visible);
    if (T > 1) std::fill(vis.begin() + n_kv, vis.begin() + 2 * n_kv, 0);  // token 1 sees no key
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    std::vector<float> want(q.size());
    cpu.attention_sinks(host(q, F32, {hd, H, T}), host(kv, F32, {hd, n_kv}), host(vis, I8, {n_kv, T}), host(sinks, F32, {H}),
                        scale, host(want, F32, {hd, H, T}));
    const Tensor dq = dev.put(q, F32, {hd, H, T}), dkv = dev.put(kv, F32, {hd, n_kv}), dvis = dev.put(vis, I8, {n_kv, T});
    const Tensor dsinks = dev.put(sinks, F32, {H}), dout = dev.poisoned(F32, {hd, H, T});
    gpu.attention_sinks(dq, dkv, dvis, dsinks, scale, dout);
    const auto got = dev.get<float>(dout);
    INFO("hd " << hd << " heads " << H << " tokens " << T << " keys " << n_kv << " err " << rel_diff(got, want));
    CHECK(rel_diff(got, want) <= 1e-4);
    if (T > 1)
      for (int64_t i = hd * H; i < 2 * hd * H; ++i) REQUIRE(got[i] == 0.0f);
    gpu.attention_sinks(dq, dkv, dvis, dsinks, scale, dq);  // out aliasing q
    CHECK(dev.get<float>(dq) == got);
    if (hd == 512 && (n_kv == 1128 || T == 37)) {  // Flash decode and a prefill chunk: time them
      gpu.synchronize();
      const auto t0 = std::chrono::steady_clock::now();
      const int reps = 50;
      for (int r = 0; r < reps; ++r) gpu.attention_sinks(dq, dkv, dvis, dsinks, scale, dout);
      gpu.synchronize();
      const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / reps;
      std::printf("attention_sinks %lld heads x %lld, %lld tokens, %lld keys (%d key splits): %.1f us per call\n",
                  static_cast<long long>(H), static_cast<long long>(hd), static_cast<long long>(T),
                  static_cast<long long>(n_kv), ep::backend::cuda::attention_sinks_splits(H, T, n_kv), us);
      CHECK(us > 0);
    }
  }
}

TEST_CASE("attention_sinks splits the keys of decode-sized launches", "[gpu][deepseek_v4]") {
  CHECK(ep::backend::cuda::attention_sinks_splits(64, 1, 640) == 5);    // Flash decode: 5 splits of 128
  CHECK(ep::backend::cuda::attention_sinks_splits(64, 1, 1128) == 5);
  CHECK(ep::backend::cuda::attention_sinks_splits(64, 37, 640) == 1);   // prefill fills the GPU already
  CHECK(ep::backend::cuda::attention_sinks_splits(5, 4, 300) == 3);     // tested above with a masked token
  CHECK(ep::backend::cuda::attention_sinks_splits(3, 5, 29) == 1);
  CHECK(ep::backend::cuda::attention_sinks_workspace_bytes(512, 64, 1, 640) == 64u * 5u * 514u * 4u);
}

TEST_CASE_METHOD(Backends, "pool_windows on CUDA matches the CPU, −inf slots included", "[gpu][deepseek_v4]") {
  struct Shape {
    int64_t d, slots, win;
  };
  for (Shape s : {Shape{512, 8, 1}, Shape{512, 8, 37}, Shape{128, 4, 9}, Shape{37, 1, 3}, Shape{24, 16, 5}}) {
    Arena dev(gpu);
    const int64_t d = s.d, S = s.slots, W = s.win;
    auto kv = ep::test::random_floats(d * S * W, rng, -3, 3), gate = ep::test::random_floats(d * S * W, rng, -6, 6);
    if (S > 1)
      for (int64_t c = 0; c < d; c += 3) gate[c] = -INFINITY;  // window 0, slot 0: every third channel excluded
    for (int64_t s2 = 0; s2 < S; ++s2) gate[s2 * d + 1] = -INFINITY;  // window 0, channel 1: all slots excluded → 0
    std::vector<float> want(d * W);
    cpu.pool_windows(host(kv, F32, {d, S, W}), host(gate, F32, {d, S, W}), host(want, F32, {d, W}));
    const Tensor dout = dev.poisoned(F32, {d, W});
    gpu.pool_windows(dev.put(kv, F32, {d, S, W}), dev.put(gate, F32, {d, S, W}), dout);
    const auto got = dev.get<float>(dout);
    INFO("d " << d << " slots " << S << " windows " << W);
    CHECK(rel_diff(got, want) <= 1e-5);
    CHECK(got[1] == 0.0f);
  }
}

TEST_CASE_METHOD(Backends, "indexer_scores, top_k over its −inf tail and set_visible on CUDA match the CPU", "[gpu][deepseek_v4]") {
  struct Shape {
    int64_t dim, h, t, n;
    int32_t k;
  };
  for (Shape s : {Shape{128, 64, 1, 640, 512}, Shape{128, 64, 37, 640, 512}, Shape{24, 8, 5, 17, 5}, Shape{16, 3, 2, 1, 1}}) {
    Arena dev(gpu);
    const int64_t dim = s.dim, H = s.h, T = s.t, n = s.n;
    auto q = ep::test::random_floats(dim * H * T, rng), w = ep::test::random_floats(H * T, rng);
    auto keys = ep::test::random_floats(dim * n, rng);
    // causal-style visibility: token t sees the first (t + 1)·n / T entries (all of them at the last)
    std::vector<int8_t> vis(n * T, 0);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < (t + 1) * n / T; ++j) vis[t * n + j] = 1;
    const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
    std::vector<float> want(n * T);
    cpu.indexer_scores(host(q, F32, {dim, H, T}), host(w, F32, {H, T}), host(keys, F32, {dim, n}), host(vis, I8, {n, T}), scale,
                       host(want, F32, {n, T}));
    const Tensor dvis = dev.put(vis, I8, {n, T}), dscores = dev.poisoned(F32, {n, T});
    gpu.indexer_scores(dev.put(q, F32, {dim, H, T}), dev.put(w, F32, {H, T}), dev.put(keys, F32, {dim, n}), dvis, scale, dscores);
    INFO("dim " << dim << " heads " << H << " tokens " << T << " keys " << n);
    CHECK(rel_diff(dev.get<float>(dscores), want) <= 1e-4);
    // top_k + set_visible on the CPU's scores (identical input on both backends)
    const int32_t k = s.k;
    std::vector<int32_t> idx(k * T);
    std::vector<float> val(k * T);
    cpu.top_k(host(want, F32, {n, T}), k, host(idx, I32, {k, T}), host(val, F32, {k, T}));
    const Tensor dwant = dev.put(want, F32, {n, T}), didx = dev.poisoned(I32, {k, T}), dval = dev.poisoned(F32, {k, T});
    gpu.top_k(dwant, k, didx, dval);
    CHECK(dev.get<int32_t>(didx) == idx);
    CHECK(dev.get<float>(dval) == val);
    const int64_t offset = 3, rows = offset + n;
    std::vector<int8_t> mask = random_mask(static_cast<size_t>(rows * T), rng, 0.1);
    const Tensor dmask = dev.put(mask, I8, {rows, T});
    cpu.set_visible(host(idx, I32, {k, T}), host(val, F32, {k, T}), offset, host(mask, I8, {rows, T}));
    gpu.set_visible(didx, dval, offset, dmask);
    CHECK(dev.get<int8_t>(dmask) == mask);
  }
}
