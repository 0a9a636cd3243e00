#include "engine/engine.hpp"

#include "backend/cpu_backend.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "engine/pack_resolution.hpp"
#include "experts/packed_experts.hpp"
#include "experts/sharded_experts.hpp"
#include "store/stats.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#ifdef EP_HAVE_CUDA
#include "backend/cuda/cuda_backend.hpp"
#include "gpu/device.hpp"
#endif

namespace ep::engine {

int cuda_device_count(std::string *why) {
#ifdef EP_HAVE_CUDA
  return gpu::device_count(why);
#else
  if (why) *why = "this build has no CUDA backend (EP_WITH_CUDA=OFF)";
  return 0;
#endif
}

namespace {

/// True for CUDA (see DeviceChoice); @p arch is the source's architecture.
bool choose_cuda(DeviceChoice choice, int32_t index, const std::string &arch, const std::string &source) {
  if (choice == DeviceChoice::cpu) return false;
  const bool arch_cuda = model::architecture_runs_on(arch, backend::Device::cuda);
  if (choice == DeviceChoice::cuda && !arch_cuda)
    fail(Status::unsupported, "EP_DEVICE_CUDA: {} is a {} model, which has no CUDA implementation (use EP_DEVICE_CPU or EP_DEVICE_AUTO)",
         source, arch);
  std::string why;
  const int count = cuda_device_count(&why);
  if (choice == DeviceChoice::automatic) {
    if (count > index && !arch_cuda)
      log::info("{} is a {} model, which has no CUDA implementation: using the CPU, not CUDA device {}", source, arch, index);
    return count > index && arch_cuda;
  }
  if (count == 0) fail(Status::no_device, "EP_DEVICE_CUDA: no CUDA device ({})", why);
  if (index >= count) fail(Status::no_device, "EP_DEVICE_CUDA: device {} of {}", index, count);
  return true;
}

/// "1.5 MiB" for messages.
std::string mib(uint64_t bytes) { return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / 1048576.0); }

/// ModelOptions::kv_budget_bytes of 0 on the engine's device, after the weights and the expert
/// cache took their memory.
uint64_t automatic_kv_budget(int32_t cuda_device) {
#ifdef EP_HAVE_CUDA
  if (cuda_device >= 0) {
    const uint64_t free = gpu::free_memory_bytes(cuda_device);
    return free > kKvActivationReserveBytes ? free - kKvActivationReserveBytes : 0;
  }
#else
  (void)cuda_device;
#endif
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) fail_errno(errno, "sysconf(_SC_PHYS_PAGES) for the automatic KV budget");
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) / 4;
}

/// What a cache of every expert (cache_budget_bytes 0) on CUDA leaves free for the KV budget,
/// beside its own reserve: an explicit budget; when the KV budget is automatic too, a share of the
/// GPU memory free once the dense weights are in (kKvAutomaticShare). Without that share, a model
/// whose experts do not fit would leave the automatic KV budget the cache's reserve less
/// kKvActivationReserveBytes, about 1 GiB: a few hundred tokens of Kimi-K3.
uint64_t kv_reserve_beside_cache(const ModelOptions &options, int32_t cuda_device) {
  if (options.kv_budget_bytes) return options.kv_budget_bytes;
#ifdef EP_HAVE_CUDA
  if (cuda_device >= 0 && options.store.cache_budget_bytes == 0) return gpu::free_memory_bytes(cuda_device) / kKvAutomaticShare;
#else
  (void)cuda_device;
#endif
  return 0;
}

/// Resolves the KV budget once the model's memory is taken, and says what it is and why.
void set_kv_budget(Engine &e, uint64_t requested, uint64_t &budget) {
  budget = requested ? requested : automatic_kv_budget(e.device_index());
  const uint64_t one = e.session_bytes(1);
  log::info("{}: KV budget {} ({}; a session takes {} at 1 token, {} at {} tokens){}", e.source_path(), mib(budget),
            requested ? "kv_budget_bytes"
            : e.device() == backend::Device::cuda ? "automatic: the free GPU memory less 1 GiB for activations"
                                                  : "automatic: a quarter of the physical memory",
            mib(one), mib(e.session_bytes(e.context_length() > 0 ? e.context_length() : 4096)),
            e.context_length() > 0 ? e.context_length() : 4096,
            e.context_length() > 0 ? "" : "; the model states no context length: only the budget limits a session");
  if (budget < one)
    fail(Status::budget, "{}: the KV budget of {} bytes ({}) cannot hold one session of one token ({} bytes){}", e.source_path(),
         budget, mib(budget), one, requested ? "" : ": the weights and the expert cache left too little memory (lower cache_budget_bytes)");
}

}  // namespace

std::vector<DeviceEntry> parse_devices(const std::string &devices) {
  std::vector<DeviceEntry> out;
  size_t begin = 0;
  while (true) {
    const size_t end = std::min(devices.find(',', begin), devices.size());
    const std::string entry = devices.substr(begin, end - begin);
    DeviceEntry d;
    if (entry == "cpu") {
      d.cuda = false;
    } else if (entry.rfind("cuda:", 0) == 0 && entry.size() > 5 && entry.size() <= 5 + 9 &&
               entry.find_first_not_of("0123456789", 5) == std::string::npos) {
      d.cuda = true;
      d.index = static_cast<int32_t>(std::stol(entry.substr(5)));
    } else {
      fail(Status::invalid_argument, "devices '{}': entry '{}' (expected cpu or cuda:N, comma-separated)", devices, entry);
    }
    if (!out.empty() && out.front().cuda != d.cuda)
      fail(Status::invalid_argument, "devices '{}': {} and {} (the devices of a model are of one kind)", devices,
           out.front().cuda ? "cuda" : "cpu", d.cuda ? "cuda" : "cpu");
    out.push_back(d);
    if (out.size() > kMaxDevices) fail(Status::invalid_argument, "devices '{}': more than {} devices", devices, kMaxDevices);
    if (end == devices.size()) break;
    begin = end + 1;
  }
  return out;
}

void validate_model_options(const ModelOptions &options) {
  if (options.device_index < 0) fail(Status::invalid_argument, "device_index {} (expected 0 or more)", options.device_index);
  if (!options.devices.empty()) {
    parse_devices(options.devices);
    const ModelOptions defaults;
    if (options.device != defaults.device || options.device_index != defaults.device_index)
      fail(Status::invalid_argument, "devices '{}' and device {} / device_index {} both given (give the device list alone)",
           options.devices, options.device == DeviceChoice::cpu ? "cpu" : options.device == DeviceChoice::cuda ? "cuda" : "auto",
           options.device_index);
  }
  if (options.cpu_threads < 0 || options.cpu_threads > 4096)
    fail(Status::invalid_argument, "cpu_threads {} (expected 0 .. 4096)", options.cpu_threads);
  if (options.store.direct_io < -1 || options.store.direct_io > 1)
    fail(Status::invalid_argument, "direct_io {} (expected -1, 0 or 1)", options.store.direct_io);
  if (options.no_pack && options.resident_experts)
    fail(Status::invalid_argument, "no_pack (experts read from the source through the cache) and resident_experts (every "
         "expert in memory) exclude each other");
}

std::unique_ptr<Engine> Engine::open(const std::string &path, const ModelOptions &options) {
  validate_model_options(options);
  PackPlacement place;
  place.pack_dir = options.pack_dir;
  place.build = options.pack_build;
  place.progress = options.progress;
  place.source_index = options.no_pack;
  // The architecture decides the device and the model class; it is read before a pack is built
  // (a pack given explicitly is checked first: its manifest names the source).
  const bool given_pack = is_pack_file(path);
  if (options.resident_experts && given_pack)
    fail(Status::invalid_argument, "{} is an Expert Pack; resident experts need the source", path);
  if (options.no_pack && given_pack)
    fail(Status::invalid_argument, "{} is an Expert Pack (or a source index); no_pack reads the experts from the source: give "
         "the source", path);
  ResolvedModel rm;
  if (given_pack) rm = resolve_model(path, place);
  const std::string source = given_pack ? rm.source : path;
  const std::string arch = model::source_architecture(source);
  if (!model::architecture_known(arch))
    fail(Status::unsupported, "{}: architecture '{}' is not supported (supported: {})", source, arch, model::known_architectures());
  // The devices: the list, or the one device of device / device_index (a list of one).
  std::vector<DeviceEntry> devices;
  if (!options.devices.empty()) {
    devices = parse_devices(options.devices);
    int32_t top = 0;
    for (const DeviceEntry &d : devices) top = std::max(top, d.index);
    choose_cuda(devices.front().cuda ? DeviceChoice::cuda : DeviceChoice::cpu, top, arch, source);
  } else {
    devices.push_back({choose_cuda(options.device, options.device_index, arch, source), options.device_index});
  }
  std::unique_ptr<Engine> e(new Engine());
  std::vector<backend::Backend *> backends;
  std::vector<void *> cuda_streams;
  for (const DeviceEntry &d : devices) {
    std::unique_ptr<backend::Backend> be;
    void *stream = nullptr;
#ifdef EP_HAVE_CUDA
    if (d.cuda) {
      auto cuda = std::make_unique<backend::cuda::CudaBackend>(d.index);
      stream = cuda->stream();
      be = std::move(cuda);
    }
#else
    (void)d;  // without CUDA every device is the CPU
#endif
    if (!be) be = std::make_unique<backend::CpuBackend>(static_cast<uint32_t>(options.cpu_threads));
    backends.push_back(be.get());
    cuda_streams.push_back(stream);
    if (!e->backend_) e->backend_ = std::move(be);
    else e->peers_.push_back(std::move(be));
  }
  if (devices.front().cuda) {
    e->device_index_ = devices.front().index;
#ifdef EP_HAVE_CUDA
    // Peer copies between distinct GPUs go directly where the hardware allows it.
    for (const DeviceEntry &a : devices)
      for (const DeviceEntry &b : devices)
        if (a.index != b.index) gpu::enable_peer_access(a.index, b.index);
#endif
  }
  e->backend_->make_current();
  if (options.resident_experts) {
    model::CausalLmOptions lo;
    lo.expert_devices = backends;
    e->lm_ = model::open_causal_lm(source, *e->backend_, lo);
    e->source_path_ = source;
    set_kv_budget(*e, options.kv_budget_bytes, e->kv_budget_bytes_);
    return e;
  }
  if (!given_pack) rm = resolve_model(path, place);
  model::CausalLmOptions lo;
  lo.resident_experts = false;
  e->lm_ = model::open_causal_lm(rm.source, *e->backend_, lo);
  // One store per device, each with its own expert cache (the budget is per device) and an equal
  // share of the host tier; a device's store serves the experts it owns (experts::expert_owner).
  std::vector<experts::ShardedExperts::Shard> shards;
  for (size_t i = backends.size(); i-- > 0;) {
    backends[i]->make_current();
    experts::PackedExpertsOptions po;
    po.store = options.store;
    po.store.host_cache_bytes = options.store.host_cache_bytes / backends.size();
    po.cuda_device = devices[i].cuda ? devices[i].index : -1;
    po.cuda_stream = cuda_streams[i];
    po.first_layer = e->lm_->first_expert_layer();
    // The first device holds the sessions' state: its cache leaves the KV budget room.
    if (i == 0) po.cuda_reserve_bytes += kv_reserve_beside_cache(options, po.cuda_device);
    auto packed = std::make_unique<experts::PackedExperts>(rm.pack, e->lm_->expert_shapes(), e->lm_->info().n_experts_used, po);
    // On one GPU whose cache holds every expert, they are read once now and each step resolves
    // its picks on the device (no host round trip per MoE layer); the CPU backend reads host picks
    // either way, and on several devices the host decides which device computes each pick. An
    // expert that cannot be read or fails its check keeps the model on the store path, where it
    // fails only the steps that pick it (as without this load).
    if (devices.size() == 1 && devices[i].cuda) {
      try {
        packed->load_every_expert(*backends[i]);
      } catch (const Error &err) {
        if (err.status() != Status::io && err.status() != Status::corrupt) throw;
        log::warn("{}: not every expert could be read at open ({}); experts are read through the cache as steps pick them",
                  rm.pack, err.what());
      }
    }
    e->packed_.insert(e->packed_.begin(), packed.get());
    shards.insert(shards.begin(), experts::ShardedExperts::Shard{backends[i], std::move(packed)});
  }
  e->backend_->make_current();
  auto sharded = std::make_unique<experts::ShardedExperts>(std::move(shards));
  e->experts_ = sharded.get();
  e->lm_->set_experts(std::move(sharded));
  e->pack_path_ = rm.pack;
  e->source_path_ = rm.source;
  set_kv_budget(*e, options.kv_budget_bytes, e->kv_budget_bytes_);
  return e;
}

uint64_t Engine::session_bytes(int64_t tokens) const {
  return lm_->state_bytes(tokens) + static_cast<uint64_t>(lm_->info().vocab) * sizeof(float);
}

uint64_t Engine::kv_in_use_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return kv_in_use_bytes_;
}

void Engine::kv_check(uint64_t release_bytes, uint64_t take_bytes, const std::string &what) const {
  if (take_bytes <= release_bytes) return;
  const uint64_t others = kv_in_use_bytes_ - release_bytes;
  if (others + take_bytes <= kv_budget_bytes_) return;
  fail(Status::budget,
       "{} needs {} bytes ({}) of session state; the KV budget is {} bytes ({}) and {} bytes ({}) of it are held by {} "
       "sessions{}: close sessions or raise kv_budget_bytes (--kv-mib)",
       what, take_bytes, mib(take_bytes), kv_budget_bytes_, mib(kv_budget_bytes_), kv_in_use_bytes_, mib(kv_in_use_bytes_),
       kv_sessions_, release_bytes ? fmt::format(" ({} of them by the sessions this call grows)", release_bytes) : "");
}

void Engine::kv_apply(uint64_t release_bytes, uint64_t take_bytes, int64_t sessions) {
  kv_in_use_bytes_ = kv_in_use_bytes_ - release_bytes + take_bytes;
  kv_sessions_ += sessions;
}

Engine::~Engine() {
  // The model (and the experts on every device) first; each other device's backend is freed with
  // its device current.
  lm_.reset();
  try {
    for (auto &peer : peers_) {
      peer->make_current();
      peer.reset();
    }
    if (backend_) backend_->make_current();
  } catch (const std::exception &) {
    // A failing device at close: nothing left to report it to.
  }
}

store::StoreStats Engine::store_stats() const {
  if (packed_.empty()) return {};
  std::lock_guard<std::mutex> lock(mutex_);
  store::StoreStats sum = packed_.front()->stats();
  for (size_t i = 1; i < packed_.size(); ++i) store::add_stats(sum, packed_[i]->stats());
  return sum;
}

uint64_t Engine::expert_read_bytes() const { return packed_.empty() ? 0 : store_stats().pack_read_bytes; }

void Engine::set_route_override(std::shared_ptr<experts::RouteOverride> route) {
  if (!experts_)
    fail(Status::invalid_argument, "{}: replayed expert picks need the experts served from a pack; this model holds them in memory",
         source_path_);
  if (route && experts_->wants_hints())
    fail(Status::invalid_argument,
         "{}: replayed expert picks and prefetch: the prefetch hints predict the router's picks, not the replayed ones (open "
         "without prefetch)",
         source_path_);
  std::lock_guard<std::mutex> lock(mutex_);
  experts_->set_route_override(std::move(route));
}

}  // namespace ep::engine
