#include "format/microscale.hpp"

#include "core/error.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace ep::format {

void fp4_e8m0_to_mxfp4(const uint8_t *packed, const uint8_t *scales, uint64_t rows, uint64_t cols, uint8_t *out,
                       const std::string &what) {
  if (cols % 32 != 0) fail(Status::shape, "{}: {} columns are not a whole number of 32-value FP4 blocks", what, cols);
  const uint64_t nb = cols / 32;
  for (uint64_t r = 0; r < rows; ++r) {
    for (uint64_t b = 0; b < nb; ++b) {
      const uint64_t blk = r * nb + b;
      const uint8_t e = scales[blk];
      if (e == 0xFF) fail(Status::corrupt, "{}: E8M0 scale byte {} (row {}, block {}) is NaN (0xFF)", what, blk, r, b);
      const uint8_t *src = packed + r * (cols / 2) + b * 16;  // element 2i: low nibble of src[i]
      uint8_t *dst = out + blk * 17;
      dst[0] = e;
      // ggml's byte j holds element j (low) and j + 16 (high): elements 2i, 2i + 1 are src[i]'s
      // nibbles, elements 16 + 2i, 17 + 2i src[8 + i]'s. So byte 2i is src[i]'s low nibble with
      // src[8 + i]'s low one above it, byte 2i + 1 the two high nibbles.
#if defined(__SSE2__)
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i *>(src));  // src[i] in byte i < 8
      const __m128i c = _mm_srli_si128(a, 8);                                       // src[8 + i] in byte i
      const __m128i low = _mm_set1_epi8(0x0F), high = _mm_set1_epi8(static_cast<char>(0xF0));
      // (16-bit shifts: the bits crossing into the neighbouring byte are masked off)
      const __m128i even = _mm_or_si128(_mm_and_si128(a, low), _mm_and_si128(_mm_slli_epi16(c, 4), high));
      const __m128i odd = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(a, 4), low), _mm_and_si128(c, high));
      _mm_storeu_si128(reinterpret_cast<__m128i *>(dst + 1), _mm_unpacklo_epi8(even, odd));
#else
      for (int i = 0; i < 8; ++i) {
        const uint8_t a = src[i], c = src[8 + i];
        dst[1 + 2 * i] = static_cast<uint8_t>((a & 0x0F) | (c << 4));
        dst[2 + 2 * i] = static_cast<uint8_t>((a >> 4) | (c & 0xF0));
      }
#endif
    }
  }
}

void mxfp4_to_fp4_e8m0(const uint8_t *mxfp4, uint64_t rows, uint64_t cols, uint8_t *packed, uint8_t *scales) {
  const uint64_t nb = cols / 32;
  for (uint64_t blk = 0; blk < rows * nb; ++blk) {
    const uint8_t *src = mxfp4 + blk * 17;
    scales[blk] = src[0];
    uint8_t elem[32];
    for (int j = 0; j < 16; ++j) {
      elem[j] = src[1 + j] & 0x0F;
      elem[j + 16] = src[1 + j] >> 4;
    }
    uint8_t *dst = packed + blk * 16;
    for (int i = 0; i < 16; ++i) dst[i] = static_cast<uint8_t>(elem[2 * i] | (elem[2 * i + 1] << 4));
  }
}

double e4m3_value(uint8_t b) noexcept {
  const int e = (b >> 3) & 0x0F, m = b & 0x07;
  if (e == 0x0F && m == 0x07) return std::nan("");
  const double mag = e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10);
  return (b & 0x80) ? -mag : mag;
}

uint8_t e4m3_from_value(double v) noexcept {
  // The 127 finite non-negative codes in increasing order: code c has value e4m3_value(c).
  static const std::array<double, 127> table = [] {
    std::array<double, 127> t{};
    for (int c = 0; c < 127; ++c) t[static_cast<size_t>(c)] = e4m3_value(static_cast<uint8_t>(c));
    return t;
  }();
  const uint8_t sign = std::signbit(v) ? 0x80 : 0x00;
  const double a = std::fabs(v);
  if (!(a < table.back())) return static_cast<uint8_t>(sign | 126);  // saturate (and NaN → max)
  const auto it = std::lower_bound(table.begin(), table.end(), a);
  int hi = static_cast<int>(it - table.begin());
  if (hi == 0) return sign;
  const int lo = hi - 1;
  const double dl = a - table[static_cast<size_t>(lo)], dh = table[static_cast<size_t>(hi)] - a;
  const int c = dl < dh ? lo : dh < dl ? hi : (lo % 2 == 0 ? lo : hi);
  return static_cast<uint8_t>(sign | c);
}

GgmlType fp8_block_type(const uint8_t *scales, uint64_t n_scales, ScaleType scale_type) {
  for (uint64_t i = 0; i < n_scales; ++i) {
    int k;
    if (scale_type == ScaleType::e8m0) {
      k = static_cast<int>(scales[i]) - 127;
    } else {
      float f;
      std::memcpy(&f, scales + 4 * i, 4);
      int e;
      const double m = std::frexp(static_cast<double>(f), &e);
      if (!std::isfinite(f) || m != 0.5) return GgmlType::f32;  // not a power of two
      k = e - 1;
    }
    // e4m3 values lie in [2^-9, 448] with their lowest bit >= 2^-9: times 2^k they are exact
    // in bf16 (subnormals down to 2^-133, maximum above 448 · 2^119).
    if (k < -124 || k > 119) return GgmlType::f32;
  }
  return GgmlType::bf16;
}

std::vector<uint8_t> fp8_block_dequant(const uint8_t *weights, const uint8_t *scales, ScaleType scale_type, uint64_t rows,
                                       uint64_t cols, uint64_t block_rows, uint64_t block_cols, GgmlType type,
                                       const std::string &what) {
  if (type != GgmlType::bf16 && type != GgmlType::f32) fail(Status::internal, "{}: FP8 dequantized to type {}", what, static_cast<uint32_t>(type));
  if (block_rows == 0 || block_cols == 0) fail(Status::shape, "{}: FP8 block size {}x{}", what, block_rows, block_cols);
  const uint64_t sc_cols = (cols + block_cols - 1) / block_cols;
  std::vector<float> values(static_cast<size_t>(rows * cols));
  for (uint64_t r = 0; r < rows; ++r) {
    for (uint64_t cb = 0; cb < sc_cols; ++cb) {
      const uint64_t si = (r / block_rows) * sc_cols + cb;
      double s;
      if (scale_type == ScaleType::e8m0) {
        if (scales[si] == 0xFF) fail(Status::corrupt, "{}: E8M0 block scale {} (row block {}, column block {}) is NaN (0xFF)", what, si, r / block_rows, cb);
        s = std::ldexp(1.0, static_cast<int>(scales[si]) - 127);
      } else {
        float f;
        std::memcpy(&f, scales + 4 * si, 4);
        if (!std::isfinite(f)) fail(Status::corrupt, "{}: F32 block scale {} is {}", what, si, f);
        s = f;
      }
      const uint64_t c1 = std::min(cols, (cb + 1) * block_cols);
      for (uint64_t c = cb * block_cols; c < c1; ++c) {
        const uint64_t i = r * cols + c;
        const double w = e4m3_value(weights[i]);
        if (std::isnan(w)) fail(Status::corrupt, "{}: element {} (row {}, column {}) is an FP8 NaN (0x{:02x})", what, i, r, c, weights[i]);
        const double v = w * s;  // exact: 4 significant bits times a double
        const float f = static_cast<float>(v);
        if (!std::isfinite(f) || (scale_type == ScaleType::e8m0 && static_cast<double>(f) != v))
          fail(Status::corrupt, "{}: element {} (row {}, column {}) = {} x {} lies outside f32's range", what, i, r, c, w, s);
        uint32_t bits;
        std::memcpy(&bits, &f, 4);
        if (type == GgmlType::bf16 && (bits & 0xFFFFu) != 0)
          fail(Status::corrupt, "{}: element {} (row {}, column {}) = {} x {} is not exact in bf16", what, i, r, c, w, s);
        values[static_cast<size_t>(i)] = f;
      }
    }
  }
  std::vector<uint8_t> out;
  if (type == GgmlType::bf16) {
    out.resize(values.size() * 2);
    for (size_t i = 0; i < values.size(); ++i) {
      uint32_t bits;
      std::memcpy(&bits, &values[i], 4);
      const uint16_t h = static_cast<uint16_t>(bits >> 16);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  } else {
    out.resize(values.size() * 4);
    std::memcpy(out.data(), values.data(), out.size());
  }
  return out;
}

}  // namespace ep::format
