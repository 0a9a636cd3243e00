// Every CUDA op against the CPU reference backend on fresh random inputs. Device outputs are
// poisoned with 0xFF bytes (NaN for f32, −1 for i32) before each call; a NaN never passes.
// Thresholds (relative to the largest magnitude of the reference output):
//   dequantization and embedding: bit-exact (f32) / equal to the rounded CPU value (bf16);
//   GEMV path (<= 8 tokens, fp32 accumulation in a different order): 1e-4;
//   GEMM path (> 8 tokens; the default split f16 mode: weights and x as f16 halves at per-row and
//   per-token powers of two, tensor cores, f32 sums; and the exact f32 mode): 1e-4; the split
//   GEMM over wide ranges: each output within 1e-4 of Σ|w·x| (its own scale);
//   norms, RoPE, softmax, activations, router weights: 1e-5 (RoPE 1e-4 at large positions);
//   router and top-k indices, greedy and seeded sampling: equal.
#include "backend/cpu_backend.hpp"
#include "backend/dequant.hpp"
#include "gpu/check.hpp"
#include "backend/cuda/cuda_backend.hpp"
#include "backend/cuda/kernels.hpp"
#include "backend/cuda/split_f16.cuh"
#include "backend/expert_batch.hpp"
#include "backend/random_weights.hpp"
#include "support/catch.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <random>
#include <string>
#include <vector>

using namespace ep::backend;
using ep::backend::cuda::CudaBackend;
using ep::format::GgmlType;

namespace {

// A device copy of a host vector (or an uninitialised, poisoned buffer) owned by the test.
struct DevBuf {
  CudaBackend &be;
  void *p = nullptr;
  uint64_t bytes = 0;
  // Poisoned on the backend's own stream: that stream is non-blocking, so a memset on the
  // legacy default stream could land after the kernel under test and overwrite its output.
  DevBuf(CudaBackend &b, uint64_t n) : be(b), p(b.allocate(n)), bytes(n) {
    EP_CUDA_CHECK(cudaMemsetAsync(p, 0xFF, n, b.stream()));
    EP_CUDA_CHECK(cudaStreamSynchronize(b.stream()));
  }
  template <typename T>
  DevBuf(CudaBackend &b, const std::vector<T> &v) : DevBuf(b, v.size() * sizeof(T)) {
    b.upload(p, v.data(), bytes);
  }
  ~DevBuf() { be.deallocate(p); }
  DevBuf(const DevBuf &) = delete;
  template <typename T>
  std::vector<T> get() {
    std::vector<T> v(bytes / sizeof(T));
    be.download(v.data(), p, bytes);
    return v;
  }
};

Tensor t_of(void *p, GgmlType type, Device dev, std::initializer_list<int64_t> shape) {
  return Tensor::make(p, type, dev, shape);
}

// max |a − b| / max |b| over the vectors; +inf when any a is not finite.
double rel_err(const std::vector<float> &a, const std::vector<float> &b) {
  REQUIRE(a.size() == b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    num = std::max(num, std::fabs(static_cast<double>(a[i]) - b[i]));
    den = std::max(den, std::fabs(static_cast<double>(b[i])));
  }
  return den > 0 ? num / den : num;
}

}  // namespace

TEST_CASE("dequantization on the GPU is bit-exact with the CPU for every type", "[gpu][dequant]") {
  CudaBackend be;
  std::mt19937 rng(21);
  for (GgmlType type : ep::test::every_weight_type()) {
    const int64_t k = 768, rows = 9;
    auto w = ep::test::random_weights(type, k, rows, rng);
    DevBuf dw(be, w), out(be, static_cast<uint64_t>(k * rows) * 4), out16(be, static_cast<uint64_t>(k * rows) * 2);
    ep::backend::cuda::launch_dequant_rows(static_cast<uint32_t>(type), dw.p, k, rows, static_cast<float *>(out.p), nullptr, be.stream());
    ep::backend::cuda::launch_dequant_rows(static_cast<uint32_t>(type), dw.p, k, rows, nullptr, static_cast<uint16_t *>(out16.p),
                                  be.stream());
    const auto got = out.get<float>();
    const auto got16 = out16.get<uint16_t>();
    std::vector<float> want(static_cast<size_t>(k * rows));
    dequantize_row(type, w.data(), want.data(), k * rows);
    int bad = 0, bad16 = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      bad += std::memcmp(&got[i], &want[i], 4) != 0;
      bad16 += got16[i] != fp32_to_bf16(want[i]);
    }
    INFO("type " << static_cast<int>(type));
    CHECK(bad == 0);
    CHECK(bad16 == 0);
  }
}

TEST_CASE("matmul (GEMV and GEMM paths) matches the CPU for every type", "[gpu][matmul]") {
  CudaBackend gpu;
  CpuBackend cpu;
  REQUIRE(gpu.gemm_mode() == ep::backend::cuda::GemmMode::split_f16);  // the default
  std::mt19937 rng(22);
  struct Shape {
    int64_t k, n;
  };
  // the kernels launch_gemv picks for these small matrices (generic, pipe or rows for one token,
  // mma for 2..8 tokens of mxfp4, q2_K, q3_K, iq2_xxs and q8_0; every family on its own:
  // gemv_gpu_test), then the GEMM path above kGemvMaxTokens tokens
  // (types without GEMV kernels take dequantization + cuBLAS at every token count)
  for (GgmlType type : ep::test::every_weight_type()) {
    for (Shape s : {Shape{512, 37}, Shape{3584, 24}}) {  // odd rows; 3584 = unaligned q3_K rows
      auto w = ep::test::random_weights(type, s.k, s.n, rng);
      DevBuf dw(gpu, w);
      for (int64_t t : {int64_t{1}, int64_t{3}, int64_t{8}, int64_t{20}}) {
        auto x = ep::test::random_floats(static_cast<size_t>(s.k * t), rng);
        DevBuf dx(gpu, x), dy(gpu, static_cast<uint64_t>(s.n * t) * 4);
        std::vector<float> want(static_cast<size_t>(s.n * t));
        cpu.matmul(t_of(w.data(), type, Device::cpu, {s.k, s.n}), t_of(x.data(), GgmlType::f32, Device::cpu, {s.k, t}),
                   t_of(want.data(), GgmlType::f32, Device::cpu, {s.n, t}));
        gpu.matmul(t_of(dw.p, type, Device::cuda, {s.k, s.n}), t_of(dx.p, GgmlType::f32, Device::cuda, {s.k, t}),
                   t_of(dy.p, GgmlType::f32, Device::cuda, {s.n, t}));
        const double err = rel_err(dy.get<float>(), want);
        const double limit = 1e-4;  // GEMV kernels and the default (split f16) prefill GEMM alike
        INFO("type " << static_cast<int>(type) << " k " << s.k << " n " << s.n << " tokens " << t << " err " << err);
        CHECK(err <= limit);
      }
    }
  }
}

namespace {

// The dequantized rows of W [k][n] (any type) and y = W·x in double: the reference of the split
// GEMM's cases, with Σ|w·x| per output (the scale of its rounding).
struct DoubleRef {
  std::vector<double> y, abs;
};
DoubleRef double_matmul(GgmlType type, const std::vector<uint8_t> &w, int64_t k, int64_t n, const std::vector<float> &x,
                        int64_t t) {
  std::vector<float> wf(static_cast<size_t>(k * n));
  dequantize_row(type, w.data(), wf.data(), k * n);
  DoubleRef r{std::vector<double>(static_cast<size_t>(n * t)), std::vector<double>(static_cast<size_t>(n * t))};
  for (int64_t i = 0; i < t; ++i)
    for (int64_t row = 0; row < n; ++row) {
      double sum = 0, abs = 0;
      for (int64_t j = 0; j < k; ++j) {
        const double p = static_cast<double>(wf[static_cast<size_t>(row * k + j)]) * x[static_cast<size_t>(i * k + j)];
        sum += p;
        abs += std::fabs(p);
      }
      r.y[static_cast<size_t>(i * n + row)] = sum;
      r.abs[static_cast<size_t>(i * n + row)] = abs;
    }
  return r;
}

// max over outputs of |got − want| / Σ|w·x| (+inf for a non-finite output).
double scaled_err(const std::vector<float> &got, const DoubleRef &ref) {
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    if (ref.abs[i] > 0) worst = std::max(worst, std::fabs(got[i] - ref.y[i]) / ref.abs[i]);
    else if (got[i] != 0.0f) return INFINITY;
  }
  return worst;
}

}  // namespace

TEST_CASE("split f16 GEMM: rows over 1e-4..1e2 and tokens over 1e-6..1e4 keep f32 accuracy each", "[gpu][matmul][split]") {
  // Each row and each token has its own power of two, so every output keeps ~22 bits of each factor
  // whatever its own magnitude: checked per output against Σ|w·x| of that output (a bound relative
  // to max|y| would hide the small rows and tokens), beside the exact f32 mode's error. Also a
  // row and a token far outside f16's range (1e15, 1e-10; 1e-20, 1e20). Without the per-row or per-token
  // scale the 1e-6 tokens and the 1e-20 token would fall into f16's subnormals and miss the bound.
  using ep::backend::cuda::GemmMode;
  CudaBackend gpu;
  std::mt19937 rng(31);
  const int64_t k = 1024, n = 66, t = 18;
  std::vector<float> w(static_cast<size_t>(k * n));
  for (int64_t r = 0; r < n; ++r) {
    const double scale = r == n - 1 ? 1e15 : r == n - 2 ? 1e-10 : std::pow(10.0, -4.0 + 6.0 * static_cast<double>(r) / (n - 3));
    for (int64_t j = 0; j < k; ++j)
      w[static_cast<size_t>(r * k + j)] = static_cast<float>(std::uniform_real_distribution<double>(-1, 1)(rng) * scale);
  }
  std::vector<float> x(static_cast<size_t>(k * t));
  for (int64_t i = 0; i < t; ++i) {
    const double scale = i == t - 1 ? 1e20 : i == t - 2 ? 1e-20 : std::pow(10.0, -6.0 + 10.0 * static_cast<double>(i) / (t - 3));
    for (int64_t j = 0; j < k; ++j)
      x[static_cast<size_t>(i * k + j)] = static_cast<float>(std::uniform_real_distribution<double>(-1, 1)(rng) * scale);
  }
  std::vector<uint8_t> wb(w.size() * 4);
  std::memcpy(wb.data(), w.data(), wb.size());
  for (GgmlType type : {GgmlType::f32, GgmlType::f16}) {
    // f16 weights: rows 1e-4.. as f16 values (1e15 and 1e-10 become inf and 0: those rows dropped)
    const int64_t rows = type == GgmlType::f32 ? n : n - 2;
    std::vector<uint8_t> wt = wb;
    if (type == GgmlType::f16) {
      wt.assign(static_cast<size_t>(k * rows) * 2, 0);
      for (size_t i = 0; i < static_cast<size_t>(k * rows); ++i) {
        const uint16_t v = fp32_to_fp16(w[i]);
        std::memcpy(wt.data() + 2 * i, &v, 2);
      }
    }
    const DoubleRef ref = double_matmul(type, wt, k, rows, x, t);
    DevBuf dw(gpu, wt), dx(gpu, x);
    double err[2] = {0, 0};
    for (GemmMode mode : {GemmMode::split_f16, GemmMode::exact_f32}) {
      DevBuf dy(gpu, static_cast<uint64_t>(rows * t) * 4);
      gpu.matmul_gemm(t_of(dw.p, type, Device::cuda, {k, rows}), t_of(dx.p, GgmlType::f32, Device::cuda, {k, t}),
                      t_of(dy.p, GgmlType::f32, Device::cuda, {rows, t}), mode);
      err[mode == GemmMode::split_f16 ? 0 : 1] = scaled_err(dy.get<float>(), ref);
    }
    std::printf("split f16 GEMM, %s weights, rows 1e-4..1e2 (and 1e-10, 1e15), tokens 1e-6..1e4 (and 1e+-20): max |err| / "
                "sum|w*x| split %.3g, exact f32 %.3g\n",
                type == GgmlType::f32 ? "f32" : "f16", err[0], err[1]);
    INFO("type " << static_cast<int>(type) << " split " << err[0] << " exact " << err[1]);
    CHECK(err[0] <= 1e-4);
    CHECK(err[1] <= 1e-4);
  }
}

TEST_CASE("EP_CUDA_GEMM picks the GEMM mode by name; any other value is refused", "[gpu][matmul][split]") {
  using ep::backend::cuda::GemmMode;
  struct Restore {  // the environment as it was, however the case ends
    const char *before = std::getenv("EP_CUDA_GEMM");
    std::string saved = before ? before : "";
    ~Restore() {
      if (before) {
        setenv("EP_CUDA_GEMM", saved.c_str(), 1);
      } else {
        unsetenv("EP_CUDA_GEMM");
      }
    }
  } restore;
  for (auto [name, mode] : {std::pair{"split", GemmMode::split_f16}, std::pair{"exact", GemmMode::exact_f32},
                            std::pair{"bf16", GemmMode::fast_bf16}}) {
    GemmMode parsed{};
    CHECK(ep::backend::cuda::parse_gemm_mode(name, parsed));
    CHECK(parsed == mode);
    CHECK(std::string(ep::backend::cuda::gemm_mode_name(mode)) == name);
    REQUIRE(setenv("EP_CUDA_GEMM", name, 1) == 0);
    CudaBackend gpu;
    CHECK(gpu.gemm_mode() == mode);
  }
  GemmMode untouched = GemmMode::exact_f32;
  CHECK_FALSE(ep::backend::cuda::parse_gemm_mode("f32", untouched));
  CHECK(untouched == GemmMode::exact_f32);
  REQUIRE(setenv("EP_CUDA_GEMM", "fast", 1) == 0);
  std::string refused;
  try {
    CudaBackend bad;
  } catch (const std::exception &e) {
    refused = e.what();
  }
  INFO(refused);
  CHECK(refused.find("EP_CUDA_GEMM is 'fast'") != std::string::npos);
}

TEST_CASE("split f16 GEMM: NaN reaches the outputs it touches, zeros stay zero, inf gives NaN", "[gpu][matmul][split]") {
  CudaBackend gpu;
  CpuBackend cpu;
  std::mt19937 rng(32);
  const int64_t k = 512, n = 40, t = 12;
  const int64_t nan_tok = 3, inf_tok = 7, zero_tok = 9, zero_row = 5, nan_row = 11;
  auto w = ep::test::random_floats(static_cast<size_t>(k * n), rng);
  auto x = ep::test::random_floats(static_cast<size_t>(k * t), rng);
  x[static_cast<size_t>(nan_tok * k + 17)] = std::nanf("");
  x[static_cast<size_t>(inf_tok * k + 100)] = INFINITY;
  std::fill(x.begin() + zero_tok * k, x.begin() + (zero_tok + 1) * k, 0.0f);
  std::fill(w.begin() + zero_row * k, w.begin() + (zero_row + 1) * k, 0.0f);
  w[static_cast<size_t>(nan_row * k + 300)] = std::nanf("");
  DevBuf dw(gpu, w), dx(gpu, x), dy(gpu, static_cast<uint64_t>(n * t) * 4);
  std::vector<float> want(static_cast<size_t>(n * t));
  cpu.matmul(t_of(w.data(), GgmlType::f32, Device::cpu, {k, n}), t_of(x.data(), GgmlType::f32, Device::cpu, {k, t}),
             t_of(want.data(), GgmlType::f32, Device::cpu, {n, t}));
  gpu.matmul_gemm(t_of(dw.p, GgmlType::f32, Device::cuda, {k, n}), t_of(dx.p, GgmlType::f32, Device::cuda, {k, t}),
                  t_of(dy.p, GgmlType::f32, Device::cuda, {n, t}), ep::backend::cuda::GemmMode::split_f16);
  const auto got = dy.get<float>();
  double num = 0, den = 0;
  int wrong = 0;
  for (int64_t i = 0; i < t; ++i)
    for (int64_t r = 0; r < n; ++r) {
      const float g = got[static_cast<size_t>(i * n + r)], c = want[static_cast<size_t>(i * n + r)];
      INFO("token " << i << " row " << r << " got " << g << " cpu " << c);
      if (i == nan_tok || i == inf_tok || r == nan_row) {
        // the math (the CPU) gives NaN here, or ±inf for the inf token: the split GEMM NaN
        wrong += !std::isnan(g);
        if (i != inf_tok) wrong += !std::isnan(c);
      } else if (i == zero_tok || r == zero_row) {
        wrong += g != 0.0f;
      } else {
        wrong += !std::isfinite(g);
        num = std::max(num, std::fabs(static_cast<double>(g) - c));
        den = std::max(den, std::fabs(static_cast<double>(c)));
      }
    }
  CHECK(wrong == 0);
  CHECK(num / den <= 1e-4);
}

TEST_CASE("split f16 GEMM against the exact f32 GEMM on every kind of weight and token count", "[gpu][matmul][split]") {
  using ep::backend::cuda::GemmMode;
  CudaBackend gpu;
  std::mt19937 rng(33);
  const int64_t k = 2048, n = 256;
  for (GgmlType type : {GgmlType::q8_0, GgmlType::iq2_xxs, GgmlType::q2_k, GgmlType::f16, GgmlType::f32}) {
    auto w = ep::test::random_weights(type, k, n, rng);
    DevBuf dw(gpu, w);
    const Tensor wt = t_of(dw.p, type, Device::cuda, {k, n});
    for (int64_t t : {int64_t{9}, int64_t{16}, int64_t{64}, int64_t{512}}) {
      auto x = ep::test::random_floats(static_cast<size_t>(k * t), rng);
      DevBuf dx(gpu, x), exact(gpu, static_cast<uint64_t>(n * t) * 4), split(gpu, static_cast<uint64_t>(n * t) * 4);
      const Tensor xt = t_of(dx.p, GgmlType::f32, Device::cuda, {k, t});
      gpu.matmul_gemm(wt, xt, t_of(exact.p, GgmlType::f32, Device::cuda, {n, t}), GemmMode::exact_f32);
      gpu.matmul_gemm(wt, xt, t_of(split.p, GgmlType::f32, Device::cuda, {n, t}), GemmMode::split_f16);
      const double err = rel_err(split.get<float>(), exact.get<float>());
      const std::string name(ep::format::ggml_type_info(static_cast<uint32_t>(type))->name);
      std::printf("split f16 vs exact f32 GEMM, %-8s %4lld tokens: max|diff| / max|y| %.3g\n", name.c_str(),
                  static_cast<long long>(t), err);
      INFO("type " << static_cast<int>(type) << " tokens " << t << " err " << err);
      CHECK(err <= 1e-4);
    }
  }
}

TEST_CASE("split f16 halves on the device equal the host's split function bit for bit", "[gpu][matmul][split]") {
  // split_f16.cuh runs the hardware's f16 conversions on the device and backend::fp32_to_fp16 on the
  // host (where split_f16_test checks its bounds): the same halves and exponents from both, for
  // rows and tokens over f32's whole range, subnormals, zero, NaN and inf included.
  namespace sp = ep::backend::cuda::split;
  CudaBackend gpu;
  std::mt19937 rng(34);
  const int64_t k = 256, rows = 40;
  std::vector<float> v(static_cast<size_t>(k * rows));
  for (int64_t r = 0; r < rows; ++r) {
    const int top = -149 + static_cast<int>(r * 276 / (rows - 1));  // the row's largest exponent, -149..127
    for (int64_t j = 0; j < k; ++j) {
      const int e = std::max(-149, top - static_cast<int>(rng() % 40));
      v[static_cast<size_t>(r * k + j)] = std::ldexp(std::uniform_real_distribution<float>(1, 2)(rng), e) * (rng() % 2 ? 1.f : -1.f);
    }
  }
  std::fill(v.begin() + 3 * k, v.begin() + 4 * k, 0.0f);
  v[static_cast<size_t>(5 * k + 7)] = std::nanf("");
  v[static_cast<size_t>(6 * k + 9)] = -INFINITY;
  DevBuf dv(gpu, v), dw(gpu, static_cast<uint64_t>(3 * k * rows) * 2), dwe(gpu, static_cast<uint64_t>(rows) * 4);
  DevBuf dx(gpu, static_cast<uint64_t>(3 * k * rows) * 2), dxe(gpu, static_cast<uint64_t>(rows) * 4);
  // the same values as f32 weight rows and as tokens
  ep::backend::cuda::launch_dequant_rows_split(static_cast<uint32_t>(GgmlType::f32), dv.p, k, rows, static_cast<uint16_t *>(dw.p),
                                               static_cast<int32_t *>(dwe.p), gpu.stream());
  ep::backend::cuda::launch_split_tokens(static_cast<const float *>(dv.p), k, rows, static_cast<uint16_t *>(dx.p),
                                         static_cast<int32_t *>(dxe.p), gpu.stream());
  const auto w_halves = dw.get<uint16_t>(), x_halves = dx.get<uint16_t>();
  const auto w_exps = dwe.get<int32_t>(), x_exps = dxe.get<int32_t>();
  auto same = [](uint16_t a, uint16_t b) {
    const bool nan_a = (a & 0x7C00) == 0x7C00 && (a & 0x3FF), nan_b = (b & 0x7C00) == 0x7C00 && (b & 0x3FF);
    return nan_a || nan_b ? nan_a && nan_b : a == b;
  };
  int bad = 0;
  for (int64_t r = 0; r < rows; ++r) {
    float m = 0;
    for (int64_t j = 0; j < k; ++j) m = std::fmax(m, std::fabs(v[static_cast<size_t>(r * k + j)]));
    const int e = sp::scale_exponent(m);
    INFO("row " << r << " exponent " << e << " device " << w_exps[r] << " / " << x_exps[r]);
    CHECK(w_exps[r] == e);
    CHECK(x_exps[r] == e);
    const size_t base = static_cast<size_t>(r * 3 * k);
    for (int64_t j = 0; j < k; ++j) {
      const sp::Halves h = sp::split(v[static_cast<size_t>(r * k + j)], sp::pow2(e));
      // weights [hi | lo | hi], tokens [lo ; hi ; hi]
      bad += !same(w_halves[base + j], h.hi) || !same(w_halves[base + k + j], h.lo) || !same(w_halves[base + 2 * k + j], h.hi);
      bad += !same(x_halves[base + j], h.lo) || !same(x_halves[base + k + j], h.hi) || !same(x_halves[base + 2 * k + j], h.hi);
    }
  }
  CHECK(bad == 0);
}

TEST_CASE("grouped_matmul matches the CPU for 1..9 tokens, each token as it is alone", "[gpu][matmul]") {
  // 1..8 tokens of q8_0 and f16: one GEMV launch over the groups (between a gather and a scatter
  // for several); 9 tokens, and q4_K and q2_K at any count: the default (a matmul per group). q8_0
  // (DeepSeek-V4's o_a) where its several-token launch runs the row kernel (gemv.cu's
  // kQ8_0SeveralTokensOnMma off): every token's outputs equal a one-token call's bit for bit (that
  // kernel sums in the one-token order); on the tensor-core kernel (the default), the CPU's
  // tolerance only.
  CudaBackend gpu;
  CpuBackend cpu;
  std::mt19937 rng(25);
  const int64_t groups = 4, k = 512, o = 48;
  for (GgmlType type : {GgmlType::q8_0, GgmlType::f16, GgmlType::q4_k, GgmlType::q2_k}) {
    auto w = ep::test::random_weights(type, k, groups * o, rng);
    DevBuf dw(gpu, w);
    const Tensor wg = t_of(dw.p, type, Device::cuda, {k, groups * o});
    for (int64_t t = 1; t <= 9; ++t) {
      auto x = ep::test::random_floats(static_cast<size_t>(groups * k * t), rng);
      DevBuf dx(gpu, x), dy(gpu, static_cast<uint64_t>(groups * o * t) * 4);
      std::vector<float> want(static_cast<size_t>(groups * o * t));
      cpu.grouped_matmul(t_of(w.data(), type, Device::cpu, {k, groups * o}), groups,
                         t_of(x.data(), GgmlType::f32, Device::cpu, {groups * k, t}),
                         t_of(want.data(), GgmlType::f32, Device::cpu, {groups * o, t}));
      gpu.grouped_matmul(wg, groups, t_of(dx.p, GgmlType::f32, Device::cuda, {groups * k, t}),
                         t_of(dy.p, GgmlType::f32, Device::cuda, {groups * o, t}));
      const auto got = dy.get<float>();
      const double err = rel_err(got, want);
      INFO("type " << static_cast<int>(type) << " tokens " << t << " err " << err);
      CHECK(err <= 1e-4);
      if (type != GgmlType::q8_0 || t > 8) continue;
      ep::backend::cuda::GemvArgs probe;  // the launch grouped_matmul makes (a table of 16-byte aligned groups)
      const void *const table[1] = {nullptr};
      probe.w_ptrs = table;
      probe.w_ptrs_aligned16 = true;
      probe.k = k;
      probe.n = o;
      probe.n_tok = static_cast<int32_t>(t);
      probe.n_mat = static_cast<int32_t>(groups);
      if (ep::backend::cuda::gemv_kernel_for(static_cast<uint32_t>(type), probe) != ep::backend::cuda::GemvKernel::rows) continue;
      for (int64_t i = 0; i < t; ++i) {  // token i alone
        DevBuf dx1(gpu, std::vector<float>(x.begin() + i * groups * k, x.begin() + (i + 1) * groups * k));
        DevBuf dy1(gpu, static_cast<uint64_t>(groups * o) * 4);
        gpu.grouped_matmul(wg, groups, t_of(dx1.p, GgmlType::f32, Device::cuda, {groups * k, 1}),
                           t_of(dy1.p, GgmlType::f32, Device::cuda, {groups * o, 1}));
        const auto alone = dy1.get<float>();
        INFO("token " << i);
        CHECK(std::memcmp(alone.data(), got.data() + i * groups * o, static_cast<size_t>(groups * o) * 4) == 0);
      }
    }
  }
}

TEST_CASE("rms_norm, rope, softmax, top_k, glu, add, embed match the CPU", "[gpu][ops]") {
  CudaBackend gpu;
  CpuBackend cpu;
  std::mt19937 rng(23);
  {  // rms_norm with and without weight
    const int64_t n = 4096, rows = 3;
    auto x = ep::test::random_floats(n * rows, rng, -4, 4);
    auto w = ep::test::random_floats(n, rng);
    DevBuf dx(gpu, x), dw(gpu, w), dy(gpu, x.size() * 4);
    std::vector<float> want(x.size());
    for (bool weighted : {false, true}) {
      Tensor wc = t_of(w.data(), GgmlType::f32, Device::cpu, {n}), wg = t_of(dw.p, GgmlType::f32, Device::cuda, {n});
      cpu.rms_norm(t_of(x.data(), GgmlType::f32, Device::cpu, {n, rows}), weighted ? &wc : nullptr, 1e-6f,
                   t_of(want.data(), GgmlType::f32, Device::cpu, {n, rows}));
      gpu.rms_norm(t_of(dx.p, GgmlType::f32, Device::cuda, {n, rows}), weighted ? &wg : nullptr, 1e-6f,
                   t_of(dy.p, GgmlType::f32, Device::cuda, {n, rows}));
      CHECK(rel_err(dy.get<float>(), want) <= 1e-5);
    }
  }
  {  // rope: DeepSeek-V4 shape (last 64 of 512, YaRN), inverse, and plain full-head rope
    const int64_t hd = 512, heads = 4, toks = 3;
    auto x = ep::test::random_floats(hd * heads * toks, rng);
    std::vector<int32_t> pos = {0, 4097, 900000};
    DevBuf dx(gpu, x), dp(gpu, pos), dy(gpu, x.size() * 4);
    RopeParams p;
    p.n_dims = 64;
    p.dim_offset = 448;
    p.theta = 160000.0f;
    p.yarn_factor = 16.0f;
    p.yarn_original_max_positions = 65536;
    for (bool inv : {false, true}) {
      p.inverse = inv;
      std::vector<float> want(x.size());
      cpu.rope(t_of(x.data(), GgmlType::f32, Device::cpu, {hd, heads, toks}), t_of(pos.data(), GgmlType::i32, Device::cpu, {toks}),
               p, t_of(want.data(), GgmlType::f32, Device::cpu, {hd, heads, toks}));
      gpu.rope(t_of(dx.p, GgmlType::f32, Device::cuda, {hd, heads, toks}), t_of(dp.p, GgmlType::i32, Device::cuda, {toks}), p,
               t_of(dy.p, GgmlType::f32, Device::cuda, {hd, heads, toks}));
      CHECK(rel_err(dy.get<float>(), want) <= 1e-4);
    }
  }
  {  // softmax and top_k (with ties)
    const int64_t n = 1000, rows = 4;
    auto x = ep::test::random_floats(n * rows, rng, -5, 5);
    x[10] = x[20] = 9.0f;  // a tie at the top of row 0
    DevBuf dx(gpu, x), dy(gpu, x.size() * 4);
    std::vector<float> want(x.size());
    cpu.softmax(t_of(x.data(), GgmlType::f32, Device::cpu, {n, rows}), t_of(want.data(), GgmlType::f32, Device::cpu, {n, rows}));
    gpu.softmax(t_of(dx.p, GgmlType::f32, Device::cuda, {n, rows}), t_of(dy.p, GgmlType::f32, Device::cuda, {n, rows}));
    CHECK(rel_err(dy.get<float>(), want) <= 1e-5);
    const int32_t k = 7;
    DevBuf di(gpu, static_cast<uint64_t>(k * rows) * 4), dv(gpu, static_cast<uint64_t>(k * rows) * 4);
    std::vector<int32_t> wi(k * rows);
    std::vector<float> wv(k * rows);
    cpu.top_k(t_of(x.data(), GgmlType::f32, Device::cpu, {n, rows}), k, t_of(wi.data(), GgmlType::i32, Device::cpu, {k, rows}),
              t_of(wv.data(), GgmlType::f32, Device::cpu, {k, rows}));
    gpu.top_k(t_of(dx.p, GgmlType::f32, Device::cuda, {n, rows}), k, t_of(di.p, GgmlType::i32, Device::cuda, {k, rows}),
              t_of(dv.p, GgmlType::f32, Device::cuda, {k, rows}));
    CHECK(di.get<int32_t>() == wi);
    CHECK(dv.get<float>() == wv);
    CHECK(wi[0] == 10);
    CHECK(wi[1] == 20);
  }
  {  // glu (clamped swiglu, situ) and add
    const int64_t n = 5000;
    auto g = ep::test::random_floats(n, rng, -20, 20), u = ep::test::random_floats(n, rng, -40, 40);
    DevBuf dg(gpu, g), du(gpu, u), dy(gpu, n * 4);
    for (Activation act : {Activation{ActivationKind::swiglu, 10.0f}, Activation{ActivationKind::situ, 0.0f, 4.0f, 25.0f}}) {
      std::vector<float> want(n);
      cpu.glu(t_of(g.data(), GgmlType::f32, Device::cpu, {n}), t_of(u.data(), GgmlType::f32, Device::cpu, {n}), act,
              t_of(want.data(), GgmlType::f32, Device::cpu, {n}));
      gpu.glu(t_of(dg.p, GgmlType::f32, Device::cuda, {n}), t_of(du.p, GgmlType::f32, Device::cuda, {n}), act,
              t_of(dy.p, GgmlType::f32, Device::cuda, {n}));
      CHECK(rel_err(dy.get<float>(), want) <= 1e-5);
    }
    std::vector<float> want(n);
    cpu.add(t_of(g.data(), GgmlType::f32, Device::cpu, {n}), t_of(u.data(), GgmlType::f32, Device::cpu, {n}),
            t_of(want.data(), GgmlType::f32, Device::cpu, {n}));
    gpu.add(t_of(dg.p, GgmlType::f32, Device::cuda, {n}), t_of(du.p, GgmlType::f32, Device::cuda, {n}),
            t_of(dy.p, GgmlType::f32, Device::cuda, {n}));
    CHECK(dy.get<float>() == want);
  }
  for (GgmlType type : {GgmlType::q6_k, GgmlType::q8_0, GgmlType::f16}) {  // embed: exact
    const int64_t d = 512, vocab = 50;
    auto table = ep::test::random_weights(type, d, vocab, rng);
    std::vector<int32_t> ids = {49, 0, 7, 7};
    DevBuf dt(gpu, table), di(gpu, ids), dy(gpu, static_cast<uint64_t>(d * 4) * 4);
    std::vector<float> want(static_cast<size_t>(d * 4));
    cpu.embed(t_of(table.data(), type, Device::cpu, {d, vocab}), t_of(ids.data(), GgmlType::i32, Device::cpu, {4}),
              t_of(want.data(), GgmlType::f32, Device::cpu, {d, 4}));
    gpu.embed(t_of(dt.p, type, Device::cuda, {d, vocab}), t_of(di.p, GgmlType::i32, Device::cuda, {4}),
              t_of(dy.p, GgmlType::f32, Device::cuda, {d, 4}));
    CHECK(dy.get<float>() == want);
  }
}

TEST_CASE("router: softmax, sigmoid + bias, sqrt-softplus, hash", "[gpu][moe]") {
  CudaBackend gpu;
  CpuBackend cpu;
  std::mt19937 rng(24);
  const int64_t n_exp = 896, toks = 5;
  auto logits = ep::test::random_floats(n_exp * toks, rng, -4, 4);
  auto bias = ep::test::random_floats(n_exp, rng, -0.5f, 0.5f);
  std::vector<int32_t> table(16 * 100), tok = {0, 99, 5, 5, 42};
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>((i * 37) % n_exp);
  DevBuf dl(gpu, logits), db(gpu, bias), dt(gpu, table), dtok(gpu, tok);
  Tensor bc = t_of(bias.data(), GgmlType::f32, Device::cpu, {n_exp}), bg = t_of(db.p, GgmlType::f32, Device::cuda, {n_exp});
  Tensor tc = t_of(table.data(), GgmlType::i32, Device::cpu, {16, 100}), tg = t_of(dt.p, GgmlType::i32, Device::cuda, {16, 100});
  Tensor kc = t_of(tok.data(), GgmlType::i32, Device::cpu, {toks}), kg = t_of(dtok.p, GgmlType::i32, Device::cuda, {toks});
  for (int mode = 0; mode < 4; ++mode) {
    RouterParams pc, pg;
    pc.k = pg.k = mode == 0 ? 8 : 16;
    pc.scoring = pg.scoring = mode == 0 ? Scoring::softmax : mode == 1 ? Scoring::sigmoid : Scoring::sqrt_softplus;
    pc.scale = pg.scale = mode >= 2 ? 1.5f : 1.0f;
    pc.renormalize = pg.renormalize = mode != 0;
    if (mode == 1) {
      pc.bias = &bc;
      pg.bias = &bg;
    }
    if (mode == 3) {
      pc.hash_table = &tc;
      pg.hash_table = &tg;
      pc.token_ids = &kc;
      pg.token_ids = &kg;
    }
    const int64_t k = pc.k;
    std::vector<int32_t> wi(k * toks);
    std::vector<float> ww(k * toks);
    DevBuf di(gpu, static_cast<uint64_t>(k * toks) * 4), dw(gpu, static_cast<uint64_t>(k * toks) * 4);
    cpu.route(t_of(logits.data(), GgmlType::f32, Device::cpu, {n_exp, toks}), pc,
              t_of(wi.data(), GgmlType::i32, Device::cpu, {k, toks}), t_of(ww.data(), GgmlType::f32, Device::cpu, {k, toks}));
    gpu.route(t_of(dl.p, GgmlType::f32, Device::cuda, {n_exp, toks}), pg, t_of(di.p, GgmlType::i32, Device::cuda, {k, toks}),
              t_of(dw.p, GgmlType::f32, Device::cuda, {k, toks}));
    INFO("mode " << mode);
    CHECK(di.get<int32_t>() == wi);
    CHECK(rel_err(dw.get<float>(), ww) <= 1e-5);
  }
}

TEST_CASE("moe (decode and grouped prefill paths), moe_pairs + moe_combine, and ffn match the CPU", "[gpu][moe]") {
  CudaBackend gpu;
  CpuBackend cpu;
  std::mt19937 rng(25);
  const int64_t d = 512, f = 256;
  const int n_exp = 6, k = 3;
  struct Types {
    GgmlType gu, down;
  };
  for (Types ty : {Types{GgmlType::mxfp4, GgmlType::mxfp4}, Types{GgmlType::q2_k, GgmlType::q3_k},
                   Types{GgmlType::iq2_xxs, GgmlType::q4_k}}) {
    const uint64_t gate_bytes = ep::format::ggml_row_bytes(ty.gu, d, "t") * f;
    const uint64_t down_bytes = ep::format::ggml_row_bytes(ty.down, f, "t") * d;
    SlotLayout l;
    l.gate = {0, ty.gu, d, f};
    l.up = {gate_bytes, ty.gu, d, f};  // packed back to back: offsets need no alignment
    l.down = {2 * gate_bytes, ty.down, f, d};
    const uint64_t slot_bytes = 2 * gate_bytes + down_bytes;
    std::vector<std::vector<uint8_t>> host(n_exp);
    std::vector<std::unique_ptr<DevBuf>> dev;
    std::vector<const void *> tc(n_exp), tg(n_exp);
    for (int e = 0; e < n_exp; ++e) {
      auto g = ep::test::random_weights(ty.gu, d, f, rng), u = ep::test::random_weights(ty.gu, d, f, rng);
      auto o = ep::test::random_weights(ty.down, f, d, rng);
      host[e].resize(slot_bytes);
      std::memcpy(host[e].data(), g.data(), g.size());
      std::memcpy(host[e].data() + l.up.offset, u.data(), u.size());
      std::memcpy(host[e].data() + l.down.offset, o.data(), o.size());
      dev.push_back(std::make_unique<DevBuf>(gpu, host[e]));
      tc[e] = host[e].data();
      tg[e] = dev.back()->p;
    }
    DevBuf slots_dev(gpu, tg);  // the expert addresses on the device (what ResidentExperts keeps)
    for (int64_t toks : {int64_t{2}, int64_t{20}}) {
      auto x = ep::test::random_floats(static_cast<size_t>(d * toks), rng);
      std::vector<int32_t> ids(static_cast<size_t>(k * toks));
      std::vector<float> w = ep::test::random_floats(ids.size(), rng, 0.1f, 1.0f);
      for (auto &id : ids) id = static_cast<int32_t>(rng() % n_exp);
      DevBuf dx(gpu, x), di(gpu, ids), dw(gpu, w), dy(gpu, static_cast<uint64_t>(d * toks) * 4);
      std::vector<float> want(static_cast<size_t>(d * toks));
      const Activation act{ActivationKind::swiglu, 10.0f};
      cpu.moe(t_of(x.data(), GgmlType::f32, Device::cpu, {d, toks}), t_of(ids.data(), GgmlType::i32, Device::cpu, {k, toks}),
              t_of(w.data(), GgmlType::f32, Device::cpu, {k, toks}), ep::test::host_batch(ids, tc, l).batch, l, act,
              t_of(want.data(), GgmlType::f32, Device::cpu, {d, toks}));
      // The GPU batch: host copies, and the role table built on the device from the ids (as the
      // resident experts do); it equals the host-built one.
      ep::test::HostBatch hg = ep::test::host_batch(ids, tg, l);
      DevBuf roles(gpu, static_cast<uint64_t>(3 * k * toks) * sizeof(void *));
      gpu.gather_role_table(t_of(di.p, GgmlType::i32, Device::cuda, {k, toks}), static_cast<const void *const *>(slots_dev.p), n_exp,
                            l, static_cast<const void **>(roles.p));
      CHECK(roles.get<const void *>() == hg.role_table);
      hg.batch.role_table = static_cast<const void *const *>(roles.p);
      CHECK(gpu.moe_reads_host_picks(toks, l) == (toks > 8));
      gpu.moe(t_of(dx.p, GgmlType::f32, Device::cuda, {d, toks}), t_of(di.p, GgmlType::i32, Device::cuda, {k, toks}),
              t_of(dw.p, GgmlType::f32, Device::cuda, {k, toks}), hg.batch, l, act, t_of(dy.p, GgmlType::f32, Device::cuda, {d, toks}));
      const double err = rel_err(dy.get<float>(), want);
      INFO("types " << static_cast<int>(ty.gu) << "/" << static_cast<int>(ty.down) << " tokens " << toks << " err " << err);
      // 20 tokens over 6 experts: some experts get > 8 tokens and take the (exact f32) cuBLAS path
      CHECK(err <= 1e-4);

      // Expert-major (a prompt pass with a small cache): moe_pairs over disjoint expert sets, each
      // with only its own slots, then moe_combine, give moe()'s bits; rows of other experts stay
      // poisoned.
      const std::vector<float> whole = dy.get<float>();
      DevBuf dp(gpu, static_cast<uint64_t>(d * k * toks) * 4), dz(gpu, static_cast<uint64_t>(d * toks) * 4);
      const Tensor P = t_of(dp.p, GgmlType::f32, Device::cuda, {d, k * toks});
      for (const std::vector<int32_t> &set : {std::vector<int32_t>{4, 0}, {1, 5, 3}, {2}}) {
        std::vector<const void *> table(static_cast<size_t>(n_exp), nullptr);
        for (int32_t e : set) table[static_cast<size_t>(e)] = tg[static_cast<size_t>(e)];
        gpu.moe_pairs(t_of(dx.p, GgmlType::f32, Device::cuda, {d, toks}), t_of(di.p, GgmlType::i32, Device::cuda, {k, toks}),
                      ep::test::host_batch(ids, table, l).batch, l, act, P);
        if (set.front() == 4) {
          const std::vector<float> rows = dp.get<float>();
          int64_t wrong = 0;
          for (int64_t p = 0; p < k * toks; ++p) {
            const bool mine = ids[static_cast<size_t>(p)] == 4 || ids[static_cast<size_t>(p)] == 0;
            for (int64_t i = 0; i < d; ++i) wrong += std::isfinite(rows[static_cast<size_t>(p * d + i)]) != mine;
          }
          CHECK(wrong == 0);
        }
      }
      gpu.moe_combine(P, t_of(dw.p, GgmlType::f32, Device::cuda, {k, toks}), t_of(dz.p, GgmlType::f32, Device::cuda, {d, toks}));
      const std::vector<float> split = dz.get<float>();
      CHECK(std::memcmp(split.data(), whole.data(), whole.size() * sizeof(float)) == 0);
      CHECK(std::isfinite(split[0]));
      ep::test::HostBatch no_host = ep::test::host_batch(ids, tg, l);  // a batch without host slots
      no_host.batch.pair_slots = nullptr;
      CHECK_THROWS_AS(gpu.moe_pairs(t_of(dx.p, GgmlType::f32, Device::cuda, {d, toks}),
                                    t_of(di.p, GgmlType::i32, Device::cuda, {k, toks}), no_host.batch, l, act, P),
                      ep::Error);
    }
    // shared expert / dense FFN on the first slot
    const int64_t toks = 2;
    auto x = ep::test::random_floats(static_cast<size_t>(d * toks), rng);
    DevBuf dx(gpu, x), dy(gpu, static_cast<uint64_t>(d * toks) * 4);
    std::vector<float> want(static_cast<size_t>(d * toks));
    const Activation act{ActivationKind::situ, 0.0f, 4.0f, 25.0f};
    const auto *hb = host[0].data();
    const auto *gb = static_cast<const uint8_t *>(tg[0]);
    cpu.ffn(t_of(x.data(), GgmlType::f32, Device::cpu, {d, toks}), t_of(const_cast<uint8_t *>(hb), ty.gu, Device::cpu, {d, f}),
            t_of(const_cast<uint8_t *>(hb + l.up.offset), ty.gu, Device::cpu, {d, f}),
            t_of(const_cast<uint8_t *>(hb + l.down.offset), ty.down, Device::cpu, {f, d}), act,
            t_of(want.data(), GgmlType::f32, Device::cpu, {d, toks}));
    gpu.ffn(t_of(dx.p, GgmlType::f32, Device::cuda, {d, toks}), t_of(const_cast<uint8_t *>(gb), ty.gu, Device::cuda, {d, f}),
            t_of(const_cast<uint8_t *>(gb + l.up.offset), ty.gu, Device::cuda, {d, f}),
            t_of(const_cast<uint8_t *>(gb + l.down.offset), ty.down, Device::cuda, {f, d}), act,
            t_of(dy.p, GgmlType::f32, Device::cuda, {d, toks}));
    CHECK(rel_err(dy.get<float>(), want) <= 1e-4);
  }
}

TEST_CASE("a prompt of IQ2_XXS experts runs the chunked tensor-core GEMVs: the CPU's result, the same bits by expert subsets",
          "[gpu][moe]") {
  // gate/up IQ2_XXS and down Q2_K have tensor-core kernels for 2..32 tokens: a prompt's experts run
  // in chunks of up to 32 of their tokens (each expert's weights read once per chunk), as the
  // other tensor-core types' do. Expert-major passes (moe_pairs over disjoint expert sets, then
  // moe_combine) give moe()'s bits; decode-sized steps (the one-token kernels over their pairs)
  // agree with the prompt's rows within the kernels' tolerance.
  CudaBackend gpu;
  CpuBackend cpu;
  std::mt19937 rng(26);
  const int64_t d = 1024, f = 2048;
  const int n_exp = 4, k = 3;
  SlotLayout l;
  const uint64_t gate_bytes = ep::format::ggml_row_bytes(GgmlType::iq2_xxs, d, "t") * f;
  const uint64_t down_bytes = ep::format::ggml_row_bytes(GgmlType::q2_k, f, "t") * d;
  l.gate = {0, GgmlType::iq2_xxs, d, f};
  l.up = {gate_bytes, GgmlType::iq2_xxs, d, f};
  l.down = {2 * gate_bytes, GgmlType::q2_k, f, d};
  {  // the chunk launches' kernels (a table of expert addresses, 8 tokens)
    const void *const table[1] = {nullptr};
    ep::backend::cuda::GemvArgs a;
    a.w_ptrs = table;
    a.n_tok = 8;
    a.k = d;
    a.n = f;
    REQUIRE(ep::backend::cuda::gemv_kernel_for(static_cast<uint32_t>(GgmlType::iq2_xxs), a) == ep::backend::cuda::GemvKernel::mma);
    a.k = f;
    a.n = d;
    REQUIRE(ep::backend::cuda::gemv_kernel_for(static_cast<uint32_t>(GgmlType::q2_k), a) == ep::backend::cuda::GemvKernel::mma);
  }
  std::vector<std::vector<uint8_t>> host(n_exp);
  std::vector<std::unique_ptr<DevBuf>> dev;
  std::vector<const void *> tc(n_exp), tg(n_exp);
  for (int e = 0; e < n_exp; ++e) {
    auto g = ep::test::random_weights(GgmlType::iq2_xxs, d, f, rng), u = ep::test::random_weights(GgmlType::iq2_xxs, d, f, rng);
    auto o = ep::test::random_weights(GgmlType::q2_k, f, d, rng);
    host[e].resize(2 * gate_bytes + down_bytes);
    std::memcpy(host[e].data(), g.data(), g.size());
    std::memcpy(host[e].data() + l.up.offset, u.data(), u.size());
    std::memcpy(host[e].data() + l.down.offset, o.data(), o.size());
    dev.push_back(std::make_unique<DevBuf>(gpu, host[e]));
    tc[e] = host[e].data();
    tg[e] = dev.back()->p;
  }
  const Activation act{ActivationKind::swiglu, 10.0f};
  DevBuf slots_dev(gpu, tg);
  // y of `toks` tokens on the GPU, as the resident experts run them
  auto run = [&](const std::vector<float> &x, const std::vector<int32_t> &ids, const std::vector<float> &w, int64_t toks) {
    DevBuf dx(gpu, x), di(gpu, ids), dw(gpu, w), dy(gpu, static_cast<uint64_t>(d * toks) * 4);
    ep::test::HostBatch hg = ep::test::host_batch(ids, tg, l);
    DevBuf roles(gpu, static_cast<uint64_t>(3 * k * toks) * sizeof(void *));
    gpu.gather_role_table(t_of(di.p, GgmlType::i32, Device::cuda, {k, toks}), static_cast<const void *const *>(slots_dev.p), n_exp,
                          l, static_cast<const void **>(roles.p));
    hg.batch.role_table = static_cast<const void *const *>(roles.p);
    gpu.moe(t_of(dx.p, GgmlType::f32, Device::cuda, {d, toks}), t_of(di.p, GgmlType::i32, Device::cuda, {k, toks}),
            t_of(dw.p, GgmlType::f32, Device::cuda, {k, toks}), hg.batch, l, act, t_of(dy.p, GgmlType::f32, Device::cuda, {d, toks}));
    return dy.get<float>();
  };
  for (int64_t toks : {int64_t{24}, int64_t{1400}}) {  // 1,400 tokens: about 130 chunks per expert
    auto x = ep::test::random_floats(static_cast<size_t>(d * toks), rng);
    std::vector<int32_t> ids(static_cast<size_t>(k * toks));
    std::vector<float> w = ep::test::random_floats(ids.size(), rng, 0.1f, 1.0f);
    for (auto &id : ids) id = static_cast<int32_t>(rng() % n_exp);
    REQUIRE(gpu.moe_reads_host_picks(toks, l));
    const std::vector<float> got = run(x, ids, w, toks);
    if (toks == 24) {
      std::vector<float> want(static_cast<size_t>(d * toks));
      cpu.moe(t_of(x.data(), GgmlType::f32, Device::cpu, {d, toks}), t_of(ids.data(), GgmlType::i32, Device::cpu, {k, toks}),
              t_of(w.data(), GgmlType::f32, Device::cpu, {k, toks}), ep::test::host_batch(ids, tc, l).batch, l, act,
              t_of(want.data(), GgmlType::f32, Device::cpu, {d, toks}));
      const double err = rel_err(got, want);
      INFO("err " << err);
      CHECK(err <= 2e-4);  // the tensor-core kernels carry x in ~22 bits (gate/up, then down)
    }
    // expert-major: moe_pairs over disjoint expert sets, each with only its own slots, then
    // moe_combine: a chunk's rows depend only on its own expert's tokens
    {
      DevBuf dx(gpu, x), di(gpu, ids), dw(gpu, w), dp(gpu, static_cast<uint64_t>(d * k * toks) * 4),
          dz(gpu, static_cast<uint64_t>(d * toks) * 4);
      const Tensor P = t_of(dp.p, GgmlType::f32, Device::cuda, {d, k * toks});
      for (const std::vector<int32_t> &set : {std::vector<int32_t>{2, 0}, {3}, {1}}) {
        std::vector<const void *> table(static_cast<size_t>(n_exp), nullptr);
        for (int32_t e : set) table[static_cast<size_t>(e)] = tg[static_cast<size_t>(e)];
        gpu.moe_pairs(t_of(dx.p, GgmlType::f32, Device::cuda, {d, toks}), t_of(di.p, GgmlType::i32, Device::cuda, {k, toks}),
                      ep::test::host_batch(ids, table, l).batch, l, act, P);
      }
      gpu.moe_combine(P, t_of(dw.p, GgmlType::f32, Device::cuda, {k, toks}), t_of(dz.p, GgmlType::f32, Device::cuda, {d, toks}));
      const std::vector<float> split = dz.get<float>();
      INFO("tokens " << toks);
      CHECK(std::isfinite(split[0]));
      CHECK(std::memcmp(split.data(), got.data(), got.size() * sizeof(float)) == 0);
    }
    // decode-sized windows (the first tokens, and the last) run the one-token kernels over their
    // pairs: the prompt's rows within the two paths' tolerances together (the dp4a family carries x
    // in ~15 bits: 5e-4 of the CPU's before the chunks ran on tensor cores)
    for (int64_t from : {int64_t{0}, toks - 8}) {
      const int64_t n = 8;
      std::vector<float> xs(x.begin() + from * d, x.begin() + (from + n) * d), ws(w.begin() + from * k, w.begin() + (from + n) * k);
      std::vector<int32_t> is(ids.begin() + from * k, ids.begin() + (from + n) * k);
      REQUIRE_FALSE(gpu.moe_reads_host_picks(n, l));
      const std::vector<float> alone = run(xs, is, ws, n);
      const std::vector<float> rows(got.begin() + from * d, got.begin() + (from + n) * d);
      const double err = rel_err(alone, rows);
      INFO("tokens " << toks << " window from " << from << " err " << err);
      CHECK(err <= 1e-3);
    }
  }
}

TEST_CASE("a prompt's experts of 12, 40 and 100 tokens run wide tensor-core chunks: the CPU's result, the same bits by "
          "expert subsets",
          "[gpu][moe]") {
  // Experts whose three roles run on the tensor-core kernel take chunks of 32 tokens and the rest
  // in one of 8, 16 or 32: 12 tokens one chunk of 16, 40 one of 32 and one of 8, 100 three of 32
  // and one of 8 (one launch per role and chunk size). Two layouts: IQ2_XXS gate and up (one
  // launch for both) with Q2_K down, and MXFP4 gate, Q8_0 up and Q3_K down (gate and up apart).
  CudaBackend gpu;
  CpuBackend cpu;
  std::mt19937 rng(40);
  const int64_t d = 1024, f = 2048;
  const int n_exp = 4, k = 2;
  const int counts[3] = {12, 40, 100};  // pairs of experts 0, 1, 2; expert 3 has none
  const int64_t toks = (12 + 40 + 100) / k;
  const GgmlType layouts[2][3] = {{GgmlType::iq2_xxs, GgmlType::iq2_xxs, GgmlType::q2_k},
                                  {GgmlType::mxfp4, GgmlType::q8_0, GgmlType::q3_k}};
  for (const auto &types : layouts) {
    for (int r = 0; r < 3; ++r)
      REQUIRE(ep::backend::cuda::gemv_runs_wide(static_cast<uint32_t>(types[r]), r == 2 ? f : d));
    SlotLayout l;
    const uint64_t gate_bytes = ep::format::ggml_row_bytes(types[0], d, "t") * f;
    const uint64_t up_bytes = ep::format::ggml_row_bytes(types[1], d, "t") * f;
    const uint64_t down_bytes = ep::format::ggml_row_bytes(types[2], f, "t") * d;
    l.gate = {0, types[0], d, f};
    l.up = {gate_bytes, types[1], d, f};
    l.down = {gate_bytes + up_bytes, types[2], f, d};
    std::vector<std::vector<uint8_t>> host(n_exp);
    std::vector<std::unique_ptr<DevBuf>> dev;
    std::vector<const void *> tc(n_exp), tg(n_exp);
    for (int e = 0; e < n_exp; ++e) {
      auto g = ep::test::random_weights(types[0], d, f, rng), u = ep::test::random_weights(types[1], d, f, rng);
      auto o = ep::test::random_weights(types[2], f, d, rng);
      host[e].resize(gate_bytes + up_bytes + down_bytes);
      std::memcpy(host[e].data(), g.data(), g.size());
      std::memcpy(host[e].data() + l.up.offset, u.data(), u.size());
      std::memcpy(host[e].data() + l.down.offset, o.data(), o.size());
      dev.push_back(std::make_unique<DevBuf>(gpu, host[e]));
      tc[e] = host[e].data();
      tg[e] = dev.back()->p;
    }
    const Activation act{ActivationKind::swiglu, 10.0f};
    auto x = ep::test::random_floats(static_cast<size_t>(d * toks), rng);
    std::vector<int32_t> ids;
    for (int e = 0; e < 3; ++e) ids.insert(ids.end(), static_cast<size_t>(counts[e]), e);
    std::shuffle(ids.begin(), ids.end(), rng);
    REQUIRE(static_cast<int64_t>(ids.size()) == k * toks);
    std::vector<float> w = ep::test::random_floats(ids.size(), rng, 0.1f, 1.0f);
    REQUIRE(gpu.moe_reads_host_picks(toks, l));
    DevBuf dx(gpu, x), di(gpu, ids), dw(gpu, w), dy(gpu, static_cast<uint64_t>(d * toks) * 4);
    const Tensor X = t_of(dx.p, GgmlType::f32, Device::cuda, {d, toks}), I = t_of(di.p, GgmlType::i32, Device::cuda, {k, toks});
    const Tensor W = t_of(dw.p, GgmlType::f32, Device::cuda, {k, toks});
    gpu.moe(X, I, W, ep::test::host_batch(ids, tg, l).batch, l, act, t_of(dy.p, GgmlType::f32, Device::cuda, {d, toks}));
    const std::vector<float> got = dy.get<float>();
    std::vector<float> want(static_cast<size_t>(d * toks));
    cpu.moe(t_of(x.data(), GgmlType::f32, Device::cpu, {d, toks}), t_of(ids.data(), GgmlType::i32, Device::cpu, {k, toks}),
            t_of(w.data(), GgmlType::f32, Device::cpu, {k, toks}), ep::test::host_batch(ids, tc, l).batch, l, act,
            t_of(want.data(), GgmlType::f32, Device::cpu, {d, toks}));
    const double err = rel_err(got, want);
    INFO("types " << static_cast<int>(types[0]) << " " << static_cast<int>(types[1]) << " " << static_cast<int>(types[2])
                  << " err " << err);
    CHECK(err <= 2e-4);  // as the 8-token chunks: x in ~22 bits through gate/up, then down
    // expert-major: each expert's chunks depend on its own token count only, so moe_pairs over
    // disjoint expert sets, then moe_combine, give moe()'s bits
    DevBuf dp(gpu, static_cast<uint64_t>(d * k * toks) * 4), dz(gpu, static_cast<uint64_t>(d * toks) * 4);
    const Tensor P = t_of(dp.p, GgmlType::f32, Device::cuda, {d, k * toks});
    for (const std::vector<int32_t> &set : {std::vector<int32_t>{2, 0}, {1}, {3}}) {
      std::vector<const void *> table(static_cast<size_t>(n_exp), nullptr);
      for (int32_t e : set) table[static_cast<size_t>(e)] = tg[static_cast<size_t>(e)];
      gpu.moe_pairs(X, I, ep::test::host_batch(ids, table, l).batch, l, act, P);
    }
    gpu.moe_combine(P, W, t_of(dz.p, GgmlType::f32, Device::cuda, {d, toks}));
    const std::vector<float> split = dz.get<float>();
    CHECK(std::isfinite(split[0]));
    CHECK(std::memcmp(split.data(), got.data(), got.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("sampling on the GPU picks the CPU's token", "[gpu][sampling]") {
  CudaBackend gpu;
  CpuBackend cpu;
  std::mt19937 rng(26);
  const int64_t n = 163840;  // Kimi-K3 vocabulary
  auto logits = ep::test::random_floats(n, rng, -8, 8);
  DevBuf dl(gpu, logits);
  const Tensor lc = t_of(logits.data(), GgmlType::f32, Device::cpu, {n}), lg = t_of(dl.p, GgmlType::f32, Device::cuda, {n});
  const SamplingParams params[] = {{0.0f, 0, 1.0f, 1}, {0.7f, 0, 1.0f, 2}, {1.0f, 40, 1.0f, 3}, {0.9f, 0, 0.9f, 4},
                                   {1.2f, 100, 0.8f, 5}};
  int mismatches = 0, total = 0;
  for (const auto &p : params)
    for (uint64_t c = 0; c < 20; ++c) {
      mismatches += cpu.sample(lc, p, c) != gpu.sample(lg, p, c);
      ++total;
    }
  INFO(mismatches << " of " << total << " draws differ");
  CHECK(mismatches == 0);
}
