// Dequantization: hand-built blocks with known values for every field, checked against values
// computed here element by element from the ggml formulas (models.md §4), exactly.
#include "backend/backend.hpp"
#include "backend/dequant.hpp"
#include "backend/iq2xxs_table.hpp"
#include "backend/iq_grids.hpp"
#include "core/status.hpp"
#include "support/catch.hpp"

#include <cmath>
#include <cstring>
#include <random>
#include <string>
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
    dequantize_row(GgmlType::tq1_0, b.data(), y.data(), 256);
    FAIL("tq1_0 accepted");
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

TEST_CASE("every type the table gives kernels dequantizes; every other is refused", "[dequant]") {
  // the type table (format::kGgmlTypes) is the only list: the CPU dispatch, the supported
  // weight types and their names are made from it
  int computed = 0;
  for (const ep::format::GgmlTypeInfo &row : ep::format::kGgmlTypes) {
    INFO(row.name);
    const int64_t n = row.block_elems == 1 ? 32 : row.block_elems;
    const std::vector<uint8_t> zeros(static_cast<size_t>(n / row.block_elems * row.block_bytes), 0);
    std::vector<float> y(static_cast<size_t>(n), NAN);
    const bool has_kernels = row.compute != ep::format::GgmlCompute::none;
    CHECK(ep::backend::is_supported_weight_type(row.type) == has_kernels);
    std::string names(1, ' '), name(1, ' ');
    names.append(ep::backend::supported_weight_type_names()).push_back(' ');
    name.append(row.name).push_back(' ');
    const bool named = names.find(name) != std::string::npos;
    CHECK(named == has_kernels);
    if (has_kernels) {
      ++computed;
      dequantize_row(row.type, zeros.data(), y.data(), n);
      CHECK(y[static_cast<size_t>(n) - 1] == y[static_cast<size_t>(n) - 1]);  // written (not NaN)
    } else {
      try {
        dequantize_row(row.type, zeros.data(), y.data(), n);
        FAIL("a type without kernels was dequantized");
      } catch (const ep::Error &e) {
        CHECK(e.status() == ep::Status::unsupported);
      }
    }
  }
  CHECK(computed == 23);  // f32, f16, bf16, q8_0, q4_0..q5_1, q2_K..q6_K, mxfp4 and the i-quants
}

namespace {
void put_u16(std::vector<uint8_t> &b, size_t at, uint32_t v) {
  b[at] = static_cast<uint8_t>(v & 0xFF);
  b[at + 1] = static_cast<uint8_t>((v >> 8) & 0xFF);
}
void put_u32(std::vector<uint8_t> &b, size_t at, uint32_t v) {
  for (int k = 0; k < 4; ++k) b[at + k] = static_cast<uint8_t>((v >> (8 * k)) & 0xFF);
}
/// Value j of a grid entry (byte j).
int grid_byte(uint64_t entry, int j) { return static_cast<int>((entry >> (8 * j)) & 0xFF); }
}  // namespace

TEST_CASE("q4_0 and q4_1: nibbles minus 8, or times d plus the min", "[dequant]") {
  std::vector<uint8_t> b(18, 0);
  put_half(b, 0, 0.5f);
  b[2] = 0x0F;  // value 0: 15, value 16: 0
  b[17] = 0x9F;  // value 15: 15, value 31: 9
  auto y = deq(GgmlType::q4_0, b, 32);
  CHECK(y[0] == (15 - 8) * 0.5f);
  CHECK(y[16] == -8 * 0.5f);
  CHECK(y[15] == 3.5f);
  CHECK(y[31] == 0.5f);
  CHECK(y[1] == -4.0f);
  put_u16(b, 0, 0xFBFF);  // d = -65504: the extremes stay exact
  y = deq(GgmlType::q4_0, b, 32);
  CHECK(y[0] == 7 * -65504.0f);
  CHECK(y[16] == -8 * -65504.0f);
  put_u16(b, 0, 0x0001);  // the smallest subnormal half
  CHECK(deq(GgmlType::q4_0, b, 32)[0] == 7 * std::ldexp(1.0f, -24));

  std::vector<uint8_t> c(20, 0);
  put_half(c, 0, 0.25f);
  put_half(c, 2, -1.0f);
  c[4] = 0xA3;
  y = deq(GgmlType::q4_1, c, 32);
  CHECK(y[0] == 3 * 0.25f - 1.0f);
  CHECK(y[16] == 10 * 0.25f - 1.0f);
  CHECK(y[1] == -1.0f);
}

TEST_CASE("q5_0 and q5_1: the fifth bit of value j is bit j of qh", "[dequant]") {
  std::vector<uint8_t> b(22, 0);
  put_half(b, 0, 2.0f);
  put_u32(b, 2, 1u | (1u << 16) | (1u << 31));  // values 0, 16, 31 have their fifth bit
  b[6] = 0x21;                                    // value 0: 1, value 16: 2
  b[21] = 0xF0;                                   // value 15: 0, value 31: 15
  auto y = deq(GgmlType::q5_0, b, 32);
  CHECK(y[0] == ((1 | 16) - 16) * 2.0f);
  CHECK(y[16] == ((2 | 16) - 16) * 2.0f);
  CHECK(y[1] == -16 * 2.0f);
  CHECK(y[15] == -16 * 2.0f);
  CHECK(y[31] == ((15 | 16) - 16) * 2.0f);

  std::vector<uint8_t> c(24, 0);
  put_half(c, 0, 0.5f);
  put_half(c, 2, 3.0f);
  put_u32(c, 4, 0xFFFFFFFFu);
  c[8] = 0xFF;
  y = deq(GgmlType::q5_1, c, 32);
  CHECK(y[0] == 31 * 0.5f + 3.0f);
  CHECK(y[16] == 31 * 0.5f + 3.0f);
  CHECK(y[1] == 16 * 0.5f + 3.0f);
}

TEST_CASE("iq4_nl and iq4_xs: the 16 non-linear levels, 6-bit sub-scales minus 32", "[dequant]") {
  const int8_t kv[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
  for (int i = 0; i < 16; ++i) CHECK(ep::backend::kIq4nlValues[i] == kv[i]);
  std::vector<uint8_t> b(18, 0);
  put_half(b, 0, -0.5f);
  for (int j = 0; j < 16; ++j) b[2 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  auto y = deq(GgmlType::iq4_nl, b, 32);
  for (int j = 0; j < 16; ++j) {
    CHECK(y[j] == -0.5f * kv[j]);
    CHECK(y[16 + j] == -0.5f * kv[15 - j]);
  }

  std::vector<uint8_t> c(136, 0);
  put_half(c, 0, 0.25f);
  put_u16(c, 2, 0x3u | (0x2u << 14));  // sub-block 0: high bits 3; sub-block 7: high bits 2
  c[4] = 0x0F;                         // sub-block 0: low 15, sub-block 1: low 0 (and high 0)
  c[7] = 0x50;                         // sub-block 7: low 5
  c[8] = 0x08;                         // sub-block 0, byte 0: values 0 (level 8) and 16 (level 0)
  c[8 + 16 * 7 + 15] = 0xF7;           // sub-block 7, byte 15: values 15 (level 7) and 31 (level 15)
  y = deq(GgmlType::iq4_xs, c, 256);
  CHECK(y[0] == 0.25f * 31 * kv[8]);        // ls = 15 | 3 << 4 = 63
  CHECK(y[16] == 0.25f * 31 * kv[0]);
  CHECK(y[32] == 0.25f * -32 * kv[0]);      // ls = 0
  CHECK(y[224 + 15] == 0.25f * 5 * kv[7]);  // ls = 5 | 2 << 4 = 37
  CHECK(y[224 + 31] == 0.25f * 5 * kv[15]);
}

TEST_CASE("iq2_xs and iq2_s: 9- and 10-bit grid indices, signs, a scale per 16 values", "[dequant]") {
  CHECK(ep::backend::kIq2xsGrid[0] == 0x0808080808080808ull);
  CHECK(ep::backend::kIq2xsGrid[1] == 0x080808080808082bull);
  CHECK(ep::backend::kIq2xsGrid[511] == 0x2b2b2b2b2b2b2b2bull);
  CHECK(ep::backend::kIq2sGrid[1023] == 0x2b2b2b2b2b2b2b2bull);
  std::vector<uint8_t> b(74, 0);
  put_half(b, 0, 1.0f);
  b[66] = 0x5F;                            // sub-block 0: db = (0.5 + 15)/4 for values 0-15, (0.5 + 5)/4 after
  put_u16(b, 2, 1u | (3u << 9));           // values 0-7: grid 1, sign index 3 (values 0 and 1 negative)
  put_u16(b, 2 + 4, 511u | (127u << 9));   // values 16-23: grid 511, every sign
  auto y = deq(GgmlType::iq2_xs, b, 256);
  CHECK(y[0] == -3.875f * 0x2b);
  CHECK(y[1] == -3.875f * 8);
  CHECK(y[2] == 3.875f * 8);
  for (int j = 16; j < 24; ++j) CHECK(y[j] == -1.375f * 0x2b);
  CHECK(y[32] == 0.125f * 8);  // sub-block 1: scale nibble 0, grid 0, no signs

  std::vector<uint8_t> c(82, 0);
  put_half(c, 0, -2.0f);
  c[74] = 0x30;             // sub-block 0: db = -2·0.5/4 for values 0-15, -2·3.5/4 after
  c[2] = 1;                 // values 0-7: index 1 (high bits 0)
  c[3] = 0xFF;              // values 8-15: index 0xFF | 3 << 8 = 1023
  c[66] = 0x0C;             // qh of sub-block 0: bits 2-3 = 3 for the second group of 8
  c[34] = 0x01;             // signs of values 0-7: value 0 negative
  c[34 + 2] = 0x80;         // signs of values 16-23: value 23 negative
  c[4] = 2;                 // values 16-23: index 2
  y = deq(GgmlType::iq2_s, c, 256);
  CHECK(y[0] == 0.25f * 0x2b);  // -2·0.125·43·(-1)
  CHECK(y[1] == -0.25f * 8);
  for (int j = 8; j < 16; ++j) CHECK(y[j] == -0.25f * 0x2b);
  CHECK(y[16] == -1.75f * grid_byte(ep::backend::kIq2sGrid[2], 0));
  CHECK(y[23] == 1.75f * grid_byte(ep::backend::kIq2sGrid[2], 7));
}

TEST_CASE("iq3_xxs and iq3_s: two 4-value grid entries per 8 values, signs, scales", "[dequant]") {
  CHECK(ep::backend::kIq3xxsGrid[1] == 0x04040414u);
  CHECK(ep::backend::kIq3xxsGrid[255] == 0x3e341c04u);
  CHECK(ep::backend::kIq3sGrid[511] == 0x0f0f0101u);
  std::vector<uint8_t> b(98, 0);
  put_half(b, 0, 1.0f);
  b[2] = 1;
  b[3] = 255;
  put_u32(b, 66, 1u | (15u << 28));  // sign index 1 for values 0-7 (129: values 0 and 7), scale 15
  auto y = deq(GgmlType::iq3_xxs, b, 256);
  CHECK(y[0] == -7.75f * 0x14);
  CHECK(y[1] == 7.75f * 4);
  CHECK(y[4] == 7.75f * 4);
  CHECK(y[7] == -7.75f * 0x3e);
  CHECK(y[32] == 0.25f * 4);  // sub-block 1: scale 0 → (0.5 + 0)·0.5

  std::vector<uint8_t> c(110, 0);
  put_half(c, 0, 0.5f);
  c[106] = 0x0F;    // sub-block 0: db = 0.5·31; sub-block 1: 0.5·1
  c[2] = 0xFF;      // values 0-3: index 0xFF | bit 0 of qh[0] << 8 = 511
  c[3] = 0;         // values 4-7: index 0 | bit 1 of qh[0] << 8 = 256
  c[66] = 0x03;
  c[74] = 0x24;     // signs of values 0-7: values 2 and 5 negative
  auto y3 = deq(GgmlType::iq3_s, c, 256);
  CHECK(y3[0] == 15.5f * 1);
  CHECK(y3[2] == -15.5f * 15);
  CHECK(y3[4] == 15.5f * grid_byte(ep::backend::kIq3sGrid[256], 0));
  CHECK(y3[5] == -15.5f * grid_byte(ep::backend::kIq3sGrid[256], 1));
  CHECK(y3[32] == 0.5f * 1);  // sub-block 1: index 0 = 0x01010101, db = 0.5
}

TEST_CASE("iq1_s and iq1_m: ternary grid, ±1/8 shift, odd scales", "[dequant]") {
  CHECK(ep::backend::kIq1sGrid[0] == 0xffffffffffffffffull);
  CHECK(ep::backend::kIq1sGrid[2047] == 0x0101010101010101ull);
  CHECK(ep::backend::kIq1sDelta == 0.125f);
  std::vector<uint8_t> b(50, 0);
  put_half(b, 0, 1.0f);
  b[2] = 255;                                    // values 0-7: index 255 | 7 << 8 = 2047
  put_u16(b, 34, 7u | (7u << 12) | 0x8000u);     // sub-block 0: scale 2·7 + 1, delta −1/8
  auto y = deq(GgmlType::iq1_s, b, 256);
  for (int j = 0; j < 8; ++j) CHECK(y[j] == 15.0f * (1 - 0.125f));
  for (int j = 8; j < 16; ++j) CHECK(y[j] == 15.0f * (-1 - 0.125f));  // index 0: all −1
  CHECK(y[32] == 1.0f * (-1 + 0.125f));                              // sub-block 1: scale 1, +1/8

  std::vector<uint8_t> c(56, 0);
  // the f16 scale 1.0 (0x3C00) in the top nibbles of the four scale words: 0, 0, 0xC, 0x3
  put_u16(c, 48, 7u | (1u << 3));  // sub-block 0: 2·7 + 1 for values 0-15, 2·1 + 1 for 16-31
  put_u16(c, 50, 0);
  put_u16(c, 52, 0xC000);
  put_u16(c, 54, 0x3000);
  c[0] = 255;
  c[32] = 0x8F;  // values 0-7: index bits 7, delta −; values 8-15: index bits 0, delta −
  auto y1 = deq(GgmlType::iq1_m, c, 256);
  for (int j = 0; j < 8; ++j) CHECK(y1[j] == 15.0f * (1 - 0.125f));
  for (int j = 8; j < 16; ++j) CHECK(y1[j] == 15.0f * (-1 - 0.125f));
  CHECK(y1[16] == 3.0f * (-1 + 0.125f));
  CHECK(y1[32] == 1.0f * (-1 + 0.125f));
}
