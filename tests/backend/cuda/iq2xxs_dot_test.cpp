// The iq2_xxs stream decoder's sub-block arithmetic (cuda/iq2xxs_dot.cuh) on a CPU, against
// ggml's definition: every (grid entry, sign pattern) pair signed by the byte-mask trick equals the
// signed grid values; random sub-blocks' integer sums equal the exact sums over the dequantized
// values; and ggml's block scale d·(0.5 + s)·0.25 equals d/8·(2s + 1) for every finite f16 d.
#include "backend/cuda/iq2xxs_dot.cuh"

#include "backend/iq2xxs_table.hpp"
#include "support/catch.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace {

using ep::backend::cuda::iq2xxs::WordPair;

struct Tables {
  WordPair grid[256], masks[128];
  Tables() {
    for (int i = 0; i < 256; ++i)
      grid[i] = {static_cast<uint32_t>(ep::backend::kIq2xxsGrid[i]), static_cast<uint32_t>(ep::backend::kIq2xxsGrid[i] >> 32)};
    for (int i = 0; i < 128; ++i) masks[i] = ep::backend::cuda::iq2xxs::sign_masks(ep::backend::kIq2xsSigns[i]);
  }
};

// ggml's value j (0..7) of grid entry g under sign pattern s: ±grid byte
int ggml_value(int g, int s, int j) {
  const int mag = static_cast<int>((ep::backend::kIq2xxsGrid[g] >> (8 * j)) & 0xFF);
  return ((ep::backend::kIq2xsSigns[s] >> j) & 1) != 0 ? -mag : mag;
}

float f16_to_float(uint16_t h) {  // every finite f16, subnormals included
  const int e = (h >> 10) & 31, m = h & 1023;
  const float v = e == 0 ? std::ldexp(static_cast<float>(m), -24) : std::ldexp(static_cast<float>(m + 1024), e - 25);
  return (h & 0x8000) != 0 ? -v : v;
}

}  // namespace

TEST_CASE("iq2_xxs: a grid word signed by its pattern's byte mask is ggml's signed values", "[iq2xxs]") {
  const Tables t;
  int checked = 0;
  for (int g = 0; g < 256; ++g) {
    for (int s = 0; s < 128; ++s) {
      const uint32_t w[2] = {ep::backend::cuda::iq2xxs::signed_word(t.grid[g].lo, t.masks[s].lo),
                             ep::backend::cuda::iq2xxs::signed_word(t.grid[g].hi, t.masks[s].hi)};
      for (int j = 0; j < 8; ++j) {
        const int got = static_cast<int8_t>((w[j >> 2] >> (8 * (j & 3))) & 0xFF);
        if (got != ggml_value(g, s, j)) FAIL("grid " << g << " signs " << s << " value " << j << ": " << got);
        ++checked;
      }
    }
  }
  CHECK(checked == 256 * 128 * 8);
}

TEST_CASE("iq2_xxs: the sub-block sum equals the exact sum over ggml's values", "[iq2xxs]") {
  const Tables t;
  std::mt19937 rng(41);
  std::uniform_int_distribution<int> byte(-128, 127);
  int64_t largest = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    const bool extreme = trial % 7 == 0;  // scale 15, x at ±127 with the weights' signs: near the bound
    const uint32_t idx = static_cast<uint32_t>(rng());
    const uint32_t aux = extreme ? static_cast<uint32_t>(rng()) | 0xF0000000u : static_cast<uint32_t>(rng());
    uint32_t xh[8], xl[8];
    int8_t hb[32], lb[32];
    for (int i = 0; i < 32; ++i) {
      const int w = ggml_value(static_cast<int>((idx >> (8 * (i / 8))) & 0xFF), static_cast<int>((aux >> (7 * (i / 8))) & 127), i % 8);
      hb[i] = static_cast<int8_t>(extreme ? (w < 0 ? -127 : 127) : byte(rng));
      lb[i] = static_cast<int8_t>(extreme ? (w < 0 ? -127 : 127) : byte(rng));
    }
    std::memcpy(xh, hb, 32);
    std::memcpy(xl, lb, 32);
    int64_t want = 0;
    for (int l = 0; l < 4; ++l) {
      const int g = static_cast<int>((idx >> (8 * l)) & 0xFF), s = static_cast<int>((aux >> (7 * l)) & 127);
      for (int j = 0; j < 8; ++j) want += static_cast<int64_t>(ggml_value(g, s, j)) * (254 * hb[8 * l + j] + lb[8 * l + j]);
    }
    want *= 2 * static_cast<int64_t>(aux >> 28) + 1;
    largest = std::max(largest, want < 0 ? -want : want);
    const int32_t got = ep::backend::cuda::iq2xxs::subblock_sum(idx, aux, t.grid, t.masks, xh, xl);
    if (got != want) FAIL("trial " << trial << ": " << got << " != " << want);
  }
  INFO("largest |sum| " << largest);
  CHECK(largest < (int64_t{1} << 31));
  CHECK(largest > (int64_t{1} << 28));  // the extreme trials came near the bound
}

TEST_CASE("iq2_xxs: ggml's scale d·(0.5 + s)·0.25 is d/8·(2s + 1) for every f16 d", "[iq2xxs]") {
  int checked = 0;
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if (((h >> 10) & 31) == 31) continue;  // inf and NaN
    const float d = f16_to_float(static_cast<uint16_t>(h));
    for (uint32_t s = 0; s < 16; ++s) {
      const float ggml = (d * (0.5f + static_cast<float>(s))) * 0.25f;
      const float ours = d * 0.125f * static_cast<float>(2 * s + 1);
      if (std::memcmp(&ggml, &ours, sizeof ggml) != 0) FAIL("d bits " << h << " s " << s << ": " << ggml << " vs " << ours);
      ++checked;
    }
  }
  CHECK(checked == 63488 * 16);
}
