// Seeded random weights for the synthetic GGUF writers (deepseek_v4_gguf, kimi_gguf):
// every byte is a pure function of (seed, tensor, block), so files of any size are written with
// constant memory, in parallel, and reproducibly.
#pragma once

#include "format/ggml_type.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace ep::testkit {

uint64_t mix64(uint64_t z);

/// Deterministic randomness keyed by (seed, tensor, index).
struct Rand {
  uint64_t state;
  Rand(uint64_t seed, uint64_t tensor, uint64_t index) : state(mix64(seed ^ mix64(tensor * 0x100000001B3ull ^ mix64(index)))) {}
  uint64_t next() { return state = mix64(state); }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  double gauss() {
    const double u1 = std::max(uniform(), 1e-300), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
};

/// The type a dense matrix of rows of @p ne0 gets: @p dense when its blocks divide the rows, else f16.
format::GgmlType dense_type(format::GgmlType dense, uint64_t ne0);
/// The value scale of a random matrix with rows of @p ne0 (outputs of about @p scale for unit inputs).
inline float matrix_std(uint64_t ne0, float scale = 1.0f) { return static_cast<float>(scale / std::sqrt(static_cast<double>(ne0))); }

void put_f16(uint8_t *p, float v);
void put_f32(uint8_t *p, float v);

/// The router correction bias of the expert of popularity rank @p rank under ep-synth --zipf S:
/// -S · kZipfBiasScale · ln(1 + rank).
inline constexpr double kZipfBiasScale = 0.25;
float zipf_router_bias(double zipf, uint32_t rank);

/// Writes bytes [offset, offset + out.size()) of a tensor made of @p block_bytes-byte blocks:
/// block bi is made by make(bi, block) (a pure function of bi), and cut to the range.
template <class Make>
void fill_blocks(uint32_t block_bytes, uint64_t offset, std::span<uint8_t> out, Make &&make) {
  std::vector<uint8_t> block(block_bytes);
  uint64_t pos = offset;
  size_t done = 0;
  while (done < out.size()) {
    const uint64_t bi = pos / block_bytes, within = pos % block_bytes;
    make(bi, block.data());
    const size_t n = static_cast<size_t>(std::min<uint64_t>(block_bytes - within, out.size() - done));
    std::copy_n(block.data() + within, n, out.data() + done);
    done += n;
    pos += n;
  }
}

/// One block (or one element for f32 / f16 / bf16) of a random tensor whose values are about
/// @p std: random quants with a scale set for that magnitude. Status::unsupported for a type
/// without a rule (mxfp4, q2_K..q6_K, q8_0, iq2_xxs and the float types have one).
void make_block(format::GgmlType type, float std, Rand &r, uint8_t *out, uint32_t block_bytes);

/// A seeded permutation of @p n_experts expert ranks for layer @p layer (rank[e], 0 = most
/// popular): the routing shape of ep-synth --zipf.
std::vector<uint32_t> expert_ranks(uint64_t seed, uint32_t n_experts, int64_t layer);

/// Fills @p out (the bytes at @p offset of one tensor) with @p fill_range, splitting large
/// ranges over the machine's threads (any split gives the same bytes).
void parallel_fill(const std::function<void(uint64_t offset, std::span<uint8_t> out)> &fill_range, uint64_t offset,
                   std::span<uint8_t> out);

}  // namespace ep::testkit
