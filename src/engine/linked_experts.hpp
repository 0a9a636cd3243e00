// The expert store as a component other engines link (include/expertpack/experts.h): an
// ExpertStore on a pack or a source index, found the way a model finds its pack
// (pack_resolution.hpp) and sized the way PackedExperts sizes a model's, with no model around
// it. The host engine brings the ids and its own kernels; this hands out, per id, the addresses
// of the expert's object and roles, ready in the order of the host's CUDA stream.
//
// Streams (CUDA): the store orders its consumers on a compute stream of its own. An acquire
// makes the host's stream wait for that stream after the store queued its waits for the slots'
// `ready` events and published the pointer table; a release makes the store's stream wait for
// the host's before the store records the slots' `last_use` events there. Both are event waits
// on the device: with every id resident, an acquire never blocks the host.
//
// Thread safety: every method may be called from any thread (the store serialises acquire,
// release and hint; the stream bridge is used under the same lock order). A Lease is released
// once.
#pragma once

#include "engine/pack_resolution.hpp"
#include "format/ggml_type.hpp"
#include "store/expert_store.hpp"
#include "store/store_settings.hpp"

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

namespace ep::store {
class PackObjectMap;
}  // namespace ep::store

namespace ep::engine {

enum class DeviceChoice : uint8_t;

struct LinkedExpertsOptions {
  DeviceChoice device{};             ///< automatic: the CUDA device when it exists, else host memory
  int32_t device_index = 0;
  /// The cache, host tier and reads under ep_model_options' names and defaults (a cache budget of 0
  /// is every expert: on the host at most half the RAM, on CUDA the free VRAM less the reserve;
  /// prefetch: accept hint()s). overlap_reads does not apply: an acquire returns once its reads
  /// have landed.
  store::StoreSettings store;
  uint64_t cuda_reserve_bytes = uint64_t{2} << 30;  ///< left free on the GPU when the budget is "all of it"
  PackPlacement placement;           ///< where a source's pack (or source index) is found or built
  uint32_t tokens_per_acquire = 1;   ///< 0: as many as the budget holds top_k experts for
  std::string stats_path;            ///< JSON stats file ("" = none)
  uint32_t stats_every = 0;          ///< write it every N acquires (0 = at close only)
  uint32_t top_k = 0;                ///< experts per token; 0: the pack's
};

/// One role of every expert object of a layer.
struct RoleLayout {
  format::GgmlType type{};
  uint64_t ne0 = 0, ne1 = 0;  ///< ggml order: elements per row, rows
  uint64_t offset = 0;        ///< bytes from the object's start
  uint64_t row_bytes = 0;
  uint64_t bytes = 0;
};

struct LayerLayout {
  uint32_t num_experts = 0;
  uint64_t object_bytes = 0;  ///< end of the last role
  std::array<RoleLayout, 3> roles{};
};

class LinkedExperts {
 public:
  /// Resolves @p path (a pack, a source index or a source) and opens the store; throws what
  /// resolve_model(), the pack reader and the store throw, Status::unsupported for a layer whose
  /// experts are not laid out alike, Status::invalid_argument for bad options.
  static std::unique_ptr<LinkedExperts> open(const std::string &path, const LinkedExpertsOptions &options);
  ~LinkedExperts();
  LinkedExperts(const LinkedExperts &) = delete;
  LinkedExperts &operator=(const LinkedExperts &) = delete;

  struct Lease {
    store::Acquisition acquisition;
    std::vector<int32_t> ids;            ///< as given
    std::vector<const void *> roles;     ///< role-major: roles[r * n + i]
    std::vector<uint32_t> slots;         ///< per id: its slot
  };
  /// Acquires @p ids of @p layer for work on @p stream (a cudaStream_t on CUDA; must be null in
  /// host memory). Throws Status::invalid_argument naming the layer and position of a bad id.
  std::unique_ptr<Lease> acquire(uint32_t layer, std::span<const int32_t> ids, void *stream);
  /// The work queued on @p stream before this call is the lease's last use.
  void release(Lease &lease, void *stream);
  /// Prefetch hint; Status::invalid_argument without LinkedExpertsOptions::prefetch.
  void hint(uint32_t layer, std::span<const int32_t> ids);
  store::StoreStats stats() const { return store_->stats(); }

  const std::string &pack_path() const { return pack_path_; }
  bool on_cuda() const { return cuda_device_ >= 0; }
  int cuda_device() const { return cuda_device_; }
  uint32_t num_layers() const { return static_cast<uint32_t>(layouts_.size()); }
  uint32_t first_layer() const { return first_layer_; }
  uint32_t num_experts() const { return num_experts_; }
  uint32_t top_k() const { return top_k_; }
  uint32_t tokens_per_acquire() const { return tokens_; }
  uint32_t max_unique() const { return max_unique_; }
  uint32_t max_table_ids() const { return top_k_ * tokens_; }
  uint64_t slot_bytes() const { return store_->slot_bytes(); }
  uint32_t num_slots() const { return store_->num_slots(); }
  uint32_t num_host_slots() const { return store_->num_host_slots(); }
  /// Slot 0's address; slot s is at + s × slot_bytes() (checked at open).
  const void *slots_base() const { return slots_base_; }
  /// Throws Status::invalid_argument for a layer out of range.
  const LayerLayout &layout(uint32_t layer) const;

 private:
  LinkedExperts();
  void check_stream(void *stream, const char *what) const;
  void check_ids(uint32_t layer, std::span<const int32_t> ids, const char *what) const;

  std::string pack_path_;
  std::shared_ptr<store::PackObjectMap> pack_;
  std::unique_ptr<store::ExpertStore> store_;
  std::vector<LayerLayout> layouts_;
  uint32_t first_layer_ = 0, num_experts_ = 0, top_k_ = 1, tokens_ = 1, max_unique_ = 1;
  bool prefetch_ = false;
  int cuda_device_ = -1;
  void *store_stream_ = nullptr;  // the store's compute stream (CUDA)
  const void *slots_base_ = nullptr;
  std::mutex bridge_mutex_;       // the events below are re-recorded per call
  /// The events that order the store's stream and a caller's (CUDA builds; empty otherwise).
  struct StreamOrders;
  std::unique_ptr<StreamOrders> orders_;
};

}  // namespace ep::engine
