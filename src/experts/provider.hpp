// The expert-batch contract: one MoE layer's picks resolved to the slots the backend's moe op
// reads. Per MoE layer the router writes expert ids on the backend; a provider resolves them to
// a backend::ExpertBatch — the table of slot addresses — and releases it after the op:
//  - ResidentExperts (resident_experts.hpp): every expert's bytes read from the source into
//    backend memory once, at load; its batches are built on the device from the router's ids
//    (no host round trip) unless the backend's moe op reads host picks.
//  - PackedExperts (packed_experts.hpp): served by the ExpertStore (src/store) from an Expert
//    Pack or a source index through a bounded slot cache; the router's ids come to the host
//    once, the store resolves them once.
// The runner (runner.hpp) is the one caller of a provider in a forward pass.
#pragma once

#include "backend/backend.hpp"
#include "backend/device_buffer.hpp"

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace ep::experts {

class RouteOverride;
class ShardedExperts;

/// One role (gate, up or down) of a layer's experts as a model's source stacks them: n_experts
/// matrices of ne1 rows of ne0 values of one ggml type.
struct StackedRole {
  backend::GgmlType type = backend::GgmlType::f32;
  int64_t ne0 = 0, ne1 = 0, n_experts = 0;
  std::string origin;  ///< "file: tensor name", for messages
  /// The bytes of expert e (one ne0 × ne1 slab); empty when the source cannot read single experts.
  std::function<std::vector<uint8_t>(int64_t e)> read_expert;
};

/// What the model expects of each layer's experts (from the source's stacked tensors): types and
/// shapes of gate / up / down; offsets are not used.
struct ExpertShape {
  backend::SlotWeight gate, up, down;
};
/// The shape of a layer's experts from its stacked gate / up / down roles; Status::unsupported
/// (naming the tensor) when a type is not one the backends multiply.
ExpertShape expert_shape_of(const StackedRole &gate, const StackedRole &up, const StackedRole &down);

/// One layer's experts at fixed addresses (every expert in memory, none ever evicted), and the
/// batch of a step's picks over them: per pair, its expert's address (with host ids) and, unless
/// the backend's moe op reads host picks or only some experts are asked for, the role table
/// gathered on the backend from the router's ids (no host round trip). Used by ResidentExperts
/// and by PackedExperts once it holds every expert.
struct FixedExperts {
  /// Per expert, its object's address (host copy); null for an expert another device holds (a
  /// model on several devices: sharded_experts.hpp), which a batch with host ids refuses.
  std::vector<const void *> slots;
  backend::DeviceBuffer slots_dev;  ///< the same addresses in backend memory
  /// Uploads @p addresses (one per expert) as slots and slots_dev on @p be.
  void set(backend::Backend &be, std::vector<const void *> addresses);
};
/// The batch of @p ids (i32 [k, T] on the backend; @p host_ids the same on the host, or null)
/// over @p experts of MoE layer @p layer (named in errors), with acquire()'s meaning of @p only.
/// @p pair_slots and @p role_table are the caller's buffers, reused from call to call; the
/// batch points into them. Status::corrupt for a host id outside the layer's experts,
/// Status::internal for one whose expert is not held here.
backend::ExpertBatch fixed_experts_batch(backend::Backend &be, int64_t layer, const FixedExperts &experts,
                                         const backend::SlotLayout &layout, const backend::Tensor &ids,
                                         const int32_t *host_ids, std::span<const int32_t> only,
                                         std::vector<const void *> &pair_slots, backend::DeviceBuffer &role_table);

/// Supplies routed-expert batches per layer (see the file comment).
class ExpertProvider {
 public:
  virtual ~ExpertProvider() = default;
  /// Where gate / up / down sit inside each expert object of layer @p layer.
  virtual const backend::SlotLayout &layout(int64_t layer) const = 0;
  /// True when acquire() needs the picks on the host (a cache decides hits and misses there).
  virtual bool needs_host_ids() const = 0;
  /// Makes the experts of layer @p layer's picks resident and returns their batch, valid until
  /// release(). @p ids: i32 [k, T] in backend memory (the router's output); @p host_ids: the
  /// same k·T ids in host memory, or null when neither needs_host_ids() nor the backend's moe op
  /// asks for them. With @p only non-empty (distinct experts, host_ids given), the batch covers
  /// only the pairs whose expert is listed (an expert-major pass: Backend::moe_pairs); at most
  /// max_unique() distinct experts per call either way.
  virtual backend::ExpertBatch acquire(int64_t layer, const backend::Tensor &ids, const int32_t *host_ids,
                                       std::span<const int32_t> only) = 0;
  /// Ends the last acquire() of @p layer (after the ops that read its batch were queued).
  virtual void release(int64_t layer) = 0;
  /// The most distinct expert ids one acquire() may cover.
  virtual int64_t max_unique() const { return std::numeric_limits<int64_t>::max(); }

  /// True when acquire_staged() may return before every expert of the picks is resident (a cache
  /// whose misses are read from a disk): the MoE then computes the resident experts' rows while
  /// the others are read (the runner's staged strategy).
  virtual bool stages_reads() const { return false; }
  /// acquire() of every pick (host_ids given), returning once the misses' reads are submitted:
  /// the batch covers the pairs whose expert is resident (pair_slots null for the others; its
  /// role_table only when it covers every pair). next_staged() hands out the rest.
  virtual backend::ExpertBatch acquire_staged(int64_t layer, const backend::Tensor &ids, const int32_t *host_ids) {
    return acquire(layer, ids, host_ids, {});
  }
  /// acquire_staged() of the pairs whose expert is in @p only (distinct experts, at most
  /// max_unique(); a device's share of the picks, sharded_experts.hpp): returns once their misses'
  /// reads are submitted, with the pairs of the resident ones; next_staged() hands out the rest
  /// (its batches carry no wave table). The default: acquire() of them, complete.
  virtual backend::ExpertBatch acquire_staged_only(int64_t layer, const backend::Tensor &ids, const int32_t *host_ids,
                                                   std::span<const int32_t> only) {
    return acquire(layer, ids, host_ids, only);
  }
  /// Waits until more experts of the last acquire_staged() (or acquire_staged_only()) of @p layer are resident and sets
  /// @p batch to the pairs they cover (pair_slots null for every other pair); false once every
  /// pair was handed out. Throws the failed read's error (EP_ERR_IO, EP_ERR_CORRUPT) once the
  /// acquisition's reads all landed; release() must follow either way.
  virtual bool next_staged(int64_t layer, backend::ExpertBatch &batch) {
    (void)layer;
    (void)batch;
    return false;
  }
  /// True when the provider uses hint()s (prefetch): the runner then asks the model for a later
  /// layer's predicted picks (MoeLayer::route with next = true).
  virtual bool wants_hints() const { return false; }
  /// Experts of MoE layer @p layer a later acquire() will likely ask for (ids outside the range
  /// are ignored): the provider may start loading them. Never changes a result.
  virtual void hint(int64_t layer, std::span<const int32_t> ids) {
    (void)layer;
    (void)ids;
  }

  /// Backend memory for the per-pair rows of a staged MoE (f32 [d, pairs]),
  /// reused layer after layer (grown when a step needs more).
  float *staged_rows(backend::Backend &be, uint64_t bytes) {
    if (staged_rows_.bytes() < bytes) staged_rows_ = backend::DeviceBuffer(be, bytes);
    return static_cast<float *>(staged_rows_.get());
  }

  /// The experts spread over several devices (sharded_experts.hpp), when this provider is that;
  /// null for a provider of one backend's experts.
  virtual ShardedExperts *sharded() { return nullptr; }

  /// Benchmark-only picks that replace the router's (experts/route_override.hpp); null: none.
  void set_route_override(std::shared_ptr<RouteOverride> route) { route_override_ = std::move(route); }
  RouteOverride *route_override() const { return route_override_.get(); }

 private:
  backend::DeviceBuffer staged_rows_;
  std::shared_ptr<RouteOverride> route_override_;
};

}  // namespace ep::experts
