// launch_gemv against a CPU reference (ggml dequantization + f64 dot products) for every GEMV
// kernel variant: several matrices per launch through w_ptrs and x_rows, 1..8 tokens (9..32 on
// the tensor-core kernel), partial
// row tiles, unaligned q3_K rows and blocks, the mma kernel's k split (matrices below 2048 rows)
// and unsplit warps, and x far outside the f16 range (the mma kernel carries x as scaled f16 hi +
// lo halves, the dp4a kernel as int8 hi + lo parts per 32 values).
// Device outputs are poisoned with NaN before each launch, with a poisoned tail that must stay
// unwritten. Thresholds (worst |gpu − ref| over the
// largest |ref| of each matrix): 5e-5 for mma, 2e-4 for dp4a and stream (x carried with ~15 bits:
// 5e-5 was measured on the H200), 1e-4 for the exact per-lane kernels on every type. Launches go
// to a created stream (stream uses programmatic dependent launch there).
#include "backend/dequant.hpp"
#include "core/status.hpp"
#include "gpu/check.hpp"
#include "backend/cuda/kernels.hpp"
#include "backend/random_weights.hpp"
#include "support/catch.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

using ep::backend::cuda::GemvArgs;
using ep::backend::cuda::GemvKernel;
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

// A created stream (blocking: ordered after the legacy-stream memsets and copies), destroyed on
// every exit. The stream kernel uses programmatic dependent launch on a created stream only.
struct Stream {
  cudaStream_t s = nullptr;
  Stream() { EP_CUDA_CHECK(cudaStreamCreate(&s)); }
  ~Stream() { cudaStreamDestroy(s); }
  Stream(const Stream &) = delete;
  Stream &operator=(const Stream &) = delete;
};

struct Case {
  GgmlType type;
  int64_t k, n;
  int n_mat, n_tok;
  float x_scale = 1.0f;
};

// Worst |gpu − ref| / max |ref| over the matrices of one launch (each matrix on its own scale);
// +inf for any non-finite output or any write past the outputs.
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
  // y with a poisoned tail of kGuard floats that no launch may write
  constexpr size_t kGuard = 64;
  const size_t y_count = static_cast<size_t>(c.n_mat) * c.n * c.n_tok;
  Dev dptrs(ptrs), dxrows(x_rows), dx(x), dy((y_count + kGuard) * 4);

  GemvArgs a;
  a.w_ptrs = static_cast<const void *const *>(dptrs.p);
  a.w_ptrs_aligned16 = true;  // matrices 4096 bytes apart from cudaMalloc's aligned start
  a.x = static_cast<const float *>(dx.p);
  a.x_rows = static_cast<const int32_t *>(dxrows.p);
  a.y = static_cast<float *>(dy.p);
  a.k = c.k;
  a.n = c.n;
  a.n_tok = c.n_tok;
  a.n_mat = c.n_mat;
  a.kernel = kernel;
  Stream stream;
  ep::backend::cuda::launch_gemv(static_cast<uint32_t>(c.type), a, stream.s);
  EP_CUDA_CHECK(cudaStreamSynchronize(stream.s));
  const auto got = dy.get<float>();
  for (size_t i = y_count; i < got.size(); ++i) {
    uint32_t bits = 0;
    std::memcpy(&bits, &got[i], 4);
    if (bits != 0xFFFFFFFFu) return INFINITY;  // written past the outputs
  }

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

// mma: x as f16 hi + lo (~22 bits); dp4a: x as int8 hi + lo per 32 values (~15 bits)
double limit_of(GemvKernel kernel) { return kernel == GemvKernel::mma ? 5e-5 : 2e-4; }

}  // namespace

TEST_CASE("tensor-core and dp4a GEMV match the CPU for mxfp4, q2_K, q3_K, iq2_xxs and q8_0", "[gpu][gemv]") {
  std::mt19937 rng(31);
  // the dp4a and stream kernels run one token; asked for more they fall back to automatic (mma)
  for (GemvKernel kernel : {GemvKernel::mma, GemvKernel::dp4a, GemvKernel::stream}) {
    double worst = 0;
    // iq2_xxs has no dp4a kernel and q8_0 neither dp4a nor stream (asked for them: automatic's
    // pick, stream / pipe and rows / mma)
    for (GgmlType type : {GgmlType::mxfp4, GgmlType::q2_k, GgmlType::q3_k, GgmlType::iq2_xxs, GgmlType::q8_0}) {
      // 3584: q3_K rows of 1540 bytes (not 16-byte aligned, every other block 2 bytes off a word);
      // 768: q3_K rows of 330 bytes (every other row 2 bytes off); 256: one block per row (many
      // rows per warp step); odd n: partial warp and block tiles; 4608 with one token: three mma
      // x phases of 2048 values; 8 tokens: phases of 256 values; 3072 and 2048 with one token: the
      // benchmark's other two k (K3's latent down, DeepSeek-V4's down); 2100 rows: the mma kernel's
      // warps on rows of their own (fewer rows: the k split), a partial tile.
      for (Case c : {Case{type, 512, 37, 3, 1}, Case{type, 3584, 24, 2, 3}, Case{type, 1024, 100, 4, 8},
                     Case{type, 4608, 20, 2, 1}, Case{type, 1536, 16, 2, 8}, Case{type, 3584, 45, 2, 1},
                     Case{type, 768, 67, 3, 1}, Case{type, 256, 130, 2, 1}, Case{type, 2048, 70, 1, 1},
                     Case{type, 3072, 33, 2, 1}, Case{type, 1024, 2100, 2, 5}}) {
        const double err = run_case(c, kernel, rng);
        worst = std::max(worst, err);
        INFO(ep::backend::cuda::gemv_kernel_name(kernel) << " type " << static_cast<int>(type) << " k " << c.k << " n " << c.n
                                                << " mats " << c.n_mat << " tokens " << c.n_tok << " err " << err);
        CHECK(err <= limit_of(kernel));
      }
    }
    std::printf("gemv %s: worst error %.3g of the largest output\n", ep::backend::cuda::gemv_kernel_name(kernel), worst);
  }
}

TEST_CASE("the tensor-core kernel's wide launches (9, 16, 17, 32 tokens) match the CPU for every type it runs",
          "[gpu][gemv]") {
  // 16 and 32 tokens: two and four tiles of 8 tokens per decoded weight fragment, x staged 256
  // values per phase (32 KB at 32 tokens); 9 and 17 tokens leave the last tile partly or wholly
  // padding. Shapes: the k split (100 rows) with its partial sums per tile, 18 phases (k 4608),
  // q3_K's unaligned rows (768), warps on rows of their own with a partial tile (2060 rows), x
  // far outside the f16 range.
  std::mt19937 rng(32);
  double worst = 0;
  for (GgmlType type : {GgmlType::mxfp4, GgmlType::q2_k, GgmlType::q3_k, GgmlType::iq2_xxs, GgmlType::q8_0}) {
    REQUIRE(ep::backend::cuda::gemv_runs_wide(static_cast<uint32_t>(type), 1024));
    for (int n_tok : {9, 16, 17, 32}) {
      for (Case c : {Case{type, 1024, 100, 3, n_tok}, Case{type, 4608, 20, 2, n_tok}, Case{type, 768, 67, 3, n_tok},
                     Case{type, 512, 2060, 1, n_tok}, Case{type, 2048, 33, 2, n_tok, 3e5f}}) {
        // asked for the row kernel, a wide launch runs the tensor-core kernel
        for (GemvKernel kernel : {GemvKernel::automatic, GemvKernel::rows}) {
          ep::backend::cuda::GemvArgs probe;
          probe.k = c.k;
          probe.n = c.n;
          probe.n_tok = c.n_tok;
          probe.kernel = kernel;
          REQUIRE(ep::backend::cuda::gemv_kernel_for(static_cast<uint32_t>(type), probe) == GemvKernel::mma);
          if (kernel == GemvKernel::rows && (c.k != 1024 || n_tok != 16)) continue;
          const double err = run_case(c, kernel, rng);
          worst = std::max(worst, err);
          INFO("type " << static_cast<int>(type) << " k " << c.k << " n " << c.n << " mats " << c.n_mat << " tokens "
                       << c.n_tok << " x scale " << c.x_scale << " err " << err);
          CHECK(err <= limit_of(GemvKernel::mma));
        }
      }
    }
  }
  std::printf("gemv mma 9..32 tokens: worst error %.3g of the largest output\n", worst);
  // other types and shapes take at most 8 tokens: no kernel above that
  ep::backend::cuda::GemvArgs probe;
  probe.k = 1024;
  probe.n = 64;
  probe.n_tok = 16;
  CHECK(ep::backend::cuda::gemv_kernel_for(static_cast<uint32_t>(GgmlType::q4_k), probe) == GemvKernel::automatic);
  CHECK_FALSE(ep::backend::cuda::gemv_runs_wide(static_cast<uint32_t>(GgmlType::q4_k), 1024));
  CHECK_FALSE(ep::backend::cuda::gemv_runs_wide(static_cast<uint32_t>(GgmlType::q2_k), 1024 + 32));
}

TEST_CASE("launch_gemv rejects shapes it cannot run, before any launch", "[gpu][gemv]") {
  GemvArgs a;  // no buffers: every check comes before the first CUDA call
  a.k = 4096;
  a.n = int64_t{1} << 31;  // rows are counted in 32 bits on the device
  auto message = [&] {
    try {
      ep::backend::cuda::launch_gemv(static_cast<uint32_t>(GgmlType::q2_k), a, nullptr);
    } catch (const ep::Error &e) {
      CHECK(e.status() == ep::Status::invalid_argument);
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(message().find("below 2^31") != std::string::npos);
  a.n = 16;
  a.n_tok = 33;
  CHECK(message().find("n_tok 33 outside 1..32") != std::string::npos);
  a.n_tok = 9;  // 9..32 tokens: only the tensor-core kernel's types and shapes
  a.k = 4096 + 32;
  CHECK(message().find("n_tok 9 above 8") != std::string::npos);
  a.k = 4096;
  auto message_q4_k = [&] {
    try {
      ep::backend::cuda::launch_gemv(static_cast<uint32_t>(GgmlType::q4_k), a, nullptr);
    } catch (const ep::Error &e) {
      CHECK(e.status() == ep::Status::invalid_argument);
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(message_q4_k().find("n_tok 9 above 8") != std::string::npos);
  a.n_tok = 1;
  a.k = 100;
  CHECK(message().find("multiple of 32") != std::string::npos);
}

TEST_CASE("a stream launch sees the previous launch's output (programmatic dependent launch)", "[gpu][gemv]") {
  // launch 1: y1 = W1·x (k 512, n 1024); launch 2, right behind it on the same stream: y2 = W2·y1
  // (k 1024, n 300). The second kernel may start before the first ends; it must still read the
  // finished y1 (poisoned with NaN before the first launch).
  std::mt19937 rng(36);
  for (GgmlType type : {GgmlType::mxfp4, GgmlType::q2_k, GgmlType::q3_k}) {
    const auto w1 = ep::test::random_weights(type, 512, 1024, rng);
    const auto w2 = ep::test::random_weights(type, 1024, 300, rng);
    const auto x = ep::test::random_floats(512, rng);
    Dev dw1(w1), dw2(w2), dx(x), dy1(1024 * 4), dy2(300 * 4);
    Stream stream;
    const cudaStream_t s = stream.s;
    for (int rep = 0; rep < 3; ++rep) {
      EP_CUDA_CHECK(cudaMemsetAsync(dy1.p, 0xFF, dy1.bytes, s));
      EP_CUDA_CHECK(cudaMemsetAsync(dy2.p, 0xFF, dy2.bytes, s));
      GemvArgs a;
      a.w = dw1.p;
      a.x = static_cast<const float *>(dx.p);
      a.y = static_cast<float *>(dy1.p);
      a.k = 512;
      a.n = 1024;
      a.kernel = GemvKernel::stream;
      ep::backend::cuda::launch_gemv(static_cast<uint32_t>(type), a, s);
      GemvArgs b = a;
      b.w = dw2.p;
      b.x = static_cast<const float *>(dy1.p);
      b.y = static_cast<float *>(dy2.p);
      b.k = 1024;
      b.n = 300;
      ep::backend::cuda::launch_gemv(static_cast<uint32_t>(type), b, s);
      EP_CUDA_CHECK(cudaStreamSynchronize(s));
      const auto y1 = dy1.get<float>();
      const auto y2 = dy2.get<float>();
      std::vector<float> deq(1024 * 300);
      ep::backend::dequantize_row(type, w2.data(), deq.data(), 1024 * 300);
      double num = 0, den = 0;
      bool finite = true;
      for (int r = 0; r < 300; ++r) {
        double want = 0;
        for (int i = 0; i < 1024; ++i) want += static_cast<double>(deq[r * 1024 + i]) * y1[i];
        finite = finite && std::isfinite(y2[r]);
        num = std::max(num, std::fabs(y2[r] - want));
        den = std::max(den, std::fabs(want));
      }
      INFO("type " << static_cast<int>(type) << " repetition " << rep << " err " << num / den);
      CHECK(finite);
      CHECK(num / den <= 2e-4);
    }
  }
}

TEST_CASE("tensor-core and dp4a GEMV keep their precision for x far outside the f16 range", "[gpu][gemv]") {
  std::mt19937 rng(32);
  for (GemvKernel kernel : {GemvKernel::mma, GemvKernel::dp4a, GemvKernel::stream}) {
    for (GgmlType type : {GgmlType::mxfp4, GgmlType::q2_k, GgmlType::q3_k, GgmlType::iq2_xxs, GgmlType::q8_0}) {
      for (float scale : {1e-7f, 3e5f, 1e9f}) {
        for (int n_tok : {1, 5}) {
          const double err = run_case(Case{type, 2048, 40, 2, n_tok, scale}, kernel, rng);
          INFO(ep::backend::cuda::gemv_kernel_name(kernel) << " type " << static_cast<int>(type) << " x scale " << scale
                                                  << " tokens " << n_tok << " err " << err);
          CHECK(err <= limit_of(kernel));
        }
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
        INFO(ep::backend::cuda::gemv_kernel_name(kernel) << " type " << static_cast<int>(type) << " tokens " << n_tok << " err "
                                                << err);
        CHECK(err <= 1e-4);
      }
    }
  }
}

TEST_CASE("the row kernel matches the CPU for q8_0 and the float types", "[gpu][gemv]") {
  std::mt19937 rng(34);
  // row lengths for every lane count: q8_0 pieces of 256 values, float pieces of 32 (1, 8, 64
  // and 256 pieces per row: 4, 8, 32 and 128 lanes); odd n: partial row groups
  for (GgmlType type : {GgmlType::q8_0, GgmlType::f32, GgmlType::f16, GgmlType::bf16}) {
    const int64_t piece = type == GgmlType::q8_0 ? 256 : 32;
    for (int64_t pieces : {1, 8, 64, 256}) {
      for (Case c : {Case{type, piece * pieces, 37, 2, 1}, Case{type, piece * pieces, 5, 1, 3}, Case{type, piece * pieces, 130, 3, 8}}) {
        if (c.k * c.n > (int64_t{1} << 22)) c.n = 9;
        const double err = run_case(c, GemvKernel::rows, rng);
        INFO("type " << static_cast<int>(type) << " k " << c.k << " n " << c.n << " mats " << c.n_mat << " tokens " << c.n_tok
                     << " err " << err);
        CHECK(err <= 1e-5);
      }
    }
  }
  // One token of q8_0 in matrices of many rows (the warp-coalesced variant without split rows:
  // 8,192 rows or more; an output head is 129,280), partial 4-row and 16-row tiles.
  for (Case c : {Case{GgmlType::q8_0, 256, 8197, 2, 1}, Case{GgmlType::q8_0, 2048, 8195, 1, 1},
                 Case{GgmlType::q8_0, 4096, 8192, 1, 1}}) {
    const double err = run_case(c, GemvKernel::rows, rng);
    INFO("q8_0 k " << c.k << " n " << c.n << " mats " << c.n_mat << " err " << err);
    CHECK(err <= 1e-5);
  }
}

TEST_CASE("every token count 1..8 matches the CPU on the row, generic, pipe and tensor-core kernels", "[gpu][gemv]") {
  // Each count has its own kernel (rows: 2..8 the coalesced several-token kernel, k a multiple of
  // 256; k 96 the per-lane row kernel) or runs the next instantiated count with tokens skipped
  // (generic, pipe, mma: 1, 2, 4, 8). n 37 and 8197: the split rows (4 warps per row) and the
  // whole rows per warp, with partial tiles.
  std::mt19937 rng(38);
  auto check = [&](const Case &c, GemvKernel kernel, double limit) {
    const double err = run_case(c, kernel, rng);
    INFO(ep::backend::cuda::gemv_kernel_name(kernel) << " type " << static_cast<int>(c.type) << " k " << c.k << " n " << c.n
                                                     << " mats " << c.n_mat << " tokens " << c.n_tok << " err " << err);
    CHECK(err <= limit);
  };
  for (int n_tok = 1; n_tok <= 8; ++n_tok) {
    for (GgmlType type : {GgmlType::q8_0, GgmlType::f32, GgmlType::f16, GgmlType::bf16}) {
      check(Case{type, 512, 37, 3, n_tok}, GemvKernel::rows, 1e-5);
      check(Case{type, 256, 8197, 1, n_tok}, GemvKernel::rows, 1e-5);
      if (type != GgmlType::q8_0) check(Case{type, 96, 21, 2, n_tok}, GemvKernel::rows, 1e-5);
    }
    for (GemvKernel kernel : {GemvKernel::generic, GemvKernel::pipe})
      for (GgmlType type : {GgmlType::q4_k, GgmlType::q6_k, GgmlType::mxfp4, GgmlType::q8_0})
        check(Case{type, 512, 19, 2, n_tok}, kernel, 1e-4);
    for (GgmlType type : {GgmlType::mxfp4, GgmlType::q2_k, GgmlType::q3_k, GgmlType::iq2_xxs, GgmlType::q8_0}) {
      check(Case{type, 1024, 45, 2, n_tok}, GemvKernel::mma, limit_of(GemvKernel::mma));
      check(Case{type, 512, 2053, 1, n_tok}, GemvKernel::mma, limit_of(GemvKernel::mma));  // unsplit warps
    }
  }
}

TEST_CASE("each token of a several-token q8_0 launch of the row kernel equals a one-token launch bit for bit", "[gpu][gemv]") {
  // gemv_warp_tokens_kernel accumulates every (row, token) in the one-token kernel's order: a
  // sequence decoded in a batch gets the outputs it gets alone where the row kernel runs q8_0's
  // several tokens (asked for here: by default they run on tensor cores, gemv.cu's
  // kQ8_0SeveralTokensOnMma). n 1000: rows split over 4 warps; 8200: whole rows per warp (the
  // output head's split).
  std::mt19937 rng(39);
  for (const int64_t n : {int64_t{1000}, int64_t{8200}}) {
    const int64_t k = 1024;
    const auto w = ep::test::random_weights(GgmlType::q8_0, k, n, rng);
    const auto x = ep::test::random_floats(static_cast<size_t>(8 * k), rng);
    Dev dw(w), dx(x);
    Stream stream;
    auto run = [&](int n_tok, int first) {  // tokens first .. first + n_tok − 1 of x
      Dev dy(static_cast<size_t>(n * n_tok) * 4);
      GemvArgs a;
      a.w = dw.p;
      a.x = static_cast<const float *>(dx.p) + first * k;
      a.y = static_cast<float *>(dy.p);
      a.k = k;
      a.n = n;
      a.n_tok = n_tok;
      a.kernel = GemvKernel::rows;
      REQUIRE(ep::backend::cuda::gemv_kernel_for(static_cast<uint32_t>(GgmlType::q8_0), a) == GemvKernel::rows);
      ep::backend::cuda::launch_gemv(static_cast<uint32_t>(GgmlType::q8_0), a, stream.s);
      EP_CUDA_CHECK(cudaStreamSynchronize(stream.s));
      return dy.get<float>();
    };
    std::vector<std::vector<float>> alone;
    for (int t = 0; t < 8; ++t) alone.push_back(run(1, t));
    for (int n_tok = 2; n_tok <= 8; ++n_tok) {
      const auto got = run(n_tok, 0);
      for (int t = 0; t < n_tok; ++t) {
        INFO("n " << n << " tokens " << n_tok << " token " << t);
        CHECK(std::all_of(alone[t].begin(), alone[t].end(), [](float v) { return std::isfinite(v); }));
        CHECK(std::memcmp(got.data() + t * n, alone[t].data(), static_cast<size_t>(n) * 4) == 0);
      }
    }
  }
}

TEST_CASE("each token of a several-token q8_0 launch on tensor cores is within the CPU's tolerance", "[gpu][gemv]") {
  // The default for 2..8 tokens of q8_0: each token's outputs against the f64 reference over the
  // dequantized weights, within 5e-5 of that token's largest output (not only the launch's), and
  // against the same token's one-token launch (the row kernel, what a session decoded alone gets)
  // within 1e-4. n 1000: the k split (fewer than 2048 rows); 8200: a warp per 16 rows.
  std::mt19937 rng(40);
  for (const int64_t n : {int64_t{1000}, int64_t{8200}}) {
    const int64_t k = 1024;
    const auto w = ep::test::random_weights(GgmlType::q8_0, k, n, rng);
    auto x = ep::test::random_floats(static_cast<size_t>(8 * k), rng);
    for (int64_t i = 0; i < k; ++i) x[static_cast<size_t>(3 * k + i)] *= 1e4f;  // tokens on different scales
    for (int64_t i = 0; i < k; ++i) x[static_cast<size_t>(5 * k + i)] *= 1e-4f;
    std::vector<float> deq(static_cast<size_t>(k * n));
    ep::backend::dequantize_row(GgmlType::q8_0, w.data(), deq.data(), k * n);
    Dev dw(w), dx(x);
    Stream stream;
    auto run = [&](int n_tok, int first, GemvKernel kernel) {  // tokens first .. first + n_tok − 1 of x
      Dev dy(static_cast<size_t>(n * n_tok) * 4);
      GemvArgs a;
      a.w = dw.p;
      a.x = static_cast<const float *>(dx.p) + first * k;
      a.y = static_cast<float *>(dy.p);
      a.k = k;
      a.n = n;
      a.n_tok = n_tok;
      a.kernel = kernel;
      REQUIRE(ep::backend::cuda::gemv_kernel_for(static_cast<uint32_t>(GgmlType::q8_0), a) == kernel);
      ep::backend::cuda::launch_gemv(static_cast<uint32_t>(GgmlType::q8_0), a, stream.s);
      EP_CUDA_CHECK(cudaStreamSynchronize(stream.s));
      return dy.get<float>();
    };
    std::vector<std::vector<float>> alone;
    for (int t = 0; t < 8; ++t) alone.push_back(run(1, t, GemvKernel::rows));
    for (int n_tok = 2; n_tok <= 8; ++n_tok) {
      const auto got = run(n_tok, 0, GemvKernel::mma);
      for (int t = 0; t < n_tok; ++t) {
        double num = 0, den = 0, num_alone = 0;
        bool finite = true;
        for (int64_t r = 0; r < n; ++r) {
          double want = 0;
          for (int64_t i = 0; i < k; ++i) want += static_cast<double>(deq[r * k + i]) * x[static_cast<size_t>(t * k + i)];
          const float g = got[static_cast<size_t>(t * n + r)];
          finite = finite && std::isfinite(g);
          num = std::max(num, std::fabs(g - want));
          num_alone = std::max(num_alone, std::fabs(static_cast<double>(g) - alone[t][static_cast<size_t>(r)]));
          den = std::max(den, std::fabs(want));
        }
        INFO("n " << n << " tokens " << n_tok << " token " << t << " err " << num / den << " against alone " << num_alone / den);
        CHECK(finite);
        CHECK(num / den <= 5e-5);
        CHECK(num_alone / den <= 1e-4);
      }
    }
  }
}

TEST_CASE("launch_gemv picks the dp4a / tensor-core kernels where they apply", "[gpu][gemv]") {
  GemvArgs a;
  a.k = 4096;
  a.n = 2048;
  a.n_mat = 8;  // 8 experts of 2048 rows, one token: stream
  CHECK(ep::backend::cuda::gemv_kernel_for(static_cast<uint32_t>(GgmlType::q2_k), a) == GemvKernel::stream);
  CHECK(ep::backend::cuda::gemv_kernel_for(static_cast<uint32_t>(GgmlType::q3_k), a) == GemvKernel::stream);
  CHECK(ep::backend::cuda::gemv_kernel_for(static_cast<uint32_t>(GgmlType::mxfp4), a) == GemvKernel::stream);
  CHECK(ep::backend::cuda::gemv_kernel_for(static_cast<uint32_t>(GgmlType::iq2_xxs), a) == GemvKernel::stream);
  CHECK(ep::backend::cuda::gemv_kernel_for(static_cast<uint32_t>(GgmlType::q6_k), a) == GemvKernel::pipe);
  // q8_0 and float matrices: rows when every matrix is known to be 16-byte aligned
  CHECK(ep::backend::cuda::gemv_kernel_for(static_cast<uint32_t>(GgmlType::q8_0), a) == GemvKernel::rows);
  CHECK(ep::backend::cuda::gemv_kernel_for(static_cast<uint32_t>(GgmlType::f16), a) == GemvKernel::rows);
  const void *table[1] = {nullptr};
  a.w_ptrs = table;  // a table nobody checked: the per-lane kernel
  CHECK(ep::backend::cuda::gemv_kernel_for(static_cast<uint32_t>(GgmlType::q8_0), a) == GemvKernel::pipe);
  a.w_ptrs_aligned16 = true;
  CHECK(ep::backend::cuda::gemv_kernel_for(static_cast<uint32_t>(GgmlType::bf16), a) == GemvKernel::rows);
  a.w_ptrs = nullptr;
  a.w_ptrs_aligned16 = false;
  a.w = reinterpret_cast<const void *>(uintptr_t{8});  // a misaligned single matrix
  CHECK(ep::backend::cuda::gemv_kernel_for(static_cast<uint32_t>(GgmlType::f32), a) == GemvKernel::pipe);
  a.w = nullptr;
  a.n_tok = 2;  // several tokens: tensor cores for iq2_xxs, the row kernel for q8_0 (kQ8_0SeveralTokensOnMma off)
  CHECK(ep::backend::cuda::gemv_kernel_for(static_cast<uint32_t>(GgmlType::iq2_xxs), a) == GemvKernel::mma);
  CHECK(ep::backend::cuda::gemv_kernel_for(static_cast<uint32_t>(GgmlType::q8_0), a) == GemvKernel::rows);
  a.kernel = GemvKernel::mma;  // asked for: the tensor-core kernel
  CHECK(ep::backend::cuda::gemv_kernel_for(static_cast<uint32_t>(GgmlType::q8_0), a) == GemvKernel::mma);
  a.kernel = GemvKernel::automatic;
  a.k = 4096 + 32;  // q8_0 rows of whole blocks but not of 256 values: neither mma nor rows
  CHECK(ep::backend::cuda::gemv_kernel_for(static_cast<uint32_t>(GgmlType::q8_0), a) == GemvKernel::pipe);
  a.k = 4096;
  a.n_tok = 1;
  a.n = 1000;
  a.n_mat = 64;  // many small matrices: the choice goes by rows per matrix, not per launch
  CHECK(ep::backend::cuda::gemv_kernel_for(static_cast<uint32_t>(GgmlType::q2_k), a) == GemvKernel::pipe);
  a.n_mat = 1;  // too few rows for dp4a: the exact per-lane kernels
  CHECK(ep::backend::cuda::gemv_kernel_for(static_cast<uint32_t>(GgmlType::q2_k), a) == GemvKernel::pipe);
  CHECK(ep::backend::cuda::gemv_kernel_for(static_cast<uint32_t>(GgmlType::mxfp4), a) == GemvKernel::generic);
  a.n_tok = 2;  // several tokens: one mma covers them all
  CHECK(ep::backend::cuda::gemv_kernel_for(static_cast<uint32_t>(GgmlType::q3_k), a) == GemvKernel::mma);
  a.kernel = GemvKernel::dp4a;  // dp4a runs one token only: automatic's pick instead
  CHECK(ep::backend::cuda::gemv_kernel_for(static_cast<uint32_t>(GgmlType::q3_k), a) == GemvKernel::mma);
  a.n_tok = 1;
  CHECK(ep::backend::cuda::gemv_kernel_for(static_cast<uint32_t>(GgmlType::q3_k), a) == GemvKernel::dp4a);  // asked for: any size
  a.kernel = GemvKernel::stream;  // asked for: any size; more tokens: automatic's pick
  CHECK(ep::backend::cuda::gemv_kernel_for(static_cast<uint32_t>(GgmlType::q3_k), a) == GemvKernel::stream);
  a.n_tok = 3;
  CHECK(ep::backend::cuda::gemv_kernel_for(static_cast<uint32_t>(GgmlType::q3_k), a) == GemvKernel::mma);
  a.n_tok = 1;
  a.kernel = GemvKernel::mma;  // asked for a type it does not cover: the type's default
  CHECK(ep::backend::cuda::gemv_kernel_for(static_cast<uint32_t>(GgmlType::q4_k), a) == GemvKernel::generic);
  a.k = 96;  // mxfp4 with k not a multiple of 256
  CHECK(ep::backend::cuda::gemv_kernel_for(static_cast<uint32_t>(GgmlType::mxfp4), a) == GemvKernel::generic);
  a.kernel = GemvKernel::dp4a;
  CHECK(ep::backend::cuda::gemv_kernel_for(static_cast<uint32_t>(GgmlType::mxfp4), a) == GemvKernel::generic);
  GemvArgs b;  // one matrix 2 bytes off a word: dp4a loads words (q3_K handles 2-byte offsets)
  b.k = 4096;
  b.n = 4096;
  b.w = reinterpret_cast<const void *>(uintptr_t{0x10002});
  CHECK(ep::backend::cuda::gemv_kernel_for(static_cast<uint32_t>(GgmlType::q2_k), b) == GemvKernel::pipe);
  CHECK(ep::backend::cuda::gemv_kernel_for(static_cast<uint32_t>(GgmlType::mxfp4), b) == GemvKernel::generic);
  // stream q3_K reads 4-byte aligned rows: a 2-byte aligned matrix or rows of an odd number of
  // blocks (k 768: every other row 2 bytes off) run on dp4a
  CHECK(ep::backend::cuda::gemv_kernel_for(static_cast<uint32_t>(GgmlType::q3_k), b) == GemvKernel::dp4a);
  b.w = reinterpret_cast<const void *>(uintptr_t{0x10004});
  CHECK(ep::backend::cuda::gemv_kernel_for(static_cast<uint32_t>(GgmlType::q3_k), b) == GemvKernel::stream);
  b.k = 768;
  CHECK(ep::backend::cuda::gemv_kernel_for(static_cast<uint32_t>(GgmlType::q3_k), b) == GemvKernel::dp4a);
  b.k = 4096;
  b.w = reinterpret_cast<const void *>(uintptr_t{0x10002});
  CHECK(ep::backend::cuda::gemv_kernel_for(static_cast<uint32_t>(GgmlType::iq2_xxs), b) == GemvKernel::stream);  // 2-byte aligned
  b.w = reinterpret_cast<const void *>(uintptr_t{0x10001});
  CHECK(ep::backend::cuda::gemv_kernel_for(static_cast<uint32_t>(GgmlType::iq2_xxs), b) == GemvKernel::pipe);
  std::mt19937 rng(34);
  CHECK(run_case(Case{GgmlType::mxfp4, 96, 21, 2, 2}, GemvKernel::mma, rng) <= 1e-4);
  CHECK(run_case(Case{GgmlType::mxfp4, 96, 21, 2, 1}, GemvKernel::dp4a, rng) <= 1e-4);
  CHECK(run_case(Case{GgmlType::mxfp4, 96, 21, 2, 1}, GemvKernel::stream, rng) <= 1e-4);
  GemvKernel k{};
  CHECK(ep::backend::cuda::parse_gemv_kernel("dp4a", k));
  CHECK(k == GemvKernel::dp4a);
  CHECK(ep::backend::cuda::parse_gemv_kernel("stream", k));
  CHECK(k == GemvKernel::stream);
  CHECK(ep::backend::cuda::parse_gemv_kernel("auto", k));
  CHECK(k == GemvKernel::automatic);
  CHECK_FALSE(ep::backend::cuda::parse_gemv_kernel("fast", k));
}

TEST_CASE("an activation on the input (GemvGlu) equals launch_glu then launch_gemv bit for bit", "[gpu][gemv]") {
  // down's input act(gate, up) computed as the dp4a / stream kernels read x, against the GLU
  // launch the decode path used before: the same f32 values in, the same outputs out
  // (k 2048: DeepSeek-V4's down; 3584: the wider stream blocks of q2_K, q3_K and mxfp4 at that k)
  std::mt19937 rng(37);
  const int64_t n = 2048;
  const int n_mat = 3;
  const std::vector<int32_t> rows = {2, 0, 3};
  for (const int64_t k : {int64_t{2048}, int64_t{3584}}) {
    for (GgmlType type : {GgmlType::q2_k, GgmlType::q3_k, GgmlType::mxfp4, GgmlType::iq2_xxs}) {
      const auto t = static_cast<uint32_t>(type);
      const uint64_t mat_bytes = ep::format::ggml_row_bytes(type, k, "test") * n;
      std::vector<uint8_t> all;
      for (int m = 0; m < n_mat; ++m) {
        const auto w = ep::test::random_weights(type, k, n, rng);
        all.insert(all.end(), w.begin(), w.end());
      }
      Dev dw(all);
      std::vector<const void *> ptrs;
      for (int m = 0; m < n_mat; ++m) ptrs.push_back(static_cast<uint8_t *>(dw.p) + m * mat_bytes);
      const auto gate = ep::test::random_floats(static_cast<size_t>(4 * k), rng, -12.0f, 12.0f);  // past the clamp
      const auto up = ep::test::random_floats(static_cast<size_t>(4 * k), rng, -12.0f, 12.0f);
      Dev dptrs(ptrs), drows(rows), dg(gate), du(up), dh(gate.size() * 4), dy_ref(static_cast<size_t>(n_mat * n) * 4),
          dy(static_cast<size_t>(n_mat * n) * 4);
      for (const ep::backend::cuda::GemvGlu act : {ep::backend::cuda::GemvGlu{nullptr, 0, 7.0f, 1.0f, 1.0f}, ep::backend::cuda::GemvGlu{nullptr, 1, 0.0f, 1.5f, 2.5f}}) {
        for (GemvKernel kernel : {GemvKernel::automatic, GemvKernel::dp4a}) {
          Stream stream;
          EP_CUDA_CHECK(cudaMemsetAsync(dy_ref.p, 0xFF, dy_ref.bytes, stream.s));
          EP_CUDA_CHECK(cudaMemsetAsync(dy.p, 0xFF, dy.bytes, stream.s));
          ep::backend::cuda::launch_glu(static_cast<const float *>(dg.p), static_cast<const float *>(du.p), 4 * k, act.kind, act.limit,
                               act.beta_g, act.beta_u, static_cast<float *>(dh.p), stream.s);
          GemvArgs a;
          a.w_ptrs = static_cast<const void *const *>(dptrs.p);
          a.x = static_cast<const float *>(dh.p);
          a.x_rows = static_cast<const int32_t *>(drows.p);
          a.y = static_cast<float *>(dy_ref.p);
          a.k = k;
          a.n = n;
          a.n_mat = n_mat;
          a.kernel = kernel;
          ep::backend::cuda::launch_gemv(t, a, stream.s);
          a.x = static_cast<const float *>(dg.p);
          a.y = static_cast<float *>(dy.p);
          a.glu = act;
          a.glu.up = static_cast<const float *>(du.p);
          REQUIRE(ep::backend::cuda::gemv_takes_glu(t, a));
          ep::backend::cuda::launch_gemv(t, a, stream.s);
          EP_CUDA_CHECK(cudaStreamSynchronize(stream.s));
          const auto want = dy_ref.get<float>(), got = dy.get<float>();
          INFO("type " << t << " k " << k << " kernel " << ep::backend::cuda::gemv_kernel_name(ep::backend::cuda::gemv_kernel_for(t, a))
                       << " activation " << act.kind);
          CHECK(std::all_of(got.begin(), got.end(), [](float v) { return std::isfinite(v); }));
          CHECK(std::memcmp(got.data(), want.data(), got.size() * 4) == 0);
        }
      }
      // a kernel that reads x elsewhere than into a quantized copy: refused before any launch
      GemvArgs p;
      p.w_ptrs = static_cast<const void *const *>(dptrs.p);
      p.x = static_cast<const float *>(dg.p);
      p.y = static_cast<float *>(dy.p);
      p.k = k;
      p.n = n;
      p.n_mat = n_mat;
      p.kernel = GemvKernel::pipe;
      p.glu.up = static_cast<const float *>(du.p);
      CHECK_FALSE(ep::backend::cuda::gemv_takes_glu(t, p));
      ep::Status status = ep::Status::ok;
      try {
        ep::backend::cuda::launch_gemv(t, p, nullptr);
      } catch (const ep::Error &e) {
        status = e.status();
      }
      CHECK(status == ep::Status::invalid_argument);
    }
  }
}
