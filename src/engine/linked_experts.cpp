#include "engine/linked_experts.hpp"

#include "core/error.hpp"
#include "engine/engine.hpp"
#include "format/pack_file.hpp"
#include "io/file.hpp"
#include "store/device.hpp"
#include "store/pack_object_map.hpp"
#ifdef EP_HAVE_CUDA
#include "gpu/stream_order.hpp"
#endif


#include <algorithm>
#include <optional>

namespace ep::engine {

#ifdef EP_HAVE_CUDA
struct LinkedExperts::StreamOrders {
  explicit StreamOrders(int device) : acquired(device), released(device) {}
  gpu::StreamOrder acquired;  ///< the caller's stream after the store's (an acquire's copies)
  gpu::StreamOrder released;  ///< the store's stream after the caller's (a release's readers)
};
#else
struct LinkedExperts::StreamOrders {};
#endif

namespace {

/// The layout of layer @p l: every expert's roles must agree (one layout per layer: the host's
/// kernels take one set of offsets, types and shapes per layer), each a 2-D matrix of whole rows.
LayerLayout layer_layout(const format::PackFile &pf, uint32_t l) {
  const format::Role roles[3] = {format::Role::gate, format::Role::up, format::Role::down};
  LayerLayout lay;
  lay.num_experts = pf.num_experts();
  for (uint32_t e = 0; e < pf.num_experts(); ++e) {
    for (int r = 0; r < 3; ++r) {
      const format::RoleEntry &re = pf.entry(l, e, roles[r]);
      RoleLayout w;
      w.type = re.type;
      w.ne0 = re.ne[0];
      w.ne1 = re.ne[1];
      w.offset = re.offset_in_object;
      if (re.ne[2] != 1 || re.ne[3] != 1)
        fail(Status::unsupported, "{}: layer {} expert {} {}: ne [{}, {}, {}, {}], expected a matrix", pf.path(), l, e,
             format::role_name(roles[r]), re.ne[0], re.ne[1], re.ne[2], re.ne[3]);
      w.row_bytes = format::ggml_row_bytes(w.type, w.ne0, pf.path());
      w.bytes = w.row_bytes * w.ne1;
      if (re.nbytes != w.bytes)
        fail(Status::format, "{}: layer {} expert {} {}: {} bytes, expected {} ({} rows of {} bytes)", pf.path(), l, e,
             format::role_name(roles[r]), re.nbytes, w.bytes, w.ne1, w.row_bytes);
      RoleLayout &have = lay.roles[static_cast<size_t>(r)];
      if (e == 0) {
        have = w;
      } else if (w.offset != have.offset || w.type != have.type || w.ne0 != have.ne0 || w.ne1 != have.ne1) {
        fail(Status::unsupported,
             "{}: layer {}: expert {} has {} of type {} ne [{}, {}] at offset {}, expert 0 type {} ne [{}, {}] at offset {} "
             "(the experts of a layer must be laid out alike)",
             pf.path(), l, e, format::role_name(roles[r]), static_cast<uint32_t>(w.type), w.ne0, w.ne1, w.offset,
             static_cast<uint32_t>(have.type), have.ne0, have.ne1, have.offset);
      }
      lay.object_bytes = std::max(lay.object_bytes, w.offset + w.bytes);
    }
  }
  return lay;
}

bool use_cuda(DeviceChoice choice, int32_t index) {
  if (choice == DeviceChoice::cpu) return false;
  std::string why;
  const int count = cuda_device_count(&why);
  if (choice == DeviceChoice::automatic) return count > index;
  if (count == 0) fail(Status::no_device, "EP_DEVICE_CUDA: no CUDA device ({})", why);
  if (index >= count) fail(Status::no_device, "EP_DEVICE_CUDA: device {} of {}", index, count);
  return true;
}

}  // namespace

std::unique_ptr<LinkedExperts> LinkedExperts::open(const std::string &path, const LinkedExpertsOptions &options) {
  if (options.device_index < 0) fail(Status::invalid_argument, "device_index {} (expected >= 0)", options.device_index);
  if (options.store.direct_io < -1 || options.store.direct_io > 1)
    fail(Status::invalid_argument, "direct_io {} (expected -1, 0 or 1)", options.store.direct_io);
  if (options.stats_every && options.stats_path.empty())
    fail(Status::invalid_argument, "stats_every {} without stats_path (where would the counters go?)", options.stats_every);
  const bool cuda = use_cuda(options.device, options.device_index);
  const ResolvedModel rm = resolve_model(path, options.placement);

  std::unique_ptr<LinkedExperts> x(new LinkedExperts());
  x->pack_path_ = rm.pack;
  x->pack_ = store::PackObjectMap::open(rm.pack, true);
  const format::PackFile &pf = x->pack_->pack();
  x->first_layer_ = pf.first_layer();
  x->num_experts_ = pf.num_experts();
  x->top_k_ = options.top_k ? options.top_k : pf.top_k();
  if (x->top_k_ == 0)
    fail(Status::invalid_argument, "{}: the source records no top_k (experts per token): set the top_k option", rm.pack);
  if (x->top_k_ > pf.num_experts())
    fail(Status::invalid_argument, "{}: top_k {} with {} experts per layer", rm.pack, x->top_k_, pf.num_experts());
  for (uint32_t l = 0; l < pf.num_layers(); ++l) x->layouts_.push_back(layer_layout(pf, l));

  // Sized as a model's store (PackedExperts): store::configure_store.
  store::StoreOptions so;
  std::unique_ptr<store::StoreDevice> device =
      store::configure_store(options.store, cuda ? options.device_index : -1, nullptr, options.cuda_reserve_bytes, so);
  if (cuda) {
    x->cuda_device_ = options.device_index;
    x->store_stream_ = store::cuda_compute_stream(*device);
  }
  x->prefetch_ = options.store.prefetch;

  so.pack_path = rm.pack;
  so.data_paths = pf.data_files();
  so.objects = x->pack_;
  so.top_k = x->top_k_;
  // 0: the store's one slot budget decides how many tokens an acquire covers.
  so.tokens_per_acquire = options.tokens_per_acquire;
  so.stats_path = options.stats_path;
  so.stats_every = options.stats_every;
  so.table_rows = 3;  // gate, up and down addresses per id
  x->store_ = std::make_unique<store::ExpertStore>(std::move(so), std::move(device));
  x->max_unique_ = x->store_->max_unique();
  // What 0 resolved to: the store took top_k × tokens distinct ids, clamped to every expert of a
  // layer, so the tokens are the ceiling of max_unique / top_k.
  x->tokens_ = options.tokens_per_acquire ? options.tokens_per_acquire : (x->max_unique_ + x->top_k_ - 1) / x->top_k_;
  // The slots as one array (what stacked-tensor kernels index): both store devices allocate them
  // so; checked, since the device interface does not promise it.
  store::StoreDevice &dev = x->store_->device();
  x->slots_base_ = dev.slot_ptr(0);
  for (uint32_t s = 1; s < x->store_->num_slots(); ++s)
    if (dev.slot_ptr(s) != dev.slot_ptr(0) + static_cast<uint64_t>(s) * x->store_->slot_bytes())
      fail(Status::internal, "{}: the {} store's slot {} is not at slot 0 + {} x {} bytes", rm.pack, dev.name(), s, s,
           x->store_->slot_bytes());
#ifdef EP_HAVE_CUDA
  if (cuda) {
    x->orders_ = std::make_unique<StreamOrders>(options.device_index);
  }
#endif
  return x;
}

LinkedExperts::LinkedExperts() = default;
LinkedExperts::~LinkedExperts() = default;

const LayerLayout &LinkedExperts::layout(uint32_t layer) const {
  if (layer >= layouts_.size())
    fail(Status::invalid_argument, "{}: layer {} out of range (the store has {} layers)", pack_path_, layer, layouts_.size());
  return layouts_[layer];
}

void LinkedExperts::check_stream(void *stream, const char *what) const {
  if (!on_cuda() && stream)
    fail(Status::invalid_argument, "{}: a CUDA stream was given, but the experts live in host memory (pass NULL)", what);
}

void LinkedExperts::check_ids(uint32_t layer, std::span<const int32_t> ids, const char *what) const {
  (void)layout(layer);
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || static_cast<uint32_t>(ids[i]) >= num_experts_)
      fail(Status::invalid_argument, "{}: layer {}: expert id {} at position {} is outside 0..{}", what, layer, ids[i], i,
           num_experts_ - 1);
}

std::unique_ptr<LinkedExperts::Lease> LinkedExperts::acquire(uint32_t layer, std::span<const int32_t> ids, void *stream) {
  check_stream(stream, "acquire");
  if (ids.empty()) fail(Status::invalid_argument, "acquire: layer {}: no ids", layer);
  check_ids(layer, ids, "acquire");
  auto lease = std::make_unique<Lease>();
  lease->ids.assign(ids.begin(), ids.end());
  std::vector<uint32_t> u(ids.begin(), ids.end());
  const LayerLayout &lay = layouts_[layer];
  const uint64_t offsets[3] = {lay.roles[0].offset, lay.roles[1].offset, lay.roles[2].offset};
#ifdef EP_HAVE_CUDA
  std::optional<gpu::DeviceScope> scope;
  if (on_cuda()) scope.emplace(cuda_device_);
#endif
  lease->acquisition = store_->acquire(layer, u, offsets);
#ifdef EP_HAVE_CUDA
  if (on_cuda()) {
    // The host's stream waits for the store's: its waits on the slots' `ready` events and the
    // published table are queued there.
    try {
      std::lock_guard lock(bridge_mutex_);
      orders_->acquired.order(stream, store_stream_);
    } catch (...) {
      store_->release(lease->acquisition);
      throw;
    }
  }
#endif
  const size_t n = ids.size();
  for (const store::SlotRef &ref : lease->acquisition.refs) lease->slots.push_back(ref.slot);
  lease->roles.resize(3 * n);
  for (size_t r = 0; r < 3; ++r)
    for (size_t i = 0; i < n; ++i)
      lease->roles[r * n + i] = static_cast<const std::byte *>(lease->acquisition.pointers[i]) + offsets[r];
  return lease;
}

void LinkedExperts::release(Lease &lease, void *stream) {
  if (!on_cuda() && stream) {
    // Host memory: nothing can still read the experts asynchronously, so they are released and
    // the stray stream is reported.
    store_->release(lease.acquisition);
    check_stream(stream, "release");
  }
#ifdef EP_HAVE_CUDA
  std::optional<gpu::DeviceScope> scope;
  if (on_cuda()) {
    scope.emplace(cuda_device_);
    // The slots' `last_use` events go on the store's stream: it waits for the host's work first.
    // Should that fail, the experts stay pinned: the host's kernels may still read them.
    std::lock_guard lock(bridge_mutex_);
    orders_->released.order(store_stream_, stream);
  }
#endif
  store_->release(lease.acquisition);
}

void LinkedExperts::hint(uint32_t layer, std::span<const int32_t> ids) {
  if (!prefetch_) fail(Status::invalid_argument, "hint: the store was opened without prefetch (set the prefetch option)");
  check_ids(layer, ids, "hint");
  std::vector<uint32_t> u(ids.begin(), ids.end());
#ifdef EP_HAVE_CUDA
  std::optional<gpu::DeviceScope> scope;
  if (on_cuda()) scope.emplace(cuda_device_);
#endif
  store_->hint(layer, u);
}

}  // namespace ep::engine
