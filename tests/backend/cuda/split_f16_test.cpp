// The split GEMM's number format (cuda/split_f16.cuh) on a CPU, with the functions the kernels
// call: the power-of-two scale of a row for every f32 exponent of its largest value; the split of
// every exponent of a value below that largest (and every mantissa of the binades where hi or lo
// meets f16's subnormals) within |w − hi − lo| <= max(2^-22·|w|, 2^-25), i.e. 22 significant bits;
// every product of two halves exact in f32; the three products of the GEMM within 3.01·2^-22 of
// a product; NaN and inf never coming out finite.
#include "backend/cuda/split_f16.cuh"

#include "backend/dequant.hpp"
#include "support/catch.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>

namespace {

namespace sp = ep::backend::cuda::split;

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

double h(uint16_t bits) { return static_cast<double>(ep::backend::fp16_to_fp32(bits)); }

// |w − hi − lo| over the bound max(2^-22·|w|, 2^-25) for w = v·scale (exact in double).
double bound_ratio(float v, float scale) {
  const sp::Halves s = sp::split(v, scale);
  const double w = static_cast<double>(v) * scale;
  const double err = std::fabs(w - h(s.hi) - h(s.lo));
  return err / std::max(std::ldexp(std::fabs(w), -22), std::ldexp(1.0, -25));
}

}  // namespace

TEST_CASE("split_f16: the scale exponent brings every row's largest value into [2^14, 2^15)", "[backend][cuda][split]") {
  for (uint32_t field = 0; field < 256; ++field) {
    for (uint32_t mant : {0u, 1u, 0x400000u, 0x7FFFFFu}) {
      const float max_abs = from_bits(field << 23 | mant);
      const int e = sp::scale_exponent(max_abs);
      INFO("exponent field " << field << " mantissa " << mant << " -> " << e);
      CHECK(e >= -sp::kMaxExponent);
      CHECK(e <= sp::kMaxExponent);
      CHECK(static_cast<double>(sp::pow2(e)) == std::ldexp(1.0, e));
      if (field == 255) {  // inf and NaN: the clamp's smallest scale of an f32 exponent
        CHECK(e == 14 - 128);
      } else if (field >= 127 - 106) {  // normal, at least 2^-106: the target binade
        const double scaled = std::ldexp(static_cast<double>(max_abs), e);
        CHECK(scaled >= 16384.0);
        CHECK(scaled < 32768.0);
      } else {  // below 2^-106 (zero and subnormals too): the clamp
        CHECK(e == sp::kMaxExponent);
      }
    }
  }
}

TEST_CASE("split_f16: hi + lo carries 22 significant bits of every value of a row, every exponent", "[backend][cuda][split]") {
  std::mt19937 rng(41);
  double worst = 0, worst_full = 0;
  int64_t checked = 0, over = 0, not_finite = 0, over_full = 0;
  float first_bad = 0, first_bad_max = 0;
  // the row's largest value over every normal exponent a row can have before the clamp
  for (int max_exp = -106; max_exp <= 127; ++max_exp) {
    const float max_abs = std::ldexp(1.5f, max_exp);
    const float scale = sp::pow2(sp::scale_exponent(max_abs));
    // values of every exponent from the largest's down to 64 binades below it (f16's floor has
    // long taken over there), a spread of mantissas and both signs
    for (int ve = max_exp; ve >= max_exp - 64 && ve >= -149; --ve) {
      for (int i = 0; i < 64; ++i) {
        const uint32_t mant = i == 0 ? 0u : i == 1 ? 0x7FFFFFu : static_cast<uint32_t>(rng()) & 0x7FFFFFu;
        float v = std::ldexp(1.0f + static_cast<float>(mant) / 8388608.0f, ve);
        if (std::fabs(v) > max_abs) continue;
        if (i % 2) v = -v;
        ++checked;
        const double r = bound_ratio(v, scale);
        if (r > 1.0 && over++ == 0) {
          first_bad = v;
          first_bad_max = max_abs;
        }
        worst = std::max(worst, r);
        const sp::Halves s = sp::split(v, scale);
        not_finite += !std::isfinite(h(s.hi)) || !std::isfinite(h(s.lo));
        // the 22-bit claim where the bound's floor is below it: relative to the value itself
        const double w = static_cast<double>(v) * scale;
        if (std::fabs(w) >= 0.125) {
          const double rel = std::fabs(w - h(s.hi) - h(s.lo)) / std::fabs(w);
          over_full += rel > std::ldexp(1.0, -22);
          worst_full = std::max(worst_full, rel);
        }
      }
    }
  }
  std::printf("split_f16: %lld values; worst |w - hi - lo| / bound %.3f; worst relative error at |w| >= 2^-3: 2^%.2f\n",
              static_cast<long long>(checked), worst, std::log2(worst_full));
  INFO("first value over the bound: " << first_bad << " in a row of largest " << first_bad_max);
  CHECK(over == 0);
  CHECK(over_full == 0);
  CHECK(not_finite == 0);
  CHECK(checked > 900000);
  CHECK(worst > 0.25);  // the bound is not loose by orders of magnitude
}

TEST_CASE("split_f16: every mantissa of the binades where the halves meet f16's limits", "[backend][cuda][split]") {
  // w in [2^14, 2^15) (a row's largest: hi at its coarsest), [2^-3, 2^-2) (lo reaches f16's
  // subnormals), [2^-15, 2^-14) (hi itself subnormal): all 2^23 mantissas of each, scale 1
  for (int e : {14, -3, -15}) {
    double worst = 0;
    for (uint32_t mant = 0; mant < (1u << 23); ++mant) {
      const float v = from_bits(static_cast<uint32_t>(e + 127) << 23 | mant);
      const double r = bound_ratio(v, 1.0f);
      if (r > worst) worst = r;
    }
    INFO("binade 2^" << e);
    CHECK(worst <= 1.0);
  }
}

TEST_CASE("split_f16: products of halves are exact in f32 and the GEMM's three keep 22 bits", "[backend][cuda][split]") {
  std::mt19937 rng(43);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  std::uniform_int_distribution<int> ex(-17, 0);
  double worst = 0;
  for (int i = 0; i < 200000; ++i) {
    // w and x after their rows' scales: the largest in [2^14, 2^15), these down to 2^-17 of it
    // (|w| >= 2^-3: where the split's 22 bits are relative to the value)
    const float w = std::ldexp(mant(rng), 14 + ex(rng)) * (i % 2 ? -1.0f : 1.0f);
    const float x = std::ldexp(mant(rng), 14 + ex(rng)) * (i % 3 ? 1.0f : -1.0f);
    const sp::Halves a = sp::split(w, 1.0f), b = sp::split(x, 1.0f);
    const float ah = ep::backend::fp16_to_fp32(a.hi), al = ep::backend::fp16_to_fp32(a.lo);
    const float bh = ep::backend::fp16_to_fp32(b.hi), bl = ep::backend::fp16_to_fp32(b.lo);
    for (auto [p, q] : {std::pair{ah, bh}, std::pair{ah, bl}, std::pair{al, bh}}) {
      const float f = p * q;
      REQUIRE(static_cast<double>(f) == static_cast<double>(p) * static_cast<double>(q));
    }
    const double got = static_cast<double>(ah) * bh + static_cast<double>(ah) * bl + static_cast<double>(al) * bh;
    const double want = static_cast<double>(w) * x;
    const double rel = std::fabs(got - want) / std::fabs(want);
    worst = std::max(worst, rel);
    // |ε_w·x| + |w·ε_x| + |w_lo·x_lo|, each at most 2^-22·|w·x| (the last one a hair more)
    REQUIRE(rel <= 3.01 * std::ldexp(1.0, -22));
  }
  std::printf("split_f16: worst relative error of hi·hi + hi·lo + lo·hi: 2^%.2f\n", std::log2(worst));
}

TEST_CASE("split_f16: NaN stays NaN, inf gives NaN in lo, zero splits to zeros", "[backend][cuda][split]") {
  const float nan = std::nanf(""), inf = INFINITY;
  for (float scale : {sp::pow2(-114), 1.0f, sp::pow2(120)}) {
    const sp::Halves n = sp::split(nan, scale);
    CHECK(std::isnan(h(n.hi)));
    CHECK(std::isnan(h(n.lo)));
    for (float s : {inf, -inf}) {
      const sp::Halves i = sp::split(s, scale);
      CHECK(h(i.hi) == static_cast<double>(s));
      CHECK(std::isnan(h(i.lo)));
    }
    const sp::Halves z = sp::split(0.0f, scale);
    CHECK(h(z.hi) == 0.0);
    CHECK(h(z.lo) == 0.0);
  }
  CHECK(sp::scale_exponent(inf) == -114);
  CHECK(sp::scale_exponent(0.0f) == sp::kMaxExponent);
  // a row holding inf scales its finite values by 2^-114: they vanish, the inf's lo is NaN, so the
  // outputs the row touches are NaN (W_hi·x_lo or W_lo·x_hi meets that NaN), never finite
  const float scale = sp::pow2(sp::scale_exponent(inf));
  CHECK(h(sp::split(1.0f, scale).hi) == 0.0);
}
