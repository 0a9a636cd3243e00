// Seeded random weights of any supported ggml type for the backend tests: random bytes for the
// quantized fields and small finite values for every f16 scale, so that dequantized values are
// finite and of moderate size.
#pragma once

#include "backend/dequant.hpp"
#include "format/ggml_type.hpp"

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace ep::test {

inline std::vector<uint8_t> random_weights(format::GgmlType type, int64_t k, int64_t n, std::mt19937 &rng) {
  using format::GgmlType;
  const uint64_t row_bytes = format::ggml_row_bytes(type, static_cast<uint64_t>(k), "random_weights");
  std::vector<uint8_t> w(row_bytes * static_cast<uint64_t>(n));
  std::uniform_real_distribution<float> val(-1.0f, 1.0f);
  auto put16 = [&](size_t at, uint16_t h) {
    w[at] = static_cast<uint8_t>(h & 0xFF);
    w[at + 1] = static_cast<uint8_t>(h >> 8);
  };
  if (type == GgmlType::f32) {
    for (size_t i = 0; i < w.size() / 4; ++i) {
      const float f = val(rng);
      std::memcpy(&w[4 * i], &f, 4);
    }
    return w;
  }
  if (type == GgmlType::f16 || type == GgmlType::bf16) {
    for (size_t i = 0; i < w.size() / 2; ++i)
      put16(2 * i, type == GgmlType::f16 ? backend::fp32_to_fp16(val(rng)) : backend::fp32_to_bf16(val(rng)));
    return w;
  }
  for (auto &b : w) b = static_cast<uint8_t>(rng());
  const auto info = *format::ggml_type_info(static_cast<uint32_t>(type));
  std::uniform_real_distribution<float> scale(0.001f, 0.02f);
  for (size_t blk = 0; blk < w.size() / info.block_bytes; ++blk) {
    const size_t b = blk * info.block_bytes;
    auto half = [&](size_t off) { put16(b + off, backend::fp32_to_fp16(scale(rng))); };
    switch (type) {
      case GgmlType::q8_0: half(0); break;
      case GgmlType::mxfp4: w[b] = static_cast<uint8_t>(118 + rng() % 8); break;
      case GgmlType::q2_k: half(80); half(82); break;
      case GgmlType::q3_k: half(108); break;
      case GgmlType::q4_k: case GgmlType::q5_k: half(0); half(2); break;
      case GgmlType::q6_k: half(208); break;
      case GgmlType::iq2_xxs: half(0); break;
      case GgmlType::q4_1: case GgmlType::q5_1: half(0); half(2); break;
      case GgmlType::q4_0: case GgmlType::q5_0: case GgmlType::iq4_nl: case GgmlType::iq4_xs:
      case GgmlType::iq2_xs: case GgmlType::iq2_s: case GgmlType::iq3_xxs: case GgmlType::iq3_s:
      case GgmlType::iq1_s: half(0); break;
      case GgmlType::iq1_m: {  // the f16 scale lives in the top nibbles of the four scale words
        const uint16_t h = backend::fp32_to_fp16(scale(rng));
        for (int q = 0; q < 4; ++q)
          w[b + 49 + 2 * q] = static_cast<uint8_t>((w[b + 49 + 2 * q] & 0x0F) | (((h >> (4 * q)) & 0xF) << 4));
        break;
      }
      default: break;
    }
  }
  return w;
}

inline std::vector<float> random_floats(size_t n, std::mt19937 &rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto &x : v) x = d(rng);
  return v;
}

/// The weight types the backends support that have GEMV kernels on CUDA.
inline const std::vector<format::GgmlType> &all_weight_types() {
  using format::GgmlType;
  static const std::vector<GgmlType> types = {GgmlType::f32,  GgmlType::f16,  GgmlType::bf16,  GgmlType::q8_0,
                                              GgmlType::q2_k, GgmlType::q3_k, GgmlType::q4_k,  GgmlType::q5_k,
                                              GgmlType::q6_k, GgmlType::mxfp4, GgmlType::iq2_xxs};
  return types;
}

/// The supported weight types that CUDA multiplies through dequantization + cuBLAS only.
inline const std::vector<format::GgmlType> &dequant_only_weight_types() {
  using format::GgmlType;
  static const std::vector<GgmlType> types = {
      GgmlType::q4_0,   GgmlType::q4_1,    GgmlType::q5_0,  GgmlType::q5_1,  GgmlType::iq4_nl, GgmlType::iq4_xs,
      GgmlType::iq2_xs, GgmlType::iq2_s,   GgmlType::iq3_xxs, GgmlType::iq3_s, GgmlType::iq1_s,  GgmlType::iq1_m};
  return types;
}

/// Every supported weight type (backend::is_supported_weight_type).
inline std::vector<format::GgmlType> every_weight_type() {
  std::vector<format::GgmlType> types = all_weight_types();
  types.insert(types.end(), dequant_only_weight_types().begin(), dequant_only_weight_types().end());
  return types;
}

}  // namespace ep::test
