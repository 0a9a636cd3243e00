// The options of opening a model: the one internal form of the C API's ep_model_options, with
// its field names and its defaults (ep_model_options_init fills the C struct from a
// default-constructed ModelOptions). Validated once, by Engine::open (validate_model_options);
// the store's part (store::StoreSettings) goes unchanged to the store-backed expert provider.
//
// Adding an option: its field in include/expertpack/model.h (appended), its field here with the
// default, its row in EP_MODEL_OPTION_FIELDS (capi's conversions both ways are made from it), its
// check in validate_model_options if it has one, the flag table in tools/cli/model_flags.hpp,
// the bindings, and its row in docs/c-api.md's options table.
#pragma once

#include "store/store_settings.hpp"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ep::engine {

/// Where a model runs.
enum class DeviceChoice : uint8_t {
  automatic = 0,  ///< the CUDA device when it exists and the architecture runs there, else the CPU (logged)
  cpu = 1,
  cuda = 2,  ///< Status::no_device without one, Status::unsupported for a CPU-only architecture
};

struct ModelOptions {
  DeviceChoice device = DeviceChoice::automatic;
  int32_t device_index = 0;       ///< CUDA device ordinal
  /// Several devices of one kind, comma-separated: "cuda:0,cuda:1" (a GPU may be named twice: two
  /// backends with two caches on it), or "cpu,cpu" (CPU backends standing for devices). The dense
  /// weights and the attention run on the first; the routed experts are spread over all
  /// (docs/multi-device.md). "" = the one device of device / device_index, which must then keep
  /// their defaults when a list is given.
  std::string devices;
  int32_t cpu_threads = 0;        ///< CPU backend threads (0 .. 4096); 0 = EP_CPU_THREADS, else the hardware concurrency
  std::string pack_dir;           ///< packs built for sources; "" = default_pack_dir()
  bool pack_build = true;         ///< build a missing pack, rebuild a stale one
  bool resident_experts = false;  ///< every routed expert read from the source at open (no pack)
  /// No pack: the routed experts are read from the source through a source index (see
  /// pack_resolution.hpp); not with resident_experts, nor with a pack as the path.
  bool no_pack = false;
  store::StoreSettings store;     ///< the expert cache, the host tier and the reads
  /// Bytes the sessions' decode state (KV, compressor, recurrent state and last logits) may take
  /// together; 0 = automatic: on CUDA the free GPU memory after the weights and the expert
  /// cache less kKvActivationReserveBytes (an automatic cache of every expert leaves it at least
  /// 1 / kKvAutomaticShare of the memory free after the weights), on the CPU a quarter of the
  /// physical memory.
  uint64_t kv_budget_bytes = 0;
  std::function<void(uint64_t done_bytes, uint64_t total_bytes)> progress;  ///< while a pack is built
};

/// Left free on the GPU by the automatic KV budget, for activations and scratch.
inline constexpr uint64_t kKvActivationReserveBytes = uint64_t{1} << 30;
/// With the expert cache and the KV budget both automatic on CUDA, the cache of every expert
/// leaves 1 / kKvAutomaticShare of the GPU memory free after the dense weights to the KV budget.
inline constexpr uint64_t kKvAutomaticShare = 4;

/// The fields that cross the C API by value: X(ep_model_options field, ModelOptions member).
/// The C API converts each both ways by its types (a 0/1 int32_t flag to bool, a string to
/// std::string with NULL = the default, ep_device_kind to DeviceChoice); progress and its payload
/// are bound by hand.
#define EP_MODEL_OPTION_FIELDS(X)                                                                   \
  X(device, device)                                                                                 \
  X(device_index, device_index)                                                                     \
  X(cache_budget_bytes, store.cache_budget_bytes)                                                   \
  X(staging_slots, store.staging_slots)                                                             \
  X(queue_depth, store.queue_depth)                                                                 \
  X(read_splits, store.read_splits)                                                                 \
  X(direct_io, store.direct_io)                                                                     \
  X(pack_dir, pack_dir)                                                                             \
  X(pack_build, pack_build)                                                                         \
  X(resident_experts, resident_experts)                                                             \
  X(cpu_threads, cpu_threads)                                                                       \
  X(host_cache_bytes, store.host_cache_bytes)                                                       \
  X(overlap_reads, store.overlap_reads)                                                             \
  X(prefetch, store.prefetch)                                                                       \
  X(cache_policy, store.cache_policy)                                                               \
  X(no_pack, no_pack)                                                                               \
  X(kv_budget_bytes, kv_budget_bytes)                                                               \
  X(devices, devices)

/// One device of ModelOptions::devices.
struct DeviceEntry {
  bool cuda = false;
  int32_t index = 0;  ///< the CUDA ordinal (0 on the CPU)
};
/// The most devices a list may name.
inline constexpr size_t kMaxDevices = 64;
/// The devices of a list (ModelOptions::devices); Status::invalid_argument naming the list and
/// the entry for an entry other than "cpu" or "cuda:N", devices of two kinds, no entry or more
/// than kMaxDevices.
std::vector<DeviceEntry> parse_devices(const std::string &devices);

/// Throws ep::Error(Status::invalid_argument) naming the field (its C name), the value and what
/// it takes, for any value out of range or any two options that exclude each other.
void validate_model_options(const ModelOptions &options);

}  // namespace ep::engine
