// The Kimi-Linear / Kimi-K3 ops on CUDA against the CPU reference backend on fresh seeded random
// inputs, at Kimi-Linear-48B shapes (KDA 32 heads x 128, conv width 4 over 4096 channels, MLA 32
// heads with qk 192 / v 128 over 600 cached keys), at the Kimi-K3 hidden width (7168, AttnRes
// with up to 5 banked sources) and at odd small shapes (sizes not multiples of 32). Device
// outputs are poisoned with 0xFF bytes (NaN for f32) before each call; a non-finite output where
// the CPU has a finite one never passes. Thresholds (max |gpu − cpu| / max |cpu| over the output):
//   sigmoid, kda_gate: 1e-6 (expf / log1pf vs the C library);
//   short_conv_silu: 1e-6 outputs (FMA), the state exactly (a copy of input rows);
//   l2_normalize, gated_rms_norm: 1e-5 (block reduction order);
//   kda_recurrence: 1e-4 outputs and state (float sums over dk in the same order, expf, FMA;
//   17 tokens of state carried);
//   causal_attention: 1e-4 (online softmax vs the CPU's two passes, float);
//   attn_res_mix: 1e-4 (two reductions over 7168 values feed a softmax).
#include "backend/cpu_backend.hpp"
#include "backend/cuda/cuda_backend.hpp"
#include "gpu_arena.hpp"
#include "support/catch.hpp"

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

using namespace ep::backend;
using ep::backend::cuda::CudaBackend;
using ep::format::GgmlType;
using ep::test::gpu::Arena;
using ep::test::gpu::host;
using ep::test::gpu::rel_diff;

namespace {

constexpr GgmlType F32 = GgmlType::f32;

struct Backends {
  CudaBackend gpu;
  CpuBackend cpu;
  std::mt19937 rng{47};
};

std::vector<float> randn(size_t n, std::mt19937 &rng, float sd = 1.0f) {
  std::normal_distribution<float> nd(0.0f, sd);
  std::vector<float> v(n);
  for (float &x : v) x = nd(rng);
  return v;
}

double report(const char *op, const char *shape, double rel, double limit) {
  std::printf("kimi_ops_gpu %s %s: rel %.3g (limit %.3g)\n", op, shape, rel, limit);
  return rel;
}

}  // namespace

TEST_CASE_METHOD(Backends, "short_conv_silu on CUDA equals the CPU, state carried over calls", "[gpu][kimi]") {
  struct Shape {
    int64_t C, K;
  };
  for (const Shape s : {Shape{4096, 4}, Shape{37, 3}, Shape{70, 16}}) {
    Arena dev(gpu);
    auto w = randn(static_cast<size_t>(s.C * s.K), rng, 0.5f);
    auto state = randn(static_cast<size_t>(s.C * (s.K - 1)), rng);
    const Tensor dw = dev.put(w, F32, {s.K, s.C}), dstate = dev.put(state, F32, {s.C, s.K - 1});
    for (const int64_t T : {int64_t{5}, int64_t{1}, int64_t{37}, int64_t{2}}) {  // one state through all calls
      auto x = randn(static_cast<size_t>(s.C * T), rng);
      std::vector<float> want(x.size());
      cpu.short_conv_silu(host(x, F32, {s.C, T}), host(w, F32, {s.K, s.C}), host(state, F32, {s.C, s.K - 1}),
                          host(want, F32, {s.C, T}));
      const Tensor dx = dev.put(x, F32, {s.C, T}), dy = dev.poisoned(F32, {s.C, T});
      gpu.short_conv_silu(dx, dw, dstate, dy);
      CHECK(report("short_conv_silu", "y", rel_diff(dev.get<float>(dy), want), 1e-6) <= 1e-6);
      CHECK(dev.get<float>(dstate) == state);
    }
  }
}

TEST_CASE_METHOD(Backends, "l2_normalize, sigmoid, kda_gate, gated_rms_norm on CUDA equal the CPU", "[gpu][kimi]") {
  Arena dev(gpu);
  struct Shape {
    int64_t dk, H, T;
  };
  for (const Shape s : {Shape{128, 32, 9}, Shape{40, 3, 5}}) {
    const int64_t n = s.dk * s.H * s.T;
    auto x = randn(static_cast<size_t>(n), rng, 2.0f);
    std::vector<float> want(x.size());
    const Tensor dx = dev.put(x, F32, {s.dk, s.H * s.T});
    // l2 norm with a scale, out of place and in place
    cpu.l2_normalize(host(x, F32, {s.dk, s.H * s.T}), 1e-6f, 0.125f, host(want, F32, {s.dk, s.H * s.T}));
    const Tensor dy = dev.poisoned(F32, {s.dk, s.H * s.T});
    gpu.l2_normalize(dx, 1e-6f, 0.125f, dy);
    CHECK(report("l2_normalize", "", rel_diff(dev.get<float>(dy), want), 1e-5) <= 1e-5);
    const Tensor dxi = dev.put(x, F32, {s.dk, s.H * s.T});
    gpu.l2_normalize(dxi, 1e-6f, 0.125f, dxi);
    CHECK(rel_diff(dev.get<float>(dxi), want) <= 1e-5);
    // sigmoid
    cpu.sigmoid(host(x, F32, {n}), host(want, F32, {n}));
    const Tensor ds = dev.poisoned(F32, {n});
    gpu.sigmoid(dev.put(x, F32, {n}), ds);
    CHECK(report("sigmoid", "", rel_diff(dev.get<float>(ds), want), 1e-6) <= 1e-6);
    // the decay gate, both forms (f beyond 20 included through the scale of x)
    auto f = randn(static_cast<size_t>(n), rng, 8.0f), bias = randn(static_cast<size_t>(s.dk * s.H), rng),
         a = randn(static_cast<size_t>(s.H), rng);
    for (float &v : a) v = -std::exp(v);
    for (const float lb : {0.0f, -5.0f}) {
      cpu.kda_gate(host(f, F32, {s.dk, s.H, s.T}), host(bias, F32, {s.dk * s.H}), host(a, F32, {s.H}), lb,
                   host(want, F32, {s.dk, s.H, s.T}));
      const Tensor dg = dev.poisoned(F32, {s.dk, s.H, s.T});
      gpu.kda_gate(dev.put(f, F32, {s.dk, s.H, s.T}), dev.put(bias, F32, {s.dk * s.H}), dev.put(a, F32, {s.H}), lb, dg);
      CHECK(report("kda_gate", lb < 0 ? "lower-bounded" : "softplus", rel_diff(dev.get<float>(dg), want), 1e-6) <= 1e-6);
    }
    // gated RMS norm, out of place and in place
    auto gate = randn(static_cast<size_t>(n), rng, 3.0f), w = randn(static_cast<size_t>(s.dk), rng);
    cpu.gated_rms_norm(host(x, F32, {s.dk, s.H * s.T}), host(w, F32, {s.dk}), host(gate, F32, {s.dk, s.H * s.T}), 1e-5f,
                       host(want, F32, {s.dk, s.H * s.T}));
    const Tensor dgate = dev.put(gate, F32, {s.dk, s.H * s.T}), dwt = dev.put(w, F32, {s.dk});
    const Tensor dn = dev.poisoned(F32, {s.dk, s.H * s.T});
    gpu.gated_rms_norm(dx, dwt, dgate, 1e-5f, dn);
    CHECK(report("gated_rms_norm", "", rel_diff(dev.get<float>(dn), want), 1e-5) <= 1e-5);
    const Tensor dxn = dev.put(x, F32, {s.dk, s.H * s.T});
    gpu.gated_rms_norm(dxn, dwt, dgate, 1e-5f, dxn);
    CHECK(rel_diff(dev.get<float>(dxn), want) <= 1e-5);
  }
}

TEST_CASE_METHOD(Backends, "kda_recurrence on CUDA equals the CPU (outputs and state)", "[gpu][kimi]") {
  struct Shape {
    int64_t dk, dv, H;
  };
  for (const Shape s : {Shape{128, 128, 32}, Shape{40, 72, 3}, Shape{256, 16, 2}}) {
    Arena dev(gpu);
    // the model's inputs: unit q (scaled) and k, negative log-decays, β in (0, 1)
    auto S = randn(static_cast<size_t>(s.dk * s.dv * s.H), rng, 0.5f);
    const Tensor dS = dev.put(S, F32, {s.dv, s.dk, s.H});
    for (const int64_t T : {int64_t{17}, int64_t{1}, int64_t{3}}) {
      auto q = randn(static_cast<size_t>(s.dk * s.H * T), rng), k = randn(q.size(), rng), g = randn(q.size(), rng, 0.5f),
           v = randn(static_cast<size_t>(s.dv * s.H * T), rng), beta = randn(static_cast<size_t>(s.H * T), rng);
      cpu.l2_normalize(host(q, F32, {s.dk, s.H * T}), 1e-6f, 1.0f / std::sqrt(static_cast<float>(s.dk)),
                       host(q, F32, {s.dk, s.H * T}));
      cpu.l2_normalize(host(k, F32, {s.dk, s.H * T}), 1e-6f, 1.0f, host(k, F32, {s.dk, s.H * T}));
      for (float &x : g) x = -std::fabs(x);
      cpu.sigmoid(host(beta, F32, {s.H * T}), host(beta, F32, {s.H * T}));
      std::vector<float> want(v.size());
      cpu.kda_recurrence(host(q, F32, {s.dk, s.H, T}), host(k, F32, {s.dk, s.H, T}), host(v, F32, {s.dv, s.H, T}),
                         host(g, F32, {s.dk, s.H, T}), host(beta, F32, {s.H, T}), host(S, F32, {s.dv, s.dk, s.H}),
                         host(want, F32, {s.dv, s.H, T}));
      const Tensor dout = dev.poisoned(F32, {s.dv, s.H, T});
      gpu.kda_recurrence(dev.put(q, F32, {s.dk, s.H, T}), dev.put(k, F32, {s.dk, s.H, T}), dev.put(v, F32, {s.dv, s.H, T}),
                         dev.put(g, F32, {s.dk, s.H, T}), dev.put(beta, F32, {s.H, T}), dS, dout);
      char shape[96];
      std::snprintf(shape, sizeof shape, "dk %lld dv %lld H %lld T %lld", static_cast<long long>(s.dk),
                    static_cast<long long>(s.dv), static_cast<long long>(s.H), static_cast<long long>(T));
      CHECK(report("kda_recurrence out", shape, rel_diff(dev.get<float>(dout), want), 1e-4) <= 1e-4);
      CHECK(report("kda_recurrence state", shape, rel_diff(dev.get<float>(dS), S), 1e-4) <= 1e-4);
    }
  }
}

TEST_CASE_METHOD(Backends, "causal_attention on CUDA equals the CPU", "[gpu][kimi]") {
  struct Shape {
    int64_t dqk, dv, H, T, n_past, n_keys;
  };
  for (const Shape s : {Shape{192, 128, 32, 1, 600, 640}, Shape{192, 128, 32, 13, 20, 33}, Shape{24, 40, 3, 7, 0, 9},
                        Shape{512, 512, 2, 2, 70, 72}, Shape{64, 16, 4, 65, 0, 65}}) {
    Arena dev(gpu);
    auto q = randn(static_cast<size_t>(s.dqk * s.H * s.T), rng), keys = randn(static_cast<size_t>(s.dqk * s.H * s.n_keys), rng),
         values = randn(static_cast<size_t>(s.dv * s.H * s.n_keys), rng);
    const float scale = 1.0f / std::sqrt(static_cast<float>(s.dqk));
    std::vector<float> want(static_cast<size_t>(s.dv * s.H * s.T));
    cpu.causal_attention(host(q, F32, {s.dqk, s.H, s.T}), host(keys, F32, {s.dqk, s.H, s.n_keys}),
                         host(values, F32, {s.dv, s.H, s.n_keys}), s.n_past, scale, host(want, F32, {s.dv, s.H, s.T}));
    const Tensor dout = dev.poisoned(F32, {s.dv, s.H, s.T});
    gpu.causal_attention(dev.put(q, F32, {s.dqk, s.H, s.T}), dev.put(keys, F32, {s.dqk, s.H, s.n_keys}),
                         dev.put(values, F32, {s.dv, s.H, s.n_keys}), s.n_past, scale, dout);
    char shape[96];
    std::snprintf(shape, sizeof shape, "qk %lld v %lld H %lld T %lld past %lld", static_cast<long long>(s.dqk),
                  static_cast<long long>(s.dv), static_cast<long long>(s.H), static_cast<long long>(s.T),
                  static_cast<long long>(s.n_past));
    CHECK(report("causal_attention", shape, rel_diff(dev.get<float>(dout), want), 1e-4) <= 1e-4);
  }
}

TEST_CASE_METHOD(Backends, "attn_res_mix on CUDA equals the CPU", "[gpu][kimi]") {
  struct Shape {
    int64_t D, T, nb;
  };
  for (const Shape s : {Shape{7168, 3, 5}, Shape{7168, 1, 0}, Shape{100, 9, 1}, Shape{2304, 2, 2}}) {
    Arena dev(gpu);
    auto banked = randn(static_cast<size_t>(s.D * s.T * s.nb), rng, 3.0f), cur = randn(static_cast<size_t>(s.D * s.T), rng, 3.0f),
         w = randn(static_cast<size_t>(s.D), rng, 0.2f);
    std::vector<float> want(cur.size());
    const Tensor hb = s.nb ? host(banked, F32, {s.D, s.T, s.nb}) : Tensor{};
    cpu.attn_res_mix(s.nb ? &hb : nullptr, host(cur, F32, {s.D, s.T}), host(w, F32, {s.D}), 1e-6f, host(want, F32, {s.D, s.T}));
    const Tensor db = s.nb ? dev.put(banked, F32, {s.D, s.T, s.nb}) : Tensor{};
    const Tensor dout = dev.poisoned(F32, {s.D, s.T});
    gpu.attn_res_mix(s.nb ? &db : nullptr, dev.put(cur, F32, {s.D, s.T}), dev.put(w, F32, {s.D}), 1e-6f, dout);
    char shape[64];
    std::snprintf(shape, sizeof shape, "D %lld T %lld banked %lld", static_cast<long long>(s.D), static_cast<long long>(s.T),
                  static_cast<long long>(s.nb));
    CHECK(report("attn_res_mix", shape, rel_diff(dev.get<float>(dout), want), 1e-4) <= 1e-4);
  }
}
