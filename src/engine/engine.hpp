// The engine: what the C API's ep_model is. It composes a model from a path — the backend
// (CPU or a CUDA device), the model class of the source's architecture, and where its routed
// experts come from (resident in backend memory, or an Expert Pack found, built or given,
// served through a store sized to the budget) — and owns the one lock that orders forward
// passes and sampling of every session on it (engine/session.hpp).
#pragma once

#include "backend/backend.hpp"
#include "model/causal_lm.hpp"
#include "experts/route_override.hpp"
#include "store/stats.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

namespace ep::experts {
class PackedExperts;
}  // namespace ep::experts

namespace ep::engine {

/// Where a model runs.
enum class DeviceChoice : uint8_t {
  automatic = 0,  ///< the CUDA device when it exists and the architecture runs there, else the CPU (logged)
  cpu = 1,
  cuda = 2,  ///< Status::no_device without one, Status::unsupported for a CPU-only architecture
};

struct EngineOptions {
  DeviceChoice device = DeviceChoice::automatic;
  int32_t device_index = 0;      ///< CUDA device ordinal
  uint32_t cpu_threads = 0;      ///< CPU backend threads; 0 = EP_CPU_THREADS, else the hardware concurrency
  bool resident_experts = false; ///< every routed expert read from the source at open (no pack)
  uint64_t cache_bytes = 0;      ///< expert cache budget; 0 = every expert (CPU: at most half the RAM; CUDA: free VRAM − 2 GiB)
  uint32_t staging_slots = 0;    ///< 0 = the store's default
  uint32_t queue_depth = 0;      ///< 0 = the reader's default
  uint32_t read_splits = 0;      ///< 0 = the reader's default
  int32_t direct_io = -1;        ///< 1 O_DIRECT, 0 buffered, -1 automatic
  uint64_t host_cache_bytes = 0; ///< host-RAM tier below the expert cache (0 = none)
  bool overlap_reads = true;     ///< compute with the cached experts while a layer's misses are read
  bool prefetch = false;         ///< predict the next layer's experts and read them into spare I/O capacity
  std::string cache_policy = "decay";  ///< lru, sglang-lfu, decay, decay-bypass
  std::string pack_dir;          ///< packs built for sources; "" = default_pack_dir()
  bool pack_build = true;        ///< build a missing pack, rebuild a stale one
  /// No pack: the routed experts are read from the source through a source index (see
  /// pack_resolution.hpp); not with resident_experts, nor with a pack as the path.
  bool no_pack = false;
  std::function<void(uint64_t done_bytes, uint64_t total_bytes)> progress;  ///< while a pack is built
};

class Engine {
 public:
  /// Opens @p path: a GGUF (first shard of a set), a safetensors checkpoint, or an Expert Pack
  /// (its manifest names the source). Fails with the status and a message naming the file:
  /// Status::unsupported for an unknown architecture, Status::no_device, Status::budget, the
  /// pack resolver's and the model loader's errors.
  static std::unique_ptr<Engine> open(const std::string &path, const EngineOptions &options);
  ~Engine();
  Engine(const Engine &) = delete;
  Engine &operator=(const Engine &) = delete;

  const model::CausalLmInfo &info() const { return lm_->info(); }
  /// Bytes of weights held in backend memory.
  uint64_t weight_bytes() const { return lm_->weight_bytes(); }
  backend::Device device() const { return backend_->device(); }
  /// The CUDA device's ordinal; -1 on the CPU.
  int32_t device_index() const { return device_index_; }
  /// The file the dense weights (and the tokenizer) come from.
  const std::string &source_path() const { return source_path_; }
  /// The Expert Pack the routed experts are served from; "" with resident experts.
  const std::string &pack_path() const { return pack_path_; }
  /// The expert store's statistics (all zero with resident experts).
  store::StoreStats store_stats() const;
  /// Routed-expert bytes read from the pack so far (0 with resident experts).
  uint64_t expert_read_bytes() const;
  /// Benchmark-only: every MoE layer's picks come from @p route instead of the router from the
  /// next forward pass on (experts/route_override.hpp; engine/trace_replay.hpp replays a trace);
  /// null restores the router. Status::invalid_argument with resident experts (the benchmark
  /// measures the streamed path) and with prefetch (its hints predict the router's picks).
  void set_route_override(std::shared_ptr<experts::RouteOverride> route);

  /// What sessions run on; every call on them holds mutex().
  model::CausalLm &lm() { return *lm_; }
  backend::Backend &backend() { return *backend_; }
  std::mutex &mutex() const { return mutex_; }

 private:
  Engine() = default;
  std::unique_ptr<backend::Backend> backend_;
  std::unique_ptr<model::CausalLm> lm_;
  experts::PackedExperts *packed_ = nullptr;  // owned by lm_; null with resident experts
  std::string pack_path_, source_path_;
  int32_t device_index_ = -1;
  mutable std::mutex mutex_;
};

/// CUDA devices this process can use; 0 without CUDA support or a driver, with the reason in
/// @p why.
int cuda_device_count(std::string *why);

}  // namespace ep::engine
