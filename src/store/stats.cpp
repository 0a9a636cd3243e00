#include "store/stats.hpp"

#include "core/error.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <fstream>

namespace ep::store {

void add_stats(StoreStats &into, const StoreStats &more) {
  StoreStats &a = into;
  const StoreStats &b = more;
  for (auto field : {&StoreStats::acquires, &StoreStats::pack_reads, &StoreStats::pack_read_bytes, &StoreStats::pack_read_ns,
                     &StoreStats::cache_hits, &StoreStats::cache_misses, &StoreStats::cache_evictions,
                     &StoreStats::resident_experts, &StoreStats::resident_bytes, &StoreStats::h2d_bytes, &StoreStats::io_errors,
                     &StoreStats::fallback_count, &StoreStats::cache_slots, &StoreStats::host_hits, &StoreStats::host_misses,
                     &StoreStats::demotions, &StoreStats::host_resident_bytes, &StoreStats::host_slots,
                     &StoreStats::prefetch_issued, &StoreStats::prefetch_used, &StoreStats::prefetch_read_bytes,
                     &StoreStats::prefetch_used_read_bytes, &StoreStats::pack_read_full_ns, &StoreStats::expert_wait_ns,
                     &StoreStats::store_disk_idle_ns})
    a.*field += b.*field;
  a.slot_bytes = std::max(a.slot_bytes, b.slot_bytes);
  a.pack_read_full_depth = std::max(a.pack_read_full_depth, b.pack_read_full_depth);
  if (a.layers.size() < b.layers.size()) a.layers.resize(b.layers.size());
  for (size_t l = 0; l < b.layers.size(); ++l)
    for (auto field : {&LayerStats::cache_hits, &LayerStats::cache_misses, &LayerStats::host_hits, &LayerStats::pack_reads,
                       &LayerStats::pack_read_bytes, &LayerStats::expert_wait_ns})
      a.layers[l].*field += b.layers[l].*field;
}

std::string stats_to_json(const StoreStats &s) {
  nlohmann::ordered_json j;
  j["acquires"] = s.acquires;
  j["pack_reads"] = s.pack_reads;
  j["pack_read_bytes"] = s.pack_read_bytes;
  j["pack_read_ns"] = s.pack_read_ns;
  j["cache_hits"] = s.cache_hits;
  j["cache_misses"] = s.cache_misses;
  j["cache_evictions"] = s.cache_evictions;
  j["resident_experts"] = s.resident_experts;
  j["resident_bytes"] = s.resident_bytes;
  j["h2d_bytes"] = s.h2d_bytes;
  j["io_errors"] = s.io_errors;
  j["fallback_count"] = s.fallback_count;
  j["cache_slots"] = s.cache_slots;
  j["slot_bytes"] = s.slot_bytes;
  j["host_hits"] = s.host_hits;
  j["host_misses"] = s.host_misses;
  j["demotions"] = s.demotions;
  j["host_resident_bytes"] = s.host_resident_bytes;
  j["host_slots"] = s.host_slots;
  j["prefetch_issued"] = s.prefetch_issued;
  j["prefetch_used"] = s.prefetch_used;
  j["prefetch_read_bytes"] = s.prefetch_read_bytes;
  j["prefetch_used_read_bytes"] = s.prefetch_used_read_bytes;
  j["pack_read_full_ns"] = s.pack_read_full_ns;
  j["pack_read_full_depth"] = s.pack_read_full_depth;
  j["expert_wait_ns"] = s.expert_wait_ns;
  j["store_disk_idle_ns"] = s.store_disk_idle_ns;
  j["layers"] = nlohmann::ordered_json::array();
  for (const LayerStats &l : s.layers)
    j["layers"].push_back({{"cache_hits", l.cache_hits},
                           {"cache_misses", l.cache_misses},
                           {"host_hits", l.host_hits},
                           {"pack_reads", l.pack_reads},
                           {"pack_read_bytes", l.pack_read_bytes},
                           {"expert_wait_ns", l.expert_wait_ns}});
  return j.dump();
}

void write_stats_file(const StoreStats &stats, const std::string &path) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) fail_errno(errno, "create stats file " + tmp);
    out << stats_to_json(stats) << '\n';
    if (!out.flush()) fail(Status::io, "{}: write failed", tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) fail_errno(errno, "rename " + tmp + " to " + path);
}

}  // namespace ep::store
