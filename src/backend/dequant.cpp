#include "backend/dequant.hpp"

#include "backend/backend.hpp"
#include "backend/iq2xxs_table.hpp"
#include "backend/iq_grids.hpp"
#include "core/error.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <string>
#include <utility>

namespace ep::backend {
namespace {

using format::GgmlType;
constexpr int kQK = 256;

uint16_t read_u16(const uint8_t *p) noexcept { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
float read_half(const uint8_t *p) noexcept { return fp16_to_fp32(read_u16(p)); }

// The CPU kernel of a type: @p nb blocks from @p x to @p y. Defined for every type whose row in
// format::kGgmlTypes has compute kernels; kDequant below is made from the table, so a row without
// its kernel fails to link.
template <GgmlType T>
void dequant_blocks(const uint8_t *x, float *y, int64_t nb);

template <>
void dequant_blocks<GgmlType::f32>(const uint8_t *x, float *y, int64_t nb) {
  std::memcpy(y, x, static_cast<size_t>(nb) * 4);
}
template <>
void dequant_blocks<GgmlType::f16>(const uint8_t *x, float *y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) y[i] = fp16_to_fp32(read_u16(x + 2 * i));
}
template <>
void dequant_blocks<GgmlType::bf16>(const uint8_t *x, float *y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) y[i] = bf16_to_fp32(read_u16(x + 2 * i));
}

template <>
void dequant_blocks<GgmlType::q8_0>(const uint8_t *x, float *y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 34) {
    const float d = read_half(x);
    for (int j = 0; j < 32; ++j) *y++ = static_cast<float>(static_cast<int8_t>(x[2 + j])) * d;
  }
}

template <>
void dequant_blocks<GgmlType::mxfp4>(const uint8_t *x, float *y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 17, y += 32) {
    const float d = e8m0_to_fp32_half(x[0]);
    const uint8_t *qs = x + 1;
    for (int j = 0; j < 16; ++j) {
      y[j] = static_cast<float>(kMxfp4Values[qs[j] & 0x0F]) * d;
      y[j + 16] = static_cast<float>(kMxfp4Values[qs[j] >> 4]) * d;
    }
  }
}

// block_q2_K: scales[16], qs[64], d, dmin
template <>
void dequant_blocks<GgmlType::q2_k>(const uint8_t *x, float *y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 84) {
    const float d = read_half(x + 80);
    const float min = read_half(x + 82);
    const uint8_t *q = x + 16;
    int is = 0;
    for (int n = 0; n < kQK; n += 128) {
      int shift = 0;
      for (int j = 0; j < 4; ++j) {
        uint8_t sc = x[is++];
        float dl = d * static_cast<float>(sc & 0xF);
        float ml = min * static_cast<float>(sc >> 4);
        for (int l = 0; l < 16; ++l) *y++ = dl * static_cast<float>((q[l] >> shift) & 3) - ml;
        sc = x[is++];
        dl = d * static_cast<float>(sc & 0xF);
        ml = min * static_cast<float>(sc >> 4);
        for (int l = 0; l < 16; ++l) *y++ = dl * static_cast<float>((q[l + 16] >> shift) & 3) - ml;
        shift += 2;
      }
      q += 32;
    }
  }
}

// block_q3_K: hmask[32], qs[64], scales[12], d
void q3_k_scales(const uint8_t *raw, int8_t out[16]) {
  constexpr uint32_t kmask1 = 0x03030303, kmask2 = 0x0f0f0f0f;
  uint32_t aux[4];
  std::memcpy(aux, raw, 12);
  const uint32_t tmp = aux[2];
  aux[2] = ((aux[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
  aux[3] = ((aux[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
  aux[0] = (aux[0] & kmask2) | (((tmp >> 0) & kmask1) << 4);
  aux[1] = (aux[1] & kmask2) | (((tmp >> 2) & kmask1) << 4);
  std::memcpy(out, aux, 16);
}

template <>
void dequant_blocks<GgmlType::q3_k>(const uint8_t *x, float *y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 110) {
    const float d_all = read_half(x + 108);
    const uint8_t *hm = x;
    const uint8_t *q = x + 32;
    int8_t scales[16];
    q3_k_scales(x + 96, scales);
    int is = 0;
    uint8_t m = 1;
    for (int n = 0; n < kQK; n += 128) {
      int shift = 0;
      for (int j = 0; j < 4; ++j) {
        float dl = d_all * static_cast<float>(scales[is++] - 32);
        for (int l = 0; l < 16; ++l)
          *y++ = dl * static_cast<float>(((q[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4));
        dl = d_all * static_cast<float>(scales[is++] - 32);
        for (int l = 0; l < 16; ++l)
          *y++ = dl * static_cast<float>(((q[l + 16] >> shift) & 3) - ((hm[l + 16] & m) ? 0 : 4));
        shift += 2;
        m = static_cast<uint8_t>(m << 1);
      }
      q += 32;
    }
  }
}

void scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4));
  }
}

// block_q4_K: d, dmin, scales[12], qs[128]
template <>
void dequant_blocks<GgmlType::q4_k>(const uint8_t *x, float *y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 144) {
    const float d = read_half(x);
    const float min = read_half(x + 2);
    const uint8_t *scales = x + 4;
    const uint8_t *q = x + 16;
    int is = 0;
    for (int j = 0; j < kQK; j += 64) {
      uint8_t sc, m;
      scale_min_k4(is + 0, scales, &sc, &m);
      const float d1 = d * sc, m1 = min * m;
      scale_min_k4(is + 1, scales, &sc, &m);
      const float d2 = d * sc, m2 = min * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
      q += 32;
      is += 2;
    }
  }
}

// block_q5_K: d, dmin, scales[12], qh[32], qs[128]
template <>
void dequant_blocks<GgmlType::q5_k>(const uint8_t *x, float *y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 176) {
    const float d = read_half(x);
    const float min = read_half(x + 2);
    const uint8_t *scales = x + 4;
    const uint8_t *qh = x + 16;
    const uint8_t *ql = x + 48;
    int is = 0;
    uint8_t u1 = 1, u2 = 2;
    for (int j = 0; j < kQK; j += 64) {
      uint8_t sc, m;
      scale_min_k4(is + 0, scales, &sc, &m);
      const float d1 = d * sc, m1 = min * m;
      scale_min_k4(is + 1, scales, &sc, &m);
      const float d2 = d * sc, m2 = min * m;
      for (int l = 0; l < 32; ++l)
        *y++ = d1 * static_cast<float>((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
      for (int l = 0; l < 32; ++l)
        *y++ = d2 * static_cast<float>((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
      ql += 32;
      is += 2;
      u1 = static_cast<uint8_t>(u1 << 2);
      u2 = static_cast<uint8_t>(u2 << 2);
    }
  }
}

// block_q6_K: ql[128], qh[64], scales[16] (int8), d
template <>
void dequant_blocks<GgmlType::q6_k>(const uint8_t *x, float *y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 210) {
    const float d = read_half(x + 208);
    const uint8_t *ql = x;
    const uint8_t *qh = x + 128;
    const int8_t *sc = reinterpret_cast<const int8_t *>(x + 192);
    for (int n = 0; n < kQK; n += 128) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = static_cast<int8_t>((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = static_cast<int8_t>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = static_cast<int8_t>((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = static_cast<int8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l + 0] = d * static_cast<float>(sc[is + 0]) * static_cast<float>(q1);
        y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
        y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
        y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
      }
      y += 128;
      ql += 64;
      qh += 32;
      sc += 8;
    }
  }
}

// block_iq2_xxs: d, qs[32] (uint16)
template <>
void dequant_blocks<GgmlType::iq2_xxs>(const uint8_t *x, float *y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 66) {
    const float d = read_half(x);
    for (int ib32 = 0; ib32 < kQK / 32; ++ib32) {
      uint32_t aux32[2];
      std::memcpy(aux32, x + 2 + 8 * ib32, 8);
      const uint8_t *aux8 = reinterpret_cast<const uint8_t *>(aux32);
      const float db = d * (0.5f + static_cast<float>(aux32[1] >> 28)) * 0.25f;
      for (int l = 0; l < 4; ++l) {
        const uint64_t grid = kIq2xxsGrid[aux8[l]];
        const uint8_t signs = kIq2xsSigns[(aux32[1] >> 7 * l) & 127];
        for (int j = 0; j < 8; ++j) {
          const float g = static_cast<float>((grid >> (8 * j)) & 0xFF);
          y[j] = db * g * ((signs & (1u << j)) ? -1.f : 1.f);
        }
        y += 8;
      }
    }
  }
}

// ---- 32-value blocks: block_q4_0 {d, qs[16]}, block_q4_1 {d, m, qs[16]}, block_q5_0 {d, qh[4],
// qs[16]}, block_q5_1 {d, m, qh[4], qs[16]}, block_iq4_nl {d, qs[16]}. Byte j holds values j (low
// nibble) and j + 16 (high nibble); q5's fifth bits: bit j of qh for value j, bit j + 16 for j + 16.

uint32_t read_u32(const uint8_t *p) noexcept {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) | (static_cast<uint32_t>(p[2]) << 16) |
         (static_cast<uint32_t>(p[3]) << 24);
}

template <>
void dequant_blocks<GgmlType::q4_0>(const uint8_t *x, float *y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 18, y += 32) {
    const float d = read_half(x);
    for (int j = 0; j < 16; ++j) {
      y[j] = static_cast<float>((x[2 + j] & 0xF) - 8) * d;
      y[j + 16] = static_cast<float>((x[2 + j] >> 4) - 8) * d;
    }
  }
}

template <>
void dequant_blocks<GgmlType::q4_1>(const uint8_t *x, float *y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 20, y += 32) {
    const float d = read_half(x), m = read_half(x + 2);
    for (int j = 0; j < 16; ++j) {
      const float p0 = static_cast<float>(x[4 + j] & 0xF) * d;  // product rounded, then the min added
      const float p1 = static_cast<float>(x[4 + j] >> 4) * d;
      y[j] = p0 + m;
      y[j + 16] = p1 + m;
    }
  }
}

template <>
void dequant_blocks<GgmlType::q5_0>(const uint8_t *x, float *y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 22, y += 32) {
    const float d = read_half(x);
    const uint32_t qh = read_u32(x + 2);
    const uint8_t *qs = x + 6;
    for (int j = 0; j < 16; ++j) {
      const int h0 = static_cast<int>((qh >> j) & 1) << 4, h1 = static_cast<int>((qh >> (j + 16)) & 1) << 4;
      y[j] = static_cast<float>(((qs[j] & 0xF) | h0) - 16) * d;
      y[j + 16] = static_cast<float>(((qs[j] >> 4) | h1) - 16) * d;
    }
  }
}

template <>
void dequant_blocks<GgmlType::q5_1>(const uint8_t *x, float *y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 24, y += 32) {
    const float d = read_half(x), m = read_half(x + 2);
    const uint32_t qh = read_u32(x + 4);
    const uint8_t *qs = x + 8;
    for (int j = 0; j < 16; ++j) {
      const int h0 = static_cast<int>((qh >> j) & 1) << 4, h1 = static_cast<int>((qh >> (j + 16)) & 1) << 4;
      const float p0 = static_cast<float>((qs[j] & 0xF) | h0) * d;
      const float p1 = static_cast<float>((qs[j] >> 4) | h1) * d;
      y[j] = p0 + m;
      y[j + 16] = p1 + m;
    }
  }
}

template <>
void dequant_blocks<GgmlType::iq4_nl>(const uint8_t *x, float *y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 18, y += 32) {
    const float d = read_half(x);
    for (int j = 0; j < 16; ++j) {
      y[j] = d * static_cast<float>(kIq4nlValues[x[2 + j] & 0xF]);
      y[j + 16] = d * static_cast<float>(kIq4nlValues[x[2 + j] >> 4]);
    }
  }
}

// block_iq4_xs: d, scales_h (u16: 2 bits per 32 values), scales_l[4] (a nibble per 32), qs[128]
template <>
void dequant_blocks<GgmlType::iq4_xs>(const uint8_t *x, float *y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 136) {
    const float d = read_half(x);
    const uint32_t scales_h = read_u16(x + 2);
    const uint8_t *scales_l = x + 4, *qs = x + 8;
    for (int ib = 0; ib < kQK / 32; ++ib, y += 32, qs += 16) {
      const int ls = ((scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) | (static_cast<int>((scales_h >> (2 * ib)) & 3) << 4);
      const float dl = d * static_cast<float>(ls - 32);
      for (int j = 0; j < 16; ++j) {
        y[j] = dl * static_cast<float>(kIq4nlValues[qs[j] & 0xF]);
        y[j + 16] = dl * static_cast<float>(kIq4nlValues[qs[j] >> 4]);
      }
    }
  }
}

/// 8 values of a grid entry times db with the signs of @p signs (bit j: value j negative).
void grid8(uint64_t grid, uint32_t signs, float db, float *y) {
  for (int j = 0; j < 8; ++j)
    y[j] = db * static_cast<float>((grid >> (8 * j)) & 0xFF) * ((signs >> j) & 1 ? -1.f : 1.f);
}

// block_iq2_xs: d, qs[32] (u16: 9-bit grid index, 7-bit sign index), scales[8] (a nibble per 16 values)
template <>
void dequant_blocks<GgmlType::iq2_xs>(const uint8_t *x, float *y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 74) {
    const float d = read_half(x);
    const uint8_t *scales = x + 66;
    for (int ib32 = 0; ib32 < kQK / 32; ++ib32) {
      const float db[2] = {d * (0.5f + static_cast<float>(scales[ib32] & 0xF)) * 0.25f,
                           d * (0.5f + static_cast<float>(scales[ib32] >> 4)) * 0.25f};
      for (int l = 0; l < 4; ++l, y += 8) {
        const uint32_t q = read_u16(x + 2 + 2 * (4 * ib32 + l));
        grid8(kIq2xsGrid[q & 511], kIq2xsSigns[q >> 9], db[l / 2], y);
      }
    }
  }
}

// block_iq2_s: d, qs[64] (32 grid index bytes, then 32 sign bytes), qh[8] (2 high index bits per 8
// values), scales[8]
template <>
void dequant_blocks<GgmlType::iq2_s>(const uint8_t *x, float *y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 82) {
    const float d = read_half(x);
    const uint8_t *qs = x + 2, *signs = x + 34, *qh = x + 66, *scales = x + 74;
    for (int ib32 = 0; ib32 < kQK / 32; ++ib32, qs += 4, signs += 4) {
      const float db[2] = {d * (0.5f + static_cast<float>(scales[ib32] & 0xF)) * 0.25f,
                           d * (0.5f + static_cast<float>(scales[ib32] >> 4)) * 0.25f};
      for (int l = 0; l < 4; ++l, y += 8) {
        const uint32_t index = qs[l] | ((static_cast<uint32_t>(qh[ib32]) << (8 - 2 * l)) & 0x300);
        grid8(kIq2sGrid[index], signs[l], db[l / 2], y);
      }
    }
  }
}

/// 4 values of a grid entry times db, signed by bits [first, first + 4) of @p signs.
void grid4(uint32_t grid, uint32_t signs, int first, float db, float *y) {
  for (int j = 0; j < 4; ++j)
    y[j] = db * static_cast<float>((grid >> (8 * j)) & 0xFF) * ((signs >> (first + j)) & 1 ? -1.f : 1.f);
}

// block_iq3_xxs: d, qs[64] (grid index bytes, 4 values each), then per 32 values a u32: four 7-bit
// sign indices and a 4-bit scale
template <>
void dequant_blocks<GgmlType::iq3_xxs>(const uint8_t *x, float *y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 98) {
    const float d = read_half(x);
    const uint8_t *qs = x + 2;
    for (int ib32 = 0; ib32 < kQK / 32; ++ib32, qs += 8) {
      const uint32_t aux = read_u32(x + 66 + 4 * ib32);
      const float db = d * (0.5f + static_cast<float>(aux >> 28)) * 0.5f;
      for (int l = 0; l < 4; ++l, y += 8) {
        const uint32_t signs = kIq2xsSigns[(aux >> (7 * l)) & 127];
        grid4(kIq3xxsGrid[qs[2 * l]], signs, 0, db, y);
        grid4(kIq3xxsGrid[qs[2 * l + 1]], signs, 4, db, y + 4);
      }
    }
  }
}

// block_iq3_s: d, qs[64] (low 8 index bits), qh[8] (the ninth bit), signs[32], scales[4] (a nibble
// per 32 values: db = d·(1 + 2·s))
template <>
void dequant_blocks<GgmlType::iq3_s>(const uint8_t *x, float *y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 110) {
    const float d = read_half(x);
    const uint8_t *qs = x + 2, *qh = x + 66, *signs = x + 74, *scales = x + 106;
    for (int ib32 = 0; ib32 < kQK / 32; ++ib32, qs += 8, signs += 4) {
      const float db = d * static_cast<float>(1 + 2 * ((scales[ib32 / 2] >> (4 * (ib32 % 2))) & 0xF));
      const uint32_t h = qh[ib32];
      for (int l = 0; l < 4; ++l, y += 8) {
        grid4(kIq3sGrid[qs[2 * l] | ((h << (8 - 2 * l)) & 256)], signs[l], 0, db, y);
        grid4(kIq3sGrid[qs[2 * l + 1] | ((h << (7 - 2 * l)) & 256)], signs[l], 4, db, y + 4);
      }
    }
  }
}

/// 8 values of an iq1s grid entry (signed bytes -1, 0, 1): dl·(g + delta).
void grid8_iq1(uint64_t grid, float dl, float delta, float *y) {
  for (int j = 0; j < 8; ++j) y[j] = dl * (static_cast<float>(static_cast<int8_t>((grid >> (8 * j)) & 0xFF)) + delta);
}

// block_iq1_s: d, qs[32] (low 8 index bits), qh[8] (u16 per 32 values: 3 high index bits per 8
// values, a 3-bit scale, the delta's sign)
template <>
void dequant_blocks<GgmlType::iq1_s>(const uint8_t *x, float *y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 50) {
    const float d = read_half(x);
    const uint8_t *qs = x + 2;
    for (int ib = 0; ib < kQK / 32; ++ib, qs += 4) {
      const uint32_t qh = read_u16(x + 34 + 2 * ib);
      const float dl = d * static_cast<float>(2 * ((qh >> 12) & 7) + 1);
      const float delta = qh & 0x8000 ? -kIq1sDelta : kIq1sDelta;
      for (int l = 0; l < 4; ++l, y += 8) grid8_iq1(kIq1sGrid[qs[l] | (((qh >> (3 * l)) & 7) << 8)], dl, delta, y);
    }
  }
}

/// IQ1_M's f16 super-block scale: the top nibbles of its four u16 scale words.
uint16_t iq1m_scale(const uint8_t *scales) noexcept {
  const uint32_t s0 = read_u16(scales), s1 = read_u16(scales + 2), s2 = read_u16(scales + 4), s3 = read_u16(scales + 6);
  return static_cast<uint16_t>((s0 >> 12) | ((s1 >> 8) & 0x00F0) | ((s2 >> 4) & 0x0F00) | (s3 & 0xF000));
}

// block_iq1_m: qs[32] (low 8 index bits), qh[16] (per 8 values: 3 high index bits and the delta's
// sign), scales[8] (3-bit scales per 16 values; the f16 scale in the top nibbles)
template <>
void dequant_blocks<GgmlType::iq1_m>(const uint8_t *x, float *y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 56) {
    const uint8_t *qs = x, *qh = x + 32, *sc = x + 48;
    const float d = fp16_to_fp32(iq1m_scale(sc));
    for (int ib = 0; ib < kQK / 32; ++ib, qs += 4, qh += 2) {
      const uint32_t s = read_u16(sc + 2 * (ib / 2));
      const float dl1 = d * static_cast<float>(2 * ((s >> (6 * (ib % 2) + 0)) & 7) + 1);
      const float dl2 = d * static_cast<float>(2 * ((s >> (6 * (ib % 2) + 3)) & 7) + 1);
      for (int l = 0; l < 4; ++l, y += 8) {
        const uint32_t h = qh[l / 2] >> (4 * (l % 2));  // this 8-value group's nibble
        const uint32_t index = qs[l] | ((h & 7) << 8);
        const float delta = h & 8 ? -kIq1sDelta : kIq1sDelta;
        grid8_iq1(kIq1sGrid[index], l < 2 ? dl1 : dl2, delta, y);
      }
    }
  }
}

// kDequant[id]: the kernel of each type id that has one, made from format::kGgmlTypes.
using DequantFn = void (*)(const uint8_t *, float *, int64_t);
constexpr uint32_t kTypeIdLimit = [] {
  uint32_t limit = 0;
  for (const format::GgmlTypeInfo &row : format::kGgmlTypes) limit = std::max(limit, static_cast<uint32_t>(row.type) + 1);
  return limit;
}();

template <size_t I>
constexpr void put_kernel(std::array<DequantFn, kTypeIdLimit> &table) {
  constexpr format::GgmlTypeInfo row = format::kGgmlTypes[I];
  if constexpr (row.compute != format::GgmlCompute::none) table[static_cast<uint32_t>(row.type)] = &dequant_blocks<row.type>;
}
template <size_t... I>
constexpr std::array<DequantFn, kTypeIdLimit> make_kernels(std::index_sequence<I...>) {
  std::array<DequantFn, kTypeIdLimit> table{};
  (put_kernel<I>(table), ...);
  return table;
}
constexpr std::array<DequantFn, kTypeIdLimit> kDequant = make_kernels(std::make_index_sequence<format::kGgmlTypeCount>{});

}  // namespace

const int8_t kMxfp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

float fp16_to_fp32(uint16_t h) noexcept {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1F;
  uint32_t mant = h & 0x3FF;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3FF;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7F800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t fp32_to_fp16(float f) noexcept {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000;
  const uint32_t abs = x & 0x7FFFFFFF;
  if (abs > 0x7F800000) return static_cast<uint16_t>(sign | 0x7E00);  // NaN
  if (abs >= 0x477FF000) return static_cast<uint16_t>(sign | 0x7C00);  // overflow → inf
  if (abs < 0x38800000) {  // half subnormal (or zero): units of 2^-24, round to nearest even
    if (abs < 0x33000000) return static_cast<uint16_t>(sign);
    const uint32_t e = abs >> 23;
    const uint32_t m = (abs & 0x7FFFFF) | 0x800000;
    const uint32_t shift = 126 - e;  // |f| / 2^-24 = m >> shift, shift in 14..24
    const uint32_t q = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    const uint32_t r = q + ((rem > half || (rem == half && (q & 1))) ? 1 : 0);
    return static_cast<uint16_t>(sign | r);
  }
  uint32_t r = abs - 0x38000000;  // rebias 127 → 15
  const uint32_t rem = r & 0x1FFF;
  r >>= 13;
  if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) ++r;
  return static_cast<uint16_t>(sign | r);
}

float bf16_to_fp32(uint16_t h) noexcept {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t fp32_to_bf16(float f) noexcept {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7FFFFFFF) > 0x7F800000) return static_cast<uint16_t>((x >> 16) | 0x40);
  const uint32_t rounding = 0x7FFF + ((x >> 16) & 1);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

float e8m0_to_fp32_half(uint8_t e) noexcept {
  const uint32_t bits = e < 2 ? 0x00200000u << e : static_cast<uint32_t>(e - 1) << 23;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

void dequantize_row(GgmlType type, const void *src, float *dst, int64_t n) {
  const auto info = format::require_ggml_type(static_cast<uint32_t>(type), "dequantize_row");
  const DequantFn fn = kDequant[static_cast<uint32_t>(type)];
  if (!fn)
    fail(Status::unsupported, "dequantize_row: ggml type {} is not supported by the compute backends (supported: {})",
         info.name, supported_weight_type_names());
  if (n % info.block_elems != 0)
    fail(Status::shape, "dequantize_row: {} values of {} are not a whole number of {}-value blocks",
         n, info.name, info.block_elems);
  fn(static_cast<const uint8_t *>(src), dst, n / info.block_elems);
}

}  // namespace ep::backend
