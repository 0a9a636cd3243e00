// The per-lane arithmetic of the int8 tensor-core q2_K GEMV (cuda/gemv_imma.cuh) on a CPU: the
// warp's 32 lanes are run one after the other, and mma.sync.m16n8k32.u8.s8 is emulated from its
// fragment layout as the PTX ISA documents it (itself checked against a plain matrix product).
// Compared with ggml's dequantization and f64 dot products, threshold 2e-4 of the largest output
// (the dp4a kernels' threshold: x carried as int8 hi + lo). Runs without a GPU.
#include "backend/dequant.hpp"
#include "backend/cuda/gemv_imma.cuh"
#include "backend/random_weights.hpp"
#include "support/catch.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace imma = ep::backend::cuda::imma;
using ep::format::GgmlType;

namespace {

// The lane's place in the fragments: lane = 4g + t.
int a_row(int lane, int reg) { return (lane >> 2) + 8 * (reg & 1); }
int a_k(int lane, int reg, int byte) { return 4 * (lane & 3) + 16 * (reg >> 1) + byte; }
int b_col(int lane) { return lane >> 2; }
int b_k(int lane, int reg, int byte) { return 4 * (lane & 3) + 16 * reg + byte; }
int c_row(int lane, int reg) { return (lane >> 2) + 8 * (reg >> 1); }
int c_col(int lane, int reg) { return 2 * (lane & 3) + (reg & 1); }

// D = A·B + C for the whole warp: A 16x32 u8, B 32x8 s8, C/D 16x8 s32, each lane's registers as
// the PTX ISA lays them out ("Matrix Fragments for mma.m16n8k32").
void emulate_mma(const uint32_t (&a)[32][4], const uint32_t (&b)[32][2], int32_t (&c)[32][4]) {
  uint8_t A[16][32];
  int8_t B[32][8];
  for (int lane = 0; lane < 32; ++lane) {
    for (int r = 0; r < 4; ++r)
      for (int i = 0; i < 4; ++i) A[a_row(lane, r)][a_k(lane, r, i)] = static_cast<uint8_t>(a[lane][r] >> (8 * i));
    for (int r = 0; r < 2; ++r)
      for (int i = 0; i < 4; ++i) B[b_k(lane, r, i)][b_col(lane)] = static_cast<int8_t>(b[lane][r] >> (8 * i));
  }
  for (int lane = 0; lane < 32; ++lane)
    for (int r = 0; r < 4; ++r) {
      int32_t sum = 0;
      for (int k = 0; k < 32; ++k) sum += int32_t(A[c_row(lane, r)][k]) * int32_t(B[k][c_col(lane, r)]);
      c[lane][r] += sum;
    }
}

// y[r] for rows [0, n) of a q2_K matrix (k values per row) through the lane functions, one warp
// per 16-row tile, as gemv_imma_kernel computes them.
std::vector<float> imma_gemv(const std::vector<uint8_t> &w, const std::vector<float> &x, int64_t k, int64_t n) {
  const int64_t nb = k / imma::kBlockValues, row_bytes = nb * imma::kBlockBytes;
  std::vector<imma::XBlock> xq(static_cast<size_t>(nb));
  for (int64_t b = 0; b < nb; ++b)
    for (int c = 0; c < 4; ++c) {
      const float *xb = x.data() + b * imma::kBlockValues;
      float v[4][16];
      float mx = 0.0f;
      for (int j = 0; j < 4; ++j) {
        imma::load_group(xb, c, j, v[j]);
        mx = std::max(mx, imma::group_absmax(v[j]));
      }
      for (int j = 0; j < 4; ++j) imma::quantize_group(v[j], c, j, mx, xq[static_cast<size_t>(b)]);
    }
  std::vector<float> y(static_cast<size_t>(n));
  for (int64_t r0 = 0; r0 < n; r0 += 16) {
    float acc[32][2] = {};
    for (int64_t b = 0; b < nb; ++b) {
      const imma::XBlock &xb = xq[static_cast<size_t>(b)];
      auto block_of = [&](int64_t row) { return w.data() + std::min(row, n - 1) * row_bytes + b * imma::kBlockBytes; };
      int32_t blk[32][2] = {};
      for (int j = 0; j < 4; ++j) {
        int32_t c[32][4] = {};
        for (int m = 0; m < 2; ++m) {
          uint32_t a[32][4], bb[32][2];
          for (int lane = 0; lane < 32; ++lane) {
            imma::a_regs(block_of(r0 + (lane >> 2)), block_of(r0 + (lane >> 2) + 8), lane, j, m, a[lane]);
            imma::b_regs(xb, lane, j, m, bb[lane]);
          }
          emulate_mma(a, bb, c);
        }
        for (int lane = 0; lane < 32; ++lane)
          imma::add_set(c[lane], j, imma::slot_scales(block_of(r0 + (lane >> 2)), lane) & 0x0F0F0F0Fu,
                        imma::slot_scales(block_of(r0 + (lane >> 2) + 8), lane) & 0x0F0F0F0Fu, blk[lane][0],
                        blk[lane][1]);
      }
      for (int lane = 0; lane < 32; ++lane)
        for (int h = 0; h < 2; ++h) {
          const uint8_t *blkp = block_of(r0 + (lane >> 2) + 8 * h);
          const float d = ep::backend::fp16_to_fp32(static_cast<uint16_t>(blkp[80] | (blkp[81] << 8)));
          const float dmin = ep::backend::fp16_to_fp32(static_cast<uint16_t>(blkp[82] | (blkp[83] << 8)));
          uint32_t planes[3];
          imma::plane_words(xb, lane & 3, planes);
          const int32_t mins = imma::min_sum(imma::slot_scales(blkp, lane), planes);
          acc[lane][h] += imma::block_term(blk[lane][h], mins, d, dmin, xb.scale[lane & 3]);
        }
    }
    for (int g = 0; g < 8; ++g)
      for (int h = 0; h < 2; ++h) {
        const int64_t row = r0 + g + 8 * h;
        if (row < n) y[static_cast<size_t>(row)] = (acc[4 * g][h] + acc[4 * g + 1][h]) + (acc[4 * g + 2][h] + acc[4 * g + 3][h]);
      }
  }
  return y;
}

}  // namespace

TEST_CASE("the mma.m16n8k32 emulation is a matrix product", "[gemv][imma]") {
  std::mt19937 rng(7);
  uint8_t A[16][32];
  int8_t B[32][8];
  for (auto &row : A)
    for (auto &v : row) v = static_cast<uint8_t>(rng());
  for (auto &row : B)
    for (auto &v : row) v = static_cast<int8_t>(rng());
  uint32_t a[32][4] = {}, b[32][2] = {};
  for (int lane = 0; lane < 32; ++lane) {
    for (int r = 0; r < 4; ++r)
      for (int i = 0; i < 4; ++i) a[lane][r] |= uint32_t(A[a_row(lane, r)][a_k(lane, r, i)]) << (8 * i);
    for (int r = 0; r < 2; ++r)
      for (int i = 0; i < 4; ++i) b[lane][r] |= uint32_t(static_cast<uint8_t>(B[b_k(lane, r, i)][b_col(lane)])) << (8 * i);
  }
  int32_t c[32][4] = {};
  emulate_mma(a, b, c);
  emulate_mma(a, b, c);  // accumulates
  for (int lane = 0; lane < 32; ++lane)
    for (int r = 0; r < 4; ++r) {
      int32_t want = 0;
      for (int k = 0; k < 32; ++k) want += int32_t(A[c_row(lane, r)][k]) * int32_t(B[k][c_col(lane, r)]);
      CHECK(c[lane][r] == 2 * want);
    }
}

TEST_CASE("the tensor-core q2_K GEMV arithmetic matches the CPU (emulated warp)", "[gemv][imma]") {
  std::mt19937 rng(41);
  // partial tiles (n not a multiple of 16), one and several blocks per row, x far from 1
  struct Case {
    int64_t k, n;
    float x_scale;
  };
  for (const Case c : {Case{256, 16, 1.0f}, Case{1024, 37, 1.0f}, Case{4096, 48, 1.0f}, Case{768, 21, 3e-6f},
                       Case{512, 32, 4e5f}}) {
    const auto w = ep::test::random_weights(GgmlType::q2_k, c.k, c.n, rng);
    auto x = ep::test::random_floats(static_cast<size_t>(c.k), rng);
    for (auto &v : x) v *= c.x_scale;
    const auto got = imma_gemv(w, x, c.k, c.n);
    std::vector<float> deq(static_cast<size_t>(c.k * c.n));
    ep::backend::dequantize_row(GgmlType::q2_k, w.data(), deq.data(), c.k * c.n);
    double num = 0, den = 0;
    bool finite = true;
    for (int64_t r = 0; r < c.n; ++r) {
      double want = 0;
      for (int64_t i = 0; i < c.k; ++i) want += static_cast<double>(deq[r * c.k + i]) * x[i];
      finite = finite && std::isfinite(got[r]);
      num = std::max(num, std::fabs(got[r] - want));
      den = std::max(den, std::fabs(want));
    }
    INFO("k " << c.k << " n " << c.n << " x scale " << c.x_scale << " err " << num / den);
    CHECK(finite);
    CHECK(num / den <= 2e-4);
  }
}
