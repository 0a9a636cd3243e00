// The expert store's settings a user chooses: the ep_model_options fields about the expert cache,
// the host tier and the reads, under the same names and with the same defaults, handed unchanged
// from the C API through the engine to the store-backed expert provider. A default means the same
// at every level: 0 (and direct_io -1) is "automatic" here as in include/expertpack/model.h, and
// a cache budget of 0 is "room for every expert" down to cache::compute_budget.
#pragma once

#include <cstdint>
#include <string>

namespace ep::store {

struct StoreSettings {
  /// Expert cache budget in bytes; 0 = room for every expert (at most half the physical memory;
  /// CUDA: the free GPU memory less a reserve for activations).
  uint64_t cache_budget_bytes = 0;
  uint32_t staging_slots = 0;      ///< staging slots for expert reads; 0 = the store's default
  uint32_t queue_depth = 0;        ///< I/O queue depth; 0 = the reader's default
  uint32_t read_splits = 0;        ///< parts each expert object is read in; 0 = the reader's default
  int32_t direct_io = -1;          ///< 1 O_DIRECT, 0 buffered, -1 automatic
  uint64_t host_cache_bytes = 0;   ///< host-RAM tier below the expert cache (whole experts); 0 = none
  /// Compute a layer's cached experts while its misses are read, each missing one as its read
  /// lands (the provider's staged acquire); false: every read completes first.
  bool overlap_reads = true;
  bool prefetch = false;           ///< read the next layer's predicted experts into spare I/O capacity
  std::string cache_policy = "decay";  ///< lru, sglang-lfu, decay, decay-bypass (the host tier uses the same)
};

}  // namespace ep::store
