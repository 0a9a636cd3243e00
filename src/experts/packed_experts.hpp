// Routed experts served by the ExpertStore from an Expert Pack (an ExpertProvider): host-
// memory slots for the CPU backend, VRAM slots (the store's CUDA device, on the backend's stream)
// for the CUDA backend. The pack's per-role entries (type, shape, offset inside the object)
// become the backend's SlotLayout; they must match what the model's source says (fail-closed,
// Status::shape / Status::format).
//
// One acquire per MoE layer and step: the router's ids come to the host once (the runner's
// start_moe), the store dedups them once, loads the misses, makes the compute stream
// wait on the slots' `ready` events and publishes the one device table the MoE kernels read —
// per pair, the gate, up and down addresses inside its slot. release() records the `last_use`
// events. Nothing here synchronises the stream.
//
// With overlap_reads (the default), the acquire is staged: it returns once the misses' reads are
// submitted, the MoE computes the resident experts' rows meanwhile, and next_staged() hands out
// each expert as its read lands (runner.hpp). With a host tier, experts evicted
// from the slots are kept in pinned host memory; with prefetch, hints from the model load a later
// layer's likely experts into spare I/O capacity.
#pragma once

#include "experts/provider.hpp"
#include "store/store_settings.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ep::io {
class IoSeam;
}  // namespace ep::io

namespace ep::store {
class ExpertStore;
class PackObjectMap;
struct StoreStats;
}  // namespace ep::store

namespace ep::experts {

struct PackedExpertsOptions {
  store::StoreSettings store;         ///< the user's settings (ep_model_options' names and defaults)
  std::string stats_path;             ///< JSON stats written at close ("" = none)
  /// >= 0: the slots live in the memory of this CUDA device (store::make_cuda_device: pinned
  /// staging, VRAM slots, a transfer stream) and are ordered on @p cuda_stream, which must be
  /// the compute backend's stream; -1: host-memory slots (the CPU backend).
  int cuda_device = -1;
  void *cuda_stream = nullptr;  ///< a cudaStream_t (the CudaBackend's), with cuda_device >= 0
  /// CUDA: device memory left free for activations and workspaces when the budget is "all of it".
  uint64_t cuda_reserve_bytes = uint64_t{2} << 30;
  /// The model block of provider layer 0, which the pack's first_layer must equal: 0 for
  /// DeepSeek-V4; Kimi's leading dense blocks have no experts (CausalLm::first_expert_layer()).
  int64_t first_layer = 0;
  /// The most tokens one step runs through the table-driven MoE kernels (the device table's
  /// capacity is this × top_k pairs); larger steps use the host slots only.
  int64_t table_tokens = 8;
  /// The I/O seam the store's reader passes every read through (src/io/seam.hpp): fault
  /// injection for tests (EIO, short, slow or wrong bytes); null: none.
  std::shared_ptr<io::IoSeam> seam;
};

/// The store-backed provider (see the file comment).
class PackedExperts final : public ExpertProvider {
 public:
  /// @p expected: one entry per MoE layer (provider layer l = pack layer l = model block
  /// options.first_layer + l); @p top_k: experts per token.
  PackedExperts(const std::string &pack_path, const std::vector<ExpertShape> &expected, int64_t top_k,
                const PackedExpertsOptions &options);
  ~PackedExperts() override;
  const backend::SlotLayout &layout(int64_t layer) const override;
  bool needs_host_ids() const override { return true; }
  backend::ExpertBatch acquire(int64_t layer, const backend::Tensor &ids, const int32_t *host_ids,
                               std::span<const int32_t> only) override;
  void release(int64_t layer) override;
  int64_t max_unique() const override { return max_unique_; }
  bool stages_reads() const override { return overlap_reads_; }
  backend::ExpertBatch acquire_staged(int64_t layer, const backend::Tensor &ids, const int32_t *host_ids) override;
  backend::ExpertBatch acquire_staged_only(int64_t layer, const backend::Tensor &ids, const int32_t *host_ids,
                                           std::span<const int32_t> only) override;
  bool next_staged(int64_t layer, backend::ExpertBatch &batch) override;
  bool wants_hints() const override { return prefetch_; }
  void hint(int64_t layer, std::span<const int32_t> ids) override;

  store::StoreStats stats() const;
  uint32_t num_slots() const;
  uint64_t slot_bytes() const;
  /// The smallest cache budget the store accepts for this pack and top_k (top_k slots).
  static uint64_t min_cache_bytes(const std::string &pack_path, int64_t top_k);

 private:
  struct Held;
  std::shared_ptr<store::PackObjectMap> pack_;
  std::unique_ptr<store::ExpertStore> store_;
  std::vector<backend::SlotLayout> layouts_;
  std::unique_ptr<Held> held_;
  int64_t max_unique_ = 1;
  bool overlap_reads_ = true, prefetch_ = false;
  backend::ExpertBatch begin(int64_t layer, const backend::Tensor &ids, const int32_t *host_ids, std::span<const int32_t> only,
                             bool staged);
};

}  // namespace ep::experts
