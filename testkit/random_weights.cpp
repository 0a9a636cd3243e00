#include "testkit/random_weights.hpp"

#include "backend/dequant.hpp"
#include "core/error.hpp"

#include <algorithm>
#include <cstring>
#include <exception>
#include <mutex>
#include <numeric>
#include <thread>

namespace ep::testkit {

using format::GgmlType;

uint64_t mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void put_f16(uint8_t *p, float v) {
  const uint16_t h = backend::fp32_to_fp16(v);
  std::memcpy(p, &h, 2);
}

GgmlType dense_type(GgmlType dense, uint64_t ne0) {
  const auto info = format::ggml_type_info(static_cast<uint32_t>(dense));
  return (info && ne0 % info->block_elems == 0) ? dense : GgmlType::f16;
}

void put_f32(uint8_t *p, float v) { std::memcpy(p, &v, 4); }

float zipf_router_bias(double zipf, uint32_t rank) {
  return static_cast<float>(-zipf * kZipfBiasScale * std::log(1.0 + static_cast<double>(rank)));
}

void make_block(GgmlType type, float std, Rand &r, uint8_t *out, uint32_t block_bytes) {
  switch (type) {
    case GgmlType::f32: {
      const float v = static_cast<float>(r.gauss() * std);
      std::memcpy(out, &v, 4);
      return;
    }
    case GgmlType::f16: put_f16(out, static_cast<float>(r.gauss() * std)); return;
    case GgmlType::bf16: {
      const uint16_t h = backend::fp32_to_bf16(static_cast<float>(r.gauss() * std));
      std::memcpy(out, &h, 2);
      return;
    }
    default: break;
  }
  for (uint32_t i = 0; i < block_bytes; ++i) out[i] = static_cast<uint8_t>(r.next());
  const double jitter = 0.75 + 0.5 * r.uniform();
  switch (type) {
    case GgmlType::q8_0: put_f16(out, static_cast<float>(std / 73.0 * jitter)); return;
    case GgmlType::mxfp4: {
      const int e = 128 + static_cast<int>(std::lround(std::log2(std / 4.4 * jitter)));
      out[0] = static_cast<uint8_t>(std::clamp(e, 2, 254));
      return;
    }
    case GgmlType::q2_k:
      put_f16(out + 80, static_cast<float>(std / 20.0 * jitter));
      put_f16(out + 82, static_cast<float>(std / 20.0 * jitter));
      return;
    case GgmlType::q3_k: put_f16(out + 108, static_cast<float>(std / 60.0 * jitter)); return;
    case GgmlType::q4_k:
    case GgmlType::q5_k:
      put_f16(out, static_cast<float>(std / 300.0 * jitter));
      put_f16(out + 2, static_cast<float>(std / 300.0 * jitter));
      return;
    case GgmlType::q6_k: put_f16(out + 208, static_cast<float>(std / 600.0 * jitter)); return;
    case GgmlType::iq2_xxs: put_f16(out, static_cast<float>(std / 40.0 * jitter)); return;
    default: fail(Status::unsupported, "synthetic model: cannot make random {} blocks", static_cast<uint32_t>(type));
  }
}

std::vector<uint32_t> expert_ranks(uint64_t seed, uint32_t n_experts, int64_t layer) {
  const uint32_t E = n_experts;
  std::vector<uint32_t> order(E);
  std::iota(order.begin(), order.end(), 0u);
  Rand r(seed, 0x5A1Full, static_cast<uint64_t>(layer));
  for (uint32_t i = E; i > 1; --i) std::swap(order[i - 1], order[static_cast<uint32_t>(r.next() % i)]);
  std::vector<uint32_t> rank(E);
  for (uint32_t i = 0; i < E; ++i) rank[order[i]] = i;
  return rank;
}

void parallel_fill(const std::function<void(uint64_t, std::span<uint8_t>)> &fill_range, uint64_t offset, std::span<uint8_t> out) {
  static const unsigned n_threads = std::clamp(std::thread::hardware_concurrency(), 1u, 32u);
  constexpr size_t kMinPart = 256u << 10;
  const size_t parts = std::min<size_t>(n_threads, out.size() / kMinPart);
  if (parts <= 1) return fill_range(offset, out);
  const size_t step = (out.size() + parts - 1) / parts;
  std::vector<std::thread> pool;
  std::exception_ptr error;
  std::mutex error_mutex;
  for (size_t p = 0; p < parts; ++p) {
    const size_t lo = p * step, hi = std::min(out.size(), lo + step);
    if (lo >= hi) break;
    pool.emplace_back([&, lo, hi] {
      try {
        fill_range(offset + lo, out.subspan(lo, hi - lo));
      } catch (...) {
        const std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
      }
    });
  }
  for (auto &th : pool) th.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace ep::testkit
