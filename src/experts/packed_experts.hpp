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
//
// When the slots hold every expert of the model, load_every_expert() reads them all once (the
// engine calls it on CUDA at open): nothing can be evicted after that, so a step resolves its
// picks on the device from per-layer tables of slot addresses, as ResidentExperts does — no host
// round trip per layer, no store call. The store's statistics then stop at the load's reads.
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
  bool needs_host_ids() const override { return every_.empty(); }
  backend::ExpertBatch acquire(int64_t layer, const backend::Tensor &ids, const int32_t *host_ids,
                               std::span<const int32_t> only) override;
  void release(int64_t layer) override;
  int64_t max_unique() const override;
  bool stages_reads() const override { return overlap_reads_ && every_.empty(); }
  backend::ExpertBatch acquire_staged(int64_t layer, const backend::Tensor &ids, const int32_t *host_ids) override;
  backend::ExpertBatch acquire_staged_only(int64_t layer, const backend::Tensor &ids, const int32_t *host_ids,
                                           std::span<const int32_t> only) override;
  bool next_staged(int64_t layer, backend::ExpertBatch &batch) override;
  bool wants_hints() const override { return prefetch_ && every_.empty(); }
  void hint(int64_t layer, std::span<const int32_t> ids) override;

  /// When the slots hold every expert of every layer: reads each one into its slot (layer by
  /// layer, as many per acquire as the store takes), keeps their addresses in backend memory per
  /// layer and returns true; from then on acquire() builds its batch from the router's ids on
  /// @p be (which must outlive this provider), needs_host_ids() and stages_reads() are false and
  /// the store is not called again. False, with nothing changed, when the slots are too few.
  /// A read error or a corrupt expert is thrown (naming the pack, layer and expert); the
  /// provider then stays as it was, serving through the store (its cache keeps what was read).
  bool load_every_expert(backend::Backend &be);
  /// True after a load_every_expert() that returned true.
  bool holds_every_expert() const { return !every_.empty(); }

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
  /// After load_every_expert(): per layer, the slot address of every expert.
  std::vector<FixedExperts> every_;
  backend::Backend *every_be_ = nullptr;
  std::vector<const void *> every_pairs_;  // per pair, with host ids
  backend::DeviceBuffer every_table_;      // the gathered role table
  backend::ExpertBatch every_batch(int64_t layer, const backend::Tensor &ids, const int32_t *host_ids,
                                   std::span<const int32_t> only);
  bool overlap_reads_ = true, prefetch_ = false;
  backend::ExpertBatch begin(int64_t layer, const backend::Tensor &ids, const int32_t *host_ids, std::span<const int32_t> only,
                             bool staged);
};

}  // namespace ep::experts
