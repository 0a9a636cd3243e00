// The mxfp4 decoder's table lookup and x layout (cuda/mxfp4_pairs.cuh) on a CPU, against the CPU
// backend's dequantization (bit-exact with ggml): every nibble pair of a word looks up 2 × its
// e2m1 value in the documented order; a block's dot product through the lookup and the x layout
// equals the exact integer dot over the dequantized values; and the two words quantize_x's paired
// threads write put every value at its x position.
#include "backend/cuda/mxfp4_pairs.cuh"

#include "backend/dequant.hpp"
#include "backend/cuda/dp4a.cuh"
#include "format/ggml_type.hpp"
#include "support/catch.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace {

namespace mx = ep::backend::cuda::mxfp4;

// The CPU dequantizer's values of a block's 32 weights (scale byte 128) in units of the value of
// e2m1 code 1 — kvalues_mxfp4, what the lookup must return
std::vector<int> block_ints(const uint8_t (&qs)[16]) {
  auto dequant = [](const uint8_t *q16, float (&f)[32]) {
    uint8_t block[17];
    block[0] = 128;
    std::memcpy(block + 1, q16, 16);
    ep::backend::dequantize_row(ep::format::GgmlType::mxfp4, block, f, 32);
  };
  static const float unit = [&] {
    uint8_t ones[16];
    std::memset(ones, 0x11, 16);
    float f[32];
    dequant(ones, f);
    return f[0];
  }();
  float f[32];
  dequant(qs, f);
  std::vector<int> out(32);
  for (int v = 0; v < 32; ++v) {
    const float n = f[v] / unit;
    REQUIRE(n == std::round(n));
    out[v] = static_cast<int>(n);
  }
  return out;
}

int8_t byte_of(uint32_t w, int n) { return static_cast<int8_t>((w >> (8 * n)) & 0xFF); }

}  // namespace

TEST_CASE("the mxfp4 lookup gives 2 x e2m1 for every nibble pair, in nibble order", "[gemv][mxfp4]") {
  std::mt19937 rng(41);
  for (uint32_t low = 0; low < 65536; ++low) {
    const uint32_t q = low | ((low == 0 ? rng() : low) << 16);  // both halves of the word
    uint8_t qs[16];
    for (int t = 0; t < 4; ++t) std::memcpy(qs + 4 * t, &q, 4);
    const std::vector<int> want = block_ints(qs);
    const mx::Pairs p = mx::pairs(q);
    // .x: values 0, 16, 1, 17 of word 0 (bytes 0 and 1); .y: 2, 18, 3, 19
    const int order_x[4] = {0, 16, 1, 17}, order_y[4] = {2, 18, 3, 19};
    for (int n = 0; n < 4; ++n) {
      INFO("q " << std::hex << q << " byte " << n);
      REQUIRE(byte_of(p.x, n) == want[order_x[n]]);
      REQUIRE(byte_of(p.y, n) == want[order_y[n]]);
    }
  }
}

TEST_CASE("a block's dot through the mxfp4 lookup and x layout is the exact integer dot", "[gemv][mxfp4]") {
  std::mt19937 rng(42);
  for (int rep = 0; rep < 20000; ++rep) {
    uint8_t qs[16];
    for (auto &b : qs) b = static_cast<uint8_t>(rng());
    const std::vector<int> w = block_ints(qs);
    int8_t x[32];
    for (auto &v : x) v = static_cast<int8_t>(static_cast<int>(rng() % 255) - 127);
    // x as quantize_x lays it out: value v at byte x_position(v)
    uint8_t laid[32];
    for (int v = 0; v < 32; ++v) laid[mx::x_position(v)] = static_cast<uint8_t>(x[v]);
    uint32_t xw[8];
    std::memcpy(xw, laid, 32);
    int32_t got = 0, want = 0;
    for (int t = 0; t < 4; ++t) {
      uint32_t q;
      std::memcpy(&q, qs + 4 * t, 4);
      const mx::Pairs p = mx::pairs(q);
      got = ep::backend::cuda::dp4a<true, true>(p.x, xw[2 * t], got);
      got = ep::backend::cuda::dp4a<true, true>(p.y, xw[2 * t + 1], got);
    }
    for (int v = 0; v < 32; ++v) want += w[v] * x[v];
    REQUIRE(got == want);
  }
}

TEST_CASE("quantize_x's paired threads write every mxfp4 x value at its position", "[gemv][mxfp4]") {
  uint8_t x[32];
  for (int v = 0; v < 32; ++v) x[v] = static_cast<uint8_t>(v + 1);
  uint8_t laid[32];
  std::memset(laid, 0, 32);
  for (int s = 0; s < 16; s += 4) {  // the thread of values s.. and its partner of s + 16..
    uint32_t own, other;
    std::memcpy(&own, x + s, 4);
    std::memcpy(&other, x + s + 16, 4);
    const uint32_t lower = mx::lower_word(own, other), upper = mx::upper_word(other, own);
    std::memcpy(laid + 2 * s, &lower, 4);      // DpMxfp4::piece: position 2s
    std::memcpy(laid + 2 * s + 4, &upper, 4);  // and 2s + 4 for the upper thread
  }
  for (int v = 0; v < 32; ++v) {
    INFO("value " << v);
    CHECK(laid[mx::x_position(v)] == x[v]);
  }
}
