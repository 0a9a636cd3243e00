// launch_gemv against a CPU reference (ggml dequantization + f64 dot products) for every GEMV
// kernel variant: several matrices per launch through w_ptrs and x_rows, 1..8 tokens, partial
// row tiles, unaligned q3_K rows, and x far outside the f16 range (the mma kernel carries x as
// scaled f16 hi + lo halves). Device outputs are poisoned with NaN before each launch.
#include "backend/dequant.hpp"
#include "cuda/check.hpp"
#include "cuda/kernels.hpp"
#include "../backend/random_weights.hpp"
#include "support/catch.hpp"

#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

using ep::cuda::GemvArgs;
using ep::cuda::GemvKernel;
using ep::format::GgmlType;

namespace {

struct Dev {
  void *p = nullptr;
  size_t bytes = 0;
  explicit Dev(size_t n) : bytes(n) {
    EP_CUDA_CHECK(cudaMalloc(&p, n));
    EP_CUDA_CHECK(cudaMemset(p, 0xFF, n));
  }
  template <typename T>
  explicit Dev(const std::vector<T> &v) : Dev(v.size() * sizeof(T)) {
    EP_CUDA_CHECK(cudaMemcpy(p, v.data(), bytes, cudaMemcpyHostToDevice));
  }
  ~Dev() { cudaFree(p); }
  Dev(const Dev &) = delete;
  Dev &operator=(const Dev &) = delete;
  template <typename T>
  std::vector<T> get() const {
    std::vector<T> v(bytes / sizeof(T));
    EP_CUDA_CHECK(cudaMemcpy(v.data(), p, bytes, cudaMemcpyDeviceToHost));
    return v;
  }
};

struct Case {
  GgmlType type;
  int64_t k, n;
  int n_mat, n_tok;
  float x_scale = 1.0f;
};

// Worst |gpu − ref| / max |ref| over the matrices of one launch (each matrix on its own scale);
// +inf for any non-finite output.
double run_case(const Case &c, GemvKernel kernel, std::mt19937 &rng) {
  const uint64_t row_bytes = ep::format::ggml_row_bytes(c.type, static_cast<uint64_t>(c.k), "test");
  const uint64_t mat_bytes = row_bytes * static_cast<uint64_t>(c.n);
  const uint64_t stride = (mat_bytes + 4095) / 4096 * 4096;
  std::vector<std::vector<uint8_t>> mats;
  std::vector<uint8_t> all(stride * static_cast<uint64_t>(c.n_mat));
  for (int m = 0; m < c.n_mat; ++m) {
    mats.push_back(ep::test::random_weights(c.type, c.k, c.n, rng));
    std::memcpy(all.data() + m * stride, mats.back().data(), mat_bytes);
  }
  // the last matrix ends exactly at the end of its allocation: no reads past the weights
  Dev dw(stride * static_cast<uint64_t>(c.n_mat - 1) + mat_bytes);
  EP_CUDA_CHECK(cudaMemcpy(dw.p, all.data(), dw.bytes, cudaMemcpyHostToDevice));
  std::vector<const void *> ptrs;
  std::vector<int32_t> x_rows;
  for (int m = 0; m < c.n_mat; ++m) {
    ptrs.push_back(static_cast<uint8_t *>(dw.p) + m * stride);
    x_rows.push_back((m * 2 + 1) % (c.n_mat + 1));
  }
  const int x_count = c.n_mat + 1 + c.n_tok;
  auto x = ep::test::random_floats(static_cast<size_t>(x_count * c.k), rng);
  for (auto &v : x) v *= c.x_scale;
  Dev dptrs(ptrs), dxrows(x_rows), dx(x), dy(static_cast<size_t>(c.n_mat) * c.n * c.n_tok * 4);

  GemvArgs a;
  a.w_ptrs = static_cast<const void *const *>(dptrs.p);
  a.x = static_cast<const float *>(dx.p);
  a.x_rows = static_cast<const int32_t *>(dxrows.p);
  a.y = static_cast<float *>(dy.p);
  a.k = c.k;
  a.n = c.n;
  a.n_tok = c.n_tok;
  a.n_mat = c.n_mat;
  a.kernel = kernel;
  ep::cuda::launch_gemv(static_cast<uint32_t>(c.type), a, nullptr);
  EP_CUDA_CHECK(cudaDeviceSynchronize());
  const auto got = dy.get<float>();

  double worst = 0;
  std::vector<float> deq(static_cast<size_t>(c.k * c.n));
  for (int m = 0; m < c.n_mat; ++m) {
    ep::backend::dequantize_row(c.type, mats[m].data(), deq.data(), c.k * c.n);
    double num = 0, den = 0;
    for (int t = 0; t < c.n_tok; ++t) {
      const float *xv = x.data() + (x_rows[m] + t) * c.k;
      for (int64_t r = 0; r < c.n; ++r) {
        double want = 0;
        for (int64_t i = 0; i < c.k; ++i) want += static_cast<double>(deq[r * c.k + i]) * xv[i];
        const float g = got[(static_cast<size_t>(m) * c.n_tok + t) * c.n + r];
        if (!std::isfinite(g)) return INFINITY;
        num = std::max(num, std::fabs(g - want));
        den = std::max(den, std::fabs(want));
      }
    }
    worst = std::max(worst, den > 0 ? num / den : num);
  }
  return worst;
}

}  // namespace

TEST_CASE("tensor-core GEMV matches the CPU for mxfp4, q2_K and q3_K", "[gpu][gemv]") {
  std::mt19937 rng(31);
  for (GemvKernel kernel : {GemvKernel::mma, GemvKernel::mma_s6, GemvKernel::mma_k2, GemvKernel::mma_k4}) {
    for (GgmlType type : {GgmlType::mxfp4, GgmlType::q2_k, GgmlType::q3_k}) {
      // 3584: q3_K rows of 1540 bytes (not 16-byte aligned); odd n: partial warp and block tiles;
      // 4608 with one token: three x phases of 2048 values; 8 tokens: phases of 256 values.
      for (Case c : {Case{type, 512, 37, 3, 1}, Case{type, 3584, 24, 2, 3}, Case{type, 1024, 100, 4, 8},
                     Case{type, 4608, 20, 2, 1}, Case{type, 1536, 16, 2, 8}}) {
        const double err = run_case(c, kernel, rng);
        INFO(ep::cuda::gemv_kernel_name(kernel) << " type " << static_cast<int>(type) << " k " << c.k << " n " << c.n
                                                << " mats " << c.n_mat << " tokens " << c.n_tok << " err " << err);
        CHECK(err <= 5e-5);
      }
    }
  }
}

TEST_CASE("tensor-core GEMV keeps its precision for x far outside the f16 range", "[gpu][gemv]") {
  std::mt19937 rng(32);
  for (GgmlType type : {GgmlType::mxfp4, GgmlType::q2_k, GgmlType::q3_k}) {
    for (float scale : {1e-7f, 3e5f, 1e9f}) {
      for (int n_tok : {1, 5}) {
        const double err = run_case(Case{type, 2048, 40, 2, n_tok, scale}, GemvKernel::mma, rng);
        INFO("type " << static_cast<int>(type) << " x scale " << scale << " tokens " << n_tok << " err " << err);
        CHECK(err <= 5e-5);
      }
    }
  }
}

TEST_CASE("every GEMV kernel matches the CPU for every type", "[gpu][gemv]") {
  std::mt19937 rng(33);
  for (GemvKernel kernel : {GemvKernel::automatic, GemvKernel::generic, GemvKernel::pipe}) {
    for (GgmlType type : ep::test::all_weight_types()) {
      for (int n_tok : {1, 4}) {
        const double err = run_case(Case{type, 768, 45, 3, n_tok}, kernel, rng);
        INFO(ep::cuda::gemv_kernel_name(kernel) << " type " << static_cast<int>(type) << " tokens " << n_tok << " err "
                                                << err);
        CHECK(err <= 1e-4);
      }
    }
  }
}

TEST_CASE("launch_gemv picks the tensor-core kernel where it applies", "[gpu][gemv]") {
  GemvArgs a;
  a.k = 4096;
  a.n = 2048;
  a.n_mat = 8;  // 8 experts of 2048 rows: 1024 tiles of 16 rows
  CHECK(ep::cuda::gemv_kernel_for(static_cast<uint32_t>(GgmlType::q2_k), a) == GemvKernel::mma);
  CHECK(ep::cuda::gemv_kernel_for(static_cast<uint32_t>(GgmlType::q3_k), a) == GemvKernel::mma);
  CHECK(ep::cuda::gemv_kernel_for(static_cast<uint32_t>(GgmlType::mxfp4), a) == GemvKernel::mma);
  CHECK(ep::cuda::gemv_kernel_for(static_cast<uint32_t>(GgmlType::q6_k), a) == GemvKernel::pipe);
  a.n_mat = 1;  // one matrix, one token: too few row tiles for the tensor-core kernel
  CHECK(ep::cuda::gemv_kernel_for(static_cast<uint32_t>(GgmlType::q2_k), a) == GemvKernel::pipe);
  CHECK(ep::cuda::gemv_kernel_for(static_cast<uint32_t>(GgmlType::mxfp4), a) == GemvKernel::generic);
  a.n_tok = 2;  // several tokens: one mma covers them all
  CHECK(ep::cuda::gemv_kernel_for(static_cast<uint32_t>(GgmlType::q3_k), a) == GemvKernel::mma);
  a.n_tok = 1;
  a.kernel = GemvKernel::mma;  // asked for a type it does not cover: the type's default
  CHECK(ep::cuda::gemv_kernel_for(static_cast<uint32_t>(GgmlType::q4_k), a) == GemvKernel::generic);
  a.k = 96;  // mxfp4 with k not a multiple of 256
  CHECK(ep::cuda::gemv_kernel_for(static_cast<uint32_t>(GgmlType::mxfp4), a) == GemvKernel::generic);
  std::mt19937 rng(34);
  CHECK(run_case(Case{GgmlType::mxfp4, 96, 21, 2, 2}, GemvKernel::mma, rng) <= 1e-4);
  GemvKernel k{};
  CHECK(ep::cuda::parse_gemv_kernel("mma-k2", k));
  CHECK(k == GemvKernel::mma_k2);
  CHECK_FALSE(ep::cuda::parse_gemv_kernel("fast", k));
}
