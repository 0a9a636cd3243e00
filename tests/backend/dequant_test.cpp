// Dequantization: hand-built blocks with known values for every field, checked against values
// computed here element by element from the ggml formulas (models.md §4), exactly.
#include "backend/dequant.hpp"
#include "backend/iq2xxs_table.hpp"
#include "core/status.hpp"
#include "support/catch.hpp"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

using ep::backend::dequantize_row;
using ep::backend::fp16_to_fp32;
using ep::backend::fp32_to_fp16;
using ep::format::GgmlType;

namespace {

void put_half(std::vector<uint8_t> &b, size_t at, float v) {
  const uint16_t h = fp32_to_fp16(v);
  b[at] = static_cast<uint8_t>(h & 0xFF);
  b[at + 1] = static_cast<uint8_t>(h >> 8);
}
float get_half(const std::vector<uint8_t> &b, size_t at) { return fp16_to_fp32(static_cast<uint16_t>(b[at] | (b[at + 1] << 8))); }

std::vector<float> deq(GgmlType t, const std::vector<uint8_t> &b, int n) {
  std::vector<float> y(static_cast<size_t>(n), NAN);
  dequantize_row(t, b.data(), y.data(), n);
  return y;
}

// Random bytes with finite, moderate half scales at the given offsets.
std::vector<uint8_t> random_block(std::mt19937 &rng, size_t bytes, std::initializer_list<size_t> half_at) {
  std::vector<uint8_t> b(bytes);
  for (auto &v : b) v = static_cast<uint8_t>(rng());
  std::uniform_real_distribution<float> scale(-0.05f, 0.05f);
  for (size_t at : half_at) put_half(b, at, scale(rng));
  return b;
}

int count_mismatch(const std::vector<float> &got, const std::vector<float> &want) {
  int bad = 0;
  for (size_t i = 0; i < want.size(); ++i) bad += !(got[i] == want[i]);  // NaN never matches
  return bad;
}

}  // namespace

TEST_CASE("f16 and bf16 conversions are exact", "[dequant]") {
  CHECK(fp16_to_fp32(0x3C00) == 1.0f);
  CHECK(fp16_to_fp32(0xC000) == -2.0f);
  CHECK(fp16_to_fp32(0x0001) == std::ldexp(1.0f, -24));  // smallest subnormal
  CHECK(fp16_to_fp32(0x03FF) == std::ldexp(1023.0f, -24));
  CHECK(fp16_to_fp32(0x7BFF) == 65504.0f);
  CHECK(std::isinf(fp16_to_fp32(0x7C00)));
  CHECK(std::isnan(fp16_to_fp32(0x7E00)));
  for (uint32_t h = 0; h < 0x10000; ++h) {  // round trip of every finite half
    const float f = fp16_to_fp32(static_cast<uint16_t>(h));
    if (std::isfinite(f)) REQUIRE(fp32_to_fp16(f) == static_cast<uint16_t>(h));
  }
  CHECK(fp32_to_fp16(1.0f + std::ldexp(1.0f, -11)) == 0x3C00);  // tie → even
  CHECK(fp32_to_fp16(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3C02);
  CHECK(ep::backend::bf16_to_fp32(0x3F80) == 1.0f);
  CHECK(ep::backend::fp32_to_bf16(1.0f) == 0x3F80);
  CHECK(ep::backend::fp32_to_bf16(-3.0f) == 0xC040);
  std::vector<uint8_t> row = {0x00, 0x3C, 0x00, 0xC0};  // f16 1, -2
  CHECK(deq(GgmlType::f16, row, 2) == std::vector<float>{1.0f, -2.0f});
  CHECK(deq(GgmlType::bf16, row, 2) == std::vector<float>{ep::backend::bf16_to_fp32(0x3C00), ep::backend::bf16_to_fp32(0xC000)});
}

TEST_CASE("q8_0: y = d·q", "[dequant]") {
  std::vector<uint8_t> b(34);
  put_half(b, 0, 0.5f);
  for (int i = 0; i < 32; ++i) b[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(i - 16));
  b[2 + 31] = 0x80;  // -128
  const auto y = deq(GgmlType::q8_0, b, 32);
  CHECK(y[0] == -8.0f);
  CHECK(y[16] == 0.0f);
  CHECK(y[17] == 0.5f);
  CHECK(y[31] == -64.0f);
}

TEST_CASE("mxfp4: e8m0 half scale, low nibbles first then high nibbles", "[dequant]") {
  CHECK(ep::backend::e8m0_to_fp32_half(128) == 1.0f);
  CHECK(ep::backend::e8m0_to_fp32_half(127) == 0.5f);
  CHECK(ep::backend::e8m0_to_fp32_half(1) == std::ldexp(1.0f, -127));
  CHECK(ep::backend::e8m0_to_fp32_half(0) == std::ldexp(1.0f, -128));
  CHECK(ep::backend::e8m0_to_fp32_half(255) == std::ldexp(1.0f, 127));
  std::vector<uint8_t> b(17);
  b[0] = 129;  // d = 2
  for (int j = 0; j < 16; ++j) b[1 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  const auto y = deq(GgmlType::mxfp4, b, 32);
  const float kv[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
  for (int j = 0; j < 16; ++j) {
    CHECK(y[j] == kv[j] * 2.0f);
    CHECK(y[16 + j] == kv[15 - j] * 2.0f);
  }
  CHECK(y[7] == 24.0f);    // nibble 7 → 12 · 2
  CHECK(y[16] == -24.0f);  // high nibble 15 → −12 · 2
}

TEST_CASE("q2_K: 4-bit scale and min per 16 values, 2-bit quants by shift", "[dequant]") {
  std::vector<uint8_t> b(84, 0);
  put_half(b, 80, 1.0f);   // d
  put_half(b, 82, 0.5f);   // dmin
  b[0] = 0x21;             // group 0: scale 1, min 2
  b[16] = 0x03;            // qs[0]: value 0 = 3 (shift 0)
  b[16] |= 0x02 << 2;      // value 32 (j = 1, shift 2) = 2, group is = 2
  b[2] = 0x15;             // group 2: scale 5, min 1
  b[9] = 0xF7;             // group 9 (second half, j=0, second 16): scale 7, min 15
  b[16 + 32 + 16 + 3] = 0x01;  // second half, q[l+16] with l = 3 → y[128 + 16 + 3] = 1
  const auto y = deq(GgmlType::q2_k, b, 256);
  CHECK(y[0] == 1.0f * 1 * 3 - 0.5f * 2);
  CHECK(y[1] == -1.0f);               // q = 0 → −dmin·min
  CHECK(y[32] == 1.0f * 5 * 2 - 0.5f * 1);
  CHECK(y[128 + 16 + 3] == 7.0f * 1 - 0.5f * 15);
  CHECK(y[128 + 16 + 4] == -7.5f);
}

namespace {
float q2k_ref(const std::vector<uint8_t> &b, int i) {
  const int half = i / 128, w = i % 128, j = w / 32, grp = (w % 32) / 16, l = w % 16;
  const int sc = b[8 * half + 2 * j + grp];
  const int q = (b[16 + 32 * half + 16 * grp + l] >> (2 * j)) & 3;
  const float dl = get_half(b, 80) * static_cast<float>(sc & 0xF);
  const float ml = get_half(b, 82) * static_cast<float>(sc >> 4);
  return dl * static_cast<float>(q) - ml;
}
int q3k_scale(const std::vector<uint8_t> &b, int is) {
  const uint8_t *s = b.data() + 96;
  const int low = is < 8 ? (s[is] & 0xF) : (s[is - 8] >> 4);
  const int high = (s[8 + is % 4] >> (2 * (is / 4))) & 3;
  return low | (high << 4);
}
float q3k_ref(const std::vector<uint8_t> &b, int i) {
  const int half = i / 128, w = i % 128, j = w / 32, l = w % 32, grp = l / 16;
  const int is = 8 * half + 2 * j + grp;
  const int q = (b[32 + 32 * half + l] >> (2 * j)) & 3;
  const int hbit = (b[l] >> (4 * half + j)) & 1;
  const float dl = get_half(b, 108) * static_cast<float>(q3k_scale(b, is) - 32);
  return dl * static_cast<float>(q - (hbit ? 0 : 4));
}
void k4_scale_min(const std::vector<uint8_t> &b, int sub, int &sc, int &m) {
  const uint8_t *s = b.data() + 4;
  if (sub < 4) {
    sc = s[sub] & 63;
    m = s[sub + 4] & 63;
  } else {
    sc = (s[sub + 4] & 0xF) | ((s[sub - 4] >> 6) << 4);
    m = (s[sub + 4] >> 4) | ((s[sub] >> 6) << 4);
  }
}
float q4k_ref(const std::vector<uint8_t> &b, int i) {
  const int c = i / 64, nib = (i % 64) / 32, l = i % 32, sub = 2 * c + nib;
  int sc, m;
  k4_scale_min(b, sub, sc, m);
  const int q = (b[16 + 32 * c + l] >> (4 * nib)) & 0xF;
  return get_half(b, 0) * static_cast<float>(sc) * static_cast<float>(q) - get_half(b, 2) * static_cast<float>(m);
}
float q5k_ref(const std::vector<uint8_t> &b, int i) {
  const int c = i / 64, nib = (i % 64) / 32, l = i % 32, sub = 2 * c + nib;
  int sc, m;
  k4_scale_min(b, sub, sc, m);
  const int q = ((b[48 + 32 * c + l] >> (4 * nib)) & 0xF) + (((b[16 + l] >> sub) & 1) << 4);
  return get_half(b, 0) * static_cast<float>(sc) * static_cast<float>(q) - get_half(b, 2) * static_cast<float>(m);
}
float q6k_ref(const std::vector<uint8_t> &b, int i) {
  const int half = i / 128, w = i % 128, r = w / 32, l = w % 32;
  const int qlv = b[64 * half + l + ((r & 1) ? 32 : 0)];
  const int low = r >= 2 ? qlv >> 4 : qlv & 0xF;
  const int high = (b[128 + 32 * half + l] >> (2 * r)) & 3;
  const int q = (low | (high << 4)) - 32;
  const int sc = static_cast<int8_t>(b[192 + 8 * half + l / 16 + 2 * r]);
  return get_half(b, 208) * static_cast<float>(sc) * static_cast<float>(q);
}
float iq2xxs_ref(const std::vector<uint8_t> &b, int i) {
  const int ib = i / 32, l = (i % 32) / 8, j = i % 8;
  const uint8_t *a = b.data() + 2 + 8 * ib;
  const uint32_t a1 = a[4] | (a[5] << 8) | (a[6] << 16) | (static_cast<uint32_t>(a[7]) << 24);
  const float db = get_half(b, 0) * (0.5f + static_cast<float>(a1 >> 28)) * 0.25f;
  const int g = static_cast<int>((ep::backend::kIq2xxsGrid[a[l]] >> (8 * j)) & 0xFF);
  const int neg = (ep::backend::kIq2xsSigns[(a1 >> (7 * l)) & 127] >> j) & 1;
  return db * static_cast<float>(g) * (neg ? -1.0f : 1.0f);
}
}  // namespace

TEST_CASE("q3_K: 6-bit scales, hmask high bits, 2-bit quants", "[dequant]") {
  std::vector<uint8_t> b(110, 0);
  put_half(b, 108, 0.25f);
  // scale 0 = 33 (low 1, high 2 → 0x21): raw[0] low nibble 1, raw[8] bits 0-1 = 2
  b[96 + 0] = 0x01;
  b[96 + 8] = 0x02;
  // scale 13 = 40 (low 8 from raw[5] high nibble, high 2 from raw[8+1] bits 6-7 → 2)
  b[96 + 5] = 0x80;
  b[96 + 9] = 0x80;
  b[32 + 0] = 0x03;  // q[0] = 3 (j = 0)
  b[0] = 0x01;       // hmask[0] bit 0 set: no −4
  // y[128 + 64 + 16 + 5]: half 1, j = 2, second group → scale index 8 + 4 + 1 = 13
  b[32 + 32 + 16 + 5] = 0x02 << 4;  // q = 2 at shift 4
  b[16 + 5] = 0;                    // hmask bit 6 clear → −4
  const auto y = deq(GgmlType::q3_k, b, 256);
  CHECK(y[0] == 0.25f * (33 - 32) * 3);
  CHECK(y[1] == 0.25f * (33 - 32) * (0 - 4));
  CHECK(y[128 + 64 + 16 + 5] == 0.25f * (40 - 32) * (2 - 4));
  CHECK(q3k_scale(b, 13) == 40);
}

TEST_CASE("q4_K and q5_K: 6-bit packed scales and mins, fifth bit", "[dequant]") {
  std::vector<uint8_t> b(176, 0);
  put_half(b, 0, 0.5f);
  put_half(b, 2, 0.25f);
  b[4 + 0] = 0x43;   // sub 0: sc = 3; top bits (1) feed sub 4's scale high bits
  b[4 + 4] = 0x85;   // sub 0: m = 5; top bits (2) feed sub 4's min high bits
  b[4 + 8] = 0x97;   // sub 4: sc = 7 | 1<<4 = 23, m = 9 | 2<<4 = 41
  b[48 + 0] = 0xA6;  // q5: qs[0] low 6 / high 10
  b[16 + 0] = 0x01 | 0x20;  // qh[0]: bit 0 (sub 0) and bit 5 (sub 5)
  const auto y5 = deq(GgmlType::q5_k, b, 256);
  CHECK(y5[0] == 0.5f * 3 * (6 + 16) - 0.25f * 5);
  int sc, m;
  k4_scale_min(b, 4, sc, m);
  CHECK(sc == 23);
  CHECK(m == 41);
  CHECK(y5[128] == 0.5f * 23 * 0 - 0.25f * 41);
  // q4_K has no qh: qs start at 16
  std::vector<uint8_t> c(144, 0);
  std::memcpy(c.data(), b.data(), 16);
  c[16 + 0] = 0xA6;
  const auto y4 = deq(GgmlType::q4_k, c, 256);
  CHECK(y4[0] == 0.5f * 3 * 6 - 0.25f * 5);
  CHECK(y4[32] == 0.0f * 0 - 0.25f * 0 + (q4k_ref(c, 32)));
  CHECK(y4[32] == q4k_ref(c, 32));
}

TEST_CASE("q6_K: 4+2-bit quants minus 32, int8 scales per 16", "[dequant]") {
  std::vector<uint8_t> b(210, 0);
  put_half(b, 208, 0.125f);
  b[192 + 0] = static_cast<uint8_t>(static_cast<int8_t>(-3));
  b[192 + 8 + 1 + 6] = 10;  // half 1, l >= 16, r = 3 → sc[8 + 1 + 6]
  b[0] = 0x0F;              // ql[0] low = 15
  b[128 + 0] = 0x02;        // qh[0] bits 0-1 = 2 → q = 15 | 32 = 47 → 15
  b[64 + 32 + 20] = 0x50;   // half 1, r = 3, l = 20: ql[64 + 32 + 20] high nibble 5
  b[128 + 32 + 20] = 0xC0;  // qh bits 6-7 = 3 → q = 5 | 48 = 53 → 21
  const auto y = deq(GgmlType::q6_k, b, 256);
  CHECK(y[0] == 0.125f * -3 * 15);
  CHECK(y[128 + 96 + 20] == 0.125f * 10 * 21);
  CHECK(y[1] == 0.125f * -3 * -32);
}

TEST_CASE("iq2_xxs: grid, sign table with parity bit, 4-bit sub-scale", "[dequant]") {
  // the sign table is the 7 stored bits plus odd parity in bit 7
  for (int i = 0; i < 128; ++i) CHECK(ep::backend::kIq2xsSigns[i] == (i | ((__builtin_popcount(i) & 1) << 7)));
  CHECK(ep::backend::kIq2xxsGrid[0] == 0x0808080808080808ull);
  CHECK(ep::backend::kIq2xxsGrid[255] == 0x2b2b2b1908081908ull);
  std::vector<uint8_t> b(66, 0);
  put_half(b, 0, 1.0f);
  // sub-block 0: grid indices {0, 255, 1, 2}; signs l=0: 3 (values 0,1 negative; parity even → bit 7 clear)
  b[2] = 0;
  b[3] = 255;
  b[4] = 1;
  b[5] = 2;
  const uint32_t a1 = 3u | (5u << 28);  // scale nibble 5 → db = (0.5 + 5)·0.25 = 1.375
  std::memcpy(b.data() + 6, &a1, 4);
  const auto y = deq(GgmlType::iq2_xxs, b, 256);
  CHECK(y[0] == -1.375f * 8);
  CHECK(y[1] == -1.375f * 8);
  CHECK(y[2] == 1.375f * 8);
  CHECK(y[8] == 1.375f * 0x08);   // grid[255] byte 0 = 0x08
  CHECK(y[9] == 1.375f * 0x19);   // byte 1 = 0x19
  CHECK(y[10] == 1.375f * 0x08);  // byte 2 = 0x08
  CHECK(y[15] == 1.375f * 0x2b);  // byte 7 = 0x2b
  CHECK(y[32] == 0.0f * 1 + 0.125f * 8);  // sub-block 1: all zero → db = 0.125, grid 0, no signs
}

TEST_CASE("random blocks of every quantized type match the element formulas exactly", "[dequant]") {
  std::mt19937 rng(1234);
  for (int rep = 0; rep < 50; ++rep) {
    {
      auto b = random_block(rng, 84, {80, 82});
      std::vector<float> want(256);
      for (int i = 0; i < 256; ++i) want[i] = q2k_ref(b, i);
      REQUIRE(count_mismatch(deq(GgmlType::q2_k, b, 256), want) == 0);
    }
    {
      auto b = random_block(rng, 110, {108});
      std::vector<float> want(256);
      for (int i = 0; i < 256; ++i) want[i] = q3k_ref(b, i);
      REQUIRE(count_mismatch(deq(GgmlType::q3_k, b, 256), want) == 0);
    }
    {
      auto b = random_block(rng, 144, {0, 2});
      std::vector<float> want(256);
      for (int i = 0; i < 256; ++i) want[i] = q4k_ref(b, i);
      REQUIRE(count_mismatch(deq(GgmlType::q4_k, b, 256), want) == 0);
    }
    {
      auto b = random_block(rng, 176, {0, 2});
      std::vector<float> want(256);
      for (int i = 0; i < 256; ++i) want[i] = q5k_ref(b, i);
      REQUIRE(count_mismatch(deq(GgmlType::q5_k, b, 256), want) == 0);
    }
    {
      auto b = random_block(rng, 210, {208});
      std::vector<float> want(256);
      for (int i = 0; i < 256; ++i) want[i] = q6k_ref(b, i);
      REQUIRE(count_mismatch(deq(GgmlType::q6_k, b, 256), want) == 0);
    }
    {
      auto b = random_block(rng, 66, {0});
      std::vector<float> want(256);
      for (int i = 0; i < 256; ++i) want[i] = iq2xxs_ref(b, i);
      REQUIRE(count_mismatch(deq(GgmlType::iq2_xxs, b, 256), want) == 0);
    }
    {
      auto b = random_block(rng, 34, {0});
      std::vector<float> want(32);
      for (int i = 0; i < 32; ++i) want[i] = static_cast<float>(static_cast<int8_t>(b[2 + i])) * get_half(b, 0);
      REQUIRE(count_mismatch(deq(GgmlType::q8_0, b, 32), want) == 0);
    }
    {
      auto b = random_block(rng, 17, {});
      std::vector<float> want(32);
      const float kv[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
      const float d = std::ldexp(1.0f, static_cast<int>(b[0]) - 128);
      for (int i = 0; i < 32; ++i) want[i] = kv[i < 16 ? (b[1 + i] & 0xF) : (b[1 + i - 16] >> 4)] * d;
      REQUIRE(count_mismatch(deq(GgmlType::mxfp4, b, 32), want) == 0);
    }
  }
}

TEST_CASE("unsupported types and partial blocks are rejected", "[dequant]") {
  std::vector<uint8_t> b(256);
  std::vector<float> y(256);
  try {
    dequantize_row(GgmlType::iq3_s, b.data(), y.data(), 256);
    FAIL("iq3_s accepted");
  } catch (const ep::Error &e) {
    CHECK(e.status() == ep::Status::unsupported);
  }
  try {
    dequantize_row(GgmlType::q4_k, b.data(), y.data(), 100);
    FAIL("partial block accepted");
  } catch (const ep::Error &e) {
    CHECK(e.status() == ep::Status::shape);
  }
}
