// Routing traces: a sequence of acquires, each one layer and the expert ids it needs. Read
// from BigMoeOnEdge route CSVs (route_trace v1) or from the store's own recorder
// ("# ep_store_trace v1"); testkit/trace.hpp generates synthetic ones.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ep::cache {

struct TraceAccess {
  uint32_t layer = 0;
  std::vector<uint32_t> experts;  ///< may repeat ids (several tokens); the cache sees the unique set
  bool prefill = false;
};

struct Trace {
  std::string name;
  uint32_t num_layers = 0;
  uint32_t num_experts = 0;
  uint32_t top_k = 0;
  uint32_t tokens_per_acquire = 1;     ///< the most tokens one access covers
  std::vector<uint64_t> object_bytes;  ///< per layer
  std::vector<TraceAccess> accesses;

  uint64_t max_object_bytes() const;
  uint64_t object_bytes_of(uint32_t layer) const;
};

/// Which cells of a route trace become accesses.
enum class TracePhases {
  decode,  ///< decode cells only, one access per (token, layer) — the steady state
  all,     ///< also prefill: one access per layer with the union of all prompt tokens' experts
};

/// Reads a BigMoeOnEdge route CSV (route_trace v1) or an ep_store_trace v1 file.
/// Throws ep::Error (EP_ERR_FORMAT naming the file and line) on malformed input.
Trace read_trace(const std::string &path, TracePhases phases = TracePhases::decode);

/// How skewed one layer's routing is over a trace: every expert id of every access counted once
/// per occurrence (a token's picks).
struct LayerSkew {
  uint32_t layer = 0;
  uint64_t picks = 0;          ///< expert ids counted
  double entropy_ratio = 0.0;  ///< entropy of the expert distribution / log2(num_experts): 1 = uniform
  double top_share = 0.0;      ///< share of the picks that went to the most-picked 10 % of the experts (at least one)
};
/// Per layer (layers without picks left out).
std::vector<LayerSkew> routing_skew(const Trace &trace);

/// Writes the ep_store_trace v1 text form (what the store's recorder writes).
void write_trace(const Trace &trace, const std::string &path);

}  // namespace ep::cache
