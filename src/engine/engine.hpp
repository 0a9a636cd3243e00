// The engine: what the C API's ep_model is. It composes a model from a path — the backend
// (CPU or a CUDA device), the model class of the source's architecture, and where its routed
// experts come from (resident in backend memory, or an Expert Pack found, built or given,
// served through a store sized to the budget) — and owns the one lock that orders forward
// passes and sampling of every session on it (engine/session.hpp).
#pragma once

#include "backend/backend.hpp"
#include "engine/model_options.hpp"
#include "model/causal_lm.hpp"
#include "experts/route_override.hpp"
#include "store/stats.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace ep::experts {
class PackedExperts;
class ShardedExperts;
}  // namespace ep::experts

namespace ep::engine {

class Engine {
 public:
  /// Opens @p path: a GGUF (first shard of a set), a safetensors checkpoint, or an Expert Pack
  /// (its manifest names the source). Validates @p options first (validate_model_options).
  /// Fails with the status and a message naming the file: Status::unsupported for an unknown architecture, Status::no_device, Status::budget, the
  /// pack resolver's and the model loader's errors.
  static std::unique_ptr<Engine> open(const std::string &path, const ModelOptions &options);
  ~Engine();
  Engine(const Engine &) = delete;
  Engine &operator=(const Engine &) = delete;

  const model::CausalLmInfo &info() const { return lm_->info(); }
  /// Bytes of weights held in backend memory.
  uint64_t weight_bytes() const { return lm_->weight_bytes(); }
  backend::Device device() const { return backend_->device(); }
  /// The CUDA device's ordinal (the first device's with several); -1 on the CPU.
  int32_t device_index() const { return device_index_; }
  /// The devices the model runs on (ModelOptions::devices; 1 without a list).
  int32_t n_devices() const { return 1 + static_cast<int32_t>(peers_.size()); }
  /// The file the dense weights (and the tokenizer) come from.
  const std::string &source_path() const { return source_path_; }
  /// The Expert Pack the routed experts are served from; "" with resident experts.
  const std::string &pack_path() const { return pack_path_; }
  /// The expert store's statistics, summed over the devices' stores (all zero with resident experts).
  store::StoreStats store_stats() const;
  /// Routed-expert bytes read from the pack so far (0 with resident experts).
  uint64_t expert_read_bytes() const;
  /// Benchmark-only: every MoE layer's picks come from @p route instead of the router from the
  /// next forward pass on (experts/route_override.hpp; engine/trace_replay.hpp replays a trace);
  /// null restores the router. Status::invalid_argument with resident experts (the benchmark
  /// measures the streamed path) and with prefetch (its hints predict the router's picks).
  void set_route_override(std::shared_ptr<experts::RouteOverride> route);

  /// Positions one session may hold (the model's context length); 0 when the source states none
  /// (then only the KV budget limits a session).
  int64_t context_length() const { return lm_->info().context_length; }
  /// Bytes all sessions' decode state may take together (ModelOptions::kv_budget_bytes, or the
  /// automatic budget it resolved to at open).
  uint64_t kv_budget_bytes() const { return kv_budget_bytes_; }
  /// Bytes one session holding @p tokens tokens counts against the budget: the model's state at
  /// that length (CausalLm::state_bytes) and the session's last row of logits.
  uint64_t session_bytes(int64_t tokens) const;
  /// Bytes the open sessions (forks and kept snapshots included) count now.
  uint64_t kv_in_use_bytes() const;
  /// With mutex() held: throws Status::budget, naming the budget, what is in use and @p what,
  /// unless sessions counting @p release_bytes now may count @p take_bytes instead.
  void kv_check(uint64_t release_bytes, uint64_t take_bytes, const std::string &what) const;
  /// With mutex() held: sessions counting @p release_bytes now count @p take_bytes; @p sessions
  /// more (or fewer) are open.
  void kv_apply(uint64_t release_bytes, uint64_t take_bytes, int64_t sessions = 0);

  /// What sessions run on; every call on them holds mutex().
  model::CausalLm &lm() { return *lm_; }
  backend::Backend &backend() { return *backend_; }
  std::mutex &mutex() const { return mutex_; }

 private:
  Engine() = default;
  std::unique_ptr<backend::Backend> backend_;            // the first device: the dense weights, the attention
  std::vector<std::unique_ptr<backend::Backend>> peers_;  // the other devices (their experts)
  std::unique_ptr<model::CausalLm> lm_;
  experts::ShardedExperts *experts_ = nullptr;   // owned by lm_; null with resident experts
  std::vector<experts::PackedExperts *> packed_;  // per device, owned by experts_; empty with resident experts
  std::string pack_path_, source_path_;
  int32_t device_index_ = -1;
  uint64_t kv_budget_bytes_ = 0;
  uint64_t kv_in_use_bytes_ = 0;  // guarded by mutex_
  int64_t kv_sessions_ = 0;       // guarded by mutex_
  mutable std::mutex mutex_;
};

/// CUDA devices this process can use; 0 without CUDA support or a driver, with the reason in
/// @p why.
int cuda_device_count(std::string *why);

}  // namespace ep::engine
