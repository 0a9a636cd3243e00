// C API: the expert store for other engines (include/expertpack/experts.h): handles over the
// engine's LinkedExperts, struct-size copies and the exception barrier.
//
// A lease shares the store's state with its handle: ep_experts_close() drops the store (its
// memory goes), and a lease released afterwards finds it gone and says so instead of touching
// freed memory.
#include <expertpack/expertpack.h>
#include <expertpack/experts.h>

#include "capi/guard.hpp"
#include "capi/store_stats.hpp"
#include "engine/engine.hpp"
#include "engine/linked_experts.hpp"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <shared_mutex>
#include <span>
#include <string>

namespace {

struct Shared {
  // Exclusive for close; shared for everything that uses the store (which serialises itself).
  std::shared_mutex mutex;
  std::unique_ptr<ep::engine::LinkedExperts> experts;  // null once closed
};

// The first published sizes: fields are only appended after these.
constexpr size_t kExpertsOptionsV1 = sizeof(ep_experts_options);
constexpr size_t kExpertsPropertiesV1 = sizeof(ep_experts_properties);
constexpr size_t kLayerLayoutV1 = sizeof(ep_experts_layer_layout);
constexpr size_t kLeaseInfoV1 = sizeof(ep_experts_lease_properties);
constexpr size_t kStoreStatsV1 = offsetof(ep_store_stats, host_hits);

ep::engine::DeviceChoice device_choice(ep_device_kind kind, const char *fn) {
  switch (kind) {
    case EP_DEVICE_AUTO: return ep::engine::DeviceChoice::automatic;
    case EP_DEVICE_CPU: return ep::engine::DeviceChoice::cpu;
    case EP_DEVICE_CUDA: return ep::engine::DeviceChoice::cuda;
    default: ep::fail(ep::Status::invalid_argument, "{}: device {} is not an ep_device_kind", fn, static_cast<int>(kind));
  }
}

void check_flag(int32_t value, const char *fn, const char *name) {
  if (value < 0 || value > 1) ep::fail(ep::Status::invalid_argument, "{}: {} {} (expected 0 or 1)", fn, name, value);
}

/// Copies @p value into @p out up to out->struct_size (checked), keeping the caller's size.
template <typename T>
void copy_out(T *out, T value, size_t min_size, const char *name) {
  ep::capi::check_struct_size(out->struct_size, min_size, sizeof(T), name);
  value.struct_size = out->struct_size;
  std::memcpy(out, &value, std::min(out->struct_size, sizeof(T)));
}

}  // namespace

struct ep_experts {
  std::shared_ptr<Shared> shared;
  std::string pack_path;
};

struct ep_experts_lease {
  std::shared_ptr<Shared> shared;
  std::unique_ptr<ep::engine::LinkedExperts::Lease> lease;
};

extern "C" {

EP_API void ep_experts_options_init(ep_experts_options *options) {
  if (!options) return;
  *options = ep_experts_options{};
  options->struct_size = sizeof(ep_experts_options);
  options->device = EP_DEVICE_AUTO;
  options->direct_io = -1;
  options->pack_build = 1;
  options->tokens_per_acquire = 1;
}

EP_API ep_status ep_experts_open(ep_experts **out_experts, const char *path, const ep_experts_options *options) {
  return ep::capi::guard(__func__, [&](const char *fn) {
    ep::capi::require_arg(out_experts, fn, "out_experts");
    *out_experts = nullptr;
    ep::capi::require_arg(path, fn, "path");
    ep_experts_options opts;
    ep_experts_options_init(&opts);
    if (options) {
      ep::capi::check_struct_size(options->struct_size, kExpertsOptionsV1, sizeof(ep_experts_options), "ep_experts_options");
      std::memcpy(&opts, options, std::min(options->struct_size, sizeof(ep_experts_options)));
      opts.struct_size = sizeof(ep_experts_options);
    }
    check_flag(opts.pack_build, fn, "pack_build");
    check_flag(opts.no_pack, fn, "no_pack");
    check_flag(opts.prefetch, fn, "prefetch");
    ep::engine::LinkedExpertsOptions lo;
    lo.device = device_choice(opts.device, fn);
    lo.device_index = opts.device_index;
    lo.store.cache_budget_bytes = opts.cache_budget_bytes;
    lo.store.staging_slots = opts.staging_slots;
    lo.store.queue_depth = opts.queue_depth;
    lo.store.read_splits = opts.read_splits;
    lo.store.direct_io = opts.direct_io;
    if (opts.pack_dir) lo.placement.pack_dir = opts.pack_dir;
    lo.placement.build = opts.pack_build != 0;
    lo.placement.source_index = opts.no_pack != 0;
    if (opts.progress) {
      const ep_model_progress_fn cb = opts.progress;
      void *payload = opts.progress_payload;
      lo.placement.progress = [cb, payload](uint64_t done, uint64_t total) { cb(done, total, payload); };
    }
    lo.store.host_cache_bytes = opts.host_cache_bytes;
    lo.store.prefetch = opts.prefetch != 0;
    if (opts.cache_policy) lo.store.cache_policy = opts.cache_policy;
    lo.tokens_per_acquire = opts.tokens_per_acquire;
    if (opts.stats_path) lo.stats_path = opts.stats_path;
    lo.stats_every = opts.stats_every;
    lo.top_k = opts.top_k;
    auto shared = std::make_shared<Shared>();
    shared->experts = ep::engine::LinkedExperts::open(path, lo);
    auto h = std::make_unique<ep_experts>();
    h->pack_path = shared->experts->pack_path();
    h->shared = std::move(shared);
    *out_experts = h.release();
  });
}

EP_API void ep_experts_close(ep_experts *experts) {
  if (!experts) return;
  {
    std::unique_lock lock(experts->shared->mutex);
    experts->shared->experts.reset();
  }
  delete experts;
}

EP_API const char *ep_experts_pack_path(const ep_experts *experts) { return experts ? experts->pack_path.c_str() : nullptr; }

EP_API void ep_experts_properties_init(ep_experts_properties *properties) {
  if (!properties) return;
  *properties = ep_experts_properties{};
  properties->struct_size = sizeof(ep_experts_properties);
}

EP_API ep_status ep_experts_info(ep_experts_properties *out_properties, const ep_experts *experts) {
  return ep::capi::guard(__func__, [&](const char *fn) {
    ep::capi::require_arg(out_properties, fn, "out_properties");
    ep::capi::require_arg(experts, fn, "experts");
    std::shared_lock lock(experts->shared->mutex);
    const ep::engine::LinkedExperts &x = *experts->shared->experts;
    ep_experts_properties p{};
    p.num_layers = x.num_layers();
    p.first_layer = x.first_layer();
    p.num_experts = x.num_experts();
    p.num_roles = EP_EXPERT_ROLES;
    p.top_k = x.top_k();
    p.max_experts_per_acquire = x.max_unique();
    p.max_table_ids = x.max_table_ids();
    p.tokens_per_acquire = x.tokens_per_acquire();
    p.slot_bytes = x.slot_bytes();
    p.cache_slots = x.num_slots();
    p.host_slots = x.num_host_slots();
    p.device = x.on_cuda() ? EP_DEVICE_CUDA : EP_DEVICE_CPU;
    p.device_index = x.on_cuda() ? x.cuda_device() : -1;
    p.slots_address = reinterpret_cast<uint64_t>(x.slots_base());
    copy_out(out_properties, p, kExpertsPropertiesV1, "ep_experts_properties");
  });
}

EP_API void ep_experts_layer_layout_init(ep_experts_layer_layout *layout) {
  if (!layout) return;
  *layout = ep_experts_layer_layout{};
  layout->struct_size = sizeof(ep_experts_layer_layout);
}

EP_API ep_status ep_experts_layout(ep_experts_layer_layout *out_layout, const ep_experts *experts, uint32_t layer) {
  return ep::capi::guard(__func__, [&](const char *fn) {
    ep::capi::require_arg(out_layout, fn, "out_layout");
    ep::capi::require_arg(experts, fn, "experts");
    std::shared_lock lock(experts->shared->mutex);
    const ep::engine::LinkedExperts &x = *experts->shared->experts;
    const ep::engine::LayerLayout &l = x.layout(layer);
    ep_experts_layer_layout o{};
    o.layer = layer;
    o.model_layer = x.first_layer() + layer;
    o.num_experts = l.num_experts;
    o.num_roles = EP_EXPERT_ROLES;
    o.object_bytes = l.object_bytes;
    for (size_t r = 0; r < EP_EXPERT_ROLES; ++r) {
      const ep::engine::RoleLayout &w = l.roles[r];
      o.roles[r].ggml_type = static_cast<uint32_t>(w.type);
      o.roles[r].n_dims = 2;
      o.roles[r].ne[0] = w.ne0;
      o.roles[r].ne[1] = w.ne1;
      o.roles[r].offset = w.offset;
      o.roles[r].row_bytes = w.row_bytes;
      o.roles[r].bytes = w.bytes;
    }
    copy_out(out_layout, o, kLayerLayoutV1, "ep_experts_layer_layout");
  });
}

EP_API ep_status ep_experts_acquire(ep_experts_lease **out_lease, ep_experts *experts, uint32_t layer, const int32_t *ids,
                                    size_t n_ids, void *cuda_stream) {
  return ep::capi::guard(__func__, [&](const char *fn) {
    ep::capi::require_arg(out_lease, fn, "out_lease");
    *out_lease = nullptr;
    ep::capi::require_arg(experts, fn, "experts");
    ep::capi::require_arg(ids, fn, "ids");
    if (n_ids == 0) ep::fail(ep::Status::invalid_argument, "{}: layer {}: n_ids is 0", fn, layer);
    if (n_ids > UINT32_MAX) ep::fail(ep::Status::invalid_argument, "{}: layer {}: {} ids", fn, layer, n_ids);
    auto l = std::make_unique<ep_experts_lease>();
    l->shared = experts->shared;
    std::shared_lock lock(experts->shared->mutex);
    l->lease = experts->shared->experts->acquire(layer, std::span<const int32_t>(ids, n_ids), cuda_stream);
    *out_lease = l.release();
  });
}

EP_API void ep_experts_lease_properties_init(ep_experts_lease_properties *info) {
  if (!info) return;
  *info = ep_experts_lease_properties{};
  info->struct_size = sizeof(ep_experts_lease_properties);
}

EP_API ep_status ep_experts_lease_info(ep_experts_lease_properties *out_info, const ep_experts_lease *lease) {
  return ep::capi::guard(__func__, [&](const char *fn) {
    ep::capi::require_arg(out_info, fn, "out_info");
    ep::capi::require_arg(lease, fn, "lease");
    std::shared_lock lock(lease->shared->mutex);
    if (!lease->shared->experts)
      ep::fail(ep::Status::invalid_argument, "{}: the lease's expert store was closed: its addresses are gone", fn);
    const ep::engine::LinkedExperts::Lease &x = *lease->lease;
    ep_experts_lease_properties i{};
    i.layer = x.acquisition.layer;
    i.n_ids = static_cast<uint32_t>(x.ids.size());
    i.ids = x.ids.data();
    i.objects = x.acquisition.pointers.data();
    i.roles = x.roles.data();
    i.device_table = x.acquisition.device_table;
    i.hits = x.acquisition.hits;
    i.misses = x.acquisition.misses;
    i.host_hits = x.acquisition.host_hits;
    i.slots = x.slots.data();
    copy_out(out_info, i, kLeaseInfoV1, "ep_experts_lease_properties");
  });
}

EP_API ep_status ep_experts_release(ep_experts_lease *lease, void *cuda_stream) {
  const std::unique_ptr<ep_experts_lease> owned(lease);
  return ep::capi::guard(__func__, [&](const char *fn) {
    if (!owned) return;
    std::shared_lock lock(owned->shared->mutex);
    if (!owned->shared->experts)
      ep::fail(ep::Status::invalid_argument,
               "{}: the lease's expert store was closed before the lease was released (the lease is freed now)", fn);
    owned->shared->experts->release(*owned->lease, cuda_stream);
  });
}

EP_API ep_status ep_experts_hint(ep_experts *experts, uint32_t layer, const int32_t *ids, size_t n_ids) {
  return ep::capi::guard(__func__, [&](const char *fn) {
    ep::capi::require_arg(experts, fn, "experts");
    if (n_ids) ep::capi::require_arg(ids, fn, "ids");
    std::shared_lock lock(experts->shared->mutex);
    experts->shared->experts->hint(layer, std::span<const int32_t>(ids, n_ids));
  });
}

EP_API ep_status ep_experts_stats(ep_store_stats *out_stats, const ep_experts *experts) {
  return ep::capi::guard(__func__, [&](const char *fn) {
    ep::capi::require_arg(out_stats, fn, "out_stats");
    ep::capi::require_arg(experts, fn, "experts");
    std::shared_lock lock(experts->shared->mutex);
    copy_out(out_stats, ep::capi::to_c_store_stats(experts->shared->experts->stats()), kStoreStatsV1, "ep_store_stats");
  });
}

}  // extern "C"
