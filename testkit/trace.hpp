// Synthetic routing traces for the cache simulator and its tests: uniform, Zipf, and Zipf with
// temporal locality (a pick repeats one of the previous token's experts), seeded and reproducible.
#pragma once

#include "cache/trace.hpp"

#include <cstdint>
#include <string>

namespace ep::testkit {

struct SyntheticTraceOptions {
  enum class Kind { uniform, zipf, zipf_temporal } kind = Kind::zipf;
  uint32_t num_layers = 8;
  uint32_t num_experts = 128;
  uint32_t top_k = 6;
  uint32_t tokens = 256;
  double zipf_s = 1.0;             ///< exponent: weight of rank r is 1 / r^s
  double temporal_repeat = 0.5;    ///< zipf_temporal: chance that a pick repeats the previous token's expert
  uint64_t object_bytes = 3u << 20;
  uint64_t seed = 1;
};

/// Token-major, then layer (decode order); each access has top_k distinct experts.
cache::Trace synthetic_trace(const SyntheticTraceOptions &options);
/// "uniform", "zipf", "zipf-temporal".
SyntheticTraceOptions::Kind parse_synthetic_kind(const std::string &name);

}  // namespace ep::testkit
