#include "backend/dequant.hpp"

#include "backend/iq2xxs_table.hpp"
#include "core/error.hpp"

#include <cstring>

namespace ep::backend {
namespace {

using format::GgmlType;
constexpr int kQK = 256;

uint16_t read_u16(const uint8_t *p) noexcept { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
float read_half(const uint8_t *p) noexcept { return fp16_to_fp32(read_u16(p)); }

void dequant_q8_0(const uint8_t *x, float *y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 34) {
    const float d = read_half(x);
    for (int j = 0; j < 32; ++j) *y++ = static_cast<float>(static_cast<int8_t>(x[2 + j])) * d;
  }
}

void dequant_mxfp4(const uint8_t *x, float *y, int64_t nb) {
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
void dequant_q2_k(const uint8_t *x, float *y, int64_t nb) {
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

void dequant_q3_k(const uint8_t *x, float *y, int64_t nb) {
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
void dequant_q4_k(const uint8_t *x, float *y, int64_t nb) {
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
void dequant_q5_k(const uint8_t *x, float *y, int64_t nb) {
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
void dequant_q6_k(const uint8_t *x, float *y, int64_t nb) {
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
void dequant_iq2_xxs(const uint8_t *x, float *y, int64_t nb) {
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
  const auto *x = static_cast<const uint8_t *>(src);
  switch (type) {
    case GgmlType::f32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case GgmlType::f16:
      for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(read_u16(x + 2 * i));
      return;
    case GgmlType::bf16:
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(read_u16(x + 2 * i));
      return;
    default:
      break;
  }
  const auto info = format::require_ggml_type(static_cast<uint32_t>(type), "dequantize_row");
  if (n % info.block_elems != 0)
    fail(Status::shape, "dequantize_row: {} values of {} are not a whole number of {}-value blocks",
         n, info.name, info.block_elems);
  const int64_t nb = n / info.block_elems;
  switch (type) {
    case GgmlType::q8_0: return dequant_q8_0(x, dst, nb);
    case GgmlType::mxfp4: return dequant_mxfp4(x, dst, nb);
    case GgmlType::q2_k: return dequant_q2_k(x, dst, nb);
    case GgmlType::q3_k: return dequant_q3_k(x, dst, nb);
    case GgmlType::q4_k: return dequant_q4_k(x, dst, nb);
    case GgmlType::q5_k: return dequant_q5_k(x, dst, nb);
    case GgmlType::q6_k: return dequant_q6_k(x, dst, nb);
    case GgmlType::iq2_xxs: return dequant_iq2_xxs(x, dst, nb);
    default:
      fail(Status::unsupported, "dequantize_row: ggml type {} is not supported by the compute backends "
           "(supported: f32 f16 bf16 q8_0 q2_K q3_K q4_K q5_K q6_K mxfp4 iq2_xxs)", info.name);
  }
}

}  // namespace ep::backend
