// C API: expert store statistics (the struct, and reading the JSON file a store writes).
#include <expertpack/expertpack.h>

#include "capi/guard.hpp"
#include "capi/store_stats.hpp"
#include "core/error.hpp"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstddef>
#include <algorithm>
#include <cstring>
#include <fstream>

namespace {

// The first published size: fields are only appended after it.
constexpr size_t kStoreStatsV1 = offsetof(ep_store_stats, host_hits);

}  // namespace

extern "C" {

EP_API void ep_store_stats_init(ep_store_stats *stats) {
  if (!stats) return;
  std::memset(stats, 0, sizeof *stats);
  stats->struct_size = sizeof *stats;
}

EP_API ep_status ep_store_stats_read_file(ep_store_stats *out_stats, const char *path) {
  return ep::capi::guard(__func__, [&](const char *fn) {
    ep::capi::require_arg(out_stats, fn, "out_stats");
    ep::capi::require_arg(path, fn, "path");
    ep::capi::check_struct_size(out_stats->struct_size, kStoreStatsV1, sizeof(ep_store_stats), "ep_store_stats");
    std::ifstream in(path);
    if (!in) ep::fail_errno(errno, std::string(fn) + ": open " + path);
    nlohmann::json j;
    try {
      in >> j;
    } catch (const std::exception &e) {
      ep::fail(ep::Status::format, "{}: {} is not JSON: {}", fn, path, e.what());
    }
    if (!j.is_object()) ep::fail(ep::Status::format, "{}: {} is not a JSON object", fn, path);
    ep_store_stats s;
    ep_store_stats_init(&s);
    const std::pair<const char *, uint64_t *> fields[] = {
        {"acquires", &s.acquires},
        {"pack_reads", &s.pack_reads},
        {"pack_read_bytes", &s.pack_read_bytes},
        {"pack_read_ns", &s.pack_read_ns},
        {"cache_hits", &s.cache_hits},
        {"cache_misses", &s.cache_misses},
        {"cache_evictions", &s.cache_evictions},
        {"resident_experts", &s.resident_experts},
        {"resident_bytes", &s.resident_bytes},
        {"h2d_bytes", &s.h2d_bytes},
        {"io_errors", &s.io_errors},
        {"fallback_count", &s.fallback_count},
        {"cache_slots", &s.cache_slots},
        {"slot_bytes", &s.slot_bytes},
        {"host_hits", &s.host_hits},
        {"host_misses", &s.host_misses},
        {"demotions", &s.demotions},
        {"host_resident_bytes", &s.host_resident_bytes},
        {"host_slots", &s.host_slots},
        {"prefetch_issued", &s.prefetch_issued},
        {"prefetch_used", &s.prefetch_used},
        {"pack_read_full_ns", &s.pack_read_full_ns},
        {"pack_read_full_depth", &s.pack_read_full_depth},
        {"expert_wait_ns", &s.expert_wait_ns},
        {"store_disk_idle_ns", &s.store_disk_idle_ns},
    };
    for (const auto &[name, dst] : fields) {
      auto it = j.find(name);
      if (it == j.end()) continue;
      if (!it->is_number_unsigned())
        ep::fail(ep::Status::format, "{}: {}: \"{}\" is not an unsigned integer", fn, path, name);
      *dst = it->get<uint64_t>();
    }
    const size_t size = std::min(out_stats->struct_size, sizeof(ep_store_stats));
    std::memcpy(out_stats, &s, size);
    out_stats->struct_size = size;
  });
}

}  // extern "C"

ep_store_stats ep::capi::to_c_store_stats(const ep::store::StoreStats &t) {
  ep_store_stats s;
  ep_store_stats_init(&s);
  s.acquires = t.acquires;
  s.pack_reads = t.pack_reads;
  s.pack_read_bytes = t.pack_read_bytes;
  s.pack_read_ns = t.pack_read_ns;
  s.cache_hits = t.cache_hits;
  s.cache_misses = t.cache_misses;
  s.cache_evictions = t.cache_evictions;
  s.resident_experts = t.resident_experts;
  s.resident_bytes = t.resident_bytes;
  s.h2d_bytes = t.h2d_bytes;
  s.io_errors = t.io_errors;
  s.fallback_count = t.fallback_count;
  s.cache_slots = t.cache_slots;
  s.slot_bytes = t.slot_bytes;
  s.host_hits = t.host_hits;
  s.host_misses = t.host_misses;
  s.demotions = t.demotions;
  s.host_resident_bytes = t.host_resident_bytes;
  s.host_slots = t.host_slots;
  s.prefetch_issued = t.prefetch_issued;
  s.prefetch_used = t.prefetch_used;
  s.pack_read_full_ns = t.pack_read_full_ns;
  s.pack_read_full_depth = t.pack_read_full_depth;
  s.expert_wait_ns = t.expert_wait_ns;
  s.store_disk_idle_ns = t.store_disk_idle_ns;
  return s;
}
