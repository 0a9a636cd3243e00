// The expert store's settings a user chooses: the ep_model_options fields about the expert cache,
// the host tier and the reads, under the same names and with the same defaults, handed unchanged
// from the C API through the engine to the store-backed expert provider. A default means the same
// at every level: 0 (and direct_io -1) is "automatic" here as in include/expertpack/model.h, and
// a cache budget of 0 is "room for every expert" down to cache::compute_budget.
#pragma once

#include <cstdint>
#include <memory>
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

class StoreDevice;
struct StoreOptions;

/// Sets @p options from @p settings: the cache budget, the policy, the host tier, prefetch, and
/// the staging slots and reader settings where they are not 0 (automatic: the store's and the
/// reader's defaults stay), and returns the device an ExpertStore with those options runs on:
/// @p cuda_device >= 0, that CUDA device, ordered on @p cuda_stream (a cudaStream_t; null: the
/// device makes its own), with @p cuda_reserve_bytes kept free (options.reserve_bytes) when the
/// budget is every expert; otherwise host memory, of which every expert may take at most half the
/// physical memory. An explicit budget is taken as given on either.
std::unique_ptr<StoreDevice> configure_store(const StoreSettings &settings, int cuda_device, void *cuda_stream,
                                             uint64_t cuda_reserve_bytes, StoreOptions &options);

}  // namespace ep::store
